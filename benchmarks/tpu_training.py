"""TPU training benchmark (issue 34): a GPT-2-class model and ResNet-50, forward + backward +
AdamW, in torch_tpu's modes against the same model and AdamW written by hand in jax.jit (the XLA
limit), all in one process.

    python benchmarks/tpu_training.py [--models gpt,resnet50] [--batches 4,8] [--image-batch 128]
        [--modes jax,compiled-model,compiled-step,eager,lazy] [--steps 5] [--warmup 2] [--tiny]
        [--check-cpu] [--partitioner NAME=VALUE,...] [--json OUT] [--markdown OUT]
    python benchmarks/tpu_training.py --merge A.json B.json [--json OUT] [--markdown OUT]

Modes: `jax` (jax.jit train step, jax.value_and_grad, AdamW in jnp, state donated; attention
materialized, einsum and softmax); `jax-flash` (the same with jax's own Pallas TPU flash
attention, TPU only: the bar for torch_tpu, whose SDPA is a flash kernel; ratios to it are
printed under the targets); `compiled-model` (torch.compile(loss_fn, backend="tpu") + eager
AdamW); `compiled-step` (the whole step compiled: forward, backward, optimizer.step(),
zero_grad); `eager`; `lazy` (torch_tpu.eager_mode(False), torch_tpu.sync() per step); `cpu`
(`--check-cpu`: torch on CPU in float32, the numerical reference). torch modes run under
torch.autocast("tpu", bfloat16) with float32 parameters; AdamW(lr 3e-4, betas (0.9, 0.95),
weight decay 0.1, torch's default foreach).
Every mode starts from the same weights and sees the same batches; every step ends with a host
read of the loss. The first step is timed alone (compiles included); after `--warmup` steps the
timed steps run round-robin across modes when all modes' weights and AdamW state fit at once
(`--interleave auto`: at most a quarter of the device's memory; the GPT's do not on a 16 GiB chip,
so its modes run one after another). A mode that runs out of memory is reported as OOM and freed.

Peak HBM is the buffers' peak plus the largest XLA temporary allocation of the mode's executables
(the same upper bound for both sides). The buffers' peak is PJRT's (jax.Device.memory_stats),
over a mode's setup and warmup steps, less the bytes in use before its setup. PJRT's peak cannot
be reset: where it rose during the mode the figure is exact; otherwise it is the largest
`bytes_in_use` seen by a thread sampling every millisecond, shown as "~". TPU's PJRT stats do
not count an executable's temporaries (a jax step's activations and gradients live there): they
come from XLA's memory analysis, of jax's step and, for torch_tpu, of its compiled graphs and
lazy traces (torch.tpu.memory_stats()["xla_temp_bytes.all.peak"]). Ops compiled by an earlier
mode of the same process are reused by later ones, so mode order matters for the first step
(`--modes` sets it). torch_tpu's persistent compile cache is a fresh directory unless
`--cache-dir` names one (jax's own is off under torch_tpu), so first steps are cold for both sides.

On a TPU with ~10 minutes per command, run one group per command and merge:
    --models gpt --batches 4 --json b4.json; --models gpt --batches 8 --json b8.json;
    --models resnet50 --json r.json; then --merge b4.json b8.json r.json --markdown results/x.md
"""

from __future__ import annotations

import argparse
import ast
import atexit
import copy
import datetime
import gc
import json
import os
import pathlib
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tpu_models import Workload

HERE = pathlib.Path(__file__).resolve().parent
MODES = ("jax", "compiled-model", "compiled-step", "eager", "lazy")
# jax-flash: the jax step with jax's own Pallas flash attention (TPU only), the bar for modes whose
# attention is torch_tpu's flash kernel; "jax" materializes attention as most hand-written steps do.
JAX_MODES = ("jax", "jax-flash")
ALL_MODES = (*MODES, "jax-flash", "cpu")
MODELS = ("gpt", "resnet50")
PEAK_TFLOPS = {"TPU v5 lite": 197.0, "TPU v5e": 197.0, "TPU v4": 275.0, "TPU v5p": 459.0, "TPU v6 lite": 918.0}
COUNTER_KEYS = ("xla_compiles", "persistent_cache_hits", "executions", "host_transfers", "cpu_fallbacks")
GIB = 1 << 30
STARTED = time.perf_counter()


# ---- runners: build a mode, put a batch on its device, run one step -----------------------


