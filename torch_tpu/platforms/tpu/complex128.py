"""complex128 on XLA:TPU: jax lowering rules, for the TPU platform only, that take complex128 apart
into its float64 parts where XLA:TPU cannot compile the complex128 op itself.

XLA:TPU emulates float64 (its X64 rewriter) and aborts the whole process, a C++ CHECK failure and
not an error, compiling (measured on a v5e, jax 0.10.2):
- a convert to or from complex128: c64 <-> c128, f32/f64 -> c128 ("Unsupported CVT X{64|128}
  expansion from c64[2] to c128[2]");
- a complex128 abs ("Check failed: operand->shape().IsTuple()").
And it computes a complex128 dot whose operand is transposed wrongly: `a @ b.mH` came out as
`a @ b.conj()`, the transpose dropped (a float64 dot with a transposed operand is right).
What it does compile: complex(f64, f64), real and imag, and float64 arithmetic. So here
convert_element_type_p with a complex128 operand or result builds the result from the parts
(`converted`), abs_p on complex128 is the hypot of the parts (`magnitude`), and dot_general_p
with a complex128 side is four float64 dots of the parts (`product`). Every other conversion,
abs and dot keeps the rule jax had; the CPU client's lowering is untouched.
"""

from __future__ import annotations

import numpy as np
from jax import lax
from jax._src.interpreters import mlir
from jax._src.lax import lax as lax_primitives

_C128 = np.dtype(np.complex128)
_F64 = np.dtype(np.float64)
_PLATFORM = "tpu"

# The rules jax had for TPU before `install`, which every other dtype keeps.
_jax_rules: dict = {}


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


def _is_c128(aval) -> bool:
    return isinstance(aval.dtype, np.dtype) and aval.dtype == _C128


_converted_lowering = mlir.lower_fun(lambda x, *, new_dtype: converted(x, new_dtype), multiple_results=False)
_magnitude_lowering = mlir.lower_fun(magnitude, multiple_results=False)
_product_lowering = mlir.lower_fun(product, multiple_results=False)


def _convert_rule(ctx, operand, *, new_dtype, weak_type, sharding):
    (aval_in,), (aval_out,) = ctx.avals_in, ctx.avals_out
    if not (_is_c128(aval_in) or _is_c128(aval_out)):
        rule = _jax_rules[lax_primitives.convert_element_type_p]
        return rule(ctx, operand, new_dtype=new_dtype, weak_type=weak_type, sharding=sharding)
    if aval_in.dtype == aval_out.dtype:  # a weak type or sharding change: no convert at all
        out = operand
    else:
        (out,) = _converted_lowering(ctx, operand, new_dtype=aval_out.dtype)
    return [mlir.lower_with_sharding_in_types(ctx, out, aval_out)]


def _abs_rule(ctx, operand, **params):
    (aval_in,), (aval_out,) = ctx.avals_in, ctx.avals_out
    if not _is_c128(aval_in):
        return _jax_rules[lax_primitives.abs_p](ctx, operand, **params)
    (out,) = _magnitude_lowering(ctx, operand)
    return [mlir.lower_with_sharding_in_types(ctx, out, aval_out)]


def _dot_rule(ctx, lhs, rhs, *, dimension_numbers, precision, preferred_element_type, out_sharding, **params):
    (aval_out,) = ctx.avals_out
    if not any(_is_c128(aval) for aval in (*ctx.avals_in, aval_out)):
        rule = _jax_rules[lax_primitives.dot_general_p]
        return rule(
            ctx,
            lhs,
            rhs,
            dimension_numbers=dimension_numbers,
            precision=precision,
            preferred_element_type=preferred_element_type,
            out_sharding=out_sharding,
            **params,
        )
    (out,) = _product_lowering(ctx, lhs, rhs, dimension_numbers=dimension_numbers, precision=precision)
    return [mlir.lower_with_sharding_in_types(ctx, out, aval_out)]


def install() -> None:
    """Registers the TPU rules of convert_element_type_p, abs_p and dot_general_p (once)."""
    if _jax_rules:
        return
    for primitive, rule in (
        (lax_primitives.convert_element_type_p, _convert_rule),
        (lax_primitives.abs_p, _abs_rule),
        (lax_primitives.dot_general_p, _dot_rule),
    ):
        entry = mlir._platform_specific_lowerings[_PLATFORM].get(primitive) or mlir._lowerings[primitive]
        _jax_rules[primitive] = entry.rule
        mlir.register_lowering(primitive, rule, platform=_PLATFORM, inline=entry.inline)
