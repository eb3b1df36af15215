"""Where a training step's device time goes: a model of tpu_training.py in one or more modes,
traced with jax's profiler for a few warm steps, and the trace summed per XLA module and per HLO
op (device planes only), beside the step's wall time. The gap between the two is time the chip
waited for the host.

    python benchmarks/tpu_step_trace.py [--modes jax,compiled-model] [--model gpt] [--batch 4] [--steps 2]
        [--tiny] [--top 25] [--out DIR] [--stacks-after SECONDS]

With --out, DIR keeps each mode's raw trace (`<mode>.xplane.pb`, readable by xprof/TensorBoard),
the compiled graphs' StableHLO, optimized HLO and buffer sizes (`dump/<mode>/`), and the summary
as `summary.json`. On the CPU client there is no device plane: the summary shows host lines only.
"""

from __future__ import annotations

import argparse
import collections
import faulthandler
import gc
import glob
import json
import pathlib
import sys
import tempfile
import time

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))


def _summarize(path: str, steps: int, top: int) -> dict:
    """Per device plane and line: total µs per step, events per step, and the top names."""
    from jax.profiler import ProfileData

    data = ProfileData.from_file(path)
    planes = {}
    for plane in data.planes:
        if not plane.name.startswith("/device:"):
            continue
        lines = {}
        for line in plane.lines:
            totals: dict[str, float] = collections.defaultdict(float)
            counts: collections.Counter = collections.Counter()
            categories: dict[str, float] = collections.defaultdict(float)
            first_stats = None
            for event in line.events:
                totals[event.name] += event.duration_ns / 1e3
                counts[event.name] += 1
                stats = dict(event.stats)
                if first_stats is None:
                    first_stats = {k: str(v)[:80] for k, v in stats.items()}
                category = stats.get("hlo_category") or stats.get("category")
                if category is not None:
                    categories[str(category)] += event.duration_ns / 1e3
            ranked = sorted(totals.items(), key=lambda kv: -kv[1])[:top]
            lines[line.name] = {
                "us_per_step": sum(totals.values()) / steps,
                "events_per_step": sum(counts.values()) / steps,
                "top": [(name, us / steps, counts[name] / steps) for name, us in ranked],
                "categories": {k: v / steps for k, v in sorted(categories.items(), key=lambda kv: -kv[1])},
                "event_stats": first_stats,
            }
        planes[plane.name] = lines
    return planes


def _print(mode: str, wall_ms: float, planes: dict, top: int) -> None:
    print(f"\n== {mode}: {wall_ms:.1f} ms per step (wall)", flush=True)
    if not planes:
        print("  no device plane in the trace (CPU client)")
    for plane, lines in planes.items():
        for name, line in lines.items():
            print(
                f"  {plane} / {name}: {line['us_per_step'] / 1e3:.2f} ms per step, "
                f"{line['events_per_step']:.0f} events per step"
            )
            if line["categories"]:
                cats = ", ".join(f"{k} {v / 1e3:.2f}" for k, v in list(line["categories"].items())[:10])
                print(f"    by category (ms): {cats}")
            if name in ("XLA Modules", "XLA Ops"):
                for op, us, n in line["top"][:top]:
                    print(f"    {us / 1e3:8.3f} ms  x{n:<5.0f} {op[:110]}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--modes", default="jax,compiled-model")
    parser.add_argument("--model", choices=("gpt", "resnet50"), default="gpt")
    parser.add_argument("--batch", type=int, default=4, help="GPT batch, or ResNet images")
    parser.add_argument("--steps", type=int, default=2, help="traced steps per mode")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--tiny", action="store_true")
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--out", default=None)
    parser.add_argument("--activation-memory-budget", type=float, default=None, help="as in tpu_training.py")
    parser.add_argument("--stacks-after", type=float, default=None, help="print every thread's stack and exit then")
    args = parser.parse_args(argv)
    if args.stacks_after:
        faulthandler.dump_traceback_later(args.stacks_after, exit=True)
    out = pathlib.Path(args.out or tempfile.mkdtemp(prefix="tpu_step_trace_"))
    out.mkdir(parents=True, exist_ok=True)

    import jax
    import torch
    import tpu_models
    import tpu_training

    if args.activation_memory_budget is not None:
        import torch._functorch.config

        torch._functorch.config.activation_memory_budget = args.activation_memory_budget

    n_steps = args.warmup + args.steps
    (w,) = tpu_models.workloads([args.model], [args.batch], args.batch, args.tiny, n_steps)
    summary = {}
    for mode in args.modes.split(","):
        dump = out / "dump" / mode
        dump.mkdir(parents=True, exist_ok=True)
        start = time.perf_counter()
        if mode == "jax":
            runner = tpu_training.JaxRunner(w)
        else:
            runner = tpu_training.TorchRunner(mode, w, None, {"dump_dir": str(dump)})
        for i in range(args.warmup):
            t = time.perf_counter()
            loss = runner.step(runner.put(*w.batches[i]))
            print(f"{mode} warmup {i}: {time.perf_counter() - t:.2f} s, loss {loss:.4f}", flush=True)
        if mode == "jax":
            state = runner.state
            compiled = runner._step.lower(*state, *runner.put(*w.batches[0])).compile()
            (dump / "jax_step.hlo.txt").write_text(compiled.as_text())
            (dump / "jax_step.memory.txt").write_text(f"{compiled.memory_analysis()}\n")
        batches = [runner.put(*w.batches[i]) for i in range(args.warmup, n_steps)]
        trace_dir = tempfile.mkdtemp(prefix=f"trace_{mode}_")
        with jax.profiler.trace(trace_dir):
            t = time.perf_counter()
            for batch in batches:
                runner.step(batch)
            wall_ms = (time.perf_counter() - t) * 1e3 / args.steps
        (path,) = glob.glob(f"{trace_dir}/**/*.xplane.pb", recursive=True)
        pathlib.Path(path).rename(out / f"{mode}.xplane.pb")
        planes = _summarize(str(out / f"{mode}.xplane.pb"), args.steps, args.top)
        _print(mode, wall_ms, planes, args.top)
        summary[mode] = {"wall_ms_per_step": wall_ms, "planes": planes, "setup_s": time.perf_counter() - start}
        runner.close()
        del runner
        gc.collect()
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(f"\nwritten to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