class TorchRunner:
    def __init__(self, mode: str, w: Workload, compile_mode: str | None, compile_options: dict | None = None):
        import torch
        import tpu_models

        import torch_tpu

        self.torch, self.torch_tpu = torch, torch_tpu
        self.device = "cpu" if mode == "cpu" else "tpu"
        self.lazy = mode == "lazy"
        model = copy.deepcopy(w.base).to(self.device).train()
        opt = tpu_models.adamw(model.parameters())
        loss_of, device, autocast = w.loss_of, self.device, mode != "cpu"

        def loss_fn(x, y):
            with torch.autocast(device, dtype=torch.bfloat16, enabled=autocast):
                return loss_of(model, x, y)

        options = {"backend": "tpu"} | ({"mode": compile_mode} if compile_mode else {})
        if compile_options:
            options["options"] = compile_options
        if mode == "compiled-model":
            loss_fn = torch.compile(loss_fn, **options)

        def step(x, y):
            loss = loss_fn(x, y)
            loss.backward()
            opt.step()
            opt.zero_grad()
            return loss

        if mode == "compiled-step":
            step = torch.compile(step, **options)
        self.model, self.opt, self._step = model, opt, step

    def put(self, x, y) -> tuple:
        if self.device == "cpu":
            return x, y
        batch = x.to(self.device), y.to(self.device)
        self.torch_tpu.sync()
        return batch

    def step(self, batch: tuple) -> float:
        """One step, ended by waiting for all its work (the optimizer's too) and reading the loss."""
        if self.lazy:
            with self.torch_tpu.eager_mode(False):
                loss = self._step(*batch)
                self.torch_tpu.sync()
            return loss.item()
        loss = self._step(*batch)
        if self.device != "cpu":
            self.torch_tpu.sync()
        return loss.item()

    def close(self) -> None:
        self.__dict__.clear()


class JaxRunner:
    """The XLA limit: one jax.jit step (value_and_grad + AdamW in jnp), state donated."""

    def __init__(self, w: Workload, flash: bool = False):
        import jax
        import jax.numpy as jnp
        import numpy as np
        import tpu_models

        self.jax, self.np, self.gpt = jax, np, w.model == "gpt"
        params, buffers = tpu_models.jax_params(w.base, hwio=not self.gpt)
        if self.gpt:
            gpt_loss = tpu_models.jax_gpt_loss(w.cfg, flash=flash)

            def loss(p, bufs, x, y):
                return gpt_loss(p, x, y), bufs

        else:
            loss = tpu_models.jax_resnet_loss(w.cfg)

        def train_step(p, m, v, count, bufs, x, y):
            (value, bufs), grads = jax.value_and_grad(loss, has_aux=True)(p, bufs, x, y)
            count = count + 1
            p, m, v = tpu_models.jax_adamw(p, grads, m, v, count)
            return p, m, v, count, bufs, value

        self._step = jax.jit(train_step, donate_argnums=(0, 1, 2, 3, 4))
        self._compiled = None  # compiled at the first step (timed), kept for its memory analysis
        self._x64 = not flash  # jax's flash kernel is traced with 64-bit types off
        params = jax.device_put(params)
        zeros = jax.tree.map(jnp.zeros_like, params)
        self.state = [params, zeros, jax.tree.map(jnp.zeros_like, params), jnp.zeros((), jnp.float32)]
        self.state.append(jax.device_put(buffers))

    def put(self, x, y) -> tuple:
        x = x.numpy().astype(self.np.int32) if self.gpt else x.permute(0, 2, 3, 1).contiguous().numpy()
        batch = self.jax.device_put((x, y.numpy().astype(self.np.int32)))
        return self.jax.block_until_ready(batch)

    def step(self, batch: tuple) -> float:
        if self._compiled is None:
            with self.jax.enable_x64(self._x64):
                self._compiled = self._step.lower(*self.state, *batch).compile()
        *self.state, loss = self._compiled(*self.state, *batch)
        self.jax.block_until_ready(self.state)
        return float(loss)

    def temp_bytes(self) -> int:
        """XLA's temporaries of the step (activations, gradients): PJRT's stats do not count them."""
        return int(self._compiled.memory_analysis().temp_size_in_bytes) if self._compiled is not None else 0

    def close(self) -> None:
        self.__dict__.clear()


# ---- memory ------------------------------------------------------------------------------


