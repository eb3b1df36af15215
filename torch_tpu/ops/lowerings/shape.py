"""Shape ops that compute new values: cat/stack, flip, roll, repeat, tril/triu,
padding and its backward, and the *_scatter ops autograd uses for views.

Views (view, reshape, transpose, permute, expand, select, slice, narrow,
split, unbind, diagonal, as_strided, ...) are not lowered: the C++ view
kernels and torch's composite kernels make them alias storage as on CPU.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import torch
from jax import lax

from torch_tpu import metrics
from torch_tpu.ops import growing
from torch_tpu.ops.dtypes import to_numpy_dtype, to_torch_dtype
from torch_tpu.ops.registry import aten, lower
from torch_tpu.ops.tensors import from_jax, to_jax
from torch_tpu.runtime import executable_cache


def _promoted(arrays) -> jnp.dtype:
    """torch's result dtype of tensors of these dtypes."""
    dtype = functools.reduce(torch.promote_types, (to_torch_dtype(a.dtype) for a in arrays))
    return jnp.dtype(to_numpy_dtype(dtype))


@lower(aten.cat.default, front=growing.APPEND, apart_from=("tensors",))
def cat(tensors, dim=0):
    dtype = _promoted(tensors)
    # Legacy rule: 1-d empty tensors are skipped whatever the other shapes.
    kept = [t for t in tensors if not (t.ndim == 1 and t.shape[0] == 0)]
    if not kept:
        return jnp.zeros((0,), dtype)
    axis = dim % kept[0].ndim
    return jnp.concatenate([t.astype(dtype) for t in kept], axis=axis)


@lower(aten.stack.default)
def stack(tensors, dim=0):
    dtype = _promoted(tensors)
    return jnp.stack([t.astype(dtype) for t in tensors], axis=dim % (tensors[0].ndim + 1))


@lower(aten.flip.default)
def flip(x, dims):
    if x.ndim == 0 or not dims:
        return x
    return jnp.flip(x, tuple(d % x.ndim for d in dims))


@lower(aten.roll.default)
def roll(x, shifts, dims=()):
    if not dims:
        return jnp.roll(x.reshape(-1), shifts[0]).reshape(x.shape)
    return jnp.roll(x, tuple(shifts), tuple(d % x.ndim for d in dims))


@lower(aten.repeat.default)
def repeat(x, repeats):
    lead = len(repeats) - x.ndim
    return jnp.tile(x.reshape((1,) * lead + x.shape), tuple(repeats))


@lower(aten.tril.default)
def tril(x, diagonal=0):
    return jnp.tril(x, diagonal)


@lower(aten.triu.default)
def triu(x, diagonal=0):
    return jnp.triu(x, diagonal)


@functools.partial(executable_cache.jit, static_argnames=("size",))
def _repeat_indices(repeats, size):
    return jnp.repeat(jnp.arange(repeats.shape[0], dtype=jnp.int64), repeats, total_repeat_length=size)


@lower(aten.repeat_interleave.Tensor, eager=True)
def repeat_interleave(repeats, *, output_size=None):
    """arange(len(repeats)) with element i repeated repeats[i] times; the
    length is data-dependent unless output_size gives it."""
    if repeats.dim() != 1:
        raise RuntimeError("repeat_interleave only accept 1D vector as repeat")
    if repeats.dtype not in (torch.int32, torch.int64):
        raise RuntimeError("repeats has to be Long or Int tensor")
    r = to_jax(repeats)
    if repeats.numel():
        metrics.bump("executions")
        metrics.bump("host_transfers")
        lo, total = (int(v) for v in jax.device_get(jnp.stack([jnp.min(r), jnp.sum(r)])))
        if lo < 0:
            raise RuntimeError("repeats can not be negative")
    else:
        total = 0
    if output_size is not None and output_size != total:
        raise RuntimeError("allocated size does not match required size")
    metrics.bump("executions")
    return from_jax(_repeat_indices(r, total), repeats.device.index)


# ---- padding -------------------------------------------------------------------------


