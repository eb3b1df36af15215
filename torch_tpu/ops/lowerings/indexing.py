"""Indexing: gather/scatter, masks and advanced indexing (index.Tensor, index_put).

jax clamps (gathers) or drops (scatters) out-of-range indices silently, so every
op that reads an index tensor checks its range on the host first and raises
CPU's error: one small min/max reduction and a two-number transfer per index
tensor (none for CPU index tensors): the `check=` of each op's `lower(...)` line.
Each check also has a graph form (`checks.range_check`, `registry.Check`): compiled graphs
compute it inside the executable and raise the same error after it runs.

Data-dependent shapes (nonzero, masked_select, bool-mask indexing, unique) are
eager: they count on the device, bring the count to the host, and run a jitted
function with that static size; nonzero, masked_select and `x[mask]` at the count's length
bucket (ops/growing.py: one executable for every count in it), with positions in int32.
"""

from __future__ import annotations

import functools
import warnings

import jax.numpy as jnp
import torch
from jax import lax
from torch._prims_common import alert_not_deterministic

from torch_tpu import metrics
from torch_tpu.ops import dispatcher, growing
from torch_tpu.ops.checks import Failure, check_ranges, first_outside, range_check, to_host
from torch_tpu.ops.dtypes import narrow_indices, type_name
from torch_tpu.ops.promotion import cast
from torch_tpu.ops.registry import Check, Lowering, aten, lower
from torch_tpu.ops.tensors import from_jax, to_jax, write_jax
from torch_tpu.runtime import executable_cache

_INDEX_DTYPES = (torch.int64, torch.int32, torch.bool, torch.uint8)


# ---- gather / scatter family ---------------------------------------------------------


def _at_least_1d(*arrays):
    return [a.reshape(1) if a is not None and jnp.ndim(a) == 0 else a for a in arrays]


def _scatter_index(index, axis):
    """Full coordinates for scattering along `axis` at `index` (in index's dtype)."""
    return tuple(index if d == axis else lax.broadcasted_iota(index.dtype, index.shape, d) for d in range(index.ndim))


def _crop(src, shape):
    return src[tuple(slice(0, n) for n in shape)]


@lower(aten.gather.default, check=range_check(False))
def gather(x, dim, index, *, sparse_grad=False):
    shape = index.shape
    x, index = _at_least_1d(x, index)
    axis = dim % x.ndim
    cropped = x[tuple(slice(None) if d == axis else slice(0, index.shape[d]) for d in range(x.ndim))]
    return jnp.take_along_axis(cropped, narrow_indices(index, x.shape[axis]), axis=axis).reshape(shape)


def _scatter(x, dim, index, src, how: str):
    shape = x.shape
    x, index = _at_least_1d(x, index)
    axis = dim % x.ndim
    index = narrow_indices(index, max(x.shape))  # its iota coordinates of the other dims too
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


_scatter_check = range_check(False)


@lower(aten.scatter.src, check=_scatter_check, apart_from=("index", "src"))
def scatter_src(x, dim, index, src):
    return _scatter(x, dim, index, src, "set")


@lower(aten.scatter.value, check=_scatter_check, traced=("value",), apart_from=("index",))
def scatter_value(x, dim, index, value):
    return _scatter(x, dim, index, value, "set")


@lower(aten.scatter.reduce, check=_scatter_check, apart_from=("index", "src"))
def scatter_reduce_legacy(x, dim, index, src, *, reduce):
    return _scatter(x, dim, index, src, reduce)


@lower(aten.scatter.value_reduce, check=_scatter_check, traced=("value",), apart_from=("index",))
def scatter_value_reduce(x, dim, index, value, *, reduce):
    return _scatter(x, dim, index, value, reduce)


@lower(aten.scatter_add.default, check=_scatter_check, apart_from=("index", "src"))
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


@lower(aten.scatter_reduce.two, check=_scatter_check, apart_from=("index", "src"))
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


def _argument_checks(pre, check: Check) -> Check:
    """`check` (a range check) after `pre`, a host check of the arguments' dtypes and shapes."""

    def host(*args, **kwargs):
        pre(*args, **kwargs)
        return check.host(*args, **kwargs)

    return Check(host, check.graph)


def _index_dtype(self, dim, index, *args, op: str, error=RuntimeError, message: str, dtypes=(torch.int64, torch.int32)):
    if isinstance(index, torch.Tensor) and index.dtype not in dtypes:
        raise error(message.format(op=op, dtype=type_name(index.dtype)))