class HbmWatch:
    """PJRT's bytes in use during a span: exact where the high-water mark rose, else sampled."""

    def __init__(self):
        import jax

        self.device = jax.devices()[0]
        self.limit = (self.stats() or {}).get("bytes_limit")
        self._thread = None

    def stats(self) -> dict | None:
        try:
            return self.device.memory_stats()
        except Exception:  # a client without memory stats (some raise instead of returning None)
            return None

    def start(self) -> None:
        first = self.stats()
        if not first:
            return
        self.base, self.peak_before = first["bytes_in_use"], first.get("peak_bytes_in_use", 0)
        self.sampled = self.base
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        while not self._done.wait(0.001):
            stats = self.stats()
            if stats:
                self.sampled = max(self.sampled, stats["bytes_in_use"])

    def stop(self) -> tuple[int | None, bool]:
        """(peak bytes over the span less those in use at its start, exact?)."""
        if self._thread is None:
            return None, False
        self._done.set()
        self._thread.join()
        self._thread = None
        last = self.stats() or {}
        peak = last.get("peak_bytes_in_use")
        if peak is not None and peak > self.peak_before:
            return peak - self.base, True
        return max(self.sampled, last.get("bytes_in_use", 0)) - self.base, False


# ---- running one (model, batch) group ----------------------------------------------------


def _counters() -> dict[str, float]:
    """COUNTER_KEYS, and the wall seconds spent compiling ("compile_s") and loading executables
    from the persistent cache ("load_s"), in dynamo ("dynamo_s", its backend's call included) and
    in that call ("backend_s": aot_autograd, or loading its results, and building the graphs):
    the rest of a first step is jax tracing and running."""
    from torch._dynamo.utils import compilation_time_metrics

    from torch_tpu import metrics

    snapshot = metrics.counters()
    counts: dict[str, float] = {k: snapshot.get(k, 0) for k in COUNTER_KEYS}
    counts["compile_s"] = sum(metrics.compile_seconds().values())
    counts["load_s"] = metrics.load_seconds()
    counts["dynamo_s"] = sum(compilation_time_metrics.get("_compile.compile_inner", []))
    counts["backend_s"] = sum(compilation_time_metrics.get("OutputGraph.call_user_compiler", []))
    return counts


def _is_oom(error: BaseException) -> bool:
    import torch

    seen: set[int] = set()
    e: BaseException | None = error
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        text = str(e)
        if isinstance(e, torch.OutOfMemoryError) or "RESOURCE_EXHAUSTED" in text or "ran out of memory" in text.lower():
            return True
        e = e.__cause__ or e.__context__
    return False


def _failure(mode: str, error: BaseException) -> str:
    if _is_oom(error):
        print(f"  {mode}: out of memory: {str(error).strip().splitlines()[0][:300] if str(error) else ''}", flush=True)
        return "OOM"
    traceback.print_exception(error, file=sys.stderr)
    first = str(error).strip().splitlines()[0][:200] if str(error).strip() else ""
    return f"error: {type(error).__name__}: {first}"


def _timed(runner, w: Workload, i: int) -> tuple[float, float, dict[str, int]]:
    """(loss, seconds, counter deltas) of step i; the batch is on the device before the clock starts."""
    batch = runner.put(*w.batches[i])
    before = _counters()
    start = time.perf_counter()
    loss = runner.step(batch)
    seconds = time.perf_counter() - start
    after = _counters()
    return loss, seconds, {k: after[k] - before[k] for k in after}


def _new_row(w: Workload, mode: str, run_id: str) -> dict:
    return {
        "group": f"{run_id} {w.model} {w.label}",  # the rows compared with one another
        "model": w.model,
        "batch": w.batch,
        "shape": w.label,
        "mode": mode,
        "status": "ok",
        "unit": w.unit,
        "items_per_step": w.items,
        "flops_per_step": w.flops,
        "losses": [],
        "warmup_s": [],
        "step_s": [],
        "counter_totals": dict.fromkeys(COUNTER_KEYS, 0),
    }


