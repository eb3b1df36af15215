"""The platform boundary: the one package that decides by which PJRT client tpu tensors run on.

ops/, compile/ and kernels/ never test the client. They ask the questions below, each named for
what differs, and a lowering that differs by platform is registered as a rule for that platform
beside the portable one (`lower(op, platform="tpu")`, ops/registry.py). The machinery only one
platform has lives in its subpackage:

- cpu/: the XLA CPU client, where a buffer is host memory: the host tier (host_tier.py), the
  background compiles it waits on (background_compile.py), the compile worker process
  (compile_worker.py), the fast op-compile flags (compile_options.py).
- tpu/: Mosaic's block rules for Pallas kernels (mosaic.py), libtpu's runtime metrics
  (monitoring.py), the low-effort op-compile option and which ops are recompiled at XLA's default
  effort (compile_options.py), jax's TPU lowering
  rules that build what XLA:TPU's 64-bit rewriting cannot compile, or computes wrongly, from what
  it can (x64_types.py: complex128 converts, abs, transposes and dots, 64-bit integer dots,
  float64 LU).

Named `platforms`, not `platform`: `torch_tpu.platform()` is the public function naming the
client. See docs/architecture.md, "The platform boundary".
"""

from __future__ import annotations

import functools
import os
from typing import Any

import jax

from torch_tpu.runtime import client


def name() -> str:
    """ "tpu", "cuda" or "cpu": the client tpu tensors run on (what `torch_tpu.platform()` says)."""
    return client.platform()


def host_memory_buffers() -> bool:
    """Whether a tpu tensor's buffer is host memory (the CPU client): a host read is a view that
    waits for no device, so the host tier can run CPU kernels on buffers and index checks read
    their indices at once instead of deferring the read (ops/deferred_checks.py)."""
    return name() == "cpu"


@functools.cache
def shaped_buffers() -> bool:
    """Whether an op's or a graph's fresh buffer keeps its tensor's shape instead of being flat:
    on TPU, where reshaping between a flat and an N-D array is a relayout copy through HBM (at
    every op and graph boundary, for every parameter, gradient and activation). On the CPU
    client the reshape is free and buffers stay flat; TORCH_TPU_SHAPED_BUFFERS=1 or 0 decides
    elsewise (tests run TPU's layout on the CPU client with it). Decided once per process: the
    host tier asks at every op."""
    setting = os.environ.get("TORCH_TPU_SHAPED_BUFFERS", "").strip()
    if setting:
        return setting not in ("0", "false", "no", "off")
    return name() != "cpu"


def donates_buffers() -> bool:
    """Whether a lazy trace hands the buffers it overwrites to XLA (donation): wherever no host
    view may hold an array behind the trace's back, i.e. except on the CPU client's host tier
    (flat buffers), where memory is host memory and a donation would save nothing."""
    return not (host_memory_buffers() and not shaped_buffers())


def saved_tensor_layouts() -> bool:
    """Whether a compiled forward returns what it saves for the backward in the layout XLA picks
    (compile/saved_layouts.py): where buffers keep their shape and XLA's layouts differ from
    row-major, i.e. on TPU (convolution activations: batch or channels minor). On the CPU client
    host views read buffers as row-major: off. TORCH_TPU_SAVED_LAYOUTS=1 or 0 decides elsewise."""
    setting = os.environ.get("TORCH_TPU_SAVED_LAYOUTS", "").strip()
    if setting:
        return setting not in ("0", "false", "no", "off")
    return name() != "cpu" and shaped_buffers()


def lazy_segment_ops() -> int:
    """How many ops `eager_mode(False)` records before it runs them and records on (0: no limit
    short of a sync). On TPU, where an executable runs asynchronously, a trace run in segments
    lets the chip run one segment while the host records the next (a GPT-2 step records ~320
    ops; recorded as one trace, the chip waits for all of them). The CPU client's programs run on
    the host's own cores, which recording needs: one trace there. TORCH_TPU_LAZY_SEGMENT_OPS
    decides elsewise."""
    setting = os.environ.get("TORCH_TPU_LAZY_SEGMENT_OPS", "").strip()
    if setting:
        return max(0, int(setting))
    return 0 if name() == "cpu" else LAZY_SEGMENT_OPS


# A steady loop's segments are the same at every step (cut at the same op counts), so each is
# compiled once; ~100 ops keep most fusion and make a GPT-2 step four executables.
LAZY_SEGMENT_OPS = 100


def kernels_compile() -> bool:
    """Whether Pallas kernels compile with Mosaic (TPU); elsewhere Pallas interprets them, an
    emulator for testing (kernels/_pallas.py)."""
    return name() == "tpu"


def lowering_platform() -> str:
    """The platform whose lowering rules apply (`lower(op, platform=...)`): the client's, except
    that TORCH_TPU_PALLAS_ON_CPU=1 gives a client without Mosaic TPU's rules, its Pallas kernels
    then interpreted (for testing kernels)."""
    platform = name()
    if platform != "tpu" and os.environ.get("TORCH_TPU_PALLAS_ON_CPU") == "1":
        return "tpu"
    return platform


def op_compile_options() -> dict[str, Any] | None:
    """XLA options for compiling one eager op: the CPU client's fast compile flags
    (cpu/compile_options.py), XLA:TPU's lowest optimization effort (tpu/compile_options.py);
    None (XLA's defaults) elsewhere."""
    platform = name()
    if platform == "cpu":
        from torch_tpu.platforms.cpu import compile_options
    elif platform == "tpu":
        from torch_tpu.platforms.tpu import compile_options
    else:
        return None
    return compile_options.op_compile_options()


def op_tier_up(compiled) -> bool:
    """Whether an eager op's executable, compiled with op_compile_options, is compiled again in
    the background at XLA's default effort (ops/op_tier_up.py): on TPU, for an op with enough
    device work that the low effort's slower program shows (tpu/compile_options.py). The CPU
    client's fast-compile flags barely change the program: never there."""
    if name() != "tpu":
        return False
    from torch_tpu.platforms.tpu import compile_options

    return compile_options.op_tier_up(compiled)


def autotune_flags() -> dict[str, Any]:
    """XLA flags of torch.compile's max-autotune modes: GPU's autotuner at its highest level; TPU
    and the CPU client have no autotuner flag. {} where no client could be created."""
    try:
        platform = name()
    except RuntimeError:
        return {}
    return {"xla_gpu_autotune_level": 4} if platform == "cuda" else {}


def serializes_programs() -> bool:
    """Whether each program waits for the ones before it: the CPU client across processes, whose
    cross-process (gloo) collectives deadlock when two multi-device programs are in flight at
    once. TPU programs stay queued asynchronously."""
    platform = name()
    return platform == "cpu" and jax.process_count(platform) > 1


def prepare_custom_calls(targets: tuple[str, ...] | None) -> None:
    """Sets up the platform's own kernels that custom-call `targets` (None: unknown) use, before an
    executable traced in another process runs them. jax does this while lowering: LAPACK's kernels
    on the CPU client are registered at import but read their LAPACK functions only after
    `initialize_lapack()` (run before it, they crash the process); GPU solvers' hybrid kernels
    likewise."""
    from jax._src.lax import linalg

    platform = name()
    if platform == "cpu" and (targets is None or any(t.startswith("lapack_") for t in targets)):
        linalg.initialize_lapack()
    elif platform in ("cuda", "rocm") and (targets is None or any("hybrid" in t for t in targets)):
        linalg.gpu_solver.initialize_hybrid_kernels()
