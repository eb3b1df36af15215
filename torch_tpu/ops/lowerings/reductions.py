"""Reductions and scans: sum, mean, prod, max/min, var/std, any/all, norms,
cumulative ops, median and mode, segment_reduce.

PyTorch's dtype rules: integer and bool sums/products/cumsums give int64
unless `dtype=` says otherwise; half-precision inputs accumulate in float32.
`dim=None` or `dim=[]` reduces every dimension; a 0-dim tensor accepts dim
0/-1 and reduces nothing. max/min/argmax pick the first extreme, NaN counts as
the largest value (it propagates), as on CPU.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import torch
from jax import lax

from torch_tpu import metrics
from torch_tpu.ops.checks import Failure, dim_in_range, index_bounds, to_host
from torch_tpu.ops.dtypes import to_numpy_dtype, type_name
from torch_tpu.ops.lowerings.sorting import sort_along
from torch_tpu.ops.registry import Check, aten, lower, signature_check
from torch_tpu.ops.tensors import from_jax, to_jax
from torch_tpu.runtime import executable_cache

_HALF = (jnp.dtype(jnp.float16), jnp.dtype(jnp.bfloat16))


def _axes(dim, ndim: int) -> tuple[int, ...]:
    """Normalized reduction axes; None and [] mean all of them."""
    if ndim == 0:
        return ()
    if dim is None:
        return tuple(range(ndim))
    if isinstance(dim, int):
        return (dim % ndim,)
    if len(dim) == 0:
        return tuple(range(ndim))
    return tuple(sorted(d % ndim for d in dim))


def _list_axes(dim, ndim: int) -> tuple[int, ...]:
    """Axes of any and all, for which CPU reads dim=[] as no axes (sum and the rest: all of them)."""
    if dim is not None and not isinstance(dim, int) and len(dim) == 0:
        return ()
    return _axes(dim, ndim)


def _axis(dim: int, ndim: int) -> int | None:
    """One normalized axis, or None for a 0-dim tensor."""
    return None if ndim == 0 else dim % ndim


def _is_exact(dtype) -> bool:
    return jnp.issubdtype(dtype, jnp.integer) or dtype == jnp.bool_


def _integral_to_long(x, dtype):
    """Casts for sum/prod/cumsum: explicit dtype, else int/bool -> int64."""
    if dtype is not None:
        return x.astype(to_numpy_dtype(dtype))
    if _is_exact(x.dtype):
        return x.astype(jnp.int64)
    return x


def _acc(x):
    """Half-precision values accumulate in float32."""
    return x.astype(jnp.float32) if x.dtype in _HALF else x


# ---- sum, mean, prod ---------------------------------------------------------


def _sum(x, dim, keepdim, dtype):
    x = _integral_to_long(x, dtype)
    out_dtype = x.dtype
    return jnp.sum(_acc(x), axis=_axes(dim, x.ndim), keepdims=keepdim).astype(out_dtype)


@lower(aten.sum.default)
def sum_all(x, *, dtype=None):
    return _sum(x, None, False, dtype)


@lower(aten.sum.dim_IntList)
def sum_dim(x, dim, keepdim=False, *, dtype=None):
    return _sum(x, dim, keepdim, dtype)


@lower(aten.nansum.default)
def nansum(x, dim=None, keepdim=False, *, dtype=None):
    if jnp.issubdtype(x.dtype, jnp.inexact):
        x = jnp.where(jnp.isnan(x), jnp.zeros((), x.dtype), x)
    return _sum(x, dim, keepdim, dtype)


def _mean(x, dim, keepdim, dtype):
    if dtype is not None:
        x = x.astype(to_numpy_dtype(dtype))
    out_dtype = x.dtype
    return jnp.mean(_acc(x), axis=_axes(dim, x.ndim), keepdims=keepdim).astype(out_dtype)


@lower(aten.mean.default)
def mean_all(x, *, dtype=None):
    return _mean(x, None, False, dtype)


@lower(aten.mean.dim)
def mean_dim(x, dim, keepdim=False, *, dtype=None):
    return _mean(x, dim, keepdim, dtype)


def _prod(x, dim, keepdim, dtype):
    x = _integral_to_long(x, dtype)
    out_dtype = x.dtype
    return jnp.prod(_acc(x), axis=_axes(dim, x.ndim), keepdims=keepdim).astype(out_dtype)


@lower(aten.prod.default)
def prod_all(x, *, dtype=None):
    return _prod(x, None, False, dtype)


@lower(aten.prod.dim_int)
def prod_dim(x, dim, keepdim=False, *, dtype=None):
    return _prod(x, dim, keepdim, dtype)


# ---- max, min, argmax, argmin ---------------------------------------------------


@lower(aten.amax.default)
def amax(x, dim=(), keepdim=False):
    return jnp.max(x, axis=_axes(dim, x.ndim), keepdims=keepdim)


@lower(aten.amin.default)
def amin(x, dim=(), keepdim=False):
    return jnp.min(x, axis=_axes(dim, x.ndim), keepdims=keepdim)


def _require_nonempty(x, name: str) -> None:
    # The meta kernels let these through; CPU raises.
    if x.size == 0:
        raise RuntimeError(
            f"{name}(): Expected reduction dim to be specified for input.numel() == 0. "
            "Specify the reduction dim with the 'dim' argument."
        )


def _require_dim_nonempty(x, axis: int | None, name: str) -> None:
    if axis is not None and x.shape[axis] == 0:
        raise IndexError(f"{name}(): Expected reduction dim {axis} to have non-zero size.")


def _require_real(x, kernel: str) -> None:
    if jnp.issubdtype(x.dtype, jnp.complexfloating):
        raise NotImplementedError(f"\"{kernel}\" not implemented for '{type_name(x.dtype)}'")


@lower(aten.max.default)
def max_all(x):
    _require_real(x, "max_all")
    _require_nonempty(x, "max")
    return jnp.max(x)


@lower(aten.min.default)
def min_all(x):
    _require_real(x, "min_all")
    _require_nonempty(x, "min")
    return jnp.min(x)


def _extreme_with_index(x, dim, keepdim, arg, name):
    axis = _axis(dim, x.ndim)
    _require_dim_nonempty(x, axis, name)
    if axis is None:
        return x, jnp.zeros((), jnp.int64)
    idx = jnp.expand_dims(arg(x, axis=axis), axis)
    values = jnp.take_along_axis(x, idx, axis=axis)
    if not keepdim:
        values, idx = values.squeeze(axis), idx.squeeze(axis)
    return values, idx


@lower(aten.max.dim)
def max_dim(x, dim, keepdim=False):
    return _extreme_with_index(x, dim, keepdim, jnp.argmax, "max")


@lower(aten.min.dim)
def min_dim(x, dim, keepdim=False):
    return _extreme_with_index(x, dim, keepdim, jnp.argmin, "min")


def _arg_extreme(x, dim, keepdim, arg):
    if dim is None:
        idx = arg(x.reshape(-1))
        return idx.reshape([1] * x.ndim) if keepdim else idx
    axis = _axis(dim, x.ndim)
    if axis is None:
        return jnp.zeros((), jnp.int64)
    return arg(x, axis=axis, keepdims=keepdim)


@lower(aten.argmax.default)
def argmax(x, dim=None, keepdim=False):
    return _arg_extreme(x, dim, keepdim, jnp.argmax)


@lower(aten.argmin.default)
def argmin(x, dim=None, keepdim=False):
    return _arg_extreme(x, dim, keepdim, jnp.argmin)


@signature_check
def _aminmax_out_check(self, *, dim=None, keepdim=False, min=None, max=None):
    """CPU's aminmax.out takes outputs of the input's dtype only (it does not cast)."""
    for out in (min, max):
        if out is not None and out.dtype != self.dtype:
            raise RuntimeError(
                f"Expected out tensor to have dtype {_c10_name(self.dtype)}, but got {_c10_name(out.dtype)} instead"
            )


def _c10_name(dtype: torch.dtype) -> str:
    return {torch.float32: "float", torch.float64: "double"}.get(dtype, str(dtype).removeprefix("torch."))


@lower(aten.aminmax.default, check=_aminmax_out_check)
def aminmax(x, *, dim=None, keepdim=False):
    axes = _axes(dim, x.ndim)
    return jnp.min(x, axis=axes, keepdims=keepdim), jnp.max(x, axis=axes, keepdims=keepdim)


# ---- var, std ------------------------------------------------------------------


def _var_mean(x, dim, correction, keepdim):
    if not jnp.issubdtype(x.dtype, jnp.inexact):
        # meta accepts integer inputs here; CPU does not.
        raise RuntimeError("std and var only support floating point and complex dtypes")
    axes = _axes(dim, x.ndim)
    xa = _acc(x)
    mean = jnp.mean(xa, axis=axes, keepdims=True)
    centered = xa - mean
    sq = jnp.real(centered * jnp.conj(centered)) if jnp.iscomplexobj(xa) else centered * centered
    n = int(np.prod([x.shape[d] for d in axes])) if axes else 1
    c = 1 if correction is None else correction
    var = jnp.sum(sq, axis=axes, keepdims=keepdim) / max(n - c, 0)
    return var, mean if keepdim else mean.reshape(var.shape)


@lower(aten.var.correction)
def var(x, dim=None, *, correction=None, keepdim=False):
    return _var_mean(x, dim, correction, keepdim)[0]


@lower(aten.std.correction)
def std(x, dim=None, *, correction=None, keepdim=False):
    return jnp.sqrt(_var_mean(x, dim, correction, keepdim)[0])


@lower(aten.var_mean.correction)
def var_mean(x, dim=None, *, correction=None, keepdim=False):
    return _var_mean(x, dim, correction, keepdim)


@lower(aten.std_mean.correction)
def std_mean(x, dim=None, *, correction=None, keepdim=False):
    v, m = _var_mean(x, dim, correction, keepdim)
    return jnp.sqrt(v), m


# ---- any, all ---------------------------------------------------------------------


@lower(aten.any.default)
def any_all(x):
    return jnp.any(x != 0)


@lower(aten.any.dim)
def any_dim(x, dim, keepdim=False):
    return jnp.any(x != 0, axis=_axes(dim, x.ndim), keepdims=keepdim)


@lower(aten.any.dims)
def any_dims(x, dim=None, keepdim=False):
    return jnp.any(x != 0, axis=_list_axes(dim, x.ndim), keepdims=keepdim)


@lower(aten.all.default)
def all_all(x):
    return jnp.all(x != 0)


@lower(aten.all.dim)
def all_dim(x, dim, keepdim=False):
    return jnp.all(x != 0, axis=_axes(dim, x.ndim), keepdims=keepdim)


@lower(aten.all.dims)
def all_dims(x, dim=None, keepdim=False):
    return jnp.all(x != 0, axis=_list_axes(dim, x.ndim), keepdims=keepdim)


@lower(aten.count_nonzero.dim_IntList)
def count_nonzero(x, dim):
    return jnp.sum(x != 0, axis=_axes(dim, x.ndim), dtype=jnp.int64)


# ---- logsumexp, norms ---------------------------------------------------------------


@lower(aten.logsumexp.default)
def logsumexp(x, dim, keepdim=False):
    if not jnp.issubdtype(x.dtype, jnp.inexact):
        x = x.astype(jnp.float32)
    out_dtype = x.dtype
    axes = _axes(dim, x.ndim)
    if x.size == 0:
        return jnp.full(jnp.sum(x, axis=axes, keepdims=keepdim).shape, -jnp.inf, out_dtype)
    return jax.nn.logsumexp(_acc(x), axis=axes, keepdims=keepdim).astype(out_dtype)


@lower(aten.linalg_vector_norm.default)
def linalg_vector_norm(x, ord=2, dim=None, keepdim=False, *, dtype=None):
    if dtype is not None:
        x = x.astype(to_numpy_dtype(dtype))
    x = jnp.abs(x)
    out_dtype = x.dtype
    x = _acc(x)
    axes = _axes(dim, x.ndim)
    ord = float(ord)
    if ord == float("inf"):
        r = jnp.max(x, axis=axes, keepdims=keepdim)
    elif ord == float("-inf"):
        r = jnp.min(x, axis=axes, keepdims=keepdim)
    elif ord == 0:
        r = jnp.sum(x != 0, axis=axes, keepdims=keepdim).astype(x.dtype)
    elif ord == 1:
        r = jnp.sum(x, axis=axes, keepdims=keepdim)
    elif ord == 2:
        r = jnp.sqrt(jnp.sum(x * x, axis=axes, keepdims=keepdim))
    else:
        r = jnp.sum(x**ord, axis=axes, keepdims=keepdim) ** (1.0 / ord)
    return r.astype(out_dtype)


def _p(p) -> float:
    return 2.0 if p is None else float(p)


@lower(aten.norm.Scalar)
def norm(x, p=2):
    return linalg_vector_norm(x, _p(p))


@lower(aten.norm.ScalarOpt_dtype)
def norm_dtype(x, p, *, dtype):
    return linalg_vector_norm(x, _p(p), dtype=dtype)


@lower(aten.norm.ScalarOpt_dim)
def norm_dim(x, p, dim, keepdim=False):
    return linalg_vector_norm(x, _p(p), dim, keepdim)


@lower(aten.norm.ScalarOpt_dim_dtype)
def norm_dim_dtype(x, p, dim, keepdim, *, dtype):
    return linalg_vector_norm(x, _p(p), dim, keepdim, dtype=dtype)


# ---- scans -------------------------------------------------------------------------


def _scan(x, dim, fn):
    if x.ndim == 0:
        return fn(x.reshape(1), axis=0).reshape(())
    return fn(x, axis=dim % x.ndim)


@lower(aten.cumsum.default)
def cumsum(x, dim, *, dtype=None):
    x = _integral_to_long(x, dtype)
    return _scan(_acc(x), dim, jnp.cumsum).astype(x.dtype)


@lower(aten.cumprod.default)
def cumprod(x, dim, *, dtype=None):
    x = _integral_to_long(x, dtype)
    return _scan(_acc(x), dim, jnp.cumprod).astype(x.dtype)


@signature_check
def _logcumsumexp_out_check(self, dim, *, out=None):
    """CPU's logcumsumexp.out takes an output of the input's dtype only (it does not cast)."""
    if out is not None and out.dtype != self.dtype:
        raise RuntimeError(f"expected scalar_type {type_name(self.dtype)} but found {type_name(out.dtype)}")


@lower(aten.logcumsumexp.default, check=_logcumsumexp_out_check)  # _logcumsumexp has no meta kernel
def logcumsumexp(x, dim):
    out_dtype = x.dtype
    return _scan(_acc(x), dim, lambda v, axis: lax.cumlogsumexp(v, axis=axis)).astype(out_dtype)


def _cum_extreme(x, dim, better):
    """Running extreme and the index where it was (last) reached; NaN sticks."""
    if x.ndim == 0:
        return x, jnp.zeros((), jnp.int64)
    axis = dim % x.ndim
    if x.shape[axis] == 0:
        return x, jnp.zeros(x.shape, jnp.int64)
    idx = lax.broadcasted_iota(jnp.int64, x.shape, axis)
    inexact = jnp.issubdtype(x.dtype, jnp.inexact)

    def combine(a, b):
        (av, ai), (bv, bi) = a, b
        take_b = better(bv, av) | (bv == av)
        if inexact:
            take_b = jnp.isnan(bv) | (~jnp.isnan(av) & take_b)
        return jnp.where(take_b, bv, av), jnp.where(take_b, bi, ai)

    return lax.associative_scan(combine, (x, idx), axis=axis)


@lower(aten.cummax.default)
def cummax(x, dim):
    return _cum_extreme(x, dim, jnp.greater)


@lower(aten.cummin.default)
def cummin(x, dim):
    return _cum_extreme(x, dim, jnp.less)


# ---- median, mode (sort based) ---------------------------------------------------


def _nan_count(s, axis):
    if jnp.issubdtype(s.dtype, jnp.inexact):
        return jnp.sum(jnp.isnan(s), axis=axis, keepdims=True)
    return jnp.zeros([1 if d == axis else n for d, n in enumerate(s.shape)], jnp.int64)


def _median_along(x, axis: int, ignore_nan: bool):
    """(values, indices) with the reduced axis kept, for a non-empty axis.

    The lower median of the sorted values (NaN sorts last); median returns the
    first NaN if there is one, nanmedian the median of the non-NaN values."""
    s, i = sort_along(x, axis, descending=False)
    n = x.shape[axis]
    nans = _nan_count(s, axis)
    if ignore_nan:
        k = n - nans
        pos = jnp.where(k > 0, (k - 1) // 2, (n - 1) // 2)
    else:
        pos = jnp.where(nans > 0, n - nans, (n - 1) // 2)
    pos = pos.astype(jnp.int64)
    return jnp.take_along_axis(s, pos, axis=axis), jnp.take_along_axis(i, pos, axis=axis)


def _median_all(x, ignore_nan):
    if x.size == 0:
        return jnp.full((), jnp.nan, jnp.float32).astype(x.dtype)
    return _median_along(x.reshape(-1), 0, ignore_nan)[0].reshape(())


def _median_dim(x, dim, keepdim, ignore_nan, name):
    axis = _axis(dim, x.ndim)
    _require_dim_nonempty(x, axis, name)
    if axis is None:
        return x, jnp.zeros((), jnp.int64)
    v, i = _median_along(x, axis, ignore_nan)
    if not keepdim:
        v, i = v.squeeze(axis), i.squeeze(axis)
    return v, i


@lower(aten.median.default)
def median_all(x):
    return _median_all(x, ignore_nan=False)


@lower(aten.nanmedian.default)
def nanmedian_all(x):
    return _median_all(x, ignore_nan=True)


@lower(aten.median.dim)
def median_dim(x, dim, keepdim=False):
    return _median_dim(x, dim, keepdim, False, "median")


@lower(aten.nanmedian.dim)
def nanmedian_dim(x, dim, keepdim=False):
    return _median_dim(x, dim, keepdim, True, "nanmedian")


@lower(aten.mode.default)
def mode(x, dim=-1, keepdim=False):
    """The smallest most frequent value and the index of its last occurrence."""
    axis = _axis(dim, x.ndim)
    _require_dim_nonempty(x, axis, "mode")
    if axis is None:
        return x, jnp.zeros((), jnp.int64)
    s, i = sort_along(x, axis, descending=False)
    n = x.shape[axis]
    pos = lax.broadcasted_iota(jnp.int64, s.shape, axis)
    first = jnp.ones_like(lax.slice_in_dim(s, 0, 1, axis=axis), dtype=bool)
    starts = jnp.concatenate(
        [first, lax.slice_in_dim(s, 1, n, axis=axis) != lax.slice_in_dim(s, 0, n - 1, axis=axis)], axis=axis
    )
    run_start = lax.cummax(jnp.where(starts, pos, 0), axis=axis)
    ends = jnp.concatenate([lax.slice_in_dim(starts, 1, n, axis=axis), first], axis=axis)
    score = jnp.where(ends, pos - run_start + 1, 0)
    best = jnp.expand_dims(jnp.argmax(score, axis=axis), axis)
    v, idx = jnp.take_along_axis(s, best, axis=axis), jnp.take_along_axis(i, best, axis=axis)
    if not keepdim:
        v, idx = v.squeeze(axis), idx.squeeze(axis)
    return v, idx


# ---- bincount (data-dependent length) --------------------------------------------------


@functools.partial(executable_cache.jit, static_argnames=("length",))
def _bincount(x, weights, length):
    if weights is None:
        return jnp.zeros((length,), jnp.int64).at[x].add(1)
    dtype = weights.dtype if weights.dtype == jnp.float32 else jnp.float64
    return jnp.zeros((length,), dtype).at[x].add(weights.astype(dtype))


@lower(aten.bincount.default, eager=True)
def bincount(self, weights=None, minlength=0):
    if self.dtype.is_floating_point or self.dtype.is_complex or self.dtype == torch.bool:
        raise NotImplementedError(f"\"bincount_cpu\" not implemented for '{type_name(self.dtype)}'")
    if minlength < 0:
        raise RuntimeError("minlength should be >= 0")
    if self.dim() != 1:
        raise RuntimeError("bincount only supports 1-d non-negative integral inputs.")
    if weights is not None and (weights.dim() != 1 or weights.shape[0] != self.shape[0]):
        raise RuntimeError("weights should be 1-d and have the same length as input")
    length = minlength
    if self.numel():
        lo, hi = index_bounds(self)
        if lo < 0:
            raise RuntimeError("bincount only supports 1-d non-negative integral inputs.")
        length = max(length, hi + 1)
    metrics.bump("executions")
    w = None if weights is None else to_jax(weights)
    return from_jax(_bincount(to_jax(self), w, length), self.device.index)


@lower(aten.equal.default, eager=True)
def equal(self, other):
    """torch.equal: same shape and equal elements (after promotion; NaN is unequal), as a Python bool."""
    if self.device != other.device:
        raise RuntimeError(
            f"Expected all tensors to be on the same device, but found at least two devices, {self.device} and "
            f"{other.device}!"
        )
    if self.shape != other.shape:
        return False
    return bool(torch.all(torch.eq(self, other)).item())


# ---- segment_reduce ------------------------------------------------------------------
# Segments run along axis lengths.dim() - 1; the leading dims of data and lengths/offsets are
# batch rows. Boundaries are traced values (cumsum and searchsorted of the lengths).

_SEGMENT_IDENTITY = {"max": -jnp.inf, "min": jnp.inf, "sum": 0.0, "mean": 0.0, "prod": 1.0}
_SEGMENT_NAMES = {"amax": "max", "amin": "min"}
_NOT_TRUE = (
    "Expected {} to be true, but got false.  "
    "(Could this error message be improved?  If so, please report an enhancement request to PyTorch.)"
)


def _segment_reduction(reduce: str) -> str:
    reduce = _SEGMENT_NAMES.get(reduce, reduce)
    if reduce not in _SEGMENT_IDENTITY:
        raise RuntimeError(f"reduce argument must be either sum, prod, mean, amax or amin, got {reduce}")
    return reduce


def _segment_layout(data, bounds, axis: int, kernel: str):
    """CPU's dtype and axis checks; returns (axis, batch rows O, axis size L, inner size I)."""
    if not jnp.issubdtype(data.dtype, jnp.floating):
        raise NotImplementedError(f"\"_segment_reduce_cpu\" not implemented for '{type_name(data.dtype)}'")
    if bounds.dtype not in (jnp.int32, jnp.int64):
        raise NotImplementedError(f"\"{kernel}\" not implemented for '{type_name(bounds.dtype)}'")
    dim_in_range(axis, data.ndim)
    axis %= max(data.ndim, 1)
    rows = int(np.prod(data.shape[:axis], dtype=np.int64))
    inner = int(np.prod(data.shape[axis + 1 :], dtype=np.int64))
    return axis, rows, data.shape[axis] if data.ndim else 1, inner


