"""64-bit element types on XLA:TPU: jax lowering rules, for the TPU platform only, that build what
XLA:TPU's 64-bit rewriting cannot compile, or computes wrongly, from what it can.

TPUs have no 64-bit units: XLA rewrites float64 as float32 pairs, int64 as int32 pairs and
complex128 as float64 parts. Measured on a v5e (jax 0.10.2), that rewriting
- aborts the whole process, a C++ CHECK failure and not an error, compiling a convert to or from
  complex128: c64 <-> c128, f32/f64 -> c128 ("Unsupported CVT X{64|128} expansion from c64[2] to
  c128[2]"), and a complex128 abs ("Check failed: operand->shape().IsTuple()");
- computes `a @ b.mH` of complex128 wrongly, as `a @ b.conj()`: the transpose is dropped, both
  with jax's complex128 dot and with float64 dots of the parts taken after a complex128
  transpose (a float64 dot with a transposed operand is right);
- stops at a 64-bit integer dot ("UNIMPLEMENTED: ... not contain X{64|128} element types ...
  dot_general"), and XLA:TPU's LU takes float32 and complex64 only.
What it does compile: complex(f64, f64), real and imag, elementwise 64-bit arithmetic, gathers and
scatters. So here, for the operands named above only:
- convert_element_type_p builds the result from the float64 parts (`converted`);
- abs_p on complex128 is the hypot of the parts (`magnitude`);
- transpose_p on complex128 transposes the float64 parts (`transposed`; not yet run on a chip);
- dot_general_p is four float64 dots of the parts for complex128 (`product`) and products summed
  without a dot for 64-bit integers (`product_by_sums`), wrapping around as CPU's gemm does;
- lu_p on float64 and complex128 is jax's unblocked loop over rows (`lu_by_rows`).
Every other operand keeps the rule jax had; the CPU client's lowering is untouched.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax._src.interpreters import mlir
from jax._src.lax import lax as lax_primitives
from jax._src.lax import linalg as lax_linalg

_C128 = np.dtype(np.complex128)
_F64 = np.dtype(np.float64)
_PLATFORM = "tpu"

_installed = False


def converted(x, new_dtype):
    """`x` as `new_dtype` (complex128 either of them) from float64 parts, as jax's convert gives
    it: a complex to a real or integer dtype takes the real part (to bool: real part != 0); a real
    or integer to complex has imaginary part +0."""
    new_dtype = np.dtype(new_dtype)
    if x.dtype == new_dtype:
        return x
    if x.dtype == _C128 and new_dtype.kind == "c":  # complex64: float32 parts
        return _from_parts(x, np.finfo(new_dtype).dtype)
    if x.dtype == _C128:
        return lax.convert_element_type(lax.real(x), new_dtype)
    if x.dtype.kind == "c":
        return _from_parts(x, _F64)
    real = lax.convert_element_type(x, _F64)
    return lax.complex(real, lax.full_like(real, 0))


def _from_parts(x, part_dtype):
    """Complex `x` with its parts converted to `part_dtype`."""
    return lax.complex(
        lax.convert_element_type(lax.real(x), part_dtype), lax.convert_element_type(lax.imag(x), part_dtype)
    )


def magnitude(x):
    """|x| of complex128 `x` as C's hypot(real, imag) gives it (CPU's torch.abs): the larger part
    times sqrt(1 + (smaller / larger)^2), so no square overflows; inf where a part is inf (even
    with a NaN in the other), else NaN where a part is NaN; 0 where both are 0."""
    re, im = lax.abs(lax.real(x)), lax.abs(lax.imag(x))
    larger, smaller = lax.max(re, im), lax.min(re, im)
    zero = larger == 0
    ratio = smaller / lax.select(zero, lax.full_like(larger, 1), larger)
    scaled = larger * lax.sqrt(1 + ratio * ratio)
    result = lax.select(zero, larger, scaled)
    infinite = lax.bitwise_or(re == np.inf, im == np.inf)
    return lax.select(infinite, lax.full_like(result, np.inf), result)


def transposed(x, permutation):
    """lax.transpose of complex128 `x`, from its float64 parts transposed."""
    return lax.complex(lax.transpose(lax.real(x), permutation), lax.transpose(lax.imag(x), permutation))


def product(lhs, rhs, *, dimension_numbers, precision=None):
    """lax.dot_general of `lhs` and `rhs` (complex128 either) as complex128, from float64 dots of
    their parts: (ar + i ai)(br + i bi) = ar br - ai bi + i (ar bi + ai br)."""

    precision = lax.Precision.HIGHEST if precision is None else precision  # float64 parts stay float64

    def dot(a, b):
        return lax.dot_general(a, b, dimension_numbers, precision=precision, preferred_element_type=_F64)

    def parts(x):
        if x.dtype.kind == "c":
            return lax.convert_element_type(lax.real(x), _F64), lax.convert_element_type(lax.imag(x), _F64)
        return lax.convert_element_type(x, _F64), None

    (ar, ai), (br, bi) = parts(lhs), parts(rhs)
    real, imag = dot(ar, br), None
    if ai is not None and bi is not None:
        real = real - dot(ai, bi)
    for a, b in ((ar, bi), (ai, br)):
        if a is not None and b is not None:
            imag = dot(a, b) if imag is None else imag + dot(a, b)
    return lax.complex(real, lax.full_like(real, 0) if imag is None else imag)


_SUMS_AT_ONCE = 1 << 22  # products past this are summed one step of k at a time


def product_by_sums(lhs, rhs, *, dimension_numbers, dtype):
    """lax.dot_general of integer `lhs` and `rhs` as `dtype`, as products summed over the
    contracting dims, without a dot. Wraps around as CPU's integer gemm does."""
    (lhs_contract, rhs_contract), (lhs_batch, rhs_batch) = dimension_numbers
    lhs_free = [d for d in range(lhs.ndim) if d not in (*lhs_contract, *lhs_batch)]
    rhs_free = [d for d in range(rhs.ndim) if d not in (*rhs_contract, *rhs_batch)]
    a = lax.transpose(lhs.astype(dtype), (*lhs_batch, *lhs_free, *lhs_contract))
    b = lax.transpose(rhs.astype(dtype), (*rhs_batch, *rhs_contract, *rhs_free))
    sizes = lambda x, dims: math.prod(x.shape[d] for d in dims)
    batch, m, k, n = sizes(lhs, lhs_batch), sizes(lhs, lhs_free), sizes(lhs, lhs_contract), sizes(rhs, rhs_free)
    a, b = a.reshape(batch, m, k), b.reshape(batch, k, n)
    if batch * m * k * n <= _SUMS_AT_ONCE:
        out = jnp.sum(a[:, :, :, None] * b[:, None, :, :], axis=2)
    else:

        def add_step(i, total):
            return total + lax.dynamic_index_in_dim(a, i, axis=2) * lax.dynamic_index_in_dim(b, i, axis=1)

        out = lax.fori_loop(0, k, add_step, jnp.zeros((batch, m, n), dtype))
    shape = [lhs.shape[d] for d in (*lhs_batch, *lhs_free)] + [rhs.shape[d] for d in rhs_free]
    return out.reshape(shape)


