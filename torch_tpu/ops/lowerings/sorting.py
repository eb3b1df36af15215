"""Sorting and searching: sort, topk, kthvalue, searchsorted, bucketize, isin, unique."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import torch
from jax import lax

from torch_tpu import metrics
from torch_tpu.ops.checks import check_ranges, dim_in_range, first_outside
from torch_tpu.ops.lowerings.indexing import count_true
from torch_tpu.ops.registry import Check, aten, lower, signature_check
from torch_tpu.ops.tensors import from_jax, to_jax
from torch_tpu.runtime import executable_cache

# ---- sorting (also used by median and mode) --------------------------------------


def sort_along(x, axis: int, descending: bool = False):
    """Stable sort along `axis`: (values, int64 indices). NaN sorts as the largest
    value; descending keeps equal elements in their original order."""
    if x.ndim == 0:
        return x, jnp.zeros((), jnp.int64)
    n = x.shape[axis]
    key = x.astype(jnp.uint8) if x.dtype == jnp.bool_ else x
    if descending:
        key = jnp.flip(key, axis)
    iota = lax.broadcasted_iota(jnp.int64, x.shape, axis)
    s, i = lax.sort((key, iota), dimension=axis, is_stable=True, num_keys=1)
    if descending:
        s, i = jnp.flip(s, axis), n - 1 - jnp.flip(i, axis)
    return s.astype(x.dtype), i


@signature_check
def _sort_check(self, *args, stable=None, dim=-1, **kwargs):
    dim_in_range(dim, self.dim())
    if self.is_complex():
        raise RuntimeError("Sort does not support complex dtypes on CPU")


# host_tier=False: CPU's unstable sort orders ties its own way; tpu's sort is always stable.
@lower(aten.sort.stable, check=_sort_check, host_tier=False)
def sort(x, *, stable=None, dim=-1, descending=False):
    return sort_along(x, dim % max(x.ndim, 1), descending)


@lower(aten.topk.default)
def topk(x, k, dim=-1, largest=True, sorted=True):
    if x.ndim == 0:
        return x, jnp.zeros((), jnp.int64)
    axis = dim % x.ndim
    s, i = sort_along(x, axis, descending=largest)
    return lax.slice_in_dim(s, 0, k, axis=axis), lax.slice_in_dim(i, 0, k, axis=axis)


@lower(aten.kthvalue.default)
def kthvalue(x, k, dim=-1, keepdim=False):
    if x.ndim == 0:
        return x, jnp.zeros((), jnp.int64)
    axis = dim % x.ndim
    s, i = sort_along(x, axis)
    v, idx = lax.slice_in_dim(s, k - 1, k, axis=axis), lax.slice_in_dim(i, k - 1, k, axis=axis)
    if not keepdim:
        v, idx = v.squeeze(axis), idx.squeeze(axis)
    return v, idx


def _searchsorted(seq, values, right, sorter, out_int32):
    if sorter is not None:
        seq = jnp.take_along_axis(seq, sorter, axis=-1)
    dtype = jnp.promote_types(seq.dtype, values.dtype)
    seq, values = seq.astype(dtype), values.astype(dtype)
    side = "right" if right else "left"
    if seq.ndim <= 1:
        out = jnp.searchsorted(seq, values, side=side)
    else:
        batch = seq.shape[:-1]
        flat = jax.vmap(lambda s, v: jnp.searchsorted(s, v, side=side))(
            seq.reshape(-1, seq.shape[-1]), values.reshape(-1, values.shape[-1])
        )
        out = flat.reshape(batch + values.shape[-1:])
    return out.astype(jnp.int32 if out_int32 else jnp.int64)


def _value(v, seq):
    """A Scalar `v` compares in the sequence's dtype when that is floating, as on CPU."""
    if isinstance(v, (int, float, bool)) and jnp.issubdtype(seq.dtype, jnp.floating):
        return jnp.asarray(v, seq.dtype)
    return jnp.asarray(v)


_SORTER_MESSAGE = "torch.searchsorted(): sorter index out of range"


def _sorter_host_check(sorted_sequence, *args, sorter=None, **kwargs):
    if isinstance(sorter, torch.Tensor) and sorted_sequence.dim():
        n = sorted_sequence.shape[-1]
        check_ranges([(sorter, 0, n, lambda v: RuntimeError(_SORTER_MESSAGE))])


def _sorter_graph_check(sorted_sequence, *args, sorter=None, **kwargs):
    if sorter is None or not jnp.ndim(sorted_sequence):
        return []
    return first_outside(sorter, 0, jnp.shape(sorted_sequence)[-1], RuntimeError, _SORTER_MESSAGE)


@lower(aten.searchsorted.Tensor, aten.searchsorted.Scalar, check=Check(_sorter_host_check, _sorter_graph_check))
def searchsorted(sorted_sequence, self, *, out_int32=False, right=False, side=None, sorter=None):
    if side not in (None, "left", "right"):
        raise RuntimeError(f"torch.searchsorted(): side can only be 'left' or 'right' but got {side}")
    if right and side == "left":
        raise RuntimeError(
            "torch.searchsorted(): side and right can't be set to opposites, got side of left while right was True"
        )
    return _searchsorted(sorted_sequence, _value(self, sorted_sequence), right or side == "right", sorter, out_int32)


