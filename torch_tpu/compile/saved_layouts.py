"""The layouts of what a compiled forward saves for its backward: XLA's choice, not row-major.

aot_autograd's saved activations leave the forward's executable and enter the backward's. In
the default (row-major) layout at that boundary, XLA:TPU copies each convolution activation out
of the layout its convolutions use (batch or channels minor) at the end of the forward and back
at the start of the backward: ResNet-50 spent ~15 ms of a ~90 ms step in ~40 such copies. So the
forward returns its saved tensors in the layout XLA picks (`Layout.AUTO`), and the backward,
compiled for the arrays it is given, reads them as they are. User outputs and the forward's
inputs keep the default layout; so does every array an eager op reads (`to_default`).
"""

from __future__ import annotations

import functools

import jax
import torch
from torch.fx import GraphModule, Node


def saved_output_positions(gm: GraphModule) -> tuple[int, ...]:
    """The positions of a forward graph's outputs that only the backward reads: after
    aot_autograd's user-facing outputs (its metadata, in the tracing context while the forward
    compiles), computed in the graph, and not also a user output. () when unknown."""
    context = torch._guards.TracingContext.try_get()
    meta = getattr(context, "fw_metadata", None)
    if meta is None:
        return ()
    returned = (
        meta.num_mutated_inp_runtime_indices
        + meta.num_outputs
        + meta.num_intermediate_bases
        + meta.num_outputs_rng_offset
        + len(meta.tokens)
    )
    outputs = gm.graph.output_node().args[0]
    if returned > len(outputs):
        return ()
    user = {o for o in outputs[:returned] if isinstance(o, Node)}
    return tuple(
        i
        for i in range(returned, len(outputs))
        if isinstance(outputs[i], Node)
        and outputs[i].op == "call_function"
        and outputs[i] not in user
        and isinstance(outputs[i].meta.get("val"), torch.Tensor)
    )


def split_outputs(flat: list, positions: list[int]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(kept, free): the flat indices of outputs in the default layout and of those in XLA's."""
    free = set(positions)
    return tuple(i for i in range(len(flat)) if i not in free), tuple(sorted(free))


def joined(outputs: tuple[list, list], split: tuple[tuple[int, ...], tuple[int, ...]]) -> list:
    """The flat outputs back in order from the executable's (kept, free) lists."""
    flat: list = [None] * (len(split[0]) + len(split[1]))
    for order, values in zip(split, outputs):
        for i, v in zip(order, values):
            flat[i] = v
    return flat


def auto_format(sharding: jax.sharding.Sharding | None):
    """XLA's choice of layout, on `sharding` (None: what jit infers, e.g. a mesh's)."""
    from jax.experimental.layout import Format, Layout

    return Format(Layout.AUTO, sharding)


@functools.cache
def _default_layout(dtype, shape: tuple[int, ...], device: jax.Device):
    return device.client.get_default_layout(dtype, shape, device)


def is_default(array) -> bool:
    """Whether a single-device array has its device's default layout for its shape."""
    if not isinstance(array, jax.Array) or array.ndim < 2 or len(array.devices()) != 1:
        return True
    (device,) = array.devices()
    return array._pjrt_layout == _default_layout(array.dtype, array.shape, device)


_relayout = jax.jit(lambda a: a)  # compiled for the argument's layout, returns the default one


def to_default(array):
    """`array` in its device's default layout (a copy when it is not)."""
    return array if is_default(array) else _relayout(array)


def is_layout_mismatch(error: ValueError) -> bool:
    """jax's refusal to run an executable on arrays in other layouts than it was compiled for."""
    return "compiled for input layouts that disagree" in str(error)


def layouts_of(dyn: list) -> tuple:
    """The arguments' layouts, for a signature that tells executables for other layouts apart."""
    return ("layouts", tuple(None if is_default(a) else str(a.format.layout) for a in dyn))
