"""Training throughput of minGPT, the Llama example and ResNet-18 on every backend, plus eager
dispatch overhead and matmul GFLOP/s; writes a markdown table and a bar chart.

python benchmarks/run.py [--steps 5] [--models minGPT,Llama,ResNet-18] [--readme]

Backends: torch_tpu eager, torch_tpu compiled (torch.compile backend "tpu"), torch CPU eager,
torch CPU inductor, and torchax on jax. Each (model, backend) cell runs in its own process (torchax
renames PrivateUse1 too, and a crash or time-out stays in its cell). A cell that cannot run says
why in the table. Results go to benchmarks/results/latest.{md,json,png}; --readme also copies the
tables into README.md between the benchmark markers.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import pathlib
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable

import numpy as np
import torch

ROOT = pathlib.Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
RESULTS = ROOT / "benchmarks" / "results"
BACKENDS = ["tpu eager", "tpu compiled", "CPU eager", "CPU inductor", "torchax (jax)"]
README_START, README_END = "<!-- benchmarks:start -->", "<!-- benchmarks:end -->"


@dataclasses.dataclass
class Workload:
    model: torch.nn.Module
    batch: tuple[torch.Tensor, ...]
    loss: Callable[..., torch.Tensor]  # loss(model, *batch)
    items: int  # tokens or images per step
    unit: str


def _lm_workload(model: torch.nn.Module, logits: Callable, block_size: int, batch_size: int = 8) -> Workload:
    from common.text import lm_batches
    from common.transformer import lm_loss

    x, y = next(lm_batches(1, 0, batch_size, block_size))
    return Workload(model, (x, y), lambda m, x, y: lm_loss(logits(m, x), y), batch_size * block_size, "tokens/s")


def _mingpt() -> Workload:
    sys.path.insert(0, str(EXAMPLES / "mingpt"))
    from model import GPT, GPTConfig

    cfg = GPTConfig()
    return _lm_workload(GPT(cfg), lambda m, x: m(x)[0], cfg.block_size)


def _llama() -> Workload:
    sys.path.insert(0, str(EXAMPLES / "llama"))
    from common.transformer import DecoderLM
    from train import CONFIG

    return _lm_workload(DecoderLM(CONFIG), lambda m, x: m(x), CONFIG.block_size)


def _resnet18() -> Workload:
    sys.path.insert(0, str(EXAMPLES / "resnet"))
    from model import resnet18

    g = torch.Generator().manual_seed(0)
    batch = (torch.randn(8, 3, 32, 32, generator=g), torch.randint(0, 10, (8,), generator=g))
    return Workload(resnet18(10), batch, lambda m, x, y: torch.nn.functional.cross_entropy(m(x), y), 8, "images/s")


WORKLOADS = {"minGPT": _mingpt, "Llama": _llama, "ResNet-18": _resnet18}


# ---- one cell, in a child process --------------------------------------------------------------


def _time_steps(step: Callable[[], torch.Tensor], warmup: int, steps: int) -> dict:
    start = time.perf_counter()
    for _ in range(warmup):
        step().item()
    first = time.perf_counter() - start
    start = time.perf_counter()
    for _ in range(steps):
        loss = step()
    loss.item()  # waits for the queued steps
    return {"seconds_per_step": (time.perf_counter() - start) / steps, "warmup_seconds": first}


def _torch_cell(work: Workload, backend: str, warmup: int, steps: int) -> dict:
    device = "tpu" if backend.startswith("tpu") else "cpu"
    if device == "tpu":
        import torch_tpu  # noqa: F401
    model = work.model.to(device).train()
    batch = tuple(t.to(device) for t in work.batch)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)

    def step_loss(*batch: torch.Tensor) -> torch.Tensor:
        return work.loss(model, *batch)

    if backend.endswith("compiled") or backend.endswith("inductor"):
        name = "tpu" if device == "tpu" else "inductor"
        if name not in torch._dynamo.list_backends():
            raise RuntimeError(f'torch.compile backend "{name}" is not registered')
        step_loss = torch.compile(step_loss, backend=name)

    def step() -> torch.Tensor:
        loss = step_loss(*batch)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        return loss

    return _time_steps(step, warmup, steps)


def _torchax_cell(work: Workload, warmup: int, steps: int) -> dict:
    try:
        import torchax
    except Exception as e:  # torchax releases pin the torch versions they know
        raise RuntimeError(f"torchax does not import with torch {torch.__version__}: {type(e).__name__}: {e}") from e
    import jax
    import jax.numpy as jnp

    class WithLoss(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = work.model

        def forward(self, *batch):
            return work.loss(self.model, *batch)

    weights, fn = torchax.extract_jax(WithLoss())
    names = {"model." + n for n, _ in work.model.named_parameters()}
    params = {k: v for k, v in weights.items() if k in names}
    buffers = {k: v for k, v in weights.items() if k not in names}
    batch = tuple(jnp.asarray(t.numpy()) for t in work.batch)

    @jax.jit
    def train_step(params, batch):
        loss, grads = jax.value_and_grad(lambda p: fn({**buffers, **p}, batch))(params)
        return jax.tree.map(lambda p, g: p - 1e-3 * g, params, grads), loss

    state = {"params": params}

    class _Loss:  # .item() as for a torch loss
        def __init__(self, value):
            self.value = value

        def item(self):
            return float(self.value)

    def step():
        state["params"], loss = train_step(state["params"], batch)
        return _Loss(loss)

    return _time_steps(step, warmup, steps)


def _dispatch_cell(repeats: int) -> dict:
    """µs per call of a small add and a 256² matmul, torch_tpu eager vs a bare jax.jit call, and
    GFLOP/s of a 1024² float32 matmul against numpy (the machine's BLAS peak)."""
    import jax
    import jax.numpy as jnp

    import torch_tpu

    def per_call(fn, sync) -> float:
        for _ in range(10):
            fn()
        sync()
        start = time.perf_counter()
        for _ in range(repeats):
            out = fn()
        sync(out)
        return (time.perf_counter() - start) / repeats

    def tpu_sync(out=None):
        torch_tpu.sync()

    def jax_sync(out=None):
        if out is not None:
            out.block_until_ready()

    def pair(torch_op, jax_op, shape, rounds: int = 7) -> dict:
        """Medians of `rounds` interleaved rounds, as benchmarks/eager_dispatch.py measures."""
        a, b = torch.randn(shape, device="tpu"), torch.randn(shape, device="tpu")
        ja, jb = jnp.asarray(np.random.rand(*shape), jnp.float32), jnp.asarray(np.random.rand(*shape), jnp.float32)
        jitted = jax.jit(jax_op)
        tpu_us, jax_us = [], []
        for _ in range(rounds):
            tpu_us.append(1e6 * per_call(lambda: torch_op(a, b), tpu_sync))
            jax_us.append(1e6 * per_call(lambda: jitted(ja, jb), jax_sync))
        return {"torch_tpu_us": statistics.median(tpu_us), "jax_jit_us": statistics.median(jax_us)}

    result = {"add 4 floats": pair(torch.add, jnp.add, (4,)), "matmul 256²": pair(torch.matmul, jnp.matmul, (256, 256))}
    n = 1024
    flops = 2 * n**3
    a, b = torch.randn(n, n, device="tpu"), torch.randn(n, n, device="tpu")
    na, nb = np.random.rand(n, n).astype(np.float32), np.random.rand(n, n).astype(np.float32)
    ja, jb = jnp.asarray(na), jnp.asarray(nb)
    jitted = jax.jit(jnp.matmul)
    repeats = max(repeats // 100, 5)
    result["matmul 1024² GFLOP/s"] = {
        "torch_tpu": flops / 1e9 / _best(lambda: per_call(lambda: a @ b, tpu_sync)),
        "jax_jit": flops / 1e9 / _best(lambda: per_call(lambda: jitted(ja, jb), jax_sync)),
        "numpy": flops / 1e9 / _best(lambda: per_call(lambda: na @ nb, lambda out=None: None)),
    }
    return result


def _best(measure: Callable[[], float], tries: int = 3) -> float:
    return min(measure() for _ in range(tries))


def _cell_main(args: argparse.Namespace) -> None:
    sys.path.insert(0, str(EXAMPLES))  # examples/common
    torch.manual_seed(0)
    try:
        if args.cell == "dispatch":
            out = _dispatch_cell(args.repeats)
        else:
            model, backend = args.cell.split("/")
            work = WORKLOADS[model]()
            if backend == "torchax (jax)":
                out = _torchax_cell(work, args.warmup, args.steps)
            else:
                out = _torch_cell(work, backend, args.warmup, args.steps)
            out.update(items=work.items, unit=work.unit)
    except Exception as e:
        out = {"error": f"{type(e).__name__}: {e}".splitlines()[0][:300]}
    print("RESULT " + json.dumps(out))


# ---- the parent: run every cell, write the results ---------------------------------------------


def _run_cell(cell: str, args: argparse.Namespace) -> dict:
    cmd = [sys.executable, __file__, "--cell", cell, "--steps", str(args.steps), "--warmup", str(args.warmup)]
    cmd += ["--repeats", str(args.repeats)]
    env = dict(os.environ, TORCH_TPU_PLATFORM=os.environ.get("TORCH_TPU_PLATFORM", "cpu"))
    start = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=args.cell_timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {args.cell_timeout} s"}
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if not lines:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        return {"error": f"exit {proc.returncode}: {tail[0][:300]}"}
    out = json.loads(lines[-1][len("RESULT ") :])
    out["wall_seconds"] = time.perf_counter() - start
    return out


def _machine() -> str:
    cpu = platform.processor() or "unknown CPU"
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    import jax

    return f"{cpu}, {os.cpu_count()} cores; torch {torch.__version__}, jax {jax.__version__}"


def _fmt(value: float) -> str:
    return f"{value:,.0f}" if value >= 100 else f"{value:.3g}"


def markdown(results: dict) -> str:
    notes: list[str] = []

    def cell(out: dict) -> str:
        if "error" in out:
            if out["error"] not in notes:
                notes.append(out["error"])
            return f"n/a [{notes.index(out['error']) + 1}]"
        return _fmt(out["items"] / out["seconds_per_step"])

    lines = [f"Training steps (forward, backward, SGD step), {results['machine']}, {results['date']}.", ""]
    lines += ["| model | " + " | ".join(BACKENDS) + " |", "|---" * (len(BACKENDS) + 1) + "|"]
    for model, row in results["training"].items():
        unit = next((o["unit"] for o in row.values() if "unit" in o), "")
        lines.append(f"| {model} ({unit}) | " + " | ".join(cell(row[b]) for b in BACKENDS if b in row) + " |")
    lines += [""] + [f"[{i + 1}] {note}" for i, note in enumerate(notes)]
    dispatch = results.get("dispatch")
    if dispatch and "error" not in dispatch:
        lines += ["", "Eager dispatch, µs per call (lower is better):", ""]
        lines += ["| op | torch_tpu eager | bare jax.jit | ratio |", "|---|---|---|---|"]
        for name in ("add 4 floats", "matmul 256²"):
            d = dispatch[name]
            ratio = d["torch_tpu_us"] / d["jax_jit_us"]
            lines.append(f"| {name} | {d['torch_tpu_us']:.1f} | {d['jax_jit_us']:.1f} | {ratio:.1f}x |")
        m = dispatch["matmul 1024² GFLOP/s"]
        lines += ["", "float32 matmul 1024², GFLOP/s (numpy's BLAS is the machine's peak here):", ""]
        lines += ["| torch_tpu eager | bare jax.jit | numpy | torch_tpu / numpy |", "|---|---|---|---|"]
        share = m["torch_tpu"] / m["numpy"]
        lines.append(f"| {m['torch_tpu']:.1f} | {m['jax_jit']:.1f} | {m['numpy']:.1f} | {share:.0%} |")
    elif dispatch:
        lines += ["", f"Eager dispatch: n/a ({dispatch['error']})"]
    return "\n".join(lines) + "\n"


def chart(results: dict, path: pathlib.Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    models = list(results["training"])
    fig, axes = plt.subplots(1, len(models), figsize=(4.2 * len(models), 3.6), squeeze=False)
    colors = plt.get_cmap("tab10").colors
    for ax, model in zip(axes[0], models):
        row = results["training"][model]
        values = [row[b]["items"] / row[b]["seconds_per_step"] if "error" not in row[b] else 0.0 for b in BACKENDS]
        unit = next((o["unit"] for o in row.values() if "unit" in o), "")
        bars = ax.bar(range(len(BACKENDS)), values, color=colors[: len(BACKENDS)])
        for bar, value in zip(bars, values):
            label = _fmt(value) if value else "n/a"
            ax.annotate(label, (bar.get_x() + bar.get_width() / 2, value), ha="center", va="bottom", fontsize=8)
        ax.set_xticks(range(len(BACKENDS)), [b.replace(" ", "\n", 1) for b in BACKENDS], fontsize=8)
        ax.set_title(f"{model} ({unit})", fontsize=10)
        ax.margins(y=0.15)
    fig.suptitle("Training throughput (higher is better)", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def update_readme(table: str) -> None:
    readme = ROOT / "README.md"
    text = readme.read_text()
    start, end = text.index(README_START) + len(README_START), text.index(README_END)
    readme.write_text(text[:start] + "\n" + table + "\n![benchmarks](benchmarks/results/latest.png)\n" + text[end:])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=",".join(WORKLOADS), help="comma-separated, of " + ", ".join(WORKLOADS))
    parser.add_argument("--backends", default=",".join(BACKENDS), help="comma-separated subset")
    parser.add_argument("--steps", type=int, default=5, help="timed steps per cell")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps first (compiles)")
    parser.add_argument("--repeats", type=int, default=2000, help="calls per dispatch measurement")
    parser.add_argument("--cell-timeout", type=int, default=600, help="seconds per cell")
    parser.add_argument("--out", type=pathlib.Path, default=RESULTS)
    parser.add_argument("--readme", action="store_true", help="copy the tables into README.md")
    parser.add_argument("--cell", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.cell:
        _cell_main(args)
        return 0

    results = {"machine": _machine(), "date": datetime.date.today().isoformat(), "training": {}}
    backends = [b for b in BACKENDS if b in args.backends.split(",")]
    for model in args.models.split(","):
        results["training"][model] = {}
        for backend in backends:
            out = _run_cell(f"{model}/{backend}", args)
            results["training"][model][backend] = out
            shown = out.get("error") or f"{out['items'] / out['seconds_per_step']:.1f} {out['unit']}"
            print(f"{model:10s} {backend:14s} {shown}", flush=True)
    results["dispatch"] = _run_cell("dispatch", args)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "latest.json").write_text(json.dumps(results, indent=2) + "\n")
    table = markdown(results)
    (args.out / "latest.md").write_text(table)
    chart(results, args.out / "latest.png")
    if args.readme:
        update_readme(table)
    print(table)
    print(f"wrote {args.out}/latest.md, latest.json and latest.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
