"""PyTorch's own device-generic test files run on tpu, each test with a timeout, failures rechecked on CPU.

    python -m torch_tpu.testing.pytorch_suite --tests DIR [--files test_view_ops.py ...]
        [--timeout S] [--sample N] [-k GLOB] [--exclude GLOB] [--report out.json] [--expected FILE]

DIR holds PyTorch's test/*.py files (of the installed torch's era); torch.testing._internal comes
from the installed torch. Each file is imported in a worker process with
PYTORCH_TESTING_DEVICE_ONLY_FOR=tpu, so `instantiate_device_type_tests` makes only the
PrivateUse1TestBase classes (TestFooTPU.test_bar_tpu_float32). Only those are collected.

The parent runs the tests of one file in one worker, one at a time, and reads a line per event
from it. A test past --timeout is stopped in the worker by an alarm (between Python calls) and
recorded as "timeout". One that does not stop within --kill-grace more seconds, or a worker that
dies (a crash) or grows past --max-rss-mb, ends that worker's whole process group (each worker is
its own session); a fresh worker takes the remaining tests. Every tpu failure is run again on CPU
(TestFooCPU.test_bar_cpu_float32); one that fails there too is "cpu_also_fails" and left out of
the pass rate, as PyTorch's test is then not a statement about tpu.

Outcomes: pass (expected failures PyTorch declares count as pass), fail, error, skip, timeout,
crash, not_run (the --budget ran out). Pass rate = pass / (collected - skip - cpu_also_fails).

The expected-failures file has one entry a line, `test id glob | kind | reason`; kinds are listed
in KINDS, and "silent-wrong-result" marks a value tpu computes wrongly without raising. The run
lists failures no entry covers ("new") and entries whose tests all passed ("fixed").
"""

from __future__ import annotations

import argparse
import dataclasses
import fnmatch
import importlib.util
import json
import os
import re
import select
import signal
import subprocess
import sys
import tempfile
import time
import traceback
import unittest
import zlib
from collections.abc import Iterable, Sequence
from pathlib import Path

FAILED = ("fail", "error", "timeout", "crash")
KINDS = (
    "silent-wrong-result",  # a value differs from CPU's, nothing raised
    "missing-check",  # bad input that CPU rejects is accepted
    "wrong-exception",  # raises, but not CPU's exception class or message
    "unsupported",  # an op, dtype or feature tpu lacks (raises)
    "metadata",  # strides, memory format, storage or view relationships differ
    "rounding",  # values agree with CPU's to float rounding; the test asks for bit equality
    "statistics",  # a random sample's statistic misses the test's tolerance (tpu's stream is not CPU's)
    "timeout",  # too slow for the per-test timeout
    "crash",  # the process died
)
DEFAULT_EXPECTED = Path(__file__).resolve().parents[2] / "tests" / "pytorch_suite" / "expected_failures.txt"


# ---- worker side: runs inside the subprocess


class _SoftTimeout(BaseException):
    """Raised in a test by the worker's alarm (a BaseException, so tests' `except Exception` let it by)."""


class _Result(unittest.TestResult):
    """Records one outcome per test (the worst one when subtests fail)."""

    def __init__(self) -> None:
        super().__init__()
        self.outcome = "pass"
        self.message = ""

    def _set(self, outcome: str, err: object | None = None, reason: str = "") -> None:
        if self.outcome in ("fail", "error") and outcome not in ("fail", "error"):
            return
        self.outcome = outcome
        if err is not None:
            exc_type, exc, _ = err  # type: ignore[misc]
            text = f"{exc_type.__name__}: {exc}"
            self.message = text.strip().splitlines()[0][:400] if text.strip() else exc_type.__name__
            self.traceback = "".join(traceback.format_exception(*err))[-4000:]  # type: ignore[misc]
        else:
            self.message = reason[:400]

    def addFailure(self, test, err):
        self._set("fail", err)

    def addError(self, test, err):
        self._set("error", err)

    def addSkip(self, test, reason):
        self._set("skip", reason=str(reason))

    def addExpectedFailure(self, test, err):
        self._set("pass", reason="expected failure (declared by PyTorch)")

    def addUnexpectedSuccess(self, test):
        self._set("fail", reason="unexpected success of a test PyTorch marks expectedFailure")

    def addSubTest(self, test, subtest, err):
        if err is not None:
            failure = issubclass(err[0], test.failureException)
            self._set("fail" if failure else "error", err)