def _source_like_self(self, dim, index, source, op: str) -> None:
    """index_add/index_copy: source is self with dim resized to the index length, same dtype."""
    if not isinstance(source, torch.Tensor) or self.dim() == 0:
        return
    if source.dtype != self.dtype:
        raise RuntimeError(
            f"{op}(): self and source expected to have the same dtype, but got (self) "
            f"{type_name(self.dtype)} and (source) {type_name(source.dtype)}"
        )
    d = dim % self.dim()
    want = [*self.shape[:d], index.numel(), *self.shape[d + 1 :]]
    if source.dim() and list(source.shape) != want:
        raise RuntimeError(
            "source tensor shape must match self tensor shape, excluding the specified dimension. "
            f"Got self.shape = {list(self.shape)} source.shape = {list(source.shape)}"
        )


def _index_add_args(self, dim, index, source, *args, **kwargs):
    _index_dtype(
        self, dim, index, op="index_add_", message="{op}(): Expected dtype int32/int64 for index but got: {dtype}"
    )
    _source_like_self(self, dim, index, source, "index_add_")


def _index_copy_args(self, dim, index, source, *args, **kwargs):
    _index_dtype(
        self,
        dim,
        index,
        op="index_copy_",
        message="{op}(): Expected a long tensor for index, but got {dtype}",
        dtypes=(torch.int64,),
    )
    _source_like_self(self, dim, index, source, "index_copy_")


def _index_fill_args(self, dim, index, *args, **kwargs):
    _index_dtype(
        self,
        dim,
        index,
        op="index_fill_",
        error=IndexError,
        message="{op}(): Expected dtype int64 for index.",
        dtypes=(torch.int64,),
    )


def _index_select_args(self, dim, index, *args, **kwargs):
    _index_dtype(self, dim, index, op="index_select", message="{op}(): Expected dtype int32 or int64 for index")
    if isinstance(index, torch.Tensor) and index.dim() > 1:
        raise IndexError("index_select(): Index is supposed to be a vector")


@lower(aten.index_reduce.default, check=range_check(False, IndexError, "index out of range in self"))
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


@lower(
    aten.index_select.default,
    check=_argument_checks(_index_select_args, range_check(False, IndexError, "index out of range in self")),
)
def index_select(x, dim, index):
    # the check has ranged the indices: "clip" clamps them, no fill (a select over the whole result)
    flat = x.reshape(1) if x.ndim == 0 else x
    axis = dim % flat.ndim
    out = jnp.take(flat, narrow_indices(index.reshape(-1), flat.shape[axis]), axis=axis, mode="clip")
    return out.reshape(()) if x.ndim == 0 else out


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


def _integer_alpha(check: Check) -> Check:
    """CPU truncates a float alpha for an integer self (meta would raise): the call continues with int(alpha)."""

    def host(self, *args, **kwargs):
        alpha = kwargs.get("alpha")
        if isinstance(alpha, float) and not (self.is_floating_point() or self.is_complex() or self.dtype == torch.bool):
            kwargs = {**kwargs, "alpha": int(alpha)}
        replaced = check.host(self, *args, **kwargs)
        return ((self, *args), kwargs) if replaced is None else replaced

    return Check(host, check.graph)


@lower(
    aten.index_add.default,
    apart_from=("index", "source"),
    check=_integer_alpha(_argument_checks(_index_add_args, range_check(False))),
    traced=("alpha",),
)
def index_add(x, dim, index, source, *, alpha=1):
    if not isinstance(alpha, int) or alpha != 1:  # CPU's alpha.to<scalar_t>() times each source value
        source = source * cast(alpha, source.dtype)
    return _index_update(x, dim, index, source, "add")


@lower(
    aten.index_copy.default,
    apart_from=("index", "source"),
    check=_argument_checks(
        _index_copy_args,
        range_check(
            False, IndexError, "index_copy_(): index {value} is out of bounds for dimension {dim} with size {size}"
        ),
    ),
)
def index_copy(x, dim, index, source):
    return _index_update(x, dim, index, source, "set")


_index_fill_check = _argument_checks(_index_fill_args, range_check(True, IndexError))


def _index_fill_scalar_host_check(self, dim, index, value, *args, **kwargs):
    if isinstance(value, complex) and not self.is_complex():
        raise RuntimeError("index_fill_(): Converting complex Scalar to non-complex type is not supported")
    _index_fill_check.host(self, dim, index)


@lower(
    aten.index_fill.int_Scalar,
    check=Check(_index_fill_scalar_host_check, _index_fill_check.graph),
    apart_from=("index",),
    traced=("value",),
)
def index_fill(x, dim, index, value):
    return _index_update(x, dim, index, value, "set")