def _segment_bounds(lengths, offsets, rows: int):
    """(offsets (O, S + 1), lengths (O, S)) as int64, batch dims flattened."""
    if offsets is not None:
        offs = offsets.reshape(rows, offsets.shape[-1]).astype(jnp.int64)
        return offs, offs[:, 1:] - offs[:, :-1]
    lens = lengths.reshape(rows, lengths.shape[-1]).astype(jnp.int64)
    return jnp.concatenate([jnp.zeros_like(lens[:, :1]), jnp.cumsum(lens, axis=1)], axis=1), lens


def _segment_ids(offs, size: int):
    """Each position's segment (O, L); S for a position in none (past the last or before the first)."""
    count = offs.shape[1] - 1
    pos = jnp.arange(size)
    k = jax.vmap(lambda o: jnp.searchsorted(o[1:], pos, side="right"))(offs)
    return jnp.where((pos[None, :] >= offs[:, :1]) & (k < count), k, count)


def _segment_setup(data, lengths, offsets, axis, kernel):
    bounds = offsets if offsets is not None else lengths
    axis, rows, size, inner = _segment_layout(data, bounds, axis, kernel)
    offs, lens = _segment_bounds(lengths, offsets, rows)
    count = lens.shape[1]
    local = _segment_ids(offs, size)
    # Global segment ids over the flattened (O * L) positions; O * S collects the positions in none.
    ids = jnp.where(local < count, local + count * jnp.arange(rows)[:, None], rows * count).reshape(-1)
    out_shape = (*bounds.shape[:-1], count, *data.shape[axis + 1 :])
    return data.reshape(rows * size, inner), ids, local, lens.reshape(-1, 1), rows * count, out_shape


