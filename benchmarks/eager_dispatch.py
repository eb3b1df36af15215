"""Eager per-op overhead of torch_tpu against bare jax.jit, torchax and torch_xla, interleaved.

python benchmarks/eager_dispatch.py [--rounds 7] [--calls 2000] [--json OUT]
    [--torchax-src DIR] [--torch-xla-python PYTHON] [--cases add4,mm256,...] [--baseline TREE]

Each backend runs in its own worker process (torchax and torch_xla rename or own PrivateUse1 and
torch_xla needs its own torch). The driver sends every worker the same case in turn, round after
round, in a shuffled order, so that load on the machine hits all backends alike. A case is timed
as `calls` back-to-back calls followed by one wait for the last result; the table shows the median
over the rounds in µs per call and the ratio to bare jax.jit (for the ops) or to torch_tpu (for the
steps). torch_tpu's op ratios are to bare jax.jit run in torch_tpu's own worker process (the row
"jax.jit (torch_tpu's process)", interleaved with it like another backend): two processes running
the same thing differ by up to ~1.4x from each other on a loaded 2-core machine, more than the
overhead measured. The other rows' ratios are to the separate jax.jit worker.

Cases:
- add4:   a + b on 4-element float32 tensors
- mm256:  a @ b on 256x256 float32
- linear_relu_step: forward and backward of relu(Linear(256, 256)(x)).sum(), x of 64x256
- mingpt_step (torch_tpu only, not run by default): one eager training step of examples/mingpt
  (forward, backward, AdamW), `calls // 400` steps per sample

`--baseline TREE` adds a torch_tpu worker importing torch_tpu from another checkout (with its
extension built), e.g. the commit before a dispatch change: `--cases mingpt_step --baseline
/work/wt/base` compares the two at equal load.

Peers: torchax runs from its source tree (`--torchax-src`, or $TORCHAX_SRC), op by op in its eager
mode (the step through torch.func.grad, its way into autograd). torch_xla runs from another
interpreter (`--torch-xla-python`, or $TORCH_XLA_PYTHON; a venv with torch==2.9.0 torch-xla==2.9.0)
with PJRT_DEVICE=CPU, in its default lazy mode with one `mark_step()` per call and, where it has
one, in its eager mode. A peer that is not given or does not start is reported as such.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time

CASES = ("add4", "mm256", "linear_relu_step", "mingpt_step")
DEFAULT_CASES = ("add4", "mm256", "linear_relu_step")
OP_CASES = ("add4", "mm256")  # compared with jax.jit; the steps with torch_tpu
STEP_CALLS_DIVISOR = {"mingpt_step": 400}  # a training step costs hundreds of ops
SAME_PROCESS = "@same_process"  # a torch_tpu worker's case suffix: the op as bare jax.jit in its process
JAX_IN_TPU = "jax.jit (torch_tpu's process)"
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# ---- workers: one process per backend, reading "CASE CALLS" lines and answering JSON -------------


def _torch_inputs(torch, device):
    g = torch.Generator().manual_seed(0)
    return {
        "add4": [torch.randn(4, generator=g).to(device) for _ in range(2)],
        "mm256": [torch.randn(256, 256, generator=g).to(device) for _ in range(2)],
        "linear_relu_step": [torch.randn(64, 256, generator=g).to(device)],
    }


def _torch_cases(torch, device, wait, mark_step=None, functional_grad=False):
    inputs = _torch_inputs(torch, device)
    linear = torch.nn.Linear(256, 256).to(device)
    params = dict(linear.named_parameters())

    def functional_loss(p, x):
        return torch.relu(torch.func.functional_call(linear, p, (x,))).sum()

    def add4():
        a, b = inputs["add4"]
        return a + b

    def mm256():
        a, b = inputs["mm256"]
        return a @ b

    def linear_relu_step():
        (x,) = inputs["linear_relu_step"]
        if functional_grad:  # torchax tensors take part in autograd through torch.func only
            return torch.func.grad(functional_loss)(params, x)["weight"]
        loss = torch.relu(linear(x)).sum()
        loss.backward()
        return linear.weight.grad

    def timed(fn):
        def run(calls):
            out = None
            start = time.perf_counter()
            for _ in range(calls):
                out = fn()
                if mark_step is not None:
                    mark_step()
            wait(out)
            return (time.perf_counter() - start) / calls

        return run

    return {name: timed(fn) for name, fn in (("add4", add4), ("mm256", mm256), ("linear_relu_step", linear_relu_step))}


def _worker_torch_tpu():
    import torch

    import torch_tpu

    def wait(out):
        torch_tpu.sync()

    cases = {**_torch_cases(torch, "tpu", wait), "mingpt_step": _mingpt_step(torch, "tpu", wait)}
    # bare jax.jit again, in this process: the same client, allocator and machine state
    cases.update({c + SAME_PROCESS: run for c, run in _jax_cases().items() if c in OP_CASES})
    return cases


def _mingpt_step(torch, device, wait):
    """examples/mingpt's eager training step, through its harness's model, loss and optimizer."""
    import importlib.util

    sys.path.insert(0, os.path.join(REPO, "examples"))
    spec = importlib.util.spec_from_file_location("mingpt_train", os.path.join(REPO, "examples", "mingpt", "train.py"))
    mingpt = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mingpt)
    example = mingpt.EXAMPLE
    torch.manual_seed(0)
    model = example.make_model().to(device)
    model.train()
    optimizer = example.make_optimizer(model)
    batch = tuple(x.to(device) for x in next(iter(example.batches(1, 0))))

    def run(calls):
        start = time.perf_counter()
        for _ in range(calls):
            loss = example.loss(model, batch)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
        wait(loss)
        return (time.perf_counter() - start) / calls

    return run


def _worker_jax():
    return _jax_cases()


def _jax_cases():
    import jax
    import jax.numpy as jnp
    import numpy as np

    rng = np.random.default_rng(0)
    a4, b4 = (jnp.asarray(rng.standard_normal(4, dtype=np.float32)) for _ in range(2))
    a, b = (jnp.asarray(rng.standard_normal((256, 256), dtype=np.float32)) for _ in range(2))
    x = jnp.asarray(rng.standard_normal((64, 256), dtype=np.float32))
    w = jnp.asarray(rng.standard_normal((256, 256), dtype=np.float32))
    bias = jnp.zeros(256, jnp.float32)
    add = jax.jit(lambda p, q: p + q)
    mm = jax.jit(lambda p, q: p @ q)
    grad = jax.jit(jax.grad(lambda w, b, x: jax.nn.relu(x @ w.T + b).sum(), argnums=(0, 1)))

    def timed(fn):
        def run(calls):
            out = None
            start = time.perf_counter()
            for _ in range(calls):
                out = fn()
            jax.block_until_ready(out)
            return (time.perf_counter() - start) / calls

        return run

    return {
        "add4": timed(lambda: add(a4, b4)),
        "mm256": timed(lambda: mm(a, b)),
        "linear_relu_step": timed(lambda: grad(w, bias, x)),
    }


def _worker_torchax():
    import jax
    import torch
    import torchax

    env = torchax.default_env()
    env.__enter__()

    def wait(out):
        jax.block_until_ready(out._elem if hasattr(out, "_elem") else out)

    return _torch_cases(torch, "jax", wait, functional_grad=True)


def _worker_torch_xla(eager: bool):
    import torch
    import torch_xla
    import torch_xla.core.xla_model as xm

    if eager:
        if not hasattr(torch_xla, "experimental") or not hasattr(torch_xla.experimental, "eager_mode"):
            raise RuntimeError("this torch_xla has no eager mode")
        torch_xla.experimental.eager_mode(True)
    device = xm.xla_device()

    def wait(out):
        xm.wait_device_ops()

    return _torch_cases(torch, device, wait, mark_step=None if eager else xm.mark_step)


WORKERS = {
    "torch_tpu": _worker_torch_tpu,
    "jax.jit": _worker_jax,
    "torchax": _worker_torchax,
    "torch_xla": lambda: _worker_torch_xla(eager=False),
    "torch_xla eager": lambda: _worker_torch_xla(eager=True),
}


def _worker_main(name: str) -> None:
    try:
        cases = WORKERS[name]()
    except Exception as e:  # reported in the table
        print(json.dumps({"error": f"{type(e).__name__}: {e}"}), flush=True)
        return
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        case, calls = line.split()
        if case not in cases:
            print(json.dumps({"us": None}), flush=True)  # not a case of this backend
            continue
        try:
            cpu = time.process_time()  # all of this process's threads: XLA's too
            seconds = cases[case](int(calls))
            cpu_us = 1e6 * (time.process_time() - cpu) / int(calls)
            print(json.dumps({"us": 1e6 * seconds, "cpu_us": cpu_us}), flush=True)
        except Exception as e:
            print(json.dumps({"error": f"{type(e).__name__}: {e}"}), flush=True)


# ---- the driver ---------------------------------------------------------------------------------


class Worker:
    def __init__(self, name: str, python: str, env: dict, kind: str | None = None):
        self.name = name  # as the table shows it; `kind` (default: the name) picks the worker
        self.error: str | None = None
        self.cpu_us: float | None = None  # the last run's CPU time per call
        self.proc = subprocess.Popen(
            [python, os.path.abspath(__file__), "--worker", kind or name],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env=env,
            cwd="/",  # never the repo root: the source tree would shadow the installed wheel
        )
        reply = self._read()
        if "error" in reply:
            self.error = reply["error"]

    def _read(self) -> dict:
        line = self.proc.stdout.readline()
        return json.loads(line) if line else {"error": "worker exited"}

    def run(self, case: str, calls: int) -> float | None:
        if self.error:
            return None
        self.proc.stdin.write(f"{case} {calls}\n")
        self.proc.stdin.flush()
        reply = self._read()
        if "error" in reply:
            self.error = reply["error"]
            return None
        self.cpu_us = reply.get("cpu_us")
        return reply["us"]  # None: not a case of this backend

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()


def _start_workers(args) -> list[Worker]:
    base = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH",)}
    here = {**base, "PYTHONPATH": os.environ.get("PYTHONPATH", "")}
    specs = [("torch_tpu", sys.executable, here), ("jax.jit", sys.executable, here)]
    if args.baseline:
        baseline_env = {**base, "PYTHONPATH": args.baseline}
        specs.append((f"torch_tpu ({args.baseline})", sys.executable, baseline_env, "torch_tpu"))
    torchax_src = args.torchax_src or os.environ.get("TORCHAX_SRC")
    if torchax_src:
        specs.append(("torchax", sys.executable, {**base, "PYTHONPATH": torchax_src}))
    xla_python = args.torch_xla_python or os.environ.get("TORCH_XLA_PYTHON")
    if xla_python:
        xla_env = {**base, "PJRT_DEVICE": "CPU"}
        specs += [("torch_xla", xla_python, xla_env), ("torch_xla eager", xla_python, xla_env)]
    workers = [Worker(*spec) for spec in specs]
    workers.insert(1, SameProcessJax(workers[0]))
    if not torchax_src:
        workers.append(_absent("torchax", "not given (--torchax-src or $TORCHAX_SRC)"))
    if not xla_python:
        workers.append(_absent("torch_xla", "not given (--torch-xla-python or $TORCH_XLA_PYTHON)"))
    return workers


class SameProcessJax:
    """The op cases as bare jax.jit inside the torch_tpu worker's process: torch_tpu's ratio is
    taken to these, which share its process (separate processes alike differ by up to ~1.4x
    from one another on this loaded machine; the separate jax.jit worker is shown too)."""

    def __init__(self, host: Worker):
        self.name = JAX_IN_TPU
        self.host = host

    @property
    def error(self) -> str | None:
        return self.host.error

    @property
    def cpu_us(self) -> float | None:
        return self.host.cpu_us

    def run(self, case: str, calls: int) -> float | None:
        return self.host.run(case + SAME_PROCESS, calls) if case in OP_CASES else None

    def close(self) -> None:
        pass


def _absent(name: str, why: str) -> Worker:
    worker = Worker.__new__(Worker)
    worker.name, worker.error, worker.proc = name, why, None
    worker.close = lambda: None
    return worker


def _calls(case: str, calls: int) -> int:
    return max(calls // STEP_CALLS_DIVISOR.get(case, 1), 1)


def measure(workers: list[Worker], rounds: int, calls: int, cases=DEFAULT_CASES) -> dict:
    samples: dict = {w.name: {c: [] for c in cases} for w in workers}
    cpu: dict = {w.name: {c: [] for c in cases} for w in workers}
    for case in cases:
        for w in workers:  # warm-up: compiles and caches
            w.run(case, max(_calls(case, calls) // 10, 2))
    for _ in range(rounds):
        for case in cases:
            order = list(workers)
            random.shuffle(order)
            for w in order:
                us = w.run(case, _calls(case, calls))
                if us is not None:
                    samples[w.name][case].append(us)
                    if w.cpu_us is not None:
                        cpu[w.name][case].append(w.cpu_us)
    return {
        w.name: {
            "error": w.error,
            **{c: statistics.median(v) for c, v in samples[w.name].items() if v},
            "cpu_us": {c: statistics.median(v) for c, v in cpu[w.name].items() if v},
        }
        for w in workers
    }


_TITLES = {"add4": "add4", "mm256": "mm256", "linear_relu_step": "Linear+ReLU step", "mingpt_step": "minGPT step"}


def table(results: dict, cases=DEFAULT_CASES) -> str:
    """µs per call of each case, then each case's ratio: ops to jax.jit (torch_tpu's to jax.jit in
    its own process), steps to torch_tpu."""
    refs = {c: ("jax.jit" if c in OP_CASES else "torch_tpu") for c in cases}
    head = [f"{_TITLES[c]} µs" for c in cases] + [f"{_TITLES[c]} / {refs[c]}" for c in cases]
    lines = ["| backend | " + " | ".join(head) + " |", "|---" * (len(head) + 1) + "|"]
    for name, r in results.items():
        if not any(c in r for c in cases):
            if r.get("error"):
                lines.append(f"| {name} | {r['error']} |" + " |" * (len(head) - 1))
            continue  # none of these cases is one of this backend's
        cells = [f"{r[c]:.1f}" if c in r else "-" for c in cases]
        for c in cases:
            ref = results.get(JAX_IN_TPU if name == "torch_tpu" and c in OP_CASES else refs[c], {})
            cells.append(f"{r[c] / ref[c]:.2f}x" if c in r and c in ref else "-")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _cpu_ratios(results: dict, cases) -> str:
    """torch_tpu's CPU time per op over bare jax.jit's in the same process: preemption on a loaded
    machine inflates wall time, not CPU time."""
    tpu = results.get("torch_tpu", {}).get("cpu_us", {})
    jit = results.get(JAX_IN_TPU, {}).get("cpu_us", {})
    parts = [f"{c} {tpu[c] / jit[c]:.2f}x ({tpu[c]:.1f} / {jit[c]:.1f} µs)" for c in cases if c in tpu and c in jit]
    return ", ".join(parts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--torchax-src")
    parser.add_argument("--torch-xla-python")
    parser.add_argument("--json")
    parser.add_argument("--cases", default=",".join(DEFAULT_CASES), help=f"some of {', '.join(CASES)}")
    parser.add_argument("--baseline", help="another checkout's root, run as a second torch_tpu worker")
    args = parser.parse_args(argv)
    if args.worker:
        _worker_main(args.worker)
        return 0
    cases = tuple(c for c in args.cases.split(",") if c)
    unknown = set(cases) - set(CASES)
    if unknown:
        parser.error(f"unknown cases {', '.join(sorted(unknown))}")
    workers = _start_workers(args)
    try:
        results = measure(workers, args.rounds, args.calls, cases)
    finally:
        for w in workers:
            w.close()
    counts = ", ".join(f"{_TITLES[c]}: {_calls(c, args.calls)}" for c in cases if c in STEP_CALLS_DIVISOR)
    print(f"median of {args.rounds} interleaved rounds of {args.calls} calls each" + (f" ({counts})" if counts else ""))
    print(table(results, cases))
    cpu_ratios = _cpu_ratios(results, cases)
    if cpu_ratios:
        print(f"CPU time (process_time, all threads), torch_tpu / jax.jit in its process: {cpu_ratios}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rounds": args.rounds, "calls": args.calls, "cases": cases, "results": results}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