class Group:
    """All modes of one workload: setup and warmup one mode at a time, timed steps round-robin
    (or each mode's right after its warmup when they do not fit at once)."""

    def __init__(self, w: Workload, modes: list[str], args, watch: HbmWatch, run_id: str):
        self.w, self.modes, self.args, self.watch = w, modes, args, watch
        self.rows = {m: _new_row(w, m, run_id) for m in modes}
        self.runners: dict[str, Any] = {}
        device_modes = [m for m in modes if m != "cpu"]
        if args.interleave == "auto":
            self.interleave = watch.limit is None or 16 * w.n_params * len(device_modes) <= watch.limit / 4
        else:
            self.interleave = args.interleave == "on"

    def run(self, save: Callable[[list[dict]], None]) -> list[dict]:
        """The group's rows; `save(rows)` after each mode, so a run stopped midway keeps what it measured."""
        w, args = self.w, self.args
        order = "round-robin" if self.interleave else "one mode after another"
        print(f"\n== {w.model} {w.label}: {', '.join(self.modes)}; timed steps {order}", flush=True)
        for mode in self.modes:
            self._warm(mode)
            if not self.interleave and mode in self.runners:
                for i in range(args.warmup, args.warmup + args.steps):
                    self._step(mode, i)
                self._drop(mode)
            save(list(self.rows.values()))
        for i in range(args.warmup, args.warmup + args.steps):
            for mode in list(self.runners):
                self._step(mode, i)
        for mode in list(self.runners):
            self._drop(mode)
        for mode in self.modes:
            row = self.rows[mode]
            if row["status"] == "ok":
                losses = " ".join(f"{x:.4f}" for x in row["losses"])
                print(f"  {mode:15s} losses: {losses}")
        return list(self.rows.values())

    def _warm(self, mode: str) -> None:
        import torch

        w, row, tpu = self.w, self.rows[mode], mode not in ("cpu",)
        gc.collect()
        failed = None
        if tpu:
            self.watch.start()
            torch.tpu.reset_peak_memory_stats()
            live_before = torch.tpu.memory_allocated()
        try:
            start = time.perf_counter()
            if mode in JAX_MODES:
                runner = JaxRunner(w, flash=mode == "jax-flash")
            else:
                runner = TorchRunner(mode, w, self.args.compile_mode, self.args.compile_options)
            self.runners[mode] = runner
            row["setup_s"] = time.perf_counter() - start
            for i in range(self.args.warmup):
                loss, seconds, counts = _timed(runner, w, i)
                row["losses"].append(loss)
                row["warmup_s"].append(seconds)
                if i == 0:
                    row["first_step_s"], row["first_step_counters"] = seconds, counts
            if mode not in JAX_MODES:  # timed steps run heavy eager ops' default-effort executables
                from torch_tpu.runtime import compile_queue

                compile_queue.wait_idle()
        except Exception as error:
            failed = _failure(mode, error)
        finally:
            if tpu:
                buffers, row["peak_hbm_exact"] = self.watch.stop()
                if mode in JAX_MODES:
                    jax_runner = self.runners.get(mode)
                    temp = jax_runner.temp_bytes() if isinstance(jax_runner, JaxRunner) else 0
                else:
                    row["torch_peak_live_bytes"] = torch.tpu.max_memory_allocated() - live_before
                    temp = torch.tpu.memory_stats().get("xla_temp_bytes.all.peak", 0)
                row["peak_buffer_bytes"], row["xla_temp_bytes"] = buffers, temp
                row["peak_hbm_bytes"] = None if buffers is None else buffers + temp
        if failed:
            row["status"] = failed
            self._drop(mode)
            return
        hbm = row.get("peak_hbm_bytes")
        hbm_text = (
            f", peak HBM {'' if row['peak_hbm_exact'] else '~'}{hbm / GIB:.2f} GiB "
            f"(buffers {row['peak_buffer_bytes'] / GIB:.2f} + XLA temporaries {row['xla_temp_bytes'] / GIB:.2f})"
            if hbm is not None
            else ""
        )
        warm = " ".join(f"{s:.2f}" for s in row["warmup_s"])
        compiles = row["first_step_counters"]["xla_compiles"]
        print(
            f"  {mode:15s} setup {row['setup_s']:.1f} s, warmup steps {warm} s "
            f"(first: {compiles} XLA compiles){hbm_text} [{time.perf_counter() - STARTED:.0f} s]",
            flush=True,
        )

    def _step(self, mode: str, i: int) -> None:
        row, failed = self.rows[mode], None
        try:
            loss, seconds, counts = _timed(self.runners[mode], self.w, i)
        except Exception as error:
            failed = _failure(mode, error)
        if failed:
            row["status"] = failed
            self._drop(mode)
            return
        row["losses"].append(loss)
        row["step_s"].append(seconds)
        for k in COUNTER_KEYS:
            row["counter_totals"][k] += counts[k]

    def _drop(self, mode: str) -> None:
        import torch

        runner = self.runners.pop(mode, None)
        if runner is not None:
            runner.close()
        del runner
        if not any(m.startswith("compiled") for m in self.runners):
            torch._dynamo.reset()
        gc.collect()


