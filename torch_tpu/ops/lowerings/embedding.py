"""Embedding backward and embedding bags."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import torch

from torch_tpu.ops.checks import Failure, check_ranges, first_outside, to_host
from torch_tpu.ops.dtypes import narrow_indices, to_opmath, type_name
from torch_tpu.ops.registry import Check, aten, lower
from torch_tpu.ops.tensors import to_jax
from torch_tpu.platforms.cpu import host_tier

# ---- embedding --------------------------------------------------------------


@lower(aten.embedding_dense_backward.default)
def embedding_dense_backward(grad_output, indices, num_weights, padding_idx, scale_grad_by_freq):
    idx = narrow_indices(indices.reshape(-1), num_weights)
    g = to_opmath(grad_output).reshape(idx.shape[0], -1)
    if padding_idx >= 0:
        g = jnp.where((idx == padding_idx)[:, None], 0, g)
    if scale_grad_by_freq:
        counts = jnp.zeros((num_weights,), g.dtype).at[idx].add(1)
        g = g / counts[idx][:, None]
    return jnp.zeros((num_weights, g.shape[1]), g.dtype).at[idx].add(g)


_BAG_SUM, _BAG_MEAN, _BAG_MAX = 0, 1, 2


def _bag_of(indices, offsets, include_last_offset):
    bags = offsets.shape[0] - (1 if include_last_offset else 0)
    starts = offsets[:bags]
    bag = jnp.searchsorted(starts, jnp.arange(indices.shape[0], dtype=starts.dtype), side="right") - 1
    return jnp.clip(bag, 0, max(bags - 1, 0)).astype(jnp.int64), bags


def _embedding_bag_impl(weight, indices, offsets, mode, per_sample_weights, include_last_offset, padding_idx):
    bag, bags = _bag_of(indices, offsets, include_last_offset)
    valid = indices != padding_idx if padding_idx >= 0 else jnp.ones(indices.shape, bool)
    rows = to_opmath(weight)[indices]
    # bag_size has one entry per offset, also with include_last_offset (the last is 0).
    bag_size = jnp.zeros((offsets.shape[0],), jnp.int64).at[bag].add(valid.astype(jnp.int64))
    max_indices = jnp.zeros((0,), jnp.int64)
    if mode == _BAG_MAX:
        masked = jnp.where(valid[:, None], rows, -jnp.inf)
        top = jax.ops.segment_max(masked, bag, num_segments=bags)
        first = jnp.where(
            valid[:, None] & (masked == top[bag]), jnp.arange(indices.shape[0])[:, None], indices.shape[0]
        )
        arg = jax.ops.segment_min(first, bag, num_segments=bags)
        empty = (bag_size[:bags] == 0)[:, None]
        max_indices = jnp.where(empty, 0, indices[jnp.clip(arg, 0, max(indices.shape[0] - 1, 0))])
        return jnp.where(empty, 0, top), bag, bag_size, max_indices
    if per_sample_weights is not None:
        rows = rows * to_opmath(per_sample_weights)[:, None]
    out = jax.ops.segment_sum(jnp.where(valid[:, None], rows, 0), bag, num_segments=bags)
    if mode == _BAG_MEAN:
        out = out / jnp.maximum(bag_size[:bags], 1)[:, None].astype(out.dtype)
    return out, bag, bag_size, max_indices


_BAG_MESSAGE = "Index {position} of input takes value {value} which is not in the valid range [0, {rows})"


_FIRST_OFFSET = (
    "offsets[0] has to be 0, i.e., the first sequence in the mini-batch has to start from position 0. "
    "However, got {value}\n[ torch.{type}Tensor{{}} ]"
)
_LAST_OFFSET = "offsets[-1] can not be greater than input's length {length} but got offsets[-1] of {value}"


def _offsets_host_check(indices, offsets) -> None:
    """CPU's checks of a 1-D input's offsets, made before it reads an index: the first bag starts
    at 0, and the last does not start past the input's end (XLA would give empty bags)."""
    if not isinstance(offsets, torch.Tensor) or indices.dim() != 1 or offsets.numel() == 0:
        return
    view = host_tier.view(offsets)
    flat = view.reshape(-1) if view is not None else torch.from_numpy(to_host(to_jax(offsets)).reshape(-1))
    first, last = int(flat[0]), int(flat[-1])
    if first != 0:
        raise RuntimeError(_FIRST_OFFSET.format(value=first, type=type_name(offsets.dtype)))
    if last > indices.shape[0]:
        raise RuntimeError(_LAST_OFFSET.format(length=indices.shape[0], value=last))