def _index_fill_tensor_host_check(self, dim, index, value, *args, **kwargs):
    _index_fill_check.host(self, dim, index)
    if value.device.type == "cpu" and self.device.type == "tpu":
        # meta rejects a CPU value tensor; CUDA-style, it is a scalar.
        return (self, dim, index, value.to(self.device), *args), kwargs
    return None


@lower(
    aten.index_fill.int_Tensor,
    check=Check(_index_fill_tensor_host_check, _index_fill_check.graph),
    apart_from=("index",),
)
def index_fill_tensor(x, dim, index, value):
    return _index_update(x, dim, index, jnp.asarray(value).reshape(()), "set")


_TAKE_MESSAGE = "out of range: tried to access index {value} on a tensor of {n} elements."


def _take_host_check(self, index, *args, **kwargs):
    n = self.numel()
    check_ranges([(index, -n, n, lambda v: IndexError(_TAKE_MESSAGE.format(value=v, n=n)))])


def _take_graph_check(x, index, *args, **kwargs) -> list[Failure]:
    n = x.size
    return first_outside(index, -n, n, IndexError, _TAKE_MESSAGE.replace("{n}", str(n)))


_take_check = Check(_take_host_check, _take_graph_check)


def _put_host_check(self, index, source, accumulate=False):
    if not accumulate:  # duplicate indices: which write lands is unspecified (CPU alerts too)
        alert_not_deterministic("put_")
    _take_host_check(self, index)


_put_check = Check(_put_host_check, _take_graph_check)


@lower(aten.take.default, check=_take_check)
def take(x, index):
    return x.reshape(-1)[index]


@lower(aten.put.default, check=_put_check, apart_from=("index", "source"))
def put(x, index, source, accumulate=False):
    flat = x.reshape(-1)
    src = source.reshape(-1).astype(x.dtype)
    ref = flat.at[index.reshape(-1)]
    if not accumulate:
        return ref.set(src).reshape(x.shape)
    return (ref.max(src) if x.dtype == jnp.bool_ else ref.add(src)).reshape(x.shape)  # bool: logical or


# ---- nonzero and masks ---------------------------------------------------------------


@functools.partial(executable_cache.jit, static_argnames=("shape",))
def _count(x, shape=None):
    if shape is not None:
        x = jnp.broadcast_to(x, shape)
    return jnp.sum(x != 0, dtype=jnp.int64)


def count_true(x, shape: tuple[int, ...] | None = None) -> int:
    """The number of nonzero elements of `x` (broadcast to `shape`): one sync."""
    metrics.bump("executions")
    return int(to_host(_count(x, shape)))


# Flat positions fit int32 below this many elements: TPU has no 64-bit units, and int64 cumsums
# and scatters are emulated there.
_INT32_POSITIONS = 2**31 - 1


def _true_positions(keep, size: int):
    """The flat positions of the true elements of bool vector `keep`, in order, `size` of them
    (past the count: keep.size), in int32 where they fit, else as jnp.nonzero gives them."""
    n = keep.size
    if n >= _INT32_POSITIONS:
        return jnp.nonzero(keep, size=size, fill_value=n)[0]
    rank = jnp.cumsum(keep, dtype=jnp.int32) - 1
    slot = jnp.where(keep, rank, size)  # past the end: dropped
    return jnp.full((size,), n, jnp.int32).at[slot].set(jnp.arange(n, dtype=jnp.int32), mode="drop")


def _coordinates(x, size: int, fill_value=None):
    """[size, x.ndim] int64: the coordinates of x's nonzero elements in row-major order, the rows
    past the count `fill_value` (None: unspecified)."""
    pos = _true_positions((x != 0).reshape(-1), size)
    coords = jnp.stack(jnp.unravel_index(jnp.minimum(pos, max(x.size - 1, 0)), x.shape), axis=1)
    if fill_value is not None:
        coords = jnp.where((pos < x.size)[:, None], coords, fill_value)
    return coords.astype(jnp.int64)


@functools.partial(executable_cache.jit, static_argnames=("size",))
def _nonzero(x, size):
    if x.ndim == 0:
        return jnp.zeros((size, 0), jnp.int64)
    return _coordinates(x, size).reshape(-1)


def _bucketed(count: int) -> int:
    """The length to compute a data-dependent result of `count` rows at: its length bucket, so
    one executable serves every count in it (ops/growing.py); exact under lazy recording or SPMD."""
    return growing.bucket(count) if growing.active() else count