def _pairs(pad, ndim: int) -> list[tuple[int, int]]:
    """torch's pad list (last dim first, (before, after) each) per dimension."""
    pairs = [(0, 0)] * ndim
    for i in range(len(pad) // 2):
        pairs[ndim - 1 - i] = (pad[2 * i], pad[2 * i + 1])
    return pairs


@lower(aten.constant_pad_nd.default, traced=("value",))
def constant_pad_nd(x, pad, value=0):
    fill = jnp.asarray(value).astype(x.dtype)
    return lax.pad(x, fill, [(lo, hi, 0) for lo, hi in _pairs(pad, x.ndim)])


def _replicate(x, pairs):
    """Edge padding that also crops (a negative pad), as CPU's: output j reads clamp(j - before)."""
    for axis, (lo, hi) in enumerate(pairs):
        if lo or hi:
            n = x.shape[axis]
            x = jnp.take(x, jnp.clip(jnp.arange(n + lo + hi) - lo, 0, n - 1), axis=axis)
    return x


def _pad_fn(mode: str, padding):
    if mode == "edge":
        return lambda x: _replicate(x, _pairs(padding, x.ndim))
    return lambda x: jnp.pad(x, _pairs(padding, x.ndim), mode=mode)


def _pad_backward(mode: str, grad_output, x, padding):
    _, vjp = jax.vjp(_pad_fn(mode, padding), jnp.zeros(x.shape, grad_output.dtype))
    return vjp(grad_output)[0]


@lower(aten.reflection_pad1d.default, aten.reflection_pad2d.default, aten.reflection_pad3d.default)
def reflection_pad(x, padding):
    return _pad_fn("reflect", padding)(x)


@lower(aten.replication_pad1d.default, aten.replication_pad2d.default, aten.replication_pad3d.default)
def replication_pad(x, padding):
    return _pad_fn("edge", padding)(x)


@lower(
    aten.reflection_pad1d_backward.default,
    aten.reflection_pad2d_backward.default,
    aten.reflection_pad3d_backward.default,
)
def reflection_pad_backward(grad_output, x, padding):
    return _pad_backward("reflect", grad_output, x, padding)


@lower(
    aten.replication_pad1d_backward.default,
    aten.replication_pad2d_backward.default,
    aten.replication_pad3d_backward.default,
)
def replication_pad_backward(grad_output, x, padding):
    return _pad_backward("edge", grad_output, x, padding)


# ---- *_scatter: the functional inverses of views ---------------------------------------


@lower(aten.slice_scatter.default)
def slice_scatter(x, src, dim=0, start=None, end=None, step=1):
    if x.ndim == 0:
        return src.astype(x.dtype).reshape(())
    axis = dim % x.ndim
    index = (slice(None),) * axis + (slice(start, end, step),)
    return x.at[index].set(src.astype(x.dtype))


@lower(aten.select_scatter.default)
def select_scatter(x, src, dim, index):
    axis = dim % x.ndim
    i = index % x.shape[axis]
    return x.at[(slice(None),) * axis + (i,)].set(src.astype(x.dtype))


@lower(aten.diagonal_scatter.default)
def diagonal_scatter(x, src, offset=0, dim1=0, dim2=1):
    d1, d2 = dim1 % x.ndim, dim2 % x.ndim
    moved = jnp.moveaxis(x, (d1, d2), (-2, -1))
    n = src.shape[-1]
    rows = jnp.arange(n) + max(-offset, 0)
    cols = jnp.arange(n) + max(offset, 0)
    moved = moved.at[..., rows, cols].set(src.astype(x.dtype))
    return jnp.moveaxis(moved, (-2, -1), (d1, d2))


@lower(aten.as_strided_scatter.default)
def as_strided_scatter(x, src, size, stride, storage_offset=None):
    """Writes `src` through as_strided(size, stride, offset) of a contiguous copy of `x`."""
    offset = storage_offset or 0
    needed = offset + 1 + sum((n - 1) * st for n, st in zip(size, stride)) if all(size) else 0
    if needed > x.size:
        itemsize = jnp.dtype(x.dtype).itemsize
        raise RuntimeError(
            f"setStorage: sizes {list(size)}, strides {list(stride)}, storage offset {offset}, and itemsize "
            f"{itemsize} requiring a storage size of {needed * itemsize} are out of bounds for storage of size "
            f"{x.size * itemsize}"
        )
    flat = x.reshape(-1)
    index = jnp.full(tuple(size), storage_offset or 0, jnp.int64)
    for d, (_n, st) in enumerate(zip(size, stride)):
        index = index + lax.broadcasted_iota(jnp.int64, tuple(size), d) * st
    return flat.at[index.reshape(-1)].set(src.astype(x.dtype).reshape(-1)).reshape(x.shape)


@lower(aten.unfold_backward.default)
def unfold_backward(grad_in, input_sizes, dim, size, step):
    """Adds each window's gradient back at the positions Tensor.unfold read it from."""
    dim = dim % max(len(input_sizes), 1)
    if not input_sizes:
        return grad_in.reshape(())
    windows = grad_in.shape[dim]
    index = (jnp.arange(windows)[:, None] * step + jnp.arange(size)[None, :]).reshape(-1)
    g = jnp.moveaxis(jnp.moveaxis(grad_in, dim, 0), -1, 1)  # (windows, size, rest...)
    g = g.reshape(windows * size, *g.shape[2:])
    rest = [n for d, n in enumerate(input_sizes) if d != dim]
    out = jnp.zeros((input_sizes[dim], *rest), grad_in.dtype).at[index].add(g)
    return jnp.moveaxis(out, 0, dim)


# ---- channel_shuffle ---------------------------------------------------------


@lower(aten.channel_shuffle.default)
def channel_shuffle(self, groups):
    n, c = self.shape[:2]
    x = self.reshape(n, groups, c // groups, *self.shape[2:])
    return jnp.swapaxes(x, 1, 2).reshape(self.shape)