# ---- results: ratios, table, targets -----------------------------------------------------


def _finish(rows: list[dict], peak_tflops: float | None, tolerance: float) -> None:
    """Adds medians, throughput, MFU and the ratios to jax (and the loss differences) to each row."""
    for row in rows:
        if row["status"] == "ok" and row["step_s"]:
            row["median_step_s"] = statistics.median(row["step_s"])
            row["throughput"] = row["items_per_step"] / row["median_step_s"]
            row["mfu"] = row["flops_per_step"] / row["median_step_s"] / (peak_tflops * 1e12) if peak_tflops else None
            row["per_step"] = {k: v / len(row["step_s"]) for k, v in row["counter_totals"].items()}
    for row in rows:
        peers = {r["mode"]: r for r in rows if r["group"] == row["group"]}
        for ref_name in ("jax", "cpu"):
            ref = peers.get(ref_name)
            if ref is None or ref is row or ref["status"] != "ok" or row["status"] != "ok":
                continue
            pairs = list(zip(row["losses"], ref["losses"]))
            if pairs:
                row[f"loss_max_abs_diff_vs_{ref_name}"] = max(abs(a - b) for a, b in pairs)
                rel = max(abs(a - b) / max(abs(b), 1e-12) for a, b in pairs)
                row[f"loss_max_rel_diff_vs_{ref_name}"] = rel
                row[f"loss_match_{ref_name}"] = rel <= tolerance
            if ref_name != "jax":
                continue
            if "throughput" in row and "throughput" in ref:
                row["speed_vs_jax"] = row["throughput"] / ref["throughput"]
            if row.get("peak_hbm_bytes") and ref.get("peak_hbm_bytes"):
                row["hbm_vs_jax"] = row["peak_hbm_bytes"] / ref["peak_hbm_bytes"]
            if "first_step_s" in row and "first_step_s" in ref:
                row["first_step_vs_jax"] = row["first_step_s"] / ref["first_step_s"]
        flash = peers.get("jax-flash")
        if flash is not None and flash is not row and "throughput" in row and "throughput" in flash:
            row["speed_vs_jax_flash"] = row["throughput"] / flash["throughput"]


HEADER = (
    "model",
    "batch",
    "mode",
    "step ms",
    "tokens or images/s",
    "MFU",
    "peak HBM GiB",
    "first step s",
    "speed ×jax",
    "HBM ×jax",
    "1st step ×jax",
    "max Δloss vs jax",
)


def _cells(row: dict) -> list[str]:
    def ratio(key):
        return f"{row[key]:.2f}x" if row.get(key) is not None else "-"

    head = [row["model"], row["shape"], row["mode"]]
    if row["status"] != "ok":
        return [*head, row["status"][:24], *["-"] * (len(HEADER) - 4)]
    hbm = row.get("peak_hbm_bytes")
    hbm_text = f"{'' if row.get('peak_hbm_exact') else '~'}{hbm / GIB:.2f}" if hbm is not None else "n/a"
    mfu = row.get("mfu")
    diff = row.get("loss_max_abs_diff_vs_jax")
    step = row.get("median_step_s")
    return [
        *head,
        f"{step * 1e3:.1f}" if step else "-",
        f"{row['throughput']:,.0f}" if step else "-",
        f"{mfu:.1%}" if mfu is not None else "n/a",
        hbm_text,
        f"{row['first_step_s']:.2f}" if "first_step_s" in row else "-",
        ratio("speed_vs_jax"),
        ratio("hbm_vs_jax"),
        ratio("first_step_vs_jax"),
        f"{diff:.2e}" if diff is not None else "-",
    ]


def _console_table(rows: list[dict]) -> str:
    table = [list(HEADER), *(_cells(r) for r in rows)]
    widths = [max(len(line[i]) for line in table) for i in range(len(HEADER))]
    lines = [
        "  ".join(c.ljust(widths[i]) if i < 3 else c.rjust(widths[i]) for i, c in enumerate(line)) for line in table
    ]
    lines.insert(1, "-" * len(lines[0]))
    return "\n".join(lines)