def _segment_fold(x, ids, n: int, reduce: str):
    if reduce in ("sum", "mean"):
        return jax.ops.segment_sum(x, ids, n + 1)[:n]
    if reduce == "prod":
        return jax.ops.segment_prod(x, ids, n + 1)[:n]
    fold = jax.ops.segment_max if reduce == "max" else jax.ops.segment_min
    r = fold(x, ids, n + 1)[:n]
    has_nan = jax.ops.segment_max(jnp.isnan(x).astype(jnp.int8), ids, n + 1)[:n] > 0
    return jnp.where(has_nan, jnp.nan, r)


_NEGATIVE_LENGTH = "lengths contains negative value!"
_LENGTHS_SUM = (
    "segment_reduce(): Expected all rows of lengths along axis to sum to data.size(lengths.dim()-1) when !unsafe."
)


def _checked_lengths(data, lengths, offsets, axis, unsafe):
    """The lengths the !unsafe check reads and data's size along axis, or None (nothing to check,
    or an argument error the lowering raises)."""
    ndim = max(len(data.shape), 1)
    if unsafe or offsets is not None or lengths is None or not -ndim <= axis < ndim:
        return None
    if axis % ndim != len(lengths.shape) - 1 or not np.prod(lengths.shape):
        return None
    return lengths, data.shape[axis % ndim] if len(data.shape) else 1