def _offsets_graph_check(indices, offsets) -> list[Failure]:
    if offsets is None or indices.ndim != 1 or offsets.size == 0:
        return []
    offsets = offsets.reshape(-1)
    first = _FIRST_OFFSET.replace("{type}", type_name(offsets.dtype))
    last = _LAST_OFFSET.replace("{length}", str(indices.shape[0]))
    return [
        Failure(offsets[0] != 0, offsets[0].astype(jnp.int64), RuntimeError, first),
        Failure(offsets[-1] > indices.shape[0], offsets[-1].astype(jnp.int64), RuntimeError, last),
    ]


def _bag_host_check(weight, indices, offsets, *args, **kwargs):
    _offsets_host_check(indices, offsets)
    rows = weight.shape[0]

    def error(value: int) -> RuntimeError:
        flat = indices.reshape(-1).cpu()
        position = int(((flat < 0) | (flat >= rows)).int().argmax())
        return RuntimeError(_BAG_MESSAGE.format(position=position, value=value, rows=rows))

    check_ranges([(indices, 0, rows, error)])


def _bag_graph_check(weight, indices, offsets, *args, **kwargs):
    rows = weight.shape[0]
    text = _BAG_MESSAGE.replace("{rows}", str(rows)).replace("Index {position} of input", "An index of input")
    return _offsets_graph_check(indices, offsets) + first_outside(indices, 0, rows, RuntimeError, text)


# host_tier=False: offset2bag, bag_size and max_indices are what the backward lowerings read.
@lower(
    aten._embedding_bag.default,
    aten._embedding_bag_forward_only.default,
    check=Check(_bag_host_check, _bag_graph_check),
    host_tier=False,
)
def embedding_bag(
    weight,
    indices,
    offsets,
    scale_grad_by_freq=False,
    mode=_BAG_SUM,
    sparse=False,
    per_sample_weights=None,
    include_last_offset=False,
    padding_idx=-1,
):
    return _embedding_bag_impl(weight, indices, offsets, mode, per_sample_weights, include_last_offset, padding_idx)


# host_tier=False: CPU's kernel mis-scales rows next to repeated ones under scale_grad_by_freq.
@lower(aten._embedding_bag_dense_backward.default, host_tier=False)
def embedding_bag_dense_backward(
    grad,
    indices,
    offset2bag,
    bag_size,
    maximum_indices,
    num_weights,
    scale_grad_by_freq,
    mode,
    per_sample_weights,
    padding_idx=-1,
):
    g = to_opmath(grad)
    valid = indices != padding_idx if padding_idx >= 0 else jnp.ones(indices.shape, bool)
    if mode == _BAG_MAX:
        dims = jnp.arange(g.shape[1])[None, :]
        keep = (bag_size[: g.shape[0]] > 0)[:, None] & ((maximum_indices != padding_idx) if padding_idx >= 0 else True)
        return jnp.zeros((num_weights, g.shape[1]), g.dtype).at[maximum_indices, dims].add(jnp.where(keep, g, 0))
    rows = g[offset2bag]
    if mode == _BAG_MEAN:
        rows = rows / jnp.maximum(bag_size[offset2bag], 1)[:, None].astype(rows.dtype)
    elif per_sample_weights is not None:
        rows = rows * to_opmath(per_sample_weights)[:, None]
    if scale_grad_by_freq:
        counts = jnp.zeros((num_weights,), rows.dtype).at[indices].add(1)
        rows = rows / counts[indices][:, None]
    return jnp.zeros((num_weights, g.shape[1]), g.dtype).at[indices].add(jnp.where(valid[:, None], rows, 0))


@lower(aten._embedding_bag_backward.default, host_tier=False)
def embedding_bag_backward(grad, indices, offsets, offset2bag, bag_size, *rest):
    """rest: maximum_indices, num_weights, scale_grad_by_freq, mode, sparse, per_sample_weights, padding_idx."""
    if rest[4]:
        raise NotImplementedError("torch_tpu: sparse embedding_bag gradients are not supported on the tpu")
    return embedding_bag_dense_backward(grad, indices, offset2bag, bag_size, *rest[:4], *rest[5:])


@lower(aten._embedding_bag_per_sample_weights_backward.default)
def embedding_bag_per_sample_weights_backward(grad, weight, indices, offsets, offset2bag, mode, padding_idx=-1):
    dots = jnp.sum(to_opmath(grad)[offset2bag] * to_opmath(weight)[indices], axis=1)
    return jnp.where(indices != padding_idx, dots, 0) if padding_idx >= 0 else dots