def _markdown_table(rows: list[dict]) -> str:
    lines = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    lines += ["| " + " | ".join(_cells(r)) + " |" for r in rows]
    return "\n".join(lines)


def _counter_lines(rows: list[dict]) -> list[str]:
    out = ["torch_tpu counters per timed step (executions, host transfers, XLA compiles, CPU fallbacks):"]
    for r in rows:
        if r["status"] == "ok" and r["mode"] not in (*JAX_MODES, "cpu") and r["step_s"]:
            c = r["per_step"]
            out.append(
                f"  {r['model']} {r['shape']} {r['mode']}: {c['executions']:.0f} executions, "
                f"{c['host_transfers']:.0f} host transfers, {c['xla_compiles']:.0f} compiles, "
                f"{c['cpu_fallbacks']:.0f} fallbacks; first step {_first_step_text(r['first_step_counters'])}"
            )
    return out


def _first_step_text(c: dict) -> str:
    text = f"{c['xla_compiles']} XLA compiles, {c['persistent_cache_hits']} persistent-cache loads"
    if "compile_s" in c:  # (rows merged from runs before these were timed have none)
        text += f" ({c['compile_s']:.1f} s compiling, {c['load_s']:.1f} s loading"
        if "dynamo_s" in c:
            text += f", {c['dynamo_s']:.1f} s in dynamo, {c['backend_s']:.1f} s of it in aot_autograd and the backend"
        text += ")"
    return text


def _targets(rows: list[dict], tolerance: float) -> list[str]:
    """Issue 34's "done when", checked where this run has the numbers."""
    out = []

    def check(what: str, value: float | None, limit: float, above: bool, fmt: str = "{:.2f}x") -> None:
        if value is None:
            return
        met = value >= limit if above else value <= limit
        sign = ">=" if above else "<="
        out.append(f"  {what}: {fmt.format(value)} ({sign} {fmt.format(limit)}) {'met' if met else 'NOT met'}")

    for group in dict.fromkeys(r["group"] for r in rows):
        peers = {r["mode"]: r for r in rows if r["group"] == group}
        model, batch, shape = next((r["model"], r["batch"], r["shape"]) for r in peers.values())
        tag = f"{model} {shape}"
        part, whole = peers.get("compiled-model"), peers.get("compiled-step")
        for row in (part, whole):
            if row is not None and row.get("speed_vs_jax_flash") is not None:
                out.append(f"  {tag} {row['mode']} speed against jax-flash: {row['speed_vs_jax_flash']:.2f}x")
        if whole is not None:
            check(f"{tag} compiled-step speed", whole.get("speed_vs_jax"), 0.95 if model == "gpt" else 0.9, True)
            if model == "gpt" and batch == 8:
                check(f"{tag} compiled-step MFU", whole.get("mfu"), 0.45, True, "{:.1%}")
        if part is not None and model == "gpt":
            check(f"{tag} compiled-model speed", part.get("speed_vs_jax"), 0.85, True)
        for row in (part, whole):
            if row is None:
                continue
            if row["status"] == "OOM":
                out.append(f"  {tag} {row['mode']}: OOM (must fit) NOT met")
            check(f"{tag} {row['mode']} peak HBM", row.get("hbm_vs_jax"), 1.1, False)
            check(f"{tag} {row['mode']} first step", row.get("first_step_vs_jax"), 1.3, False)
        for ref in ("jax", "cpu"):
            key = f"loss_max_rel_diff_vs_{ref}"
            diffs = {m: r[key] for m, r in peers.items() if key in r and not (ref == "cpu" and m in JAX_MODES)}
            if diffs:
                met = all(d <= tolerance for d in diffs.values())
                listed = ", ".join(f"{m} {d:.1e}" for m, d in diffs.items())
                out.append(
                    f"  {tag} losses vs {ref}, max rel diff over {len(peers[ref]['losses'])} steps: {listed} "
                    f"(<= {tolerance:.1e}) {'met' if met else 'NOT met'}"
                )
    return out