def lu_by_rows(a):
    """lax.linalg.lu as jax's unblocked loop over rows (elementwise ops, gathers and scatters)."""
    batch, (m, n) = a.shape[:-2], a.shape[-2:]
    pivots, perm, lu = jax.vmap(lax_linalg._lu_unblocked)(a.reshape((-1, m, n)))
    return lu.reshape(a.shape), pivots.reshape(batch + pivots.shape[-1:]), perm.reshape((*batch, m))


def _dtype_in(avals, *dtypes) -> bool:
    return any(isinstance(aval.dtype, np.dtype) and aval.dtype in dtypes for aval in avals)


_WIDE_INTEGERS = (np.dtype(np.int64), np.dtype(np.uint64))


def _convert(avals_in, avals_out, params):
    if _dtype_in((*avals_in, *avals_out), _C128):
        return converted, {"new_dtype": params["new_dtype"]}
    return None


def _abs(avals_in, avals_out, params):
    return (magnitude, {}) if _dtype_in(avals_in, _C128) else None


def _transpose(avals_in, avals_out, params):
    return (transposed, {"permutation": params["permutation"]}) if _dtype_in(avals_in, _C128) else None


def _dot(avals_in, avals_out, params):
    if _dtype_in((*avals_in, *avals_out), _C128):
        return product, {"dimension_numbers": params["dimension_numbers"], "precision": params["precision"]}
    if _dtype_in(avals_in, *_WIDE_INTEGERS):
        return product_by_sums, {"dimension_numbers": params["dimension_numbers"], "dtype": avals_out[0].dtype}
    return None


def _lu(avals_in, avals_out, params):
    return (lu_by_rows, {}) if _dtype_in(avals_in, _F64, _C128) else None


# primitive -> (avals in, avals out, params) -> (the function built of what XLA:TPU compiles,
# its keyword arguments), or None where jax's rule serves
_DECOMPOSITIONS: dict[object, Callable] = {
    lax_primitives.convert_element_type_p: _convert,
    lax_primitives.abs_p: _abs,
    lax_primitives.transpose_p: _transpose,
    lax_primitives.dot_general_p: _dot,
    lax_linalg.lu_p: _lu,
}


def _tpu_rule(decomposition: Callable, jax_rule: Callable) -> Callable:
    """A TPU lowering rule: `decomposition`'s function where it names one, else `jax_rule`."""

    def rule(ctx, *operands, **params):
        chosen = decomposition(ctx.avals_in, ctx.avals_out, params)
        if chosen is None:
            return jax_rule(ctx, *operands, **params)
        fn, kwargs = chosen
        built = functools.partial(fn, **kwargs)
        outs = mlir.lower_fun(lambda *xs: _as_list(built(*xs)), multiple_results=True)(ctx, *operands)
        return [mlir.lower_with_sharding_in_types(ctx, out, aval) for out, aval in zip(outs, ctx.avals_out)]

    return rule


def _as_list(result) -> list:
    return list(result) if isinstance(result, (tuple, list)) else [result]


def install() -> None:
    """Registers the TPU rules of the primitives in _DECOMPOSITIONS (once)."""
    global _installed
    if _installed:
        return
    _installed = True
    for primitive, decomposition in _DECOMPOSITIONS.items():  # jax's rule kept for other operands
        entry = mlir._platform_specific_lowerings[_PLATFORM].get(primitive) or mlir._lowerings[primitive]
        mlir.register_lowering(primitive, _tpu_rule(decomposition, entry.rule), platform=_PLATFORM, inline=entry.inline)