def _import_file(path: Path):
    sys.path.insert(0, str(path.parent))
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module
    spec.loader.exec_module(module)
    return module


def _device_classes(module, device: str) -> list[type]:
    from torch.testing._internal.common_device_type import CPUTestBase, PrivateUse1TestBase

    base = PrivateUse1TestBase if device != "cpu" else CPUTestBase
    return [
        obj
        for name, obj in sorted(vars(module).items())
        if isinstance(obj, type) and issubclass(obj, base) and issubclass(obj, unittest.TestCase)
    ]


def _worker(args: argparse.Namespace) -> int:
    # The protocol goes to the original stdout; anything the tests print goes to stderr.
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    os.environ["PYTORCH_TESTING_DEVICE_ONLY_FOR"] = args.device
    import torch  # noqa: F401

    import torch_tpu  # noqa: F401  (registers the tpu backend before common_device_type is read)

    def emit(**fields: object) -> None:
        proto.write(json.dumps(fields) + "\n")

    try:
        module = _import_file(Path(args.file))
    except BaseException as exc:
        emit(event="import_error", message=f"{type(exc).__name__}: {exc}"[:2000])
        return 0
    classes = {cls.__name__: cls for cls in _device_classes(module, args.device)}
    if args.worker == "collect":
        names = unittest.defaultTestLoader.getTestCaseNames
        emit(event="collected", ids=[f"{module.__name__}.{c}.{m}" for c, cls in classes.items() for m in names(cls)])
        return 0

    def on_alarm(signum, frame):
        raise _SoftTimeout(f"ran past the {args.timeout:g} s timeout")

    signal.signal(signal.SIGALRM, on_alarm)
    emit(event="ready")
    parent = os.getppid()
    for test_id in Path(args.ids).read_text().split():
        if os.getppid() != parent:
            return 1  # the parent is gone: nobody reads the results
        _, cls_name, method = test_id.split(".")
        emit(event="start", id=test_id)
        t0 = time.monotonic()
        result = _Result()
        cls = classes.get(cls_name)
        if cls is None or not hasattr(cls, method):
            result._set("error", reason=f"no test {cls_name}.{method} on {args.device}")
        else:
            # A soft timeout between Python calls; the parent kills the worker if this one misses.
            signal.setitimer(signal.ITIMER_REAL, args.timeout)
            timed_out = False
            try:
                unittest.TestSuite([cls(method)]).run(result)
            except _SoftTimeout:
                timed_out = True
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
            if timed_out or result.message.startswith(_SoftTimeout.__name__):
                result.outcome, result.message = "timeout", f"ran past the {args.timeout:g} s timeout"
        emit(
            event="result",
            id=test_id,
            outcome=result.outcome,
            message=result.message,
            traceback=getattr(result, "traceback", ""),
            seconds=round(time.monotonic() - t0, 3),
        )
    return 0


# ---- parent side


@dataclasses.dataclass
class TestOutcome:
    id: str
    outcome: str
    message: str = ""
    seconds: float = 0.0
    traceback: str = ""
    cpu_outcome: str | None = None
    cpu_message: str = ""
    expected: str | None = None  # "kind | reason" of the expected-failures entry that covers it


def to_cpu_id(test_id: str) -> str:
    """TestFooTPU.test_bar_tpu_float32 -> TestFooCPU.test_bar_cpu_float32."""
    module, cls, method = test_id.split(".")
    cls = re.sub(r"(TPU|PRIVATEUSE1)$", "CPU", cls)
    matches = list(re.finditer(r"_tpu(?=$|_)", method))
    if matches:
        m = matches[-1]
        method = method[: m.start()] + "_cpu" + method[m.end() :]
    return f"{module}.{cls}.{method}"