def _report(runs: list[dict], rows: list[dict], tolerance: float) -> tuple[str, str]:
    """(console text, markdown text) of the whole result."""
    notes = ["FLOPs per step:"]
    for formula in dict.fromkeys(f for run in runs for f in run["workloads"]):
        notes.append(f"  {formula}")
    notes.append(
        "MFU: model FLOPs / median step time / peak bf16 FLOP/s. Peak HBM: PJRT's buffer bytes over the "
        "mode's setup and warmup less those in use before it (exact, or '~' sampled every 1 ms where PJRT's "
        "high-water mark did not rise), plus the largest XLA temporary allocation of its executables "
        "(jax's step; torch_tpu's graphs and lazy traces). Ratios are to jax in the same run: speed and "
        "first step as time ratios (speed = jax step / mode step)."
    )
    failures = [f"  {r['model']} {r['shape']} {r['mode']}: {r['status']}" for r in rows if r["status"] != "ok"]
    if failures:
        notes += ["Modes that did not finish:", *failures]
    targets = _targets(rows, tolerance)
    counters = _counter_lines(rows)
    losses = ["Losses per step (warmup steps first):"]
    for r in rows:
        if r["losses"]:
            losses.append(f"  {r['model']} {r['shape']} {r['mode']}: " + " ".join(f"{x:.4f}" for x in r["losses"]))
    head = [_run_line(run) for run in runs]
    tail = [*notes, "", *counters, "", "Issue 34 targets:", *targets]
    console = "\n".join([*head, "", _console_table(rows), "", *tail])
    title = "# TPU training benchmark (`benchmarks/tpu_training.py`)"
    md_head = [title, "", *(f"- {line}" for line in head), "", _markdown_table(rows), ""]
    md = "\n".join([*md_head, "```", *tail, "", *losses, "```", ""])
    return console, md


def _run_line(run: dict) -> str:
    m = run["meta"]
    return (
        f"{m['date']}: torch_tpu {m['torch_tpu']}, torch {m['torch']}, jax {m['jax']}, platform {m['platform']} "
        f"({m['device_kind']}), peak {m['peak_tflops'] or 'n/a'} TFLOP/s, {m['command']}; "
        f"steps {m['steps']} after {m['warmup']} warmup, compile cache {m['cache']}"
    )


# ---- main --------------------------------------------------------------------------------


def _git_commit() -> str:
    import torch_tpu

    root = pathlib.Path(torch_tpu.__file__).resolve().parent.parent
    try:
        head = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        return head + (" (modified)" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return f"{getattr(torch_tpu, '__version__', 'unknown')} (no git)"


def _cache_setup(args) -> str:
    """Points torch_tpu's persistent cache at --cache-dir or a fresh directory, and torch's cache
    directory (the "tpu" backend's aot_autograd results) at its torch/ folder; before torch loads."""
    if "torch" in sys.modules:
        return "as configured (torch was imported first)"
    if args.cache_dir:
        os.environ["TORCH_TPU_CACHE_DIR"] = args.cache_dir
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(args.cache_dir, "torch")
        path = pathlib.Path(args.cache_dir)
        entries = len(list(path.glob("*.xla"))) if path.is_dir() else 0
        return f"{args.cache_dir} ({entries} entries at start)"
    fresh = tempfile.mkdtemp(prefix="tpu_training_cache_")
    atexit.register(shutil.rmtree, fresh, True)
    os.environ["TORCH_TPU_CACHE_DIR"] = fresh
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(fresh, "torch")
    return "fresh (cold)"


def _write(args, runs: list[dict], rows: list[dict]) -> str:
    console, md = _report(runs, rows, args.loss_rtol)
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps({"runs": runs, "rows": rows}, indent=1) + "\n")
    if args.markdown:
        pathlib.Path(args.markdown).write_text(md)
    return console


