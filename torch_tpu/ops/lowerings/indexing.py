"""Indexing, gather/scatter, masks, sorting and unique.

jax clamps (gathers) or drops (scatters) out-of-range indices silently, so every
op that reads an index tensor checks its range on the host first and raises
CPU's error: one small min/max reduction and a two-number transfer per index
tensor (none for CPU index tensors). Those ops are eager lowerings that run the
check and then the op's jitted kernel, `dispatcher.make_kernel` of the plain
jax function below it (so meta still decides shapes, dtypes and shape errors).
That jax function stays reachable as the eager kernel's `jit_lowering`.

Data-dependent shapes (nonzero, masked_select, bool-mask indexing, unique) are
eager: they count on the device, bring the count to the host, and run a jitted
function with that static size.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import torch
from jax import lax

from torch_tpu import metrics
from torch_tpu.ops import dispatcher
from torch_tpu.ops.checks import check_ranges, lower_checked, out_of_bounds, range_check, to_host
from torch_tpu.ops.dtypes import type_name
from torch_tpu.ops.registry import Lowering, aten, lower
from torch_tpu.ops.tensors import from_jax, to_jax, write_jax

_INDEX_DTYPES = (torch.int64, torch.int32, torch.bool, torch.uint8)


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


@lower(aten.sort.stable)
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


@lower(aten.searchsorted.Tensor, aten.searchsorted.Scalar)
def searchsorted(sorted_sequence, self, *, out_int32=False, right=False, side=None, sorter=None):
    return _searchsorted(sorted_sequence, _value(self, sorted_sequence), right or side == "right", sorter, out_int32)


@lower(aten.bucketize.Tensor, aten.bucketize.Scalar)
def bucketize(self, boundaries, *, out_int32=False, right=False):
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


# ---- gather / scatter family ---------------------------------------------------------


def _at_least_1d(*arrays):
    return [a.reshape(1) if a is not None and jnp.ndim(a) == 0 else a for a in arrays]


def _scatter_index(index, axis):
    """Full coordinates for scattering along `axis` at `index`."""
    return tuple(index if d == axis else lax.broadcasted_iota(jnp.int64, index.shape, d) for d in range(index.ndim))


def _crop(src, shape):
    return src[tuple(slice(0, n) for n in shape)]


@lower_checked(aten.gather.default, range_check(False, out_of_bounds))
def gather(x, dim, index, *, sparse_grad=False):
    shape = index.shape
    x, index = _at_least_1d(x, index)
    axis = dim % x.ndim
    cropped = x[tuple(slice(None) if d == axis else slice(0, index.shape[d]) for d in range(x.ndim))]
    return jnp.take_along_axis(cropped, index, axis=axis).reshape(shape)


def _scatter(x, dim, index, src, how: str):
    shape = x.shape
    x, index = _at_least_1d(x, index)
    axis = dim % x.ndim
    src = jnp.asarray(src).astype(x.dtype)
    if src.ndim > 0:
        src = _crop(src.reshape(-1) if src.ndim != index.ndim else src, index.shape)
    ref = x.at[_scatter_index(index, axis)]
    if how == "set":
        out = ref.set(src)
    elif how in ("add", "sum"):
        out = ref.add(src) if x.dtype != jnp.bool_ else ref.max(src)
    elif how in ("multiply", "prod"):
        out = ref.mul(src) if x.dtype != jnp.bool_ else ref.min(src)
    elif how == "amax":
        out = ref.max(src)
    else:
        out = ref.min(src)
    return out.reshape(shape)


_scatter_check = range_check(False, out_of_bounds)


@lower_checked(aten.scatter.src, _scatter_check)
def scatter_src(x, dim, index, src):
    return _scatter(x, dim, index, src, "set")


@lower_checked(aten.scatter.value, _scatter_check)
def scatter_value(x, dim, index, value):
    return _scatter(x, dim, index, value, "set")


@lower_checked(aten.scatter.reduce, _scatter_check)
def scatter_reduce_legacy(x, dim, index, src, *, reduce):
    return _scatter(x, dim, index, src, reduce)


@lower_checked(aten.scatter.value_reduce, _scatter_check)
def scatter_value_reduce(x, dim, index, value, *, reduce):
    return _scatter(x, dim, index, value, reduce)


@lower_checked(aten.scatter_add.default, _scatter_check)
def scatter_add(x, dim, index, src):
    return _scatter(x, dim, index, src, "add")


def _identity(reduce: str, dtype):
    if reduce in ("sum", "mean"):
        return jnp.zeros((), dtype)
    if reduce == "prod":
        return jnp.ones((), dtype)
    if jnp.issubdtype(dtype, jnp.floating):
        return jnp.array(-jnp.inf if reduce == "amax" else jnp.inf, dtype)
    info = jnp.iinfo(dtype) if dtype != jnp.bool_ else None
    if info is None:
        return jnp.array(reduce != "amax", dtype)
    return jnp.array(info.min if reduce == "amax" else info.max, dtype)


@lower_checked(aten.scatter_reduce.two, _scatter_check)
def scatter_reduce(x, dim, index, src, reduce, *, include_self=True):
    shape = x.shape
    x, index, src = _at_least_1d(x, index, src)
    axis = dim % x.ndim
    coords = _scatter_index(index, axis)
    src = _crop(src, index.shape).astype(x.dtype)
    start = x if include_self else x.at[coords].set(_identity(reduce, x.dtype))
    if reduce == "mean":
        hits = jnp.zeros(x.shape, jnp.int64).at[coords].add(1)
        total = start.at[coords].add(src)
        count = hits + (1 if include_self else 0)
        if jnp.issubdtype(x.dtype, jnp.inexact):
            mean = total / jnp.maximum(count, 1).astype(x.dtype)
        else:
            mean = jnp.floor_divide(total, jnp.maximum(count, 1).astype(x.dtype))
        out = jnp.where(hits > 0, mean, x)
    else:
        out = _scatter(start, axis, index, src, reduce)
    return out.reshape(shape)


@lower_checked(aten.index_reduce.default, range_check(False, out_of_bounds))
def index_reduce(x, dim, index, source, reduce, *, include_self=True):
    """scatter_reduce along `dim` with one index per slice."""
    shape = x.shape
    x, source = _at_least_1d(x, source)
    axis = dim % x.ndim
    index = index.reshape(-1)
    full = lax.broadcast_in_dim(index, source.shape, (axis,))
    return scatter_reduce(x, axis, full, source, reduce, include_self=include_self).reshape(shape)


def _along(axis: int, index):
    return (slice(None),) * axis + (index.reshape(-1),)


@lower_checked(
    aten.index_select.default,
    range_check(False, lambda v, d, s: IndexError("index out of range in self")),
)
def index_select(x, dim, index):
    if x.ndim == 0:
        return jnp.take(x.reshape(1), index.reshape(-1), axis=0).reshape(())
    return jnp.take(x, index.reshape(-1), axis=dim % x.ndim)


def _index_update(x, dim, index, value, how):
    shape = x.shape
    (x,) = _at_least_1d(x)
    axis = dim % x.ndim
    ref = x.at[_along(axis, index)]
    value = jnp.asarray(value).astype(x.dtype)
    if value.ndim:
        value = value.reshape((*x.shape[:axis], index.size, *x.shape[axis + 1 :]))
    if how == "set":
        return ref.set(value).reshape(shape)
    return (ref.max(value) if x.dtype == jnp.bool_ else ref.add(value)).reshape(shape)


@lower_checked(aten.index_add.default, range_check(False, out_of_bounds))
def index_add(x, dim, index, source, *, alpha=1):
    if alpha != 1:
        source = source * alpha
    return _index_update(x, dim, index, source, "add")


@lower_checked(
    aten.index_copy.default,
    range_check(
        False, lambda v, d, s: IndexError(f"index_copy_(): index {v} is out of bounds for dimension {d} with size {s}")
    ),
)
def index_copy(x, dim, index, source):
    return _index_update(x, dim, index, source, "set")


_index_fill_check = range_check(
    True, lambda v, d, s: IndexError(f"index {v} is out of bounds for dimension {d} with size {s}")
)


@lower_checked(aten.index_fill.int_Scalar, _index_fill_check)
def index_fill(x, dim, index, value):
    return _index_update(x, dim, index, value, "set")


def _index_fill_tensor_check(self, dim, index, value, *args, **kwargs):
    _index_fill_check(self, dim, index)
    if value.device.type == "cpu" and self.device.type == "tpu":
        # meta rejects a CPU value tensor; CUDA-style, it is a scalar.
        return (self, dim, index, value.to(self.device), *args), kwargs
    return None


@lower_checked(aten.index_fill.int_Tensor, _index_fill_tensor_check)
def index_fill_tensor(x, dim, index, value):
    return _index_update(x, dim, index, jnp.asarray(value).reshape(()), "set")


def _take_check(self, index, *args, **kwargs):
    n = self.numel()
    check_ranges(
        [(index, -n, n, lambda v: IndexError(f"out of range: tried to access index {v} on a tensor of {n} elements."))]
    )


@lower_checked(aten.take.default, _take_check)
def take(x, index):
    return x.reshape(-1)[index]


def _put_check(self, index, source, *args, **kwargs):
    _take_check(self, index)


@lower_checked(aten.put.default, _put_check)
def put(x, index, source, accumulate=False):
    flat = x.reshape(-1)
    src = source.reshape(-1).astype(x.dtype)
    ref = flat.at[index.reshape(-1)]
    return (ref.add(src) if accumulate else ref.set(src)).reshape(x.shape)


# ---- nonzero and masks ---------------------------------------------------------------


@functools.partial(jax.jit, static_argnames=("shape",))
def _count(x, shape=None):
    if shape is not None:
        x = jnp.broadcast_to(x, shape)
    return jnp.sum(x != 0, dtype=jnp.int64)


def _count_true(x, shape: tuple[int, ...] | None = None) -> int:
    """The number of nonzero elements of `x` (broadcast to `shape`): one sync."""
    metrics.bump("executions")
    return int(to_host(_count(x, shape)))


@functools.partial(jax.jit, static_argnames=("size",))
def _nonzero(x, size):
    if x.ndim == 0:
        return jnp.zeros((size, 0), jnp.int64)
    coords = jnp.nonzero(x != 0, size=size)
    return jnp.stack(coords, axis=1).astype(jnp.int64)


def _nonzero_of(t: torch.Tensor) -> torch.Tensor:
    x = to_jax(t)
    size = _count_true(x)
    metrics.bump("executions")
    return from_jax(_nonzero(x, size), t.device.index)


@lower(aten.nonzero.default, eager=True)
def nonzero(self):
    return _nonzero_of(self)


@lower(aten.nonzero_static.default)
def nonzero_static(x, *, size, fill_value=-1):
    if x.ndim == 0:
        return jnp.full((size, 0), fill_value, jnp.int64)
    coords = jnp.nonzero(x != 0, size=size, fill_value=fill_value)
    return jnp.stack(coords, axis=1).astype(jnp.int64)


def _same_device(self: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
    if other.device == self.device:
        return other
    if other.device.type == "cpu" and other.dim() == 0:
        return other.to(self.device)
    raise RuntimeError(
        "Expected all tensors to be on the same device, but found at least two devices, "
        f"{self.device} and {other.device}!"
    )


@functools.partial(jax.jit, static_argnames=("shape", "size"))
def _masked_select(x, mask, shape, size):
    flat = jnp.broadcast_to(x, shape).reshape(-1)
    keep = jnp.broadcast_to(mask, shape).reshape(-1)
    return flat[jnp.nonzero(keep, size=size)[0]]


@lower(aten.masked_select.default, eager=True)
def masked_select(self, mask):
    if mask.dtype != torch.bool:
        raise RuntimeError("masked_select: expected BoolTensor for mask")
    mask = _same_device(self, mask)
    shape = tuple(torch.broadcast_shapes(self.shape, mask.shape))
    x, m = to_jax(self), to_jax(mask)
    size = _count_true(m, shape)
    metrics.bump("executions")
    return from_jax(_masked_select(x, m, shape, size), self.device.index)


def _masked_scatter(x, mask, source):
    keep = jnp.broadcast_to(mask, x.shape).reshape(-1)
    src = source.reshape(-1)
    if src.size == 0:
        return x
    pos = jnp.clip(jnp.cumsum(keep) - 1, 0, src.size - 1)
    return jnp.where(keep, src[pos].astype(x.dtype), x.reshape(-1)).reshape(x.shape)


_masked_scatter_kernel = dispatcher.make_kernel(aten.masked_scatter_.default, Lowering(_masked_scatter), False)


@lower(aten.masked_scatter_.default, eager=True)
def masked_scatter_(self, mask, source):
    if mask.dtype != torch.bool:
        dtype = type_name(mask.dtype)
        raise RuntimeError(f"masked_scatter_ only supports boolean masks, but got mask with dtype {dtype}")
    if source.numel() < self.numel() and mask.dtype == torch.bool:
        mask = _same_device(self, mask)
        shape = tuple(torch.broadcast_shapes(self.shape, mask.shape))
        if _count_true(to_jax(mask), shape) > source.numel():
            raise RuntimeError("Number of elements of source < number of ones in mask")
    return _masked_scatter_kernel(self, mask, source)


# ---- advanced indexing: index.Tensor, _index_put_impl_ -----------------------------


def _prepare_indices(self: torch.Tensor, indices) -> list:
    """CPU's expandTensors: bool/byte masks become their nonzero() coordinates,
    CPU index tensors move to the device, and integer indices are range-checked."""
    if self.device.type != "tpu":
        raise RuntimeError(
            f"indices should be either on cpu or on the same device as the indexed tensor ({self.device})"
        )
    out: list = []
    from_mask: set[int] = set()
    for idx in indices:
        if idx is None:
            out.append(None)
            continue
        if idx.dtype not in _INDEX_DTYPES:
            raise IndexError("tensors used as indices must be long, int, byte or bool tensors")
        if idx.dtype in (torch.bool, torch.uint8):
            for j, size in enumerate(idx.shape):
                src = len(out) + j
                if src >= self.dim():
                    raise IndexError(f"too many indices for tensor of dimension {self.dim()}")
                if size != self.shape[src]:
                    raise IndexError(
                        f"The shape of the mask {list(idx.shape)} at index {j} does not match the shape of the "
                        f"indexed tensor {list(self.shape)} at index {src}"
                    )
            coords = idx.nonzero() if idx.device.type == "cpu" else _nonzero_of(idx)
            for j in range(idx.dim()):
                from_mask.add(len(out))
                out.append(coords[:, j])
        else:
            out.append(idx)
    if len(out) > self.dim():
        raise IndexError(f"too many indices for tensor of dimension {self.dim()}")
    tensors = [t for t in out if t is not None]
    try:
        torch.broadcast_shapes(*(t.shape for t in tensors))
    except RuntimeError:
        shapes = ", ".join(str(list(t.shape)) for t in tensors)
        raise IndexError(
            f"shape mismatch: indexing tensors could not be broadcast together with shapes {shapes}"
        ) from None
    checks = []
    for d, t in enumerate(out):
        if t is not None and d not in from_mask:
            # CPU's message counts dimensions among the index tensors only.
            k = sum(u is not None for u in out[:d])
            size = self.shape[d]
            checks.append(
                (
                    t,
                    -size,
                    size,
                    lambda v, k=k, size=size: IndexError(
                        f"index {v} is out of bounds for dimension {k} with size {size}"
                    ),
                )
            )
    check_ranges(checks)
    return [t if t is None or t.device == self.device else t.to(self.device) for t in out]


def _index(x, indices):
    return x[tuple(slice(None) if i is None else i for i in indices)]


_index_kernel = dispatcher.make_kernel(aten.index.Tensor, Lowering(_index), False)


@lower(aten.index.Tensor, eager=True)
def index(self, indices):
    return _index_kernel(self, _prepare_indices(self, indices))


index.jit_lowering = _index  # integer indices only, unchecked


def _index_put(x, indices, values, accumulate=False, unsafe=False):
    ref = x.at[tuple(slice(None) if i is None else i for i in indices)]
    values = jnp.asarray(values).astype(x.dtype)
    if not accumulate:
        return ref.set(values)
    return ref.max(values) if x.dtype == jnp.bool_ else ref.add(values)


_index_put_kernel = dispatcher.make_kernel(aten._index_put_impl_.default, Lowering(_index_put), False)


@functools.partial(jax.jit, static_argnames=("lead", "accumulate"))
def _mask_put(x, mask, value, lead, accumulate):
    m = mask.reshape((1,) * lead + mask.shape + (1,) * (x.ndim - lead - mask.ndim)) != 0
    value = value.reshape(()).astype(x.dtype)
    if accumulate:
        return x | m & value if x.dtype == jnp.bool_ else x + jnp.where(m, value, jnp.zeros((), x.dtype))
    return jnp.where(m, value, x)


_meta_checked: set = set()


def _meta_check(self, indices, values, accumulate) -> None:
    """The meta pass of _index_put_impl_ for the sync-free mask path (once per signature)."""
    key = (
        self.shape,
        self.dtype,
        tuple(None if i is None else (i.shape, i.dtype) for i in indices),
        values.shape,
        values.dtype,
        values.device.type,
        accumulate,
    )
    if key in _meta_checked:
        return
    meta = [None if i is None else torch.empty(i.shape, dtype=i.dtype, device="meta") for i in indices]
    v = values if values.device.type == "cpu" else torch.empty(values.shape, dtype=values.dtype, device="meta")
    aten._index_put_impl_(torch.empty(self.shape, dtype=self.dtype, device="meta"), meta, v, accumulate)
    _meta_checked.add(key)


def _is_mask_put(self: torch.Tensor, indices, values: torch.Tensor) -> bool:
    """One bool mask on the device, matching self's dims where it sits, and a
    one-element value that broadcasts to x[mask]'s shape."""
    found = [(d, i) for d, i in enumerate(indices) if i is not None]
    if len(found) != 1 or values.numel() != 1:
        return False
    d, mask = found[0]
    if mask.dtype != torch.bool or mask.device != self.device or d + mask.dim() > self.dim():
        return False
    result_dims = self.dim() - mask.dim() + 1
    return tuple(mask.shape) == tuple(self.shape[d : d + mask.dim()]) and values.dim() <= result_dims


