"""The TPU lane's driver (run by ci/tpu/lane.sh after the installs): runs each part in its own
process, one at a time (one process holds the chip), and writes lane.md, lane.json and lane.log.

    python ci/tpu/lane.py [--parts env,kernels,sync,tests,hf,examples,ops,training] [--out DIR]
        [--commit SHA] [--tests FILE...] [--test-seconds N] [--resume LANE_JSON [--retry-failed]]
        [--cache-dir DIR] [--platform tpu] [--training-args "..."] [--cold-start NAME=SECONDS,...]

Parts:
  env       platform, chip, versions
  kernels   tests/test_kernels_*.py on the chip (Pallas kernels compiled by Mosaic)
  kernel_bench  benchmarks/tpu_kernels.py (the kernels against XLA's attention and ragged_dot)
  sync      ci/tpu/sync_check.py: synchronize() waits for work whose outputs were dropped
  tests     the test suite (--tests, default tests/test_*.py less ci/tpu/not_on_tpu.txt) in one
            pytest process, each test's outcome recorded; ci/tpu/expected_failures.txt lists the
            failures known on TPU with their reasons. A suite longer than one call runs over
            several: --resume LANE_JSON leaves out the tests that run has an outcome for
            (--retry-failed: but its failures) and adds its outcomes (--test-seconds: the budget).
            A test that kills the process (XLA:TPU aborts on what it cannot compile) fails with
            the fatal line XLA printed, and pytest starts again after it
  hf        tests/test_hf_models.py (the HF families against CPU's logits and greedy tokens)
  ecosystem HF Trainer and accelerate bf16, Lightning bf16-mixed, torch.profiler device time and
            torch.tpu's API (tests/test_hf_trainer.py, test_lightning.py,
            test_profiler_device_time.py, test_device_api.py)
  examples  every example with --check
  cold_start  examples run as a user first meets them (--cold-start, default issue 33's ResNet and
            minGPT): `--steps 5 --check` in a new process with an empty compile cache, then again
            with that cache; wall seconds against the example's target, XLA compiles of each
  ops       benchmarks/op_kinds.py: eager per-op cost against jax.jit
  training  benchmarks/tpu_training.py (--training-args)
Every part runs from a scratch folder that links tests/, examples/ and benchmarks/ but not the
source package, so the installed wheel is what runs.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import os
import pathlib
import re
import shlex
import subprocess
import sys
import tempfile
import time

PARTS = (
    "env",
    "kernels",
    "kernel_bench",
    "sync",
    "tests",
    "hf",
    "ecosystem",
    "examples",
    "cold_start",
    "ops",
    "training",
)
EXPECTED_FAILURES = pathlib.Path(__file__).parent / "expected_failures.txt"  # failures known on TPU, why
MIN_ROUND_SECONDS = 60  # a tests part starts pytest again after a crash while this much time is left
SLOWEST = 15  # the slowest tests of a test part, kept with their seconds (where the lane's time goes)
HARNESS_EXAMPLES = ("mingpt", "llama", "qwen", "resnet", "dlrm", "unet")
OTHER_EXAMPLES = {
    "moe": ["examples/moe/gmm_moe.py", "--check"],
    "paged_decode": ["examples/paged_decode/paged_decode.py", "--check"],
    "distributed": ["examples/distributed/train.py", "--data", "1", "--model", "1", "--check"],
}
_ENV_SCRIPT = """
import json, jax, torch, torch_tpu
d = jax.devices()[0]
print(json.dumps({"platform": torch_tpu.platform(), "device_kind": d.device_kind, "devices": len(jax.devices()),
                  "torch": torch.__version__, "jax": jax.__version__, "torch_tpu": torch_tpu.__version__,
                  "bytes_limit": (d.memory_stats() or {}).get("bytes_limit")}))
