"""Where the host's time goes in the first compiled training step (issue 34): dynamo, aot_autograd,
torch_tpu's backend, jax lowering, XLA compiles and the rest, for tpu_training.py's models.

    python benchmarks/first_step_phases.py [--model gpt|resnet50] [--batch 4] [--tiny] [--interval-ms 5]

Runs one `compiled-step` (the whole step under torch.compile(backend="tpu"), autocast bf16) with a
fresh compile cache, and prints:
- a timeline of the calls that bound the phases (dynamo's frame compiles, the backend call,
  aot_autograd's stages and cache, each graph's compile and its XLA compile, lazy traces), with
  the thread that ran them;
- a sampled split of every thread's time inside the step: a thread takes a stack sample every
  `--interval-ms` (sys._current_frames, so a sample waits for the GIL), and each sample's
  interval goes to the first category whose frames match (CATEGORIES, ours marked "torch_tpu").
"""

from __future__ import annotations

import argparse
import collections
import functools
import os
import pathlib
import sys
import tempfile
import threading
import time

HERE = pathlib.Path(__file__).resolve().parent

# (category, substrings of "file:function" frames, all of which must be on the stack), first match wins
CATEGORIES = (
    ("XLA compile", ("backend_compile_and_load",)),
    ("execution (a host read waits)", ("deferred_checks.py:read",)),
    ("execution (a host read waits)", ("block_until_ready",)),
    ("torch_tpu: persistent cache save", ("executable_cache.py:save",)),
    ("torch_tpu: graph lowerings (node evaluation)", ("compile/graph.py:_evaluate",)),
    ("jax: tracing/lowering a graph", ("compile/graph.py:_compile",)),
    ("torch_tpu: lazy trace (state creation)", ("compile/lazy.py:",)),
    ("torch_tpu: building the graph runner", ("compile/aot_cache.py:compile_graph",)),
    ("torch_tpu: graph pickling for torch's cache", ("aot_cache.py:prepare_for_serialization",)),
    ("aot_autograd: graph text for logs", ("graph_module.py:_print_readable",)),  # compile/graph_text.py
    ("aot_autograd: AOTAutogradCache", ("autograd_cache.py:",)),
    ("aot_autograd: partitioner", ("partitioners.py:",)),
    ("aot_autograd: metadata collection", ("collect_metadata_analysis.py:",)),
    ("aot_autograd: joint graph trace", ("graph_capture.py:",)),
    ("aot_autograd: other", ("_call_user_compiler",)),
    ("dynamo: guards", ("convert_frame.py:", "guards.py:")),
    ("dynamo: tracing", ("convert_frame.py:",)),
    ("torch_tpu: graph run (other)", ("compile/graph.py:",)),
    ("eager ops", ("ops/dispatcher.py:",)),
    ("autograd engine (main waits)", ("run_backward",)),
)


def _leaf(frames: list[str], depth: int = 3) -> str:
    """The innermost `depth` frames, as "file:function" with the file's last two path parts."""
    return " < ".join("/".join(f.split("/")[-2:]) for f in frames[:depth])


def _category(frames: list[str]) -> str:
    for name, needs in CATEGORIES:
        if all(any(n in f for f in frames) for n in needs):
            return name
    return "other"


class Sampler:
    """Samples every thread's stack while running; seconds per (thread, category)."""

    def __init__(self, interval: float):
        self.interval = interval
        self.seconds: collections.Counter = collections.Counter()
        self.leaves: collections.Counter = collections.Counter()  # (thread, category, innermost frames)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="phase_sampler")

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        me = threading.get_ident()
        names = {}
        last = time.perf_counter()
        while not self._stop.wait(self.interval):
            now = time.perf_counter()
            dt, last = now - last, now
            for ident, frame in sys._current_frames().items():
                if ident == me:
                    continue
                frames = []
                while frame is not None:
                    code = frame.f_code
                    frames.append(f"{code.co_filename}:{code.co_name}")
                    frame = frame.f_back
                category = _category(frames)
                if category == "other" and not any("first_step_phases.py:_step" in f for f in frames):
                    continue  # a thread idle or doing none of the step's work
                if ident not in names:
                    names[ident] = next((t.name for t in threading.enumerate() if t.ident == ident), "autograd")
                self.seconds[(names[ident], category)] += dt
                self.leaves[(names[ident], category, _leaf(frames))] += dt


def _timed(obj, name: str, label: str, events: list, t0: list) -> None:
    original = getattr(obj, name)

    @functools.wraps(original)
    def timed(*args, **kwargs):
        start = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            if t0:
                end = time.perf_counter()
                events.append((start - t0[0], end - start, label, threading.current_thread().name))

    setattr(obj, name, timed)


