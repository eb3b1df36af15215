"""A warm second process's time to the first minGPT training step, against a process that only
imports torch_tpu and builds the model (the floor a persistent cache can reach).

python benchmarks/warm_start.py [--rounds 3] [--json OUT]

Each row is a fresh process; the rows share one TORCH_TPU_CACHE_DIR that a first, cold process
fills (not timed). Rows alternate round after round, so machine load hits them alike, and the
medians are shown:
- import + build: `import torch_tpu`, build minGPT and its AdamW on tpu; no step.
- warm first step: the same, then one eager training step (forward, backward, optimizer) and its
  loss on the host.
Prints both times, their ratio (target: <= 1.5x) and the warm process's traces and XLA compiles
(target: 0 and 0).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

EXAMPLES = pathlib.Path(__file__).resolve().parents[1] / "examples"


def _child(step: bool) -> dict:
    start = time.perf_counter()
    sys.path[:0] = [str(EXAMPLES), str(EXAMPLES / "mingpt")]
    import torch
    import train as mingpt
    from common import harness

    import torch_tpu

    example = mingpt.EXAMPLE
    torch.manual_seed(0)
    model = example.make_model().to("tpu")
    model.train()
    optimizer = example.make_optimizer(model)
    result: dict = {"ready_s": time.perf_counter() - start}
    if step:
        batch = harness.to_device(next(iter(example.batches(1, 0))), "tpu")
        loss = example.loss(model, batch)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        result["loss"] = loss.item()
    result["total_s"] = time.perf_counter() - start
    counters = torch_tpu.metrics.counters()
    result["counters"] = {k: v for k, v in counters.items() if isinstance(v, int)}
    return result


def _run(step: bool, cache_dir: str, timeout: int) -> dict:
    env = dict(os.environ, TORCH_TPU_CACHE_DIR=cache_dir, TORCH_TPU_PLATFORM="cpu")
    env.pop("TORCH_TPU_DEBUG", None)
    cmd = [sys.executable, __file__, "--child", "step" if step else "build"]
    start = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr[-3000:])
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    result["process_s"] = time.perf_counter() - start
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--timeout", type=int, default=900)
    parser.add_argument("--json")
    parser.add_argument("--child", choices=("build", "step"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(_child(args.child == "step")))
        return 0
    with tempfile.TemporaryDirectory(prefix="torch_tpu_warm_start_") as cache:
        cold = _run(True, cache, args.timeout)  # fills the cache
        build, warm = [], []
        for _ in range(args.rounds):
            build.append(_run(False, cache, args.timeout))
            warm.append(_run(True, cache, args.timeout))
    b = statistics.median(r["process_s"] for r in build)
    w = statistics.median(r["process_s"] for r in warm)
    last = warm[-1]["counters"]
    rows = {
        "cold_first_step_s": cold["process_s"],
        "import_build_s": b,
        "warm_first_step_s": w,
        "ratio": w / b,
        "warm_traces": last["traces"],
        "warm_xla_compiles": last["xla_compiles"],
        "warm_persistent_hits": last["persistent_cache_hits"],
    }
    print(f"cold first step (fills the cache)   {cold['process_s']:.2f} s")
    print(f"import torch_tpu + build minGPT     {b:.2f} s")
    print(f"warm first step                     {w:.2f} s")
    print(
        f"warm first step / import + build    {w / b:.2f}x (target <= 1.5x); warm traces {last['traces']}, "
        f"XLA compiles {last['xla_compiles']}, executables loaded {last['persistent_cache_hits']}"
    )
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