@lower(aten.bucketize.Tensor, aten.bucketize.Scalar)
def bucketize(self, boundaries, *, out_int32=False, right=False):
    if boundaries.ndim != 1:
        raise RuntimeError(f"boundaries tensor must be 1 dimension, but got dim({boundaries.ndim})")
    return _searchsorted(boundaries, _value(self, boundaries), right, None, out_int32)


@lower(aten.isin.Tensor_Tensor, aten.isin.Tensor_Scalar, aten.isin.Scalar_Tensor)
def isin(elements, test_elements, *, assume_unique=False, invert=False):
    x, test = jnp.asarray(elements), jnp.asarray(test_elements)
    dtype = jnp.promote_types(x.dtype, test.dtype)
    x, test = x.astype(dtype), test.astype(dtype).reshape(-1)
    if test.size <= 256:  # compare with every test element
        hit = jnp.any(x[..., None] == test, axis=-1)
    else:  # look each element up in the sorted test elements
        ordered = jnp.sort(test)
        hit = ordered[jnp.clip(jnp.searchsorted(ordered, x), 0, test.size - 1)] == x
    return ~hit if invert else hit


# ---- unique ---------------------------------------------------------------------------
#
# Each one works on "rows": the flattened elements (one-element rows) or, with
# a dim, the slices along it. Step 1 (jitted) orders the rows (sorted, or as
# they are for unique_consecutive) and flags where a new run starts; the number
# of runs comes to the host; step 2 (jitted, static count) gathers the runs.


def _as_rows(x, dim):
    if dim is None:
        return x.reshape(-1, 1)
    moved = jnp.moveaxis(x, dim, 0)
    return moved.reshape(moved.shape[0], -1)


@functools.partial(executable_cache.jit, static_argnames=("dim", "consecutive"))
def _runs(x, dim, consecutive):
    rows = _as_rows(x, dim)
    n = rows.shape[0]
    if consecutive or rows.shape[1] == 0:
        perm = jnp.arange(n, dtype=jnp.int64)
    elif dim is None:
        _, perm = sort_along(rows[:, 0], 0)
    else:
        keys = rows.astype(jnp.uint8) if rows.dtype == jnp.bool_ else rows
        perm = jnp.lexsort(tuple(keys[:, j] for j in reversed(range(rows.shape[1])))).astype(jnp.int64)
    s = rows[perm]
    starts = jnp.concatenate([jnp.ones((min(n, 1),), bool), jnp.any(s[1:] != s[:-1], axis=1)])
    return s, perm, starts


@functools.partial(executable_cache.jit, static_argnames=("count", "dim", "shape"))
def _gather_runs(s, perm, starts, count, dim, shape):
    """(unique values, inverse, counts); `shape` is the input's."""
    group = jnp.cumsum(starts) - 1
    rows = jnp.zeros((count, *s.shape[1:]), s.dtype).at[group].set(s)
    counts = jnp.zeros((count,), jnp.int64).at[group].add(1)
    inverse = jnp.zeros(perm.shape, jnp.int64).at[perm].set(group)
    if dim is None:
        return rows.reshape(count), inverse.reshape(shape), counts
    moved = (shape[dim], *shape[:dim], *shape[dim + 1 :])
    values = jnp.moveaxis(rows.reshape((count, *moved[1:])), 0, dim)
    return values, inverse, counts


def _unique(self: torch.Tensor, dim: int | None, consecutive: bool):
    x = to_jax(self)
    if dim is not None:  # CPU's IndexErrors
        if x.ndim == 0:
            raise IndexError(f"Dimension specified as {dim} but tensor has no dimensions")
        dim_in_range(dim, x.ndim)
        dim %= x.ndim
    metrics.bump("executions", 2)
    s, perm, starts = _runs(x, dim, consecutive)
    count = count_true(starts)
    dev = self.device.index
    return [from_jax(a, dev) for a in _gather_runs(s, perm, starts, count, dim, tuple(x.shape))]


def _empty_long(device: int) -> torch.Tensor:
    return from_jax(jnp.zeros((0,), jnp.int64), device)


def _requested(values, inverse, counts, return_inverse, return_counts):
    dev = values.device.index
    return (
        values,
        inverse if return_inverse else _empty_long(dev),
        counts if return_counts else _empty_long(dev),
    )


@lower(aten._unique2.default, eager=True)
def unique2(self, sorted=True, return_inverse=False, return_counts=False):
    # Always sorted: CPU's sorted=False order is unspecified.
    return _requested(*_unique(self, None, False), return_inverse, return_counts)


@lower(aten.unique_dim.default, eager=True)
def unique_dim(self, dim, sorted=True, return_inverse=False, return_counts=False):
    # CPU returns the inverse and counts whether asked or not.
    return tuple(_unique(self, dim, False))


@lower(aten.unique_consecutive.default, eager=True)
def unique_consecutive(self, return_inverse=False, return_counts=False, dim=None):
    values, inverse, counts = _unique(self, dim, True)
    if dim is not None:
        return values, inverse, counts  # as unique_dim
    return _requested(values, inverse, counts, return_inverse, return_counts)