def _rss_mb(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def _log_tail(log: Path, n: int = 3) -> str:
    """The last lines the worker wrote to stderr, for a crash's message."""
    try:
        lines = log.read_text(errors="replace").strip().splitlines()[-n:]
    except OSError:
        return ""
    return (": " + " | ".join(line.strip()[:200] for line in lines)) if lines else ""


class _Worker:
    """One worker process in its own session, so the whole tree can be ended at once."""

    def __init__(
        self, file: Path, device: str, mode: str, ids: Sequence[str], log: Path, workdir: Path, timeout: float = 60.0
    ):
        cmd = [sys.executable, "-m", "torch_tpu.testing.pytorch_suite", "--_worker", mode, "--file", str(file)]
        cmd += ["--device", device, "--timeout", str(timeout)]
        if ids:
            ids_file = workdir / f"ids_{os.getpid()}_{time.monotonic_ns()}.txt"
            ids_file.write_text("\n".join(ids))
            cmd += ["--ids", str(ids_file)]
        env = dict(os.environ, PYTORCH_TESTING_DEVICE_ONLY_FOR=device)
        pkg_root = str(Path(__file__).resolve().parents[2])
        env["PYTHONPATH"] = os.pathsep.join(p for p in (pkg_root, env.get("PYTHONPATH", "")) if p)
        self.log = log
        self._log = open(log, "ab")
        self.proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=self._log, cwd=workdir, env=env, start_new_session=True
        )
        self._buf = b""

    def read_event(self, deadline: float, max_rss_mb: float) -> dict | str:
        """The next event, or "timeout", "rss" or "eof"."""
        while True:
            if b"\n" in self._buf:
                line, self._buf = self._buf.split(b"\n", 1)
                try:
                    return json.loads(line)
                except ValueError:
                    continue
            left = deadline - time.monotonic()
            if left <= 0:
                return "timeout"
            if max_rss_mb and _rss_mb(self.proc.pid) > max_rss_mb:
                return "rss"
            ready, _, _ = select.select([self.proc.stdout], [], [], min(left, 1.0))
            if ready:
                chunk = os.read(self.proc.stdout.fileno(), 65536)
                if not chunk:
                    return "eof"
                self._buf += chunk

    def exit_status(self) -> str:
        try:
            return f"exit status {self.proc.wait(timeout=10)}"
        except subprocess.TimeoutExpired:
            return "closed its output, still running"

    def stop(self) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.wait()
        self.proc.stdout.close()
        self._log.close()


def collect(file: Path, device: str, workdir: Path, startup_timeout: float) -> list[str]:
    worker = _Worker(file, device, "collect", (), workdir / "collect.log", workdir)
    try:
        event = worker.read_event(time.monotonic() + startup_timeout, 0)
    finally:
        worker.stop()
    if not isinstance(event, dict) or event.get("event") != "collected":
        detail = event.get("message") if isinstance(event, dict) else event
        raise RuntimeError(f"collecting {file.name} on {device} failed: {detail} (log: {workdir / 'collect.log'})")
    return event["ids"]


def run_ids(
    file: Path,
    device: str,
    ids: Sequence[str],
    *,
    timeout: float,
    startup_timeout: float,
    max_rss_mb: float,
    budget: float | None,
    kill_grace: float = 60.0,
    workdir: Path,
    progress: bool = False,
) -> dict[str, TestOutcome]:
    """Runs the tests, restarting the worker after each timeout or crash."""
    results: dict[str, TestOutcome] = {}
    pending = list(ids)
    t_start = time.monotonic()
    while pending:
        if budget is not None and time.monotonic() - t_start > budget:
            for test_id in pending:
                results[test_id] = TestOutcome(test_id, "not_run", "the --budget ran out")
            break
        worker = _Worker(file, device, "run", pending, workdir / f"run_{device}.log", workdir, timeout)
        current: str | None = None
        deadline = time.monotonic() + startup_timeout
        try:
            while True:
                event = worker.read_event(deadline, max_rss_mb)
                if isinstance(event, str):
                    if current is None:
                        left = [i for i in pending if i not in results]
                        if event == "eof" and not left:
                            break  # the worker ran all its tests and exited
                        # The worker died or hung before its next test started.
                        why = {"eof": "worker exited before the test started", "timeout": "worker startup timed out"}
                        why = why.get(event, event) + _log_tail(worker.log)
                        results[left[0]] = TestOutcome(left[0], "crash", why)
                    else:
                        if event == "timeout":
                            outcome, message = "timeout", f"ran past the {timeout:g} s timeout and was killed"
                        elif event == "rss":
                            outcome, message = "crash", f"worker grew past {max_rss_mb:g} MB"
                        else:
                            outcome, message = "crash", f"worker died ({worker.exit_status()})" + _log_tail(worker.log)
                        results[current] = TestOutcome(current, outcome, message, timeout)
                        if progress:
                            print(f"  {outcome:7s} {timeout:7.2f}s {current}: {message[:100]}", flush=True)
                    break
                kind = event.get("event")
                if kind == "import_error":
                    for test_id in pending:
                        results[test_id] = TestOutcome(test_id, "error", "import: " + event["message"])
                    break
                if kind == "ready":
                    deadline = time.monotonic() + startup_timeout
                elif kind == "start":
                    current = event["id"]
                    deadline = time.monotonic() + timeout + kill_grace
                elif kind == "result":
                    fields = {k: event[k] for k in ("outcome", "message", "seconds", "traceback")}
                    results[event["id"]] = TestOutcome(event["id"], **fields)
                    if progress:
                        print(f"  {event['outcome']:7s} {event['seconds']:7.2f}s {event['id']}", flush=True)
                    current = None
                    deadline = time.monotonic() + startup_timeout
                    if budget is not None and time.monotonic() - t_start > budget:
                        break
        finally:
            worker.stop()
        pending = [i for i in pending if i not in results]
    return results