def _segment_host_check(data, reduce, *, lengths=None, offsets=None, axis=0, unsafe=False, **_):
    found = _checked_lengths(data, lengths, offsets, axis, unsafe)
    if found is None:
        return
    values = to_host(to_jax(lengths)) if lengths.device.type != "cpu" else lengths.numpy()
    if values.min() < 0:
        raise RuntimeError(_NEGATIVE_LENGTH)
    if not (values.sum(-1) == found[1]).all():
        raise RuntimeError(_LENGTHS_SUM)


def _segment_graph_check(data, reduce, *, lengths=None, offsets=None, axis=0, unsafe=False, **_):
    found = _checked_lengths(data, lengths, offsets, axis, unsafe)
    if found is None:
        return []
    lengths, zero = jnp.asarray(lengths), jnp.zeros((), jnp.int64)
    return [
        Failure(jnp.any(lengths < 0), zero, RuntimeError, _NEGATIVE_LENGTH),
        Failure(jnp.any(jnp.sum(lengths, -1) != found[1]), zero, RuntimeError, _LENGTHS_SUM),
    ]


@lower(aten.segment_reduce.default, check=Check(_segment_host_check, _segment_graph_check))
def segment_reduce(data, reduce, *, lengths=None, indices=None, offsets=None, axis=0, unsafe=False, initial=None):
    """torch._segment_reduce: max/min propagate nan; an empty segment gives `initial`, else the
    reduction's identity (nan for mean)."""
    if indices is not None:
        raise RuntimeError("segment_reduce(): indices based reduction is not supported yet.")
    if lengths is None and offsets is None:
        raise RuntimeError("segment_reduce(): Either lengths or offsets must be defined.")
    reduce = _segment_reduction(reduce)
    bounds, name = (offsets, "offsets") if offsets is not None else (lengths, "lengths")
    if data.ndim < bounds.ndim:
        raise RuntimeError(_NOT_TRUE.format(f"data.dim() >= {name}_value.dim()"))
    wrapped = axis % max(data.ndim, 1) if -max(data.ndim, 1) <= axis < max(data.ndim, 1) else axis
    if wrapped != bounds.ndim - 1:
        raise RuntimeError(f"segment_reduce(): Expected axis to be the last dimension of {name} but got {wrapped}.")
    kernel = f"_segment_reduce_{name}_cpu_kernel1"
    x, ids, _, lens, n, out_shape = _segment_setup(data, lengths, offsets, axis, kernel)
    acc = _acc(x)
    r = _segment_fold(acc, ids, n, reduce)
    start = jnp.asarray(_SEGMENT_IDENTITY[reduce] if initial is None else initial, data.dtype).astype(acc.dtype)
    if reduce in ("sum", "mean"):
        r = start + r
    elif reduce == "prod":
        r = start * r
    else:
        r = jnp.where(jnp.isnan(r), r, (jnp.maximum if reduce == "max" else jnp.minimum)(start, r))
    if reduce == "mean":
        r = jnp.where((lens > 0) & ~jnp.isnan(r), r / jnp.maximum(lens, 1).astype(acc.dtype), r)
        if initial is None:
            r = jnp.where(lens == 0, jnp.nan, r)
    return r.astype(data.dtype).reshape(out_shape)