def _settings(text: str) -> dict[str, Any]:
    """{"a": True, "b": 0.9} from "a=True,b=0.9" (values as Python literals, else strings)."""
    settings: dict[str, Any] = {}
    for name, _, value in (item.partition("=") for item in text.split(",") if item):
        try:
            settings[name] = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            settings[name] = value
    return settings


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=",".join(MODELS), help="gpt,resnet50")
    parser.add_argument("--batches", default=None, help="GPT batch sizes (default 4,8; --tiny 2)")
    parser.add_argument("--image-batch", type=int, default=None, help="ResNet batch (default 128; --tiny 4)")
    parser.add_argument("--modes", default=",".join(MODES), help=f"in run order, from {', '.join(ALL_MODES)}")
    parser.add_argument("--steps", type=int, default=5, help="timed steps per mode")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps per mode, the first timed alone (>= 1)")
    parser.add_argument("--tiny", action="store_true", help="tiny models for the CPU client")
    parser.add_argument(
        "--check-cpu", action="store_true", help="add torch on CPU, float32, as a loss reference (slow unless --tiny)"
    )
    parser.add_argument("--interleave", choices=("auto", "on", "off"), default="auto")
    parser.add_argument("--compile-mode", default=None, help="torch.compile mode= for the compiled modes")
    parser.add_argument(
        "--activation-memory-budget",
        type=float,
        default=None,
        help="torch._functorch.config.activation_memory_budget for the compiled modes (1.0: keep what "
        "min-cut keeps; lower recomputes more in the backward)",
    )
    parser.add_argument(
        "--partitioner",
        metavar="NAME=VALUE,...",
        help='the compiled modes\' options={"partitioner": {...}}: torch._functorch.config settings for their split',
    )
    parser.add_argument("--cache-dir", default=None, help="torch_tpu's persistent compile cache (default: fresh)")
    parser.add_argument("--commit", default=None, help="torch_tpu's commit to print, where the tree has no .git")
    parser.add_argument("--peak-tflops", type=float, default=None, help="default: from the device kind")
    parser.add_argument("--loss-rtol", type=float, default=5e-3, help="losses match within this relative diff")
    parser.add_argument("--json", default=None, help="write the results here (after each mode)")
    parser.add_argument("--markdown", default=None, help="write a markdown report here")
    parser.add_argument("--merge", nargs="+", default=None, metavar="JSON", help="combine earlier --json outputs")
    args = parser.parse_args(argv)
    args.models = [m for m in args.models.split(",") if m]
    args.modes = [m for m in args.modes.split(",") if m]
    if args.check_cpu and "cpu" not in args.modes:
        args.modes.append("cpu")
    for kind, given, allowed in (("models", args.models, MODELS), ("modes", args.modes, ALL_MODES)):
        unknown = sorted(set(given) - set(allowed))
        if unknown:
            parser.error(f"unknown {kind} {unknown}; choose from {', '.join(allowed)}")
    batches = args.batches or ("2" if args.tiny else "4,8")
    args.batches = [int(b) for b in batches.split(",") if b]
    args.image_batch = args.image_batch or (4 if args.tiny else 128)
    args.compile_options = {"partitioner": _settings(args.partitioner)} if args.partitioner else None
    if args.warmup < 1:
        parser.error("--warmup must be >= 1: the first step is timed on its own")
    return args


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    if args.merge:
        runs, rows = [], []
        for path in args.merge:
            data = json.loads(pathlib.Path(path).read_text())
            runs += data["runs"]
            rows += data["rows"]
        print(_write(args, runs, rows))
        return 0

    cache = _cache_setup(args)
    sys.path.insert(0, str(HERE))
    import jax
    import torch
    import tpu_models

    import torch_tpu

    if args.activation_memory_budget is not None:
        import torch._functorch.config

        torch._functorch.config.activation_memory_budget = args.activation_memory_budget
    watch = HbmWatch()
    kind = jax.devices()[0].device_kind
    peak = args.peak_tflops or PEAK_TFLOPS.get(kind)
    meta = {
        "run_id": f"{time.time():.0f}.{os.getpid()}",
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "torch_tpu": args.commit or _git_commit(),
        "torch": torch.__version__,
        "jax": jax.__version__,
        "platform": torch_tpu.platform(),
        "device_kind": kind,
        "hbm_limit_bytes": watch.limit,
        "peak_tflops": peak,
        "command": "tpu_training.py " + " ".join(sys.argv[1:] if argv is None else argv),
        "steps": args.steps,
        "warmup": args.warmup,
        "cache": cache,
    }
    run = {"meta": meta, "workloads": []}
    print(_run_line(run), flush=True)
    rows: list[dict] = []
    n_steps = args.warmup + args.steps
    for w in tpu_models.workloads(args.models, args.batches, args.image_batch, args.tiny, n_steps):
        run["workloads"].append(w.formula)

        def save(group_rows: list[dict], done: list[dict] = rows) -> None:
            _finish(done + group_rows, peak, args.loss_rtol)
            _write(args, [run], done + group_rows)

        rows = rows + Group(w, args.modes, args, watch, meta["run_id"]).run(save)
        _finish(rows, peak, args.loss_rtol)
        print(f"  ({time.perf_counter() - STARTED:.0f} s so far)", flush=True)
    print()
    print(_write(args, [run], rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