# ---- expected failures


@dataclasses.dataclass
class Expected:
    pattern: str
    kind: str
    reason: str
    line: int


def load_expected(path: Path | None) -> list[Expected]:
    if path is None or not path.exists():
        return []
    entries = []
    for n, raw in enumerate(path.read_text().splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        parts = [p.strip() for p in line.split("|", 2)]
        if len(parts) != 3 or not all(parts):
            raise ValueError(f"{path}:{n}: expected `test id glob | kind | reason`, got {raw!r}")
        if parts[1] not in KINDS:
            raise ValueError(f"{path}:{n}: kind {parts[1]!r} is not one of {', '.join(KINDS)}")
        entries.append(Expected(parts[0], parts[1], parts[2], n))
    return entries


def match_expected(test_id: str, entries: Iterable[Expected]) -> Expected | None:
    for entry in entries:
        if fnmatch.fnmatchcase(test_id, entry.pattern):
            return entry
    return None


# ---- summary


def summarize(outcomes: Iterable[TestOutcome]) -> dict[str, float]:
    counts = {k: 0 for k in ("collected", "pass", "fail", "error", "timeout", "crash", "skip", "not_run")}
    counts["cpu_also_fails"] = 0
    for o in outcomes:
        counts["collected"] += 1
        if o.outcome in FAILED and o.cpu_outcome in FAILED:
            counts["cpu_also_fails"] += 1
        else:
            counts[o.outcome] += 1
    counted = counts["collected"] - counts["skip"] - counts["cpu_also_fails"] - counts["not_run"]
    counts["counted"] = counted
    counts["pass_rate"] = round(100.0 * counts["pass"] / counted, 2) if counted else 0.0
    return counts


def sample_ids(ids: Sequence[str], n: int | None) -> list[str]:
    """A deterministic sample of n ids (by a hash of the id), kept in file order."""
    if n is None or n >= len(ids):
        return list(ids)
    chosen = set(sorted(ids, key=lambda i: zlib.crc32(i.encode()))[:n])
    return [i for i in ids if i in chosen]


def _matches(test_id: str, patterns: Sequence[str]) -> bool:
    return any(fnmatch.fnmatchcase(test_id, pat) or pat in test_id for pat in patterns)


def run_file(file: Path, args: argparse.Namespace, workdir: Path) -> list[TestOutcome]:
    ids = collect(file, "tpu", workdir, args.startup_timeout)
    if args.k:
        ids = [i for i in ids if _matches(i, args.k)]
    if args.exclude:
        ids = [i for i in ids if not _matches(i, args.exclude)]
    total = len(ids)
    ids = sample_ids(ids, args.sample)
    print(f"{file.name}: {len(ids)} of {total} tpu tests", flush=True)
    common = dict(
        timeout=args.timeout,
        startup_timeout=args.startup_timeout,
        max_rss_mb=args.max_rss_mb,
        kill_grace=args.kill_grace,
        workdir=workdir,
        progress=args.verbose,
    )
    tpu = run_ids(file, "tpu", ids, budget=args.budget, **common)
    failed = [i for i in ids if tpu[i].outcome in FAILED]
    if failed and not args.no_cpu_check:
        cpu_ids = {i: to_cpu_id(i) for i in failed}
        cpu = run_ids(file, "cpu", list(cpu_ids.values()), budget=None, **common)
        for i in failed:
            tpu[i].cpu_outcome = cpu[cpu_ids[i]].outcome
            tpu[i].cpu_message = cpu[cpu_ids[i]].message
    return [tpu[i] for i in ids]


def _print_summary(per_file: dict[str, dict], new: list[TestOutcome], fixed: list[Expected]) -> None:
    cols = ("counted", "pass", "fail", "error", "timeout", "crash", "skip", "cpu_also_fails", "not_run")
    print("\nfile                          " + " ".join(f"{c[:8]:>8s}" for c in cols) + "  pass%")
    for name, s in per_file.items():
        print(f"{name:30s}" + " ".join(f"{s[c]:8d}" for c in cols) + f"  {s['pass_rate']:.1f}")
    if new:
        print(f"\n{len(new)} failures no expected-failures entry covers:")
        for o in new:
            print(f"  {o.outcome:7s} {o.id}: {o.message[:160]}")
    if fixed:
        print(f"\n{len(fixed)} expected-failures entries whose tests all passed (remove them):")
        for e in fixed:
            print(f"  line {e.line}: {e.pattern}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m torch_tpu.testing.pytorch_suite", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--tests", type=Path, help="folder with PyTorch's test/*.py files")
    parser.add_argument("--files", nargs="*", help="file names in --tests (default: every test_*.py)")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds per test (default 60)")
    parser.add_argument("--kill-grace", type=float, default=60.0, help="seconds past --timeout before a kill")
    parser.add_argument("--startup-timeout", type=float, default=300.0, help="seconds for a worker to import")
    parser.add_argument("--max-rss-mb", type=float, default=8192.0, help="end a worker past this RSS")
    parser.add_argument("--budget", type=float, help="seconds per file; tests left over are not_run")
    parser.add_argument("--sample", type=int, help="run a deterministic sample of N tests per file")
    parser.add_argument("-k", action="append", help="only test ids matching this glob or substring")
    parser.add_argument("--exclude", action="append", help="leave out test ids matching this glob or substring")
    parser.add_argument("--report", type=Path, help="write the results as JSON here")
    parser.add_argument("--expected", type=Path, default=DEFAULT_EXPECTED, help="expected-failures file")
    parser.add_argument("--no-cpu-check", action="store_true", help="do not rerun failures on CPU")
    parser.add_argument("--check", action="store_true", help="exit 1 on a failure no expected entry covers")
    parser.add_argument("-v", "--verbose", action="store_true", help="print each test's outcome")
    parser.add_argument("--_worker", dest="worker", choices=("collect", "run"), help=argparse.SUPPRESS)
    parser.add_argument("--file", help=argparse.SUPPRESS)
    parser.add_argument("--device", default="tpu", help=argparse.SUPPRESS)
    parser.add_argument("--ids", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        return _worker(args)
    if args.tests is None:
        parser.error("--tests DIR is required")

    expected = load_expected(args.expected)
    names = args.files or sorted(p.name for p in args.tests.glob("test_*.py"))
    all_outcomes: list[TestOutcome] = []
    per_file: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="pytorch_suite_") as tmp:
        for name in names:
            workdir = Path(tmp) / Path(name).stem
            workdir.mkdir()
            outcomes = run_file(args.tests / name, args, workdir)
            per_file[name] = summarize(outcomes)
            all_outcomes += outcomes
    per_file["total"] = summarize(all_outcomes)

    new = []
    for o in all_outcomes:
        entry = match_expected(o.id, expected)
        if entry is not None:
            o.expected = f"{entry.kind} | {entry.reason}"
        if o.outcome in FAILED and o.cpu_outcome not in FAILED and entry is None:
            new.append(o)
    ran = [o for o in all_outcomes if o.outcome != "not_run"]
    fixed = [
        e
        for e in expected
        if (hits := [o for o in ran if fnmatch.fnmatchcase(o.id, e.pattern)])
        and all(o.outcome in ("pass", "skip") for o in hits)
    ]
    _print_summary(per_file, new, fixed)
    if args.report:
        report = {
            "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
            "timeout_s": args.timeout,
            "sample": args.sample,
            "summary": per_file,
            "new_failures": [o.id for o in new],
            "fixed_entries": [e.pattern for e in fixed],
            "tests": [dataclasses.asdict(o) for o in all_outcomes],
        }
        args.report.write_text(json.dumps(report, indent=1))
    return 1 if args.check and new else 0


if __name__ == "__main__":
    sys.exit(main())
