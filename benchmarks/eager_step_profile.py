"""Where an eager training step's host time goes: a GPT training step (autocast bf16, AdamW) in
torch_tpu's eager or lazy mode, timed per step, with the step's counters (executions, compiles,
transfers) and a cProfile of one warm step (top functions by own time).

    python benchmarks/eager_step_profile.py [--layers 4] [--d 768] [--seq 1024] [--batch 4] [--lazy]

`--optimizer adamw|adam_loop|sgd|adamw_fused` times the model's optimizer step alone instead,
fused (one executable: torch_tpu/fused_optimizer.py) against op by op
(TORCH_TPU_FUSE_OPTIMIZER=0), alternating: executions per step, the time to issue a step and
to finish it (a sync after each), and the ratios.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pathlib
import pstats
import statistics
import sys
import time

import torch

import torch_tpu

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "examples" / "mingpt"))
from model import GPT, GPTConfig


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--d", type=int, default=768)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--seq", type=int, default=1024)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=50304)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--lazy", action="store_true", help="torch_tpu.eager_mode(False)")
    parser.add_argument("--top", type=int, default=30)
    parser.add_argument("--optimizer", choices=sorted(OPTIMIZERS), help="time this optimizer's step alone")
    args = parser.parse_args(argv)
    cfg = GPTConfig(vocab_size=args.vocab, block_size=args.seq, n_layer=args.layers, n_head=args.heads, n_embd=args.d)
    torch.manual_seed(0)
    model = GPT(cfg).to("tpu")
    opt = OPTIMIZERS[args.optimizer or "adamw"](model.parameters())
    x = torch.randint(0, args.vocab, (args.batch, args.seq)).to("tpu")
    y = torch.randint(0, args.vocab, (args.batch, args.seq)).to("tpu")
    if args.optimizer:
        return optimizer_steps(model, opt, x, y, args.steps)
    if args.lazy:
        torch_tpu.eager_mode(False)

    def step():
        with torch.autocast("tpu", dtype=torch.bfloat16):
            _, loss = model(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch_tpu.sync()
        return loss

    for i in range(2):
        start = time.perf_counter()
        loss = step()
        print(f"warmup step {i}: {time.perf_counter() - start:.2f} s, loss {loss.item():.4f}", flush=True)
    torch_tpu.metrics.reset()
    times = []
    for _ in range(args.steps):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    counters = {k: v for k, v in torch_tpu.metrics.counters().items() if isinstance(v, int) and v}
    print(f"{'lazy' if args.lazy else 'eager'} step ms: {[round(t * 1e3, 1) for t in times]}")
    print(f"counters over {args.steps} steps: {counters}")
    profile = cProfile.Profile()
    profile.enable()
    start = time.perf_counter()
    loss = step()
    issued = time.perf_counter()
    loss.item()
    print(f"profiled step: {(issued - start) * 1e3:.1f} ms to issue and sync")
    profile.disable()
    text = io.StringIO()
    pstats.Stats(profile, stream=text).sort_stats("tottime").print_stats(args.top)
    print(text.getvalue())
    return 0


OPTIMIZERS = {
    "adamw": lambda ps: torch.optim.AdamW(ps, lr=3e-4),
    "adam_loop": lambda ps: torch.optim.Adam(ps, lr=3e-4, foreach=False),
    "sgd": lambda ps: torch.optim.SGD(ps, lr=3e-4, momentum=0.9, nesterov=True),
    "adamw_fused": lambda ps: torch.optim.AdamW(ps, lr=3e-4, fused=True),
}


def optimizer_steps(model, opt, x, y, steps: int) -> int:
    """`opt.step()` alone, fused and op by op in turns (a new lr each step), after one backward."""
    _, loss = model(x, y)
    loss.backward()
    params = sum(1 for p in model.parameters() if p.grad is not None)
    results: dict[str, dict[str, list[float]]] = {}
    for rnd in range(3):  # round 0 warms up (compiles, optimizer state)
        for mode, env in (("fused", "1"), ("op by op", "0")):
            os.environ["TORCH_TPU_FUSE_OPTIMIZER"] = env
            got = results.setdefault(mode, {"issue": [], "done": [], "executions": []})
            for i in range(2 if rnd == 0 else steps):
                for group in opt.param_groups:
                    group["lr"] = 3e-4 * (1 + i % 3)  # a Python float: no recompile per value
                torch_tpu.sync()
                before = torch_tpu.metrics.counters()["executions"]
                start = time.perf_counter()
                opt.step()
                issued = time.perf_counter()
                torch_tpu.sync()
                done = time.perf_counter()
                if rnd:
                    got["issue"].append(issued - start)
                    got["done"].append(done - start)
                    got["executions"].append(torch_tpu.metrics.counters()["executions"] - before)
    os.environ.pop("TORCH_TPU_FUSE_OPTIMIZER")
    print(f"{type(opt).__name__} step over {params} parameters, median of {2 * steps} steps each:")
    for mode, got in results.items():
        issue, done, runs = (statistics.median(got[k]) for k in ("issue", "done", "executions"))
        print(f"  {mode:9s} executions/step {runs:.0f}, issue {issue * 1e3:.2f} ms, done {done * 1e3:.2f} ms")
    fused, eager = results["fused"], results["op by op"]
    ratio = {k: statistics.median(eager[k]) / statistics.median(fused[k]) for k in ("issue", "done")}
    print(f"  op by op / fused: issue {ratio['issue']:.2f}x, done {ratio['done']:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
