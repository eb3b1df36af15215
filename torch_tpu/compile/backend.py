"""The `torch.compile` backend "tpu": dynamo -> aot_autograd -> one XLA executable per graph.

aot_autograd splits training graphs into forward and backward ATen graphs,
functionalizes them (input mutations arrive as `copy_` into placeholders,
kept in inference graphs) and applies decompositions for ops that have no
lowering. Each graph becomes a GraphRunner. Graphs that touch no tpu tensor
run as they are (eager), so registering the backend changes nothing for
CPU and CUDA code.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable

import torch
import torch._dynamo
from torch._ops import OpOverload
from torch.fx import GraphModule

from torch_tpu import debug, platforms
from torch_tpu.compile import full_collections, graph_text
from torch_tpu.compile import options as compile_options
from torch_tpu.ops import registry

# torch_tpu's own machinery runs eagerly even when it is called from a compiled
# region (e.g. by the autograd engine at a graph break); jax is not traceable.
_SKIPPED_MODULES = (
    "torch_tpu.ops",
    "torch_tpu.runtime",
    "torch_tpu.compile",
    "torch_tpu.metrics",
    "torch_tpu.debug",
    "torch_tpu.device",
    "torch_tpu.platforms",  # the host tier and compile worker run under ops (CPU client)
    "jax",
    "jaxlib",
    "ml_dtypes",
)

_previous_inputs: dict[int, list[str]] = {}  # dynamo frame id -> input descriptions of its last compile


def _graph_lowerable(op: OpOverload) -> bool:
    """The op has a jax function in graphs (its lowering, a graph-only one, or an eager one's `graph=`)
    on this platform."""
    lowering = registry.lowering(op, platforms.lowering_platform())
    return lowering is not None and lowering.graph_fn is not None


@functools.cache
def decompositions() -> dict:
    """PyTorch's decompositions of the ops that have no jax lowering, the shape-only rewrites, max
    pooling's backward from its input (ops/max_pool_graph.py) and batch norm as statistics and
    elementwise ops (ops/batch_norm_graph.py)."""
    from torch._decomp import decomposition_table

    from torch_tpu.ops import batch_norm_graph, max_pool_graph

    table = decomposition_table.items()
    unlowered = {op: fn for op, fn in table if isinstance(op, OpOverload) and not _graph_lowerable(op)}
    return (
        unlowered | _SHAPE_ONLY_INPUTS | max_pool_graph.graph_decompositions() | batch_norm_graph.graph_decompositions()
    )


_rewriting = threading.local()


def _by_shape(op: OpOverload, position: int) -> Callable:
    """`op` with its input `position` replaced by a blank of the same shape: the backward reads
    only its shape, so the partitioner must not keep the forward's value (the float32 log-probs
    of an autocast cross_entropy: vocabulary x tokens x 4 bytes) in HBM until the backward."""

    def rewrite(*args, **kwargs):
        if getattr(_rewriting, "on", False):
            return NotImplemented  # the rewritten call itself: traced as is
        x = args[position]
        blank = torch.empty(x.shape, dtype=x.dtype, device=x.device)
        _rewriting.on = True
        try:
            return op(*args[:position], blank, *args[position + 1 :], **kwargs)
        finally:
            _rewriting.on = False

    return rewrite


_SHAPE_ONLY_INPUTS = {
    torch.ops.aten.nll_loss_backward.default: _by_shape(torch.ops.aten.nll_loss_backward.default, 1),
    torch.ops.aten.nll_loss2d_backward.default: _by_shape(torch.ops.aten.nll_loss2d_backward.default, 1),
}


# The min-cut partitioner's settings for the backend's graphs, each applied where torch's own is
# still set (name: (torch's default, the backend's)); the "partitioner" option sets any for a graph.
# Inductor bans recomputing in the backward a value that a non-fusible op there reads (a
# convolution's or matmul's backward): its cuDNN or cuBLAS call would need it materialized, a
# kernel of its own. XLA fuses elementwise producers into their readers, so ResNet's batch norm
# and ReLU outputs (ops/batch_norm_graph.py) and the bfloat16 casts of weights are recomputed
# there from what the backward keeps anyway, as XLA does inside jax's one-module step, instead of
# crossing from the forward (ResNet-50: 42.2 -> 31.0 MB per 224² image, and no 51 MB of weights).
PARTITIONER_DEFAULTS = {"ban_recompute_materialized_backward": (True, False)}

# Ops min-cut may recompute whose lowerings check their indices (ops/checks.py): recomputed, the
# backward would check them again (a host read per step where checks are not deferred).
_CHECKED_GATHERS = (torch.ops.aten.index.Tensor, torch.ops.aten.gather.default)


def partition(joint_module, joint_inputs, **kwargs):
    """aot_autograd's min-cut partition, with the gathers whose indices are checked kept, not
    recomputed (a torch.utils.checkpoint policy already on a node wins)."""
    from torch._functorch.partitioners import min_cut_rematerialization_partition
    from torch.utils.checkpoint import CheckpointPolicy

    for node in joint_module.graph.nodes:
        if node.op == "call_function" and node.target in _CHECKED_GATHERS:
            node.meta.setdefault("recompute", CheckpointPolicy.MUST_SAVE)
    return min_cut_rematerialization_partition(joint_module, joint_inputs, **kwargs)


def _partitioner_settings(options: compile_options.CompileOptions):
    import torch._functorch.config as functorch_config

    settings = {
        name: ours for name, (torchs, ours) in PARTITIONER_DEFAULTS.items() if getattr(functorch_config, name) == torchs
    }
    return functorch_config.patch(settings | dict(options.partitioner))


@functools.cache
def _aot(options: compile_options.CompileOptions = compile_options.DEFAULT):
    # Imported on first use: registration can run while torch._inductor is half imported.
    from torch._dynamo.backends.common import aot_autograd

    from torch_tpu.compile import aot_cache  # torch's OutputCode: torch._inductor, imported whole by now

    return aot_autograd(
        # What the backward needs is chosen by min-cut, as inductor does: casts and elementwise
        # results are recomputed in the backward graph instead of kept in HBM between the two.
        partition_fn=partition,
        fw_compiler=aot_cache.compiler("forward", options),
        bw_compiler=aot_cache.compiler("backward", options),
        inference_compiler=aot_cache.compiler("inference", options),
        decompositions=decompositions(),
        keep_inference_input_mutations=True,
    )


def _touches_tpu(gm: GraphModule, example_inputs) -> bool:
    for x in example_inputs:
        if isinstance(x, torch.Tensor) and x.device.type == "tpu":
            return True
    for node in gm.graph.nodes:
        value = node.meta.get("example_value", node.meta.get("val"))
        if isinstance(value, torch.Tensor) and value.device.type == "tpu":
            return True
    return False


def _describe(x) -> str:
    if isinstance(x, torch.Tensor):
        return f"{x.device.type}:{str(x.dtype).removeprefix('torch.')}{list(x.shape)}"
    return repr(x)


def _log_recompile(example_inputs) -> None:
    """Logs why dynamo compiles a frame again: its guard failure and the inputs that changed."""
    try:
        compile_id = torch._guards.CompileContext.current_compile_id()
    except Exception:
        compile_id = None
    if compile_id is None or compile_id.frame_id is None:
        return
    described = [_describe(x) for x in example_inputs]
    previous = _previous_inputs.get(compile_id.frame_id)
    _previous_inputs[compile_id.frame_id] = described
    if previous is None or not debug.enabled():
        return
    reason = None
    try:  # dynamo's own reason, where this torch version records it
        from torch._dynamo.utils import get_metrics_context

        reason = get_metrics_context()._metrics.get("recompile_reason")
    except Exception:
        reason = None
    changed = [f"input {i}: {a} -> {b}" for i, (a, b) in enumerate(zip(previous, described)) if a != b]
    if len(previous) != len(described):
        changed.append(f"{len(previous)} -> {len(described)} inputs")
    text = "; ".join(changed[:8]) or "same inputs"
    debug.log("recompile", f"frame {compile_id}: {reason or 'guard failure'} ({text})")


def tpu_backend(gm: GraphModule, example_inputs, mode: str | None = None, options: dict | None = None):
    """The dynamo backend registered as "tpu"; `mode` and `options` are described in compile/options.py."""
    parsed = compile_options.parse(mode, options)
    if not _touches_tpu(gm, example_inputs):
        return gm.forward
    _log_recompile(example_inputs)
    from torch_tpu.compile import aot_cache

    full_collections.install()  # for the frames dynamo compiles next (a reset drops it)
    # a warm process loads aot_autograd's result (compile/aot_cache.py)
    with (
        aot_cache.settings(parsed),
        _partitioner_settings(parsed),
        full_collections.window(),
        graph_text.skipped_while_unlogged(),
    ):
        return _aot(parsed)(gm, example_inputs)


_registered = False


def register() -> None:
    """Registers the "tpu" backend with dynamo (once)."""
    global _registered
    if _registered:
        return
    from torch._dynamo import trace_rules

    for module in _SKIPPED_MODULES:
        trace_rules.add(module)
    torch._dynamo.register_backend(tpu_backend, name="tpu")
    from torch_tpu.compile import inductor_route, optimizer_capturable

    inductor_route.install()
    optimizer_capturable.install()
    full_collections.install()
    _registered = True


register()