"""


class Lane:
    def __init__(self, args):
        self.args = args
        self.repo = pathlib.Path(args.repo).resolve()
        self.out = pathlib.Path(args.out or self.repo / "benchmarks" / "results" / "tpu").resolve()
        self.out.mkdir(parents=True, exist_ok=True)
        self.log = open(self.out / "lane.log", "w")
        self.scratch = pathlib.Path(tempfile.mkdtemp(prefix="torch_tpu_lane_"))
        for name in ("tests", "examples", "benchmarks", "ci"):
            (self.scratch / name).symlink_to(self.repo / name)
        self.env = dict(os.environ, TORCH_TPU_PLATFORM=args.platform, TORCH_TPU_ASYNC_COMPILE="0")
        self.env["TORCH_TPU_CACHE_DIR"] = args.cache_dir or str(self.scratch / "cache")
        self.env.pop("TORCH_TPU_NUM_CPU_DEVICES", None)
        self.results: dict = {
            "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
            "commit": args.commit or _commit(self.repo),
            "parts": {},
        }
        self.resumed: dict = {}  # part name -> an earlier run's test part (--resume)

    def run(self, name: str, cmd: list[str], timeout: float, env: dict | None = None) -> tuple[int, str, float]:
        """Runs `cmd` in the scratch folder; (exit status, output, seconds). 124 on timeout."""
        self.log.write(f"\n===== {name}: {shlex.join(cmd)}\n")
        self.log.flush()
        start = time.perf_counter()
        try:
            done = subprocess.run(
                cmd, cwd=self.scratch, env=env or self.env, capture_output=True, text=True, timeout=timeout
            )
            code, output = done.returncode, done.stdout + done.stderr
        except subprocess.TimeoutExpired as e:
            code = 124
            output = _text(e.stdout) + _text(e.stderr) + f"\n[lane] timed out after {timeout:.0f} s\n"
        seconds = time.perf_counter() - start
        self.log.write(output + f"\n===== {name}: exit {code} in {seconds:.1f} s\n")
        self.log.flush()
        return code, output, seconds

    def python(self, name: str, args: list[str], timeout: float) -> tuple[int, str, float]:
        return self.run(name, [sys.executable, *args], timeout)

    # ---- parts --------------------------------------------------------------------------

    def part_env(self) -> dict:
        code, output, _ = self.python("env", ["-c", _ENV_SCRIPT], 300)
        found = _last_json(output)
        return {"ok": code == 0 and found is not None, **(found or {})}

    def part_kernels(self) -> dict:
        files = sorted(str(p.relative_to(self.repo)) for p in self.repo.glob("tests/test_kernels_*.py"))
        return self.pytest("kernels", files, 420)

    def part_kernel_bench(self) -> dict:
        code, output, seconds = self.python("kernel benchmark", ["benchmarks/tpu_kernels.py"], 300)
        return {"ok": code == 0, "seconds": seconds, "table": _table_of(output)}

    def part_sync(self) -> dict:
        code, output, seconds = self.python("sync", ["ci/tpu/sync_check.py"], 300)
        return {"ok": code == 0, "seconds": seconds, **(_last_json(output) or {})}

    def part_tests(self) -> dict:
        files = self.args.tests or self._default_tests()
        return self.pytest("tests", files, self.args.test_seconds + 120, budget=self.args.test_seconds)

    def part_hf(self) -> dict:
        return self.pytest(
            "hf", ["tests/test_hf_models.py"], self.args.test_seconds + 120, budget=self.args.test_seconds
        )

    def part_ecosystem(self) -> dict:
        files = ["tests/test_hf_trainer.py", "tests/test_lightning.py", "tests/test_profiler_device_time.py"]
        return self.pytest("ecosystem", [*files, "tests/test_device_api.py"], 900)

    def part_examples(self) -> dict:
        examples = {}
        for name in HARNESS_EXAMPLES:
            cmd = [f"examples/{name}/train.py", "--steps", "2", "--check", "--no-fallbacks"]
            examples[name] = self._example(name, cmd, harness=True)
        for name, cmd in OTHER_EXAMPLES.items():
            examples[name] = self._example(name, cmd, harness=False)
        return {"ok": all(e["ok"] for e in examples.values()), "examples": examples}

    def part_cold_start(self) -> dict:
        runs = {}
        for name, target in _targets(self.args.cold_start).items():
            cache = self.scratch / f"cold_start_{name}"
            env = {k: v for k, v in self.env.items() if k != "TORCH_TPU_ASYNC_COMPILE"}  # as a user runs it
            env |= {"TORCH_TPU_CACHE_DIR": str(cache), "TORCHINDUCTOR_CACHE_DIR": str(cache / "torch")}
            cmd = [sys.executable, f"examples/{name}/train.py", "--steps", "5", "--check"]
            row, wall = {"target_seconds": target}, {}
            for start in ("cold", "warm"):
                code, output, seconds = self.run(f"cold_start {name} {start}", cmd, 590, env=env)
                row[start] = {
                    "exit": code,
                    "seconds": round(seconds, 1),
                    "checked": "check passed" in output,
                    "xla_compiles": _counter(output, "xla_compiles"),
                }
                wall[start] = seconds
            row["ok"] = all(row[s]["exit"] == 0 and row[s]["checked"] for s in ("cold", "warm"))
            row["cold_met"] = wall["cold"] <= target
            row["warm_compiles_nothing"] = row["warm"]["xla_compiles"] == 0
            runs[name] = row
        return {"ok": bool(runs) and all(r["ok"] for r in runs.values()), "cold_start": runs}

    def part_ops(self) -> dict:
        code, output, seconds = self.python("ops", ["benchmarks/op_kinds.py"], 420)
        return {"ok": code == 0, "seconds": seconds, "table": _table_of(output)}

    def part_training(self) -> dict:
        args = shlex.split(self.args.training_args)
        code, output, seconds = self.python("training", ["benchmarks/tpu_training.py", *args], 590)
        return {"ok": code == 0, "seconds": seconds, "table": _table_of(output), "args": args}

    # ---- helpers --------------------------------------------------------------------------

    def _default_tests(self) -> list[str]:
        skip = _listed(self.repo / "ci" / "tpu" / "not_on_tpu.txt")
        files = sorted(str(p.relative_to(self.repo)) for p in self.repo.glob("tests/test_*.py"))
        return [f for f in files if f not in skip and not f.startswith("tests/test_kernels_")]

    def pytest(self, name: str, files: list[str], timeout: float, budget: float | None = None) -> dict:
        """Runs `files` in pytest, each test's outcome recorded as it ends. A process that dies
        (XLA:TPU aborts on what it cannot compile) fails the test it was running, and pytest
        starts again after it while the time lasts."""
        progress = self.scratch / f"{name}.progress"
        done = self.scratch / f"{name}.done"
        collected_file = self.scratch / f"{name}.collected"
        details = self.out / f"{name}.failures.txt"
        progress.unlink(missing_ok=True)
        details.unlink(missing_ok=True)
        env = dict(
            self.env,
            PYTHONPATH=os.pathsep.join(filter(None, [str(self.scratch / "ci" / "tpu"), self.env.get("PYTHONPATH")])),
            TORCH_TPU_LANE_COLLECTED=str(collected_file),
            TORCH_TPU_LANE_PROGRESS=str(progress),
            TORCH_TPU_LANE_DONE=str(done),
            TORCH_TPU_LANE_DETAILS=str(details),
        )
        earlier = self.resumed.get(name)
        retry = {"failed"} if self.args.retry_failed else set()
        earlier_done = [t for t, state in (earlier or {}).get("outcomes", {}).items() if state not in retry]
        cmd = [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-p",
            "lane_plugin",
            "--import-mode=importlib",
            "--capture=sys",  # what C++ writes to fd 2 (XLA's fatal line before an abort) reaches the log
            *([f"--timeout={self.args.test_timeout:.0f}"] if importlib.util.find_spec("pytest_timeout") else []),
            "--rootdir",
            str(self.scratch),
            *files,
        ]
        start, crashes = time.perf_counter(), {}
        while True:
            results, _ = _progress_of(progress)
            done.write_text("\n".join([*earlier_done, *results, *crashes]))
            left = timeout - (time.perf_counter() - start)
            if budget:
                env["TORCH_TPU_LANE_TEST_SECONDS"] = str(budget - (time.perf_counter() - start))
            code, output, _ = self.run(name, cmd, left, env=env)
            results, running = _progress_of(progress)
            died = code < 0 or code == 124
            if not (died and running):
                break
            crashes[running] = _crash_reason(code, output)
            print(f"[lane] {name}: {running} {crashes[running]}", flush=True)
            if (budget or timeout) - (time.perf_counter() - start) < MIN_ROUND_SECONDS:
                break
        seconds = time.perf_counter() - start
        collected = collected_file.read_text().split("\n") if collected_file.exists() else None
        if earlier and collected:  # an earlier outcome of a test its file no longer has is dropped
            earlier = _without_gone_tests(earlier, set(collected))
        results.update({test: ("failed", why, 0.0) for test, why in crashes.items()})
        part = {
            "exit": code,
            "seconds": round(seconds, 1),
            "stopped_early": "time budget" in output,
            # pytest's 2 is an interrupted session (the time budget's stop), 5 is no test left to run;
            # a round that died has its test failed and does not count against the part
            "exit_ok": code in (0, 1)
            or (code == 2 and "time budget" in output)
            or (code == 5 and bool(earlier or crashes))
            or (code < 0 and bool(crashes)),
            "collected": len(collected) if collected else None,
            "crashed": sorted(crashes),
            "outcomes": {test: state for test, (state, _, _) in results.items()},
            "reasons": {test: why for test, (state, why, _) in results.items() if state == "failed"},
        }
        part["slowest"] = _slowest({test: seconds for test, (_, _, seconds) in results.items()})
        part = _tally(part, _expected_failures(EXPECTED_FAILURES))
        return {**combine_tests(earlier, part), "resumed": True} if earlier else part

    def _example(self, name: str, cmd: list[str], harness: bool) -> dict:
        code, output, seconds = self.python(f"example {name}", cmd, 590)
        ok = code == 0 and ("check passed" in output if harness else True)
        tail = [line for line in output.strip().splitlines()[-3:]]
        return {"ok": ok, "exit": code, "seconds": round(seconds, 1), "tail": tail}

    def write(self) -> None:
        with open(self.out / "lane.json", "w") as f:
            json.dump(self.results, f, indent=1, sort_keys=True)
        (self.out / "lane.md").write_text(markdown(self.results))


def markdown(results: dict) -> str:
    parts = results["parts"]
    env = parts.get("env", {})
    lines = [
        "# TPU lane results",
        "",
        f"{results['date']}, commit {results['commit']}; {env.get('device_kind', '?')} ({env.get('platform', '?')}), "
        f"torch {env.get('torch', '?')}, jax {env.get('jax', '?')}, torch_tpu {env.get('torch_tpu', '?')}.",
        "Made by `bash ci/tpu/lane.sh` (ci/tpu/lane.py).",
        *[f"- run {r['date']}, commit {r['commit']}: {', '.join(r['parts'])}" for r in results.get("runs", [])],
        "",
        "| part | result |",
        "|---|---|",
    ]
    for name, part in parts.items():
        lines.append(f"| {name} | {'pass' if part.get('ok') else 'FAIL'}{_summary(part)} |")
    for name in ("kernels", "tests", "hf", "ecosystem"):
        tests = parts.get(name)
        if tests and tests.get("failures"):
            lines += ["", f"## {name}: failures", ""]
            unexpected = set(tests.get("unexpected_failures", []))
            lines += [
                f"- `{t}`{'' if t in unexpected else ' (expected)'}: {why}" for t, why in tests["failures"].items()
            ]
        if tests and tests.get("slowest"):
            lines += ["", f"## {name}: slowest tests", ""]
            lines += [f"- `{t}`: {seconds} s" for t, seconds in tests["slowest"]]
    if "examples" in parts:
        lines += ["", "## Examples (`--check`)", "", "| example | result | seconds |", "|---|---|---|"]
        for name, e in parts["examples"]["examples"].items():
            result = "pass" if e["ok"] else f"FAIL (exit {e['exit']})"
            lines.append(f"| {name} | {result} | {e['seconds']} |")
    if "cold_start" in parts:
        lines += [
            "",
            "## Cold start (`--steps 5 --check`, new processes: an empty compile cache, then that cache)",
            "",
            "| example | cold s | target s | cold XLA compiles | warm s | warm XLA compiles | --check |",
            "|---|---|---|---|---|---|---|",
        ]
        for name, r in parts["cold_start"]["cold_start"].items():
            cold, warm = r["cold"], r["warm"]
            met = "met" if r["cold_met"] else "NOT met"
            checked = "passed" if cold["checked"] and warm["checked"] else "FAILED"
            lines.append(
                f"| {name} | {cold['seconds']} | {r['target_seconds']:g} ({met}) | {cold['xla_compiles']} | "
                f"{warm['seconds']} | {warm['xla_compiles']} | {checked} |"
            )
    for name, title in (
        ("kernel_bench", "Kernels against XLA"),
        ("ops", "Eager op kinds against jax.jit"),
        ("training", "Training"),
    ):
        table = parts.get(name, {}).get("table")
        if table:
            lines += ["", f"## {title}", "", table]
    if "sync" in parts and "dropped_ms" in parts["sync"]:
        s = parts["sync"]
        lines += [
            "",
            "## synchronize()",
            "",
            f"10 dropped 8192² bf16 matmuls + synchronize: {s['dropped_ms']:.1f} ms; 10 kept: {s['kept_ms']:.1f} ms "
            f"(ratio {s['dropped_over_kept']:.2f}, target >= 0.8); {s['kept_tflops']:.0f} TFLOP/s.",
        ]
    return "\n".join(lines) + "\n"


def _summary(part: dict) -> str:
    if "passed" in part:
        rate = f", {part['pass_rate'] * 100:.1f}%" if part.get("pass_rate") is not None else ""
        ran = len(part.get("outcomes", {}))
        extra = f"; {ran} of {part['collected']} collected have run" if part.get("collected") else ""
        extra += " (stopped at the time budget)" if part.get("stopped_early") else ""
        unexpected = len(part.get("unexpected_failures", []))
        failed = f"{part['failed']} failed ({unexpected} not in expected_failures.txt)"
        return f": {part['passed']} passed, {failed}, {part['skipped']} skipped{rate}{extra}"
    if "tests" in part:
        return _summary(part["tests"])
    if "examples" in part:
        return f": {sum(e['ok'] for e in part['examples'].values())} of {len(part['examples'])} pass"
    if "cold_start" in part:
        runs = part["cold_start"].items()
        return ": " + ", ".join(f"{n} cold {r['cold']['seconds']} s (target {r['target_seconds']:g})" for n, r in runs)
    return ""


def _tally(part: dict, expected: dict[str, str]) -> dict:
    """part's counts, failures and verdict from its outcomes; ok when every failure is expected
    and pytest ended as it should (not a usage error, a crash or the lane's timeout)."""
    outcomes, reasons = part["outcomes"], part.get("reasons", {})
    failed = sorted(t for t, state in outcomes.items() if state == "failed")
    passed = sum(1 for state in outcomes.values() if state == "passed")
    counted = passed + len(failed)
    return {
        **part,
        "ok": part["exit_ok"] and not set(failed) - set(expected) and bool(outcomes),
        "passed": passed,
        "failed": len(failed),
        "skipped": sum(1 for state in outcomes.values() if state == "skipped"),
        "pass_rate": passed / counted if counted else None,
        "failures": {t: reasons.get(t, "") for t in failed},
        "unexpected_failures": sorted(set(failed) - set(expected)),
    }


def _without_gone_tests(part: dict, collected: set[str]) -> dict:
    """`part` less the outcomes of tests that a run collecting their module did not collect
    (renamed or removed since)."""
    modules = {t.split("::")[0] for t in collected}
    keep = {t: s for t, s in part.get("outcomes", {}).items() if t in collected or t.split("::")[0] not in modules}
    return {**part, "outcomes": keep}


def combine_tests(earlier: dict, later: dict) -> dict:
    """One test part from two runs over the same suite (a later run resumes an earlier one, or
    runs some tests again): each test's outcome from the later run where both have it."""
    reasons = {**earlier.get("reasons", earlier.get("failures", {})), **later.get("reasons", {})}
    outcomes = {**earlier.get("outcomes", {}), **later.get("outcomes", {})}
    part = {
        "exit": later["exit"],
        "exit_ok": earlier.get("exit_ok", earlier.get("exit") in (0, 1)) and later["exit_ok"],
        "seconds": round(earlier.get("seconds", 0) + later.get("seconds", 0), 1),
        "stopped_early": later.get("stopped_early", False),
        "collected": later.get("collected") or earlier.get("collected"),
        "outcomes": outcomes,
        "reasons": {t: why for t, why in reasons.items() if outcomes.get(t) == "failed"},
        "crashed": sorted(
            {t for t in earlier.get("crashed", []) if t not in later.get("outcomes", {})}
            | set(later.get("crashed", []))
        ),
        "slowest": _slowest({**dict(earlier.get("slowest", [])), **dict(later.get("slowest", []))}),
    }
    return _tally(part, _expected_failures(EXPECTED_FAILURES))


def _slowest(durations: dict[str, float]) -> list[list]:
    """The SLOWEST [test id, seconds] pairs, slowest first (a list: lane.json sorts dict keys)."""
    return [[t, s] for t, s in sorted(durations.items(), key=lambda kv: -kv[1])[:SLOWEST]]


def _progress_of(path: pathlib.Path) -> tuple[dict[str, tuple[str, str, float]], str | None]:
    """From lane_plugin's progress file: test id -> (passed | failed | skipped, first line of why,
    seconds) for each test that ended, and the test that started last without ending (None)."""
    results: dict[str, tuple[str, str, float]] = {}
    running = None
    for line in path.read_text().splitlines() if path.exists() else []:
        kind, test, *rest = line.split("\t") + [""] * 4
        if kind == "start":
            running = test
        elif kind == "done":
            results[test] = (rest[0], rest[2], float(rest[1] or 0))
            running = None
    return results, running


def _crash_reason(code: int, output: str) -> str:
    """Why a test process died: its signal and the last fatal line it printed (XLA's `F1207 ...]`
    check failure, Python's fatal error)."""
    how = "timed out" if code == 124 else f"killed by signal {-code}" + (" (abort)" if code == -6 else "")
    xla = re.findall(r"F\d{4} [\d:.]+\s+\d+ (\S+\] .*)", output)  # glog: F1207 15:42:23.4 5938 file:line] ...
    fatal = xla or re.findall(r"(Fatal Python error: .*)", output)
    return f"the test process {how}: {fatal[-1][:300]}" if fatal else f"the test process {how}"


def _listed(path: pathlib.Path) -> set[str]:
    if not path.exists():
        return set()
    return {line.split("#")[0].strip() for line in path.read_text().splitlines() if line.split("#")[0].strip()}


def _expected_failures(path: pathlib.Path) -> dict[str, str]:
    """test id -> reason, from lines `test id  # reason`."""
    if not path.exists():
        return {}
    found = {}
    for line in path.read_text().splitlines():
        test, _, reason = line.partition("#")
        if test.strip():
            found[test.strip()] = reason.strip()
    return found


def _targets(text: str) -> dict[str, float]:
    """ "resnet=25,mingpt=20" -> {"resnet": 25.0, "mingpt": 20.0}."""
    pairs = (item.split("=", 1) for item in text.split(",") if item.strip())
    return {name.strip(): float(seconds) for name, seconds in pairs}


def _counter(output: str, name: str) -> int | None:
    """A counter's value in torch_tpu.metrics.report()'s text (the examples print it), or None."""
    found = re.findall(rf"^\s*{name}\s+(\d+)\s*$", output, re.MULTILINE)
    return int(found[-1]) if found else None


def _last_json(output: str) -> dict | None:
    for line in reversed(output.strip().splitlines()):
        if line.startswith("{"):
            try:
                return json.loads(line)
            except json.JSONDecodeError:
                return None
    return None


def _table_of(output: str) -> str:
    """The markdown table(s) and the lines around them that a benchmark printed."""
    keep = [
        line
        for line in output.splitlines()
        if line.startswith("|") or re.match(r"^(worst|jax|torch_tpu|GPT|ResNet|MFU|peak)", line)
    ]
    return "\n".join(keep)


def _text(value) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else (value or "")


def _commit(repo: pathlib.Path) -> str:
    try:
        return (
            subprocess.run(
                ["git", "rev-parse", "--short", "HEAD"], cwd=repo, capture_output=True, text=True
            ).stdout.strip()
            or "unknown"
        )
    except OSError:
        return "unknown"


def merge(paths: list[str], out: pathlib.Path) -> int:
    """One lane.json and lane.md from several runs (split over calls that each fit their time):
    every run's parts, the later run's where two have the same part; each part keeps its run's
    date and commit. Test parts are tallied against expected_failures.txt as it is now."""
    merged: dict = {"parts": {}, "runs": []}
    for path in paths:
        run = json.loads(pathlib.Path(path).read_text())
        runs = run.get("runs") or [{"date": run["date"], "commit": run["commit"], "parts": sorted(run["parts"])}]
        combined = {  # a resumed run's test part already holds the earlier outcomes it kept
            name: combine_tests(merged["parts"][name], part)
            for name, part in run["parts"].items()
            if "outcomes" in part and "outcomes" in merged["parts"].get(name, {}) and not part.get("resumed")
        }
        kept = set(combined) | {name for name, part in run["parts"].items() if part.get("resumed")}
        for earlier in merged["runs"]:  # a later run's part replaces an earlier one's; test parts combine
            earlier["parts"] = [p for p in earlier["parts"] if p not in run["parts"] or p in kept]
        merged["runs"] = [r for r in merged["runs"] if r["parts"]] + runs
        merged["parts"].update(run["parts"])
        merged["parts"].update(combined)
        merged["date"], merged["commit"] = run["date"], run["commit"]
    expected = _expected_failures(EXPECTED_FAILURES)  # as the file says now
    for name, part in merged["parts"].items():
        if "outcomes" in part and "exit_ok" in part:
            merged["parts"][name] = _tally(part, expected)
    out.mkdir(parents=True, exist_ok=True)
    (out / "lane.json").write_text(json.dumps(merged, indent=1, sort_keys=True))
    (out / "lane.md").write_text(markdown(merged))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repo", default=str(pathlib.Path(__file__).resolve().parents[2]))
    parser.add_argument("--parts", default=",".join(PARTS))
    parser.add_argument("--out", help="results folder (default: benchmarks/results/tpu)")
    parser.add_argument("--commit", help="the commit the wheel was built from (default: git's HEAD)")
    parser.add_argument("--tests", nargs="*", help="test files for the tests part")
    parser.add_argument("--test-seconds", type=float, default=1800, help="time budget of the tests part")
    parser.add_argument("--test-timeout", type=float, default=300, help="seconds one test may take (pytest-timeout)")
    parser.add_argument(
        "--resume", metavar="LANE_JSON", help="an earlier lane.json: its tests not run again, its outcomes kept"
    )
    parser.add_argument(
        "--cache-dir", help="TORCH_TPU_CACHE_DIR of every part (default: a fresh one); resumed runs can share one"
    )
    parser.add_argument("--retry-failed", action="store_true", help="with --resume: run its failed tests again")
    parser.add_argument("--platform", default="tpu", help="TORCH_TPU_PLATFORM for every part (cpu: try the lane)")
    parser.add_argument("--training-args", default="", help="arguments for benchmarks/tpu_training.py")
    parser.add_argument(
        "--cold-start", default="resnet=25,mingpt=20", help="cold_start's examples and cold targets in seconds"
    )
    parser.add_argument(
        "--merge", nargs="+", metavar="LANE_JSON", help="only combine earlier runs' lane.json (later parts win)"
    )
    args = parser.parse_args(argv)
    if args.merge:
        return merge(args.merge, pathlib.Path(args.out or "."))
    lane = Lane(args)
    if args.resume:
        lane.resumed = json.loads(pathlib.Path(args.resume).read_text())["parts"]
    parts = [p for p in args.parts.split(",") if p]
    for name in parts:
        if name not in PARTS:
            parser.error(f"unknown part {name!r}; parts: {', '.join(PARTS)}")
    for name in parts:
        start = time.perf_counter()
        lane.results["parts"][name] = getattr(lane, f"part_{name}")()
        verdict = "pass" if lane.results["parts"][name].get("ok") else "FAIL"
        print(f"[lane] {name}: {verdict} ({time.perf_counter() - start:.0f} s)", flush=True)
        lane.write()
    print((lane.out / "lane.md").read_text())
    return 0 if all(p.get("ok") for p in lane.results["parts"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