def _select_rows(rows, keep, size: int):
    """rows[i] for each true keep[i] in order, `size` of them (past the count: unread), flat."""
    if not rows.shape[0]:
        return jnp.zeros((size, *rows.shape[1:]), rows.dtype).reshape(-1)
    return rows[jnp.minimum(_true_positions(keep, size), rows.shape[0] - 1)].reshape(-1)


def _nonzero_of(t: torch.Tensor) -> torch.Tensor:
    x = to_jax(t)
    count = count_true(x)
    metrics.bump("executions")
    if t.dim() == 0:
        return from_jax(_nonzero(x, count), t.device.index)
    size = _bucketed(count)
    return growing.wrap_prefix(_nonzero(x, size), [count, t.dim()], torch.int64, t.device.index)


@lower(aten.nonzero.default, eager=True)
def nonzero(self):
    return _nonzero_of(self)


@lower(aten.nonzero_static.default)
def nonzero_static(x, *, size, fill_value=-1):
    if x.ndim == 0:
        return jnp.full((size, 0), fill_value, jnp.int64)
    return _coordinates(x, size, fill_value)


def _same_device(self: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
    if other.device == self.device:
        return other
    if other.device.type == "cpu" and other.dim() == 0:
        return other.to(self.device)
    raise RuntimeError(
        "Expected all tensors to be on the same device, but found at least two devices, "
        f"{self.device} and {other.device}!"
    )


@functools.partial(executable_cache.jit, static_argnames=("shape", "size"))
def _masked_select(x, mask, shape, size):
    return _select_rows(jnp.broadcast_to(x, shape).reshape(-1), jnp.broadcast_to(mask, shape).reshape(-1), size)


@lower(aten.masked_select.default, eager=True)
def masked_select(self, mask):
    if mask.dtype != torch.bool:
        raise RuntimeError("masked_select: expected BoolTensor for mask")
    mask = _same_device(self, mask)
    shape = tuple(torch.broadcast_shapes(self.shape, mask.shape))
    x, m = to_jax(self), to_jax(mask)
    count = count_true(m, shape)
    metrics.bump("executions")
    size = _bucketed(count)
    return growing.wrap_prefix(_masked_select(x, m, shape, size), [count], self.dtype, self.device.index)


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
    mask.expand(self.shape)  # CPU's expand_inplace error for a mask of more dims (a view: nothing runs)
    if source.numel() < self.numel() and mask.dtype == torch.bool:
        mask = _same_device(self, mask)
        shape = tuple(torch.broadcast_shapes(self.shape, mask.shape))
        if count_true(to_jax(mask), shape) > source.numel():
            raise RuntimeError("Number of elements of source < number of ones in mask")
    return _masked_scatter_kernel(self, mask, source)


# ---- advanced indexing: index.Tensor, _index_put_impl_ -----------------------------


def _warn_byte_indices(indices) -> None:
    """CPU's expandTensors warns at each use of a uint8 mask."""
    for idx in indices:
        if idx is not None and idx.dtype == torch.uint8:
            warnings.warn(
                "indexing with dtype torch.uint8 is now deprecated, please use a dtype torch.bool instead.",
                stacklevel=2,
            )


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
            checks.append((t, -size, size, lambda v, k=k, size=size: IndexError(_out_of_bounds(v, k, size))))
    check_ranges(checks)
    return [t if t is None or t.device == self.device else t.to(self.device) for t in out]


def _out_of_bounds(value, dim: int, size: int) -> str:
    """CPU's message for an index out of range (it names neither for an empty dimension)."""
    if size == 0:
        return "index is out of bounds for dimension with size 0"
    return f"index {value} is out of bounds for dimension {dim} with size {size}"


def _narrowed(x, indices) -> tuple:
    """`indices` as an indexing tuple of `x`, int64 ones as int32 where they fit (narrow_indices)."""
    sizes = (*x.shape, *([2**31] * len(indices)))  # past x's dims: left as they are
    return tuple(slice(None) if i is None else narrow_indices(i, sizes[d]) for d, i in enumerate(indices))


def _index(x, indices):
    return x[_narrowed(x, indices)]


def index_failures(x, indices, *args, **kwargs) -> list[Failure]:
    """The graph form of _prepare_indices' range check (graphs hold integer indices only)."""
    failures = []
    for d, i in enumerate(indices):
        if i is not None and d < x.ndim:
            k = sum(u is not None for u in indices[:d])
            size = x.shape[d]
            message = _out_of_bounds("{value}", k, size)
            failures += first_outside(i, -size, size, IndexError, message)
    return failures


_index_kernel = dispatcher.make_kernel(aten.index.Tensor, Lowering(_index), False)


def _leading_mask(self: torch.Tensor, indices) -> torch.Tensor | None:
    """The mask of `self[mask]`: one tpu bool tensor indexing self's leading dims, else None."""
    if len(indices) != 1 or not growing.active():
        return None
    mask = indices[0]
    if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool or mask.device != self.device:
        return None
    if not 0 < mask.dim() <= self.dim() or tuple(mask.shape) != tuple(self.shape[: mask.dim()]):
        return None  # _prepare_indices raises CPU's error
    return mask


@functools.partial(executable_cache.jit, static_argnames=("lead", "size"))
def _mask_rows(x, mask, lead, size):
    """The rows of x (its dims past `lead`) where `mask` is true, `size` of them, flat."""
    return _select_rows(x.reshape((-1, *x.shape[lead:])), mask.reshape(-1), size)


@lower(aten.index.Tensor, eager=True, graph=_index, check=Check(graph=index_failures))
def index(self, indices):
    _warn_byte_indices(indices)
    mask = _leading_mask(self, indices)
    if mask is not None:  # self[mask]: at the count's length bucket
        m = to_jax(mask)
        count = count_true(m)
        metrics.bump("executions")
        rows = _mask_rows(to_jax(self), m, mask.dim(), _bucketed(count))
        return growing.wrap_prefix(rows, [count, *self.shape[mask.dim() :]], self.dtype, self.device.index)
    return _index_kernel(self, _prepare_indices(self, indices))


def put_values(x, indices, values, accumulate=False, unsafe=False):
    ref = x.at[_narrowed(x, indices)]
    values = jnp.asarray(values).astype(x.dtype)
    if not accumulate:
        return ref.set(values)
    return ref.max(values) if x.dtype == jnp.bool_ else ref.add(values)


_index_put_kernel = dispatcher.make_kernel(aten._index_put_impl_.default, Lowering(put_values), False)


@functools.partial(executable_cache.jit, static_argnames=("lead", "accumulate"))
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


@lower(
    aten._index_put_impl_.default,
    eager=True,
    graph=put_values,
    check=Check(graph=index_failures),
    apart_from=("indices", "values"),
)
def index_put_impl_(self, indices, values, accumulate=False, unsafe=False):
    _warn_byte_indices(indices)
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
    if _is_mask_put(self, indices, values):
        # x[mask] = scalar: a select, no host sync.
        _check_values_dtype(self, values, masked_fill)
        _meta_check(self, indices, values, accumulate)
        d, mask = next((d, i) for d, i in enumerate(indices) if i is not None)
        value = to_jax(values) if values.device.type == "tpu" else jnp.asarray(values.item())
        metrics.bump("executions")
        write_jax(self, _mask_put(to_jax(self), to_jax(mask), value, d, accumulate))
        return self
    indices = _prepare_indices(self, indices)
    _check_values_shape(self, indices, values)  # CPU checks the shape first
    _check_values_dtype(self, values, masked_fill)
    return _index_put_kernel(self, indices, values, accumulate, unsafe)


def _check_values_dtype(self: torch.Tensor, values: torch.Tensor, masked_fill: bool) -> None:
    if values.dtype != self.dtype and not masked_fill:
        raise RuntimeError(
            "Index put requires the source and destination dtypes match, got "
            f"{type_name(self.dtype)} for the destination and {type_name(values.dtype)} for the source."
        )


@functools.lru_cache(maxsize=1024)
def _indexing_result_shape(shape: torch.Size, index_shapes: tuple) -> torch.Size:
    """The shape of x[indices] (None for a full slice), from the meta index kernel."""
    if all(i is None for i in index_shapes):
        return shape
    meta = [None if i is None else torch.empty(i, dtype=torch.long, device="meta") for i in index_shapes]
    return aten.index.Tensor(torch.empty(shape, device="meta"), meta).shape


def _check_values_shape(self: torch.Tensor, indices, values: torch.Tensor) -> None:
    """CPU's error when the values do not broadcast to x[indices] (jax raised a ValueError)."""
    result = _indexing_result_shape(self.shape, tuple(None if i is None else i.shape for i in indices))
    try:
        fits = torch.broadcast_shapes(values.shape, result) == result
    except RuntimeError:
        fits = False
    if not fits:
        raise RuntimeError(
            f"shape mismatch: value tensor of shape {list(values.shape)} cannot be broadcast to indexing "
            f"result of shape {list(result)}"
        )