def _instrument(events: list, t0: list) -> None:
    import torch._dynamo.convert_frame as convert_frame
    import torch._dynamo.output_graph as output_graph
    import torch._functorch._aot_autograd.autograd_cache as autograd_cache
    import torch._functorch._aot_autograd.graph_compile as graph_compile
    import torch._functorch.aot_autograd as aot_autograd

    from torch_tpu.compile import graph, lazy
    from torch_tpu.compile import options as compile_options

    for obj, name, label in (
        (convert_frame, "_compile", "dynamo: a frame's compile"),
        (output_graph.OutputGraph, "call_user_compiler", "  backend call (aot_autograd + torch_tpu)"),
        (autograd_cache.AOTAutogradCache, "try_load", "    AOTAutogradCache lookup"),
        (aot_autograd, "aot_stage1_graph_capture", "    aot: metadata + joint trace"),  # (imported by name)
        (graph_compile, "aot_stage2_autograd", "    aot: partition + compilers"),
        (graph_compile, "aot_stage2_inference", "    aot: inference compiler"),
        (autograd_cache.AOTAutogradCache, "save", "    AOTAutogradCache save"),
        (graph.Segment, "_compile", "graph compile (lowering + XLA)"),
        (compile_options, "compile_lowered", "  XLA compile"),
        (lazy, "_run", "lazy trace compile + run"),
    ):
        if hasattr(obj, name):  # (another torch, or an older torch_tpu without it)
            _timed(obj, name, label, events, t0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="gpt", choices=("gpt", "resnet50"))
    parser.add_argument("--batch", type=int, default=None, help="default: 4 (gpt), 128 (resnet50); --tiny 2 and 4")
    parser.add_argument("--tiny", action="store_true", help="tpu_training.py's tiny models")
    parser.add_argument("--interval-ms", type=float, default=5.0)
    parser.add_argument("--min-seconds", type=float, default=0.05, help="timeline: calls at least this long")
    parser.add_argument("--cache-dir", help="the compile caches' folder (default: a fresh one); twice for a warm start")
    parser.add_argument(
        "--leaves", type=int, default=0, help="the innermost frames of the main thread's N largest categories"
    )
    args = parser.parse_args(argv)
    cache = args.cache_dir or tempfile.mkdtemp(prefix="first_step_phases_")
    os.environ.setdefault("TORCH_TPU_CACHE_DIR", cache)
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", os.path.join(cache, "torch"))
    sys.path.insert(0, str(HERE))
    import tpu_models
    import tpu_training

    import torch_tpu

    batch = args.batch or ((2 if args.model == "gpt" else 4) if args.tiny else (4 if args.model == "gpt" else 128))
    (w,) = tpu_models.workloads([args.model], [batch], batch, args.tiny, 1)
    runner = tpu_training.TorchRunner("compiled-step", w, None)
    events: list = []
    t0: list = []
    _instrument(events, t0)
    x = runner.put(*w.batches[0])
    torch_tpu.metrics.reset()

    def _step():
        return runner.step(x)

    t0.append(time.perf_counter())
    with Sampler(args.interval_ms / 1000) as sampler:
        loss = _step()
    total = time.perf_counter() - t0[0]
    print(f"{args.model} {w.label} on {torch_tpu.platform()}: first compiled step {total:.2f} s, loss {loss:.4f}")
    print("\ntimeline (start s, seconds, thread, call):")
    for start, seconds, label, thread in sorted(events):
        if seconds >= args.min_seconds:
            print(f"  {start:8.2f} {seconds:8.2f}  {thread[:16]:16s} {label}")
    print(f"\nsampled seconds per thread and category (every {args.interval_ms:g} ms):")
    by_thread = collections.defaultdict(dict)
    for (thread, category), seconds in sampler.seconds.items():
        by_thread[thread][category] = seconds
    for thread, split in by_thread.items():
        ours = sum(v for k, v in split.items() if k.startswith("torch_tpu"))
        print(f"  {thread}: {sum(split.values()):.2f} s ({ours:.2f} s in torch_tpu's own code)")
        for category, seconds in sorted(split.items(), key=lambda kv: -kv[1]):
            print(f"    {seconds:8.2f}  {category}")
    if args.leaves:
        _print_leaves(sampler, by_thread.get("MainThread", {}), args.leaves)
    counters = torch_tpu.metrics.counters()
    print("\ncounters:", {k: counters.get(k, 0) for k in ("xla_compiles", "graph_compiles", "executions", "lazy_runs")})
    return 0


def _print_leaves(sampler: Sampler, split: dict, n: int) -> None:
    """For the main thread's `n` largest categories, where their samples were (innermost frames)."""
    for category, seconds in sorted(split.items(), key=lambda kv: -kv[1])[:n]:
        leaves = [
            (leaf, s) for (thread, cat, leaf), s in sampler.leaves.items() if thread == "MainThread" and cat == category
        ]
        print(f"\n  {category} ({seconds:.2f} s), innermost frames:")
        for leaf, s in sorted(leaves, key=lambda kv: -kv[1])[:12]:
            print(f"    {s:7.2f}  {leaf}")


if __name__ == "__main__":
    sys.exit(main())
