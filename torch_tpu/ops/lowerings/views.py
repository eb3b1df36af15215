"""Graph-only lowerings: ops that eager tpu runs without a jax function.

Eager views (view, transpose, slice, ...) are metadata kernels in C++, and a
few ops (`copy`, `index_put`) decompose or run as eager Python kernels. Inside a compiled
graph every value is a jax array, so these become plain jax functions on
values. Each receives the node's fake result (`out`, for its dtype: its
shape may be symbolic) first, then the node's own arguments, sizes concrete.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jax import lax

from torch_tpu.ops import geometry as geo
from torch_tpu.ops.dtypes import TORCH_TO_NUMPY
from torch_tpu.ops.lowerings import indexing
from torch_tpu.ops.promotion import cast
from torch_tpu.ops.registry import Check, aten, lower


def _dim(d: int, ndim: int) -> int:
    return d + ndim if d < 0 else d


@lower(aten.view.default, aten._unsafe_view.default, aten.reshape.default, aten.view_copy.default, graph_only=True)
def view(out, x, size):
    return jnp.reshape(x, tuple(size))


@lower(aten._reshape_alias.default, graph_only=True)
def reshape_alias(out, x, size, stride):
    return jnp.reshape(x, tuple(size))


@lower(aten.t.default, aten.t_copy.default, graph_only=True)
def t(out, x):
    return x.T if x.ndim == 2 else x


@lower(aten.transpose.int, aten.transpose_copy.int, graph_only=True)
def transpose(out, x, dim0, dim1):
    if x.ndim == 0:
        return x
    return jnp.swapaxes(x, _dim(dim0, x.ndim), _dim(dim1, x.ndim))


@lower(aten.permute.default, aten.permute_copy.default, graph_only=True)
def permute(out, x, dims):
    return jnp.transpose(x, tuple(_dim(d, x.ndim) for d in dims))


@lower(aten.expand.default, aten.expand_copy.default, graph_only=True)
def expand(out, x, size, *, implicit=False):
    lead = len(size) - x.ndim
    return jnp.broadcast_to(x, tuple(x.shape[i - lead] if s == -1 else s for i, s in enumerate(size)))


@lower(aten.slice.Tensor, aten.slice_copy.Tensor, graph_only=True)
def slice_(out, x, dim=0, start=None, end=None, step=1):
    dim = _dim(dim, x.ndim)
    n = x.shape[dim]
    start = 0 if start is None else start
    end = n if end is None else end
    start = min(max(start + n if start < 0 else start, 0), n)
    end = min(max(end + n if end < 0 else end, start), n)
    index = [slice(None)] * x.ndim
    index[dim] = slice(start, end, step)
    return x[tuple(index)]


@lower(aten.select.int, aten.select_copy.int, graph_only=True)
def select(out, x, dim, index):
    dim = _dim(dim, x.ndim)
    return lax.index_in_dim(x, index + x.shape[dim] if index < 0 else index, dim, keepdims=False)


@lower(aten.unsqueeze.default, aten.unsqueeze_copy.default, graph_only=True)
def unsqueeze(out, x, dim):
    return jnp.expand_dims(x, dim + x.ndim + 1 if dim < 0 else dim)


@lower(aten.squeeze.default, aten.squeeze.dim, aten.squeeze.dims, aten.squeeze_copy.dim, graph_only=True)
def squeeze(out, x, dim=None):
    if dim is None:
        dims = range(x.ndim)
    else:
        dims = {_dim(d, x.ndim) for d in (dim if isinstance(dim, (list, tuple)) else [dim])}
    return jnp.squeeze(x, tuple(d for d in dims if x.shape[d] == 1)) if x.ndim else x


@lower(aten.split.Tensor, aten.split_with_sizes.default, aten.split_copy.Tensor, graph_only=True)
def split(out, x, split_size, dim=0):
    dim = _dim(dim, x.ndim)
    n = x.shape[dim]
    if isinstance(split_size, (list, tuple)):
        sizes = list(split_size)
    else:
        sizes = [min(split_size, n - s) for s in range(0, n, split_size)] if split_size else [n]
    pieces, start = [], 0
    for size in sizes:
        pieces.append(lax.slice_in_dim(x, start, start + size, axis=dim))
        start += size
    return pieces


@lower(aten.unbind.int, aten.unbind_copy.int, graph_only=True)
def unbind(out, x, dim=0):
    dim = _dim(dim, x.ndim)
    return [lax.index_in_dim(x, i, dim, keepdims=False) for i in range(x.shape[dim])]


@lower(aten.diagonal.default, aten.diagonal_copy.default, graph_only=True)
def diagonal(out, x, offset=0, dim1=0, dim2=1):
    return jnp.diagonal(x, offset, _dim(dim1, x.ndim), _dim(dim2, x.ndim))


@lower(
    aten.alias.default,
    aten.alias_copy.default,
    aten.detach.default,
    aten.detach_copy.default,
    aten.lift_fresh.default,
    aten.lift_fresh_copy.default,
    graph_only=True,
)
def alias(out, x):
    return x


@lower(aten.as_strided.default, aten.as_strided_copy.default, graph_only=True)
def as_strided(out, x, size, stride, storage_offset=None):
    """Reads x as a contiguous storage (what functionalized graphs give it)."""
    dtype = x.dtype
    g = geo.Geometry(tuple(size), tuple(stride), storage_offset or 0, dtype, dtype, (math.prod(x.shape),))
    return geo.read(jnp.reshape(x, (-1,)), g)


@lower(aten.copy.default, graph_only=True)
def copy(out, dst, src, non_blocking=False):
    return jnp.broadcast_to(cast(jnp.asarray(src), dst.dtype), dst.shape)


@lower(aten.empty.memory_format, aten.empty_strided.default, graph_only=True)
def empty(out, size, *args, **kwargs):
    return jnp.zeros(tuple(size), TORCH_TO_NUMPY[out.dtype])


@lower(aten.new_empty.default, aten.new_empty_strided.default, graph_only=True)
def new_empty(out, x, size, *args, **kwargs):
    return jnp.zeros(tuple(size), TORCH_TO_NUMPY[out.dtype])


@lower(aten.full_like.default, graph_only=True)
def full_like(out, x, fill_value, **kwargs):
    return jnp.full(x.shape, fill_value, TORCH_TO_NUMPY[out.dtype])


@lower(aten.rand_like.default, random=True, graph_only=True)
def rand_like(out, x, *, rng, **kwargs):
    return jax.random.uniform(rng, x.shape, TORCH_TO_NUMPY[out.dtype])


@lower(aten.randn_like.default, random=True, graph_only=True)
def randn_like(out, x, *, rng, **kwargs):
    return jax.random.normal(rng, x.shape, TORCH_TO_NUMPY[out.dtype])


def _index_put_failures(out, x, indices, values, accumulate=False):
    return indexing.index_failures(x, indices)


@lower(aten.index_put.default, graph_only=True, check=Check(graph=_index_put_failures))
def index_put(out, x, indices, values, accumulate=False):
    """Integer indices only (the graph compiler runs bool masks eagerly)."""
    return indexing.put_values(x, indices, values, accumulate)


@lower(aten.sym_size.int, graph_only=True)
def sym_size(out, x, dim):
    return x.shape[dim]


@lower(aten.sym_numel.default, graph_only=True)
def sym_numel(out, x):
    return math.prod(x.shape)


@lower(aten._assert_tensor_metadata.default, aten._assert_scalar.default, graph_only=True)
def no_op(out, *args, **kwargs):
    return None