@lower(aten._index_put_impl_.default, eager=True)
def index_put_impl_(self, indices, values, accumulate=False, unsafe=False):
    masks = [i for i in indices if i is not None]
    # CPU's masked_fill shortcut (one mask, a CPU scalar value) casts the value.
    masked_fill = (
        not accumulate
        and values.numel() == 1
        and values.device.type == "cpu"
        and len(masks) == 1
        and masks[0].dtype in (torch.bool, torch.uint8)
        and masks[0].device == self.device
    )
    if values.dtype != self.dtype and not masked_fill:
        raise RuntimeError(
            "Index put requires the source and destination dtypes match, got "
            f"{type_name(self.dtype)} for the destination and {type_name(values.dtype)} for the source."
        )
    if _is_mask_put(self, indices, values):
        # x[mask] = scalar: a select, no host sync.
        _meta_check(self, indices, values, accumulate)
        d, mask = next((d, i) for d, i in enumerate(indices) if i is not None)
        value = to_jax(values) if values.device.type == "tpu" else jnp.asarray(values.item())
        metrics.bump("executions")
        write_jax(self, _mask_put(to_jax(self), to_jax(mask), value, d, accumulate))
        return self
    return _index_put_kernel(self, _prepare_indices(self, indices), values, accumulate, unsafe)


index_put_impl_.jit_lowering = _index_put


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


@functools.partial(jax.jit, static_argnames=("dim", "consecutive"))
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


@functools.partial(jax.jit, static_argnames=("count", "dim", "shape"))
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
    if dim is not None:
        dim %= max(x.ndim, 1)
        if x.ndim == 0:
            x, dim = x.reshape(1), None
    metrics.bump("executions", 2)
    s, perm, starts = _runs(x, dim, consecutive)
    count = _count_true(starts)
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