def _segmented_cumprod(x, starts):
    """Inclusive products along axis 1 that restart where `starts` (O, L) holds."""

    def combine(a, b):
        return a[0] | b[0], jnp.where(b[0], b[1], a[1] * b[1])

    flags = jnp.broadcast_to(starts[..., None], x.shape)
    return lax.associative_scan(combine, (flags, x), axis=1)[1]


def _exclusive_segment_prod(x, local):
    """For each position, the product of the other values of its segment (x: (O, L, I))."""
    if x.shape[1] == 0:
        return x
    edge = jnp.ones_like(local[:, :1], bool)
    starts = jnp.concatenate([edge, local[:, 1:] != local[:, :-1]], axis=1)
    ends = jnp.concatenate([local[:, 1:] != local[:, :-1], edge], axis=1)
    ones = jnp.ones_like(x[:, :1])
    before = jnp.concatenate([ones, _segmented_cumprod(x, starts)[:, :-1]], axis=1)
    before = jnp.where(starts[..., None], 1, before)
    after = jnp.flip(_segmented_cumprod(jnp.flip(x, 1), jnp.flip(ends, 1)), 1)
    after = jnp.where(ends[..., None], 1, jnp.concatenate([after[:, 1:], ones], axis=1))
    return before * after


@lower(aten._segment_reduce_backward.default)
def segment_reduce_backward(grad, output, data, reduce, *, lengths=None, offsets=None, axis=0, initial=None):
    """CPU's gradients: max/min share a tie's gradient among the extremes (positive gradients only,
    as CPU does); prod takes the product of the others at a zero or nan."""
    if lengths is None and offsets is None:
        raise RuntimeError("segment_reduce(): Either lengths or offsets must be defined.")
    reduce = _segment_reduction(reduce)
    kernel = f"_segment_reduce_cpu_{'offsets' if offsets is not None else 'lengths'}_backward_kernel1"
    x, ids, local, lens, n, _ = _segment_setup(data, lengths, offsets, axis, kernel)
    x = _acc(x)
    if n == 0 or x.shape[0] == 0:
        return jnp.zeros(data.shape, grad.dtype)
    inside = (ids < n)[:, None]
    seg = jnp.minimum(ids, n - 1)
    g = _acc(grad).reshape(n, -1)[seg]
    if reduce == "sum":
        gi = g
    elif reduce == "mean":
        gi = g / jnp.maximum(lens[seg], 1).astype(g.dtype)
    elif reduce in ("max", "min"):
        out = _acc(output).reshape(n, -1)[seg]
        hit = (jnp.isnan(x) | (x == out)) & inside
        ties = jax.ops.segment_sum(hit.astype(jnp.int64), ids, n + 1)[seg]
        gi = jnp.where(hit, jnp.where((ties >= 2) & (g > 0), g / ties.astype(g.dtype), g), 0)
    else:
        out = _acc(output).reshape(n, -1)[seg]
        start = jnp.asarray(1.0 if initial is None else initial, data.dtype).astype(x.dtype)
        others = _exclusive_segment_prod(x.reshape((*local.shape, -1)), local).reshape(x.shape)
        special = jnp.isnan(x) | (x == 0)
        gi = jnp.where(special, g * (start * others), g * out / jnp.where(special, 1, x))
    return jnp.where(inside, gi, 0).astype(grad.dtype).reshape(data.shape)
