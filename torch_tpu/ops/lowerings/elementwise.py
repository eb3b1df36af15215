"""Pointwise ops: arithmetic, math functions, comparisons, logical and bitwise ops.

Operands are promoted the way TensorIterator promotes them (`result_dtype`),
so integer and bool semantics, wrapped Python numbers and reduced-precision
floats (computed in float32, as CPU's opmath does) match PyTorch.
"""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np
import torch
from jax import lax

from torch_tpu import metrics
from torch_tpu.ops import sign_bit
from torch_tpu.ops.checks import Failure
from torch_tpu.ops.dtypes import opmath, to_torch_dtype, type_name
from torch_tpu.ops.lowerings.common import divide, sigmoid
from torch_tpu.ops.promotion import (
    BOOL_UNSUPPORTED,
    PYTHON_SCALARS,
    any_bool,
    cast,
    float_args,
    is_integral,
    promote,
    require,
    result_dtype,
    to_float,
)
from torch_tpu.ops.registry import Check, aten, lower, signature_check

# ---- arithmetic -------------------------------------------------------------


def _scaled(b, alpha, dtype, ct):
    """`b * alpha` in opmath `ct` (CPU rounds alpha to dtype); alpha is a Python or a traced scalar."""
    if isinstance(alpha, PYTHON_SCALARS) and alpha == 1:
        return b
    return b * cast(cast(alpha, dtype), ct)


@lower(aten.add.Tensor, aten.add.Scalar, traced=("other", "alpha"))
def add(self, other, alpha=1):
    dtype, (a, b) = promote(self, other)
    if dtype == np.bool_:
        return a | (b & cast(alpha, np.bool_))
    ct = opmath(dtype)
    a, b = cast(a, ct), cast(b, ct)
    return a + _scaled(b, alpha, dtype, ct)


@lower(aten.sub.Tensor, aten.sub.Scalar, traced=("other", "alpha"))
def sub(self, other, alpha=1):
    if any_bool(self, other):
        raise BOOL_UNSUPPORTED(
            "Subtraction, the `-` operator, with a bool tensor is not supported. "
            "If you are trying to invert a mask, use the `~` or `logical_not()` operator instead."
        )
    dtype, (a, b) = promote(self, other)
    ct = opmath(dtype)
    a, b = cast(a, ct), cast(b, ct)
    return a - _scaled(b, alpha, dtype, ct)


@lower(aten.rsub.Tensor, aten.rsub.Scalar, traced=("other", "alpha"))
def rsub(self, other, alpha=1):
    return sub(other, self, alpha)


@lower(aten.mul.Tensor, aten.mul.Scalar, traced=("other",))
def mul(self, other):
    dtype, (a, b) = promote(self, other)
    if dtype == np.bool_:
        return a & b
    ct = opmath(dtype)
    if ct != dtype and _is_single_value(other):
        b = other  # CPU multiplies by a one-element `other` in opmath, unrounded (a Python float too)
    return cast(a, ct) * cast(b, ct)


def _is_single_value(x) -> bool:
    return isinstance(x, PYTHON_SCALARS) or x.size == 1


def _check_inplace(self, result: np.dtype) -> None:
    """CPU's check for in-place ops whose meta kernels skip it."""
    if not torch.can_cast(to_torch_dtype(result), to_torch_dtype(self.dtype)):
        raise RuntimeError(
            f"result type {type_name(result)} can't be cast to the desired output type {type_name(self.dtype)}"
        )


@lower(aten.mul_.Tensor, aten.mul_.Scalar)
def mul_(self, other):
    _check_inplace(self, result_dtype(self, other))
    return mul(self, other)


@lower(aten.div.Tensor, aten.div.Scalar, traced=("other",))
def div(self, other):
    a, b = to_float(self, other)
    return divide(a, b)


def _rem(a, b):
    """C's remainder (sign of the dividend), broadcasting."""
    return lax.rem(*jnp.broadcast_arrays(a, b))


def _floor_divide_float(a, b):
    """CPU's div_floor_floating: floor of the quotient, exact for multiples."""
    mod = _rem(a, b)
    quot = (a - mod) / b
    quot = jnp.where((mod != 0) & ((b < 0) != (mod < 0)), quot - 1, quot)
    floor = jnp.floor(quot)
    floor = jnp.where(quot - floor > 0.5, floor + 1, floor)
    floor = jnp.where(quot == 0, sign_bit.copysign(jnp.zeros_like(quot), a / b), floor)
    return jnp.where(b == 0, a / b, floor)


def _trunc_divide_float(a, b):
    """CPU's div_trunc_floating, trunc(a / b), also where the division is not correctly rounded."""
    return truncated_quotient(a, b, divide(a, b))


def truncated_quotient(a, b, quot):
    """trunc(quot) for `quot`, a / b within an ulp or two: never nearer zero than the exact
    truncated quotient. XLA:TPU divides by a refined reciprocal, not correctly rounded, so a / a
    may be 1 - ulp, whose trunc is 0 (fmod's gradient wrt its divisor, -grad * trunc(a / b), lost
    the whole cotangent). The exact one is (a - fmod(a, b)) / b, an integer to within that
    division's rounding, so rounded to the nearest integer while well below 2**mantissa bits.
    A correctly rounded quotient (CPU's, the XLA CPU client's) is never nearer zero than it:
    there the result is trunc(quot), bit for bit."""
    trunc = jnp.trunc(quot)
    exact = jnp.floor((a - _rem(a, b)) / b + 0.5)
    bound = 2.0 ** (jnp.finfo(quot.dtype).nmant - 2)
    short = (jnp.abs(trunc) < jnp.abs(exact)) & (jnp.abs(exact) < bound)
    return jnp.where(short, exact, trunc)


def _divide_rounded(self, other, rounding_mode: str):
    dtype, (a, b) = promote(self, other)
    require(f"div_{rounding_mode}_cpu", dtype, bool_ok=False)
    if is_integral(dtype):
        return lax.div(*jnp.broadcast_arrays(a, b)) if rounding_mode == "trunc" else jnp.floor_divide(a, b)
    ct = opmath(dtype)
    a, b = cast(a, ct), cast(b, ct)
    return _trunc_divide_float(a, b) if rounding_mode == "trunc" else _floor_divide_float(a, b)


def _is_integral(x) -> bool:
    if isinstance(x, torch.Tensor):
        return not (x.dtype.is_floating_point or x.dtype.is_complex)
    return isinstance(x, int)


def _zero_division_host(self, other, rounding_mode="floor", **kwargs):
    """Integer division by zero raises on CPU, where XLA would return garbage: one host sync."""
    if rounding_mode is None or not (_is_integral(self) and _is_integral(other)):
        return
    if isinstance(other, torch.Tensor):
        if other.numel() == 0:
            return
        if other.device.type == "tpu":
            metrics.bump("host_transfers")
        has_zero = bool((other == 0).any().item())
    else:
        has_zero = other == 0
    if has_zero:
        raise RuntimeError("ZeroDivisionError")


def _zero_division_graph(self, other, rounding_mode="floor", **kwargs) -> list[Failure]:
    def integral(x) -> bool:
        if isinstance(x, (bool, int)):
            return True
        return hasattr(x, "dtype") and (jnp.issubdtype(x.dtype, jnp.integer) or x.dtype == jnp.bool_)

    if rounding_mode is None or not (integral(self) and integral(other)):
        return []
    other = jnp.asarray(other)
    if other.size == 0:
        return []
    return [Failure(jnp.any(other == 0), jnp.zeros((), jnp.int64), RuntimeError, "ZeroDivisionError")]


_integer_zero_division_check = Check(_zero_division_host, _zero_division_graph)


@lower(aten.div.Tensor_mode, aten.div.Scalar_mode, check=_integer_zero_division_check)
def div_mode(self, other, *, rounding_mode=None):
    if rounding_mode is None:
        return div(self, other)
    return _divide_rounded(self, other, rounding_mode)


@lower(aten.floor_divide.default, aten.floor_divide.Scalar, check=_integer_zero_division_check)
def floor_divide(self, other):
    return _divide_rounded(self, other, "floor")


@lower(aten.floor_divide_.Tensor, aten.floor_divide_.Scalar, check=_integer_zero_division_check)
def floor_divide_(self, other):
    return floor_divide(self, other)


@lower(aten.remainder.Tensor, aten.remainder.Scalar, aten.remainder.Scalar_Tensor, check=_integer_zero_division_check)
def remainder(self, other):
    """Python's modulo: the result takes the divisor's sign."""
    dtype, (a, b) = promote(self, other)
    require("remainder_cpu", dtype, bool_ok=False)
    ct = opmath(dtype)
    a, b = cast(a, ct), cast(b, ct)
    mod = _rem(a, b)
    return jnp.where((mod != 0) & ((b < 0) != (mod < 0)), mod + b, mod)


@lower(aten.fmod.Tensor, aten.fmod.Scalar, check=_integer_zero_division_check)
def fmod(self, other):
    """C's fmod / %: the result takes the dividend's sign."""
    dtype, (a, b) = promote(self, other)
    require("fmod_cpu", dtype, bool_ok=False)
    ct = opmath(dtype)
    return _rem(cast(a, ct), cast(b, ct))


def _int_pow(base, exponent):
    """CPU's powi: square-and-multiply over every exponent bit (wrapping like C; jnp.power
    stops early for narrow types); negative exponents give 0, except for bases 1 and -1."""
    base, exponent = jnp.broadcast_arrays(base, exponent)

    def step(_, state):
        result, b, e = state
        return jnp.where((e & 1) == 1, result * b, result), b * b, e >> 1

    bits = np.dtype(exponent.dtype).itemsize * 8
    result, _, _ = lax.fori_loop(0, bits, step, (jnp.ones_like(base), base, jnp.maximum(exponent, 0)))
    if jnp.issubdtype(base.dtype, jnp.unsignedinteger):
        return result
    negative = jnp.where(base == 1, 1, jnp.where(base == -1, jnp.where(exponent % 2 == 0, 1, -1), 0))
    return jnp.where(exponent < 0, negative.astype(base.dtype), result)


def _check_pow(self, exponent):
    """Eager: an integer tensor to a negative Python int (a traced exponent cannot raise)."""
    if isinstance(self, torch.Tensor) and _is_integral(self) and isinstance(exponent, int) and exponent < 0:
        if not isinstance(exponent, bool):
            raise RuntimeError("Integers to negative integer powers are not allowed.")


def _special_pow(base, exponent):
    """CPU's special exponents (small integers, +-0.5) for a Python exponent, else None."""
    if float(exponent).is_integer() and abs(exponent) <= 4:
        return lax.integer_pow(base, int(exponent))
    if exponent == 0.5:
        return jnp.sqrt(base)
    if exponent == -0.5:
        return lax.rsqrt(base)
    return None


def _traced_pow(base, exponent):
    """`_special_pow` chosen at run time for a traced 0-d exponent: the same results, one executable."""
    result = jnp.power(base, exponent)
    for special in (0.5, -0.5, *range(-4, 5)):
        result = jnp.where(exponent == special, _special_pow(base, special), result)
    return result


@lower(aten.pow.Tensor_Tensor)
def power(self, exponent, scalar_exponent=False):
    dtype, (base, exp) = promote(self, exponent)
    require("pow", dtype, bool_ok=False)
    if is_integral(dtype):
        if isinstance(exponent, int) and exponent < 0:
            raise RuntimeError("Integers to negative integer powers are not allowed.")
        return _int_pow(base, exp)
    ct = opmath(dtype)
    base = cast(base, ct)
    if isinstance(exponent, (int, float)) and not isinstance(exponent, bool):
        special = _special_pow(base, exponent)
        if special is not None:
            return special
    elif scalar_exponent:
        return _traced_pow(base, cast(exp, ct))  # a traced Scalar (a CPU 0-dim tensor exponent is not special)
    return jnp.power(base, cast(exp, ct))


@lower(aten.pow.Tensor_Scalar, traced=("exponent",), check=_check_pow)
def power_tensor_scalar(self, exponent):
    return power(self, exponent, scalar_exponent=not isinstance(exponent, PYTHON_SCALARS))


@lower(aten.pow.Scalar, traced=("self",))
def power_scalar_tensor(self, exponent):
    return power(self, exponent)


@lower(aten.lerp.Scalar, aten.lerp.Tensor, traced=("weight",))
def lerp(self, end, weight):
    kernel = "lerp_kernel_tensor" if hasattr(weight, "dtype") and jnp.ndim(weight) else "lerp_kernel_scalar"
    require(kernel, self.dtype, bool_ok=False, int_ok=False)
    a, b, w = float_args(self, end, weight)
    return jnp.where(jnp.abs(w) < 0.5, a + w * (b - a), b - (b - a) * (1 - w))


@lower(aten.addcmul.default, traced=("value",))
def addcmul(self, tensor1, tensor2, *, value=1):
    dtype, (a, b, c) = promote(self, tensor1, tensor2)
    if dtype == np.bool_:
        return a | (b & c & cast(value, np.bool_))
    ct = opmath(dtype)
    a, b, c = cast(a, ct), cast(b, ct), cast(c, ct)
    return a + cast(value, ct) * b * c


@lower(aten.addcmul_.default, traced=("value",))
def addcmul_(self, tensor1, tensor2, *, value=1):
    _check_inplace(self, result_dtype(self, tensor1, tensor2))
    return addcmul(self, tensor1, tensor2, value=value)


@lower(aten.addcdiv.default, traced=("value",))
def addcdiv(self, tensor1, tensor2, *, value=1):
    a, b, c = float_args(self, tensor1, tensor2)
    return a + cast(value, a.dtype) * (b / c)


# ---- unary ------------------------------------------------------------------


@lower(aten.neg.default)
def neg(self):
    return -self


@lower(aten._conj_physical.default)
def conj_physical(self):
    return jnp.conj(self)


@lower(aten.conj_physical_.default)
def conj_physical_(self):
    return jnp.conj(self)


@lower(aten.conj_physical.out, eager=True)
def conj_physical_out(self, *, out):
    """CPU's conj_physical.out: resized as out= tensors are, then written (through out's bits)."""
    result = torch.conj_physical(self)
    if out.shape != result.shape:
        out.resize_(result.shape)
    return out.copy_(result)


@lower(aten.abs.default)
def absolute(self):
    require("abs_cpu", self.dtype, bool_ok=False)
    return jnp.abs(self)


@lower(aten.sign.default)
def sign(self):
    """(0 < x) - (x < 0): NaN and -0.0 give 0."""
    if self.dtype == np.bool_:
        return self
    return (self > 0).astype(self.dtype) - (self < 0).astype(self.dtype)


@lower(aten.sgn.default)
def sgn(self):
    if jnp.issubdtype(self.dtype, jnp.complexfloating):
        magnitude = jnp.abs(self)
        return jnp.where(magnitude == 0, 0, self / jnp.where(magnitude == 0, 1, magnitude).astype(self.dtype))
    return sign(self)


def _rounding(fn):
    def lowering(self):
        require(f"{fn.__name__}_vml_cpu", self.dtype, bool_ok=False)
        if jnp.issubdtype(self.dtype, jnp.complexfloating):
            raise NotImplementedError(f"{fn.__name__} is not supported for complex inputs")
        return self if is_integral(self.dtype) else fn(self)

    return lowering


for _op, _fn in {
    aten.floor.default: jnp.floor,
    aten.ceil.default: jnp.ceil,
    aten.trunc.default: jnp.trunc,
    aten.round.default: jnp.round,  # half to even, as torch
}.items():
    lower(_op)(_rounding(_fn))


@lower(aten.round.decimals)
def round_decimals(self, *, decimals):
    if is_integral(self.dtype):
        return self
    x = cast(self, opmath(self.dtype))
    scale = float(10 ** abs(decimals))
    if decimals < 0:
        return jnp.round(x / scale) * scale
    return jnp.round(x * scale) / scale


@lower(aten.frac.default)
def frac(self):
    require("frac_cpu", self.dtype, bool_ok=False, int_ok=False)
    x = cast(self, opmath(self.dtype))
    return x - jnp.trunc(x)


def _complex_atanh(z):
    """C99/NumPy catanh (CPython's cmath.atanh and its special values). jnp.arctanh and jnp.arctan
    of complex inputs differ from CPU at infinities, nans and the branch cuts' signed zeros."""
    u, v = jnp.real(z), jnp.imag(z)
    sign = jnp.where(sign_bit.signbit(u), -1.0, 1.0).astype(u.dtype)  # atanh(-z) = -atanh(z)
    x, y = jnp.abs(u), v * sign
    ay = jnp.abs(y)
    info = jnp.finfo(u.dtype)
    h = jnp.hypot(x / 2, y / 2)
    large = (x > math.sqrt(float(info.max)) / 4) | (ay > math.sqrt(float(info.max)) / 4)
    re = jnp.where(large, x / 4 / h / h, jnp.log1p(4 * x / ((1 - x) * (1 - x) + ay * ay)) / 4)
    im = jnp.where(large, -sign_bit.copysign(jnp.pi / 2, -y), -jnp.arctan2(-2 * y, (1 - x) * (1 + x) - ay * ay) / 2)
    # x == 1 with a tiny y: the general form overflows
    one = (x == 1) & (ay > 0) & (ay < math.sqrt(float(info.tiny)))
    re = jnp.where(one, -jnp.log(jnp.sqrt(ay) / jnp.sqrt(jnp.hypot(ay, 2))), re)
    im = jnp.where(one, sign_bit.copysign(jnp.arctan2(2, -ay) / 2, y), im)
    # special values: an infinite part gives 0 +- pi/2 i; a nan gives nan unless C99 says otherwise
    nan, inf_x, inf_y = jnp.isnan(x) | jnp.isnan(y), jnp.isinf(x), jnp.isinf(y)
    half_pi = sign_bit.copysign(jnp.asarray(jnp.pi / 2, u.dtype), y)
    zero, nans = jnp.zeros_like(x), jnp.full_like(x, jnp.nan)
    re = jnp.where(nan, jnp.where(inf_x | inf_y | (x == 0), zero, nans), jnp.where(inf_x | inf_y, zero, re))
    im = jnp.where(nan, jnp.where(inf_y, half_pi, nans), jnp.where(inf_x | inf_y, half_pi, im))
    return lax.complex(re * sign, im * sign)


def _atanh(x):
    return _complex_atanh(x) if jnp.iscomplexobj(x) else jnp.arctanh(x)


def _atan(x):
    if not jnp.iscomplexobj(x):
        return jnp.arctan(x)
    w = _complex_atanh(lax.complex(-jnp.imag(x), jnp.real(x)))  # atan(z) = -i atanh(i z)
    return lax.complex(jnp.imag(w), -jnp.real(w))


def _sinc(x):
    pix = x * math.pi
    return jnp.where(x == 0, jnp.ones_like(x), jnp.sin(pix) / jnp.where(x == 0, 1, pix))


# Float functions: integer and bool inputs compute in the default dtype.
_FLOAT_UNARY = {
    aten.exp.default: jnp.exp,
    aten.exp2.default: jnp.exp2,
    aten.expm1.default: jnp.expm1,
    aten.log.default: jnp.log,
    aten.log2.default: jnp.log2,
    aten.log10.default: jnp.log10,
    aten.log1p.default: jnp.log1p,
    aten.sqrt.default: jnp.sqrt,
    aten.rsqrt.default: lax.rsqrt,
    aten.reciprocal.default: lambda x: divide(1, x),
    aten.sin.default: jnp.sin,
    aten.cos.default: jnp.cos,
    aten.tan.default: jnp.tan,
    aten.asin.default: jnp.arcsin,
    aten.acos.default: jnp.arccos,
    aten.atan.default: _atan,
    aten.sinh.default: jnp.sinh,
    aten.cosh.default: jnp.cosh,
    aten.tanh.default: jnp.tanh,
    aten.asinh.default: jnp.arcsinh,
    aten.acosh.default: jnp.arccosh,
    aten.atanh.default: _atanh,
    aten.sigmoid.default: sigmoid,
    aten.erf.default: lax.erf,
    aten.erfc.default: lax.erfc,
    aten.erfinv.default: lax.erf_inv,
    aten.sinc.default: _sinc,
}


def _float_unary(fn):
    def lowering(self):
        (x,) = to_float(self)
        return fn(x)

    return lowering


for _op, _fn in _FLOAT_UNARY.items():
    lower(_op)(_float_unary(_fn))


@lower(aten.logit.default)
def logit(self, eps=None):
    (x,) = to_float(self)
    if eps is not None:
        x = jnp.clip(x, eps, 1 - eps)
    return jnp.log(x / (1 - x))


@lower(aten.nan_to_num.default)
def nan_to_num(self, nan=None, posinf=None, neginf=None):
    if is_integral(self.dtype):
        return self
    info = jnp.finfo(self.dtype)
    x = jnp.where(jnp.isnan(self), cast(0.0 if nan is None else nan, self.dtype), self)
    x = jnp.where(x == jnp.inf, cast(info.max if posinf is None else posinf, self.dtype), x)
    return jnp.where(x == -jnp.inf, cast(info.min if neginf is None else neginf, self.dtype), x)


@lower(aten.isnan.default)
def isnan(self):
    return jnp.zeros(self.shape, bool) if is_integral(self.dtype) else jnp.isnan(self)


@lower(aten.isinf.default)
def isinf(self):
    return jnp.zeros(self.shape, bool) if is_integral(self.dtype) else jnp.isinf(self)


@lower(aten.isposinf.default)
def isposinf(self):
    return jnp.zeros(self.shape, bool) if is_integral(self.dtype) else self == jnp.inf


@lower(aten.isneginf.default)
def isneginf(self):
    return jnp.zeros(self.shape, bool) if is_integral(self.dtype) else self == -jnp.inf


@lower(aten.signbit.default)
def signbit(self):
    if is_integral(self.dtype):
        return self < 0 if jnp.issubdtype(self.dtype, jnp.signedinteger) else jnp.zeros(self.shape, bool)
    return sign_bit.signbit(self)


# ---- binary math ------------------------------------------------------------


@lower(aten.atan2.default)
def atan2(self, other):
    a, b = to_float(self, other)
    return jnp.arctan2(a, b)


@lower(aten.logaddexp.default)
def logaddexp(self, other):
    a, b = float_args(self, other)
    return jnp.logaddexp(a, b)


@lower(aten.logaddexp2.default)
def logaddexp2(self, other):
    a, b = float_args(self, other)
    return jnp.logaddexp2(a, b)


@lower(aten.hypot.default)
def hypot(self, other):
    require("hypot_cpu", result_dtype(self, other), bool_ok=False, int_ok=False)
    a, b = to_float(self, other)
    return jnp.hypot(a, b)


@lower(aten.copysign.Tensor, aten.copysign.Scalar)
def copysign(self, other):
    a, b = to_float(self, other)
    return sign_bit.copysign(a, b)


@lower(aten.xlogy.Tensor, aten.xlogy.Scalar_Other, aten.xlogy.Scalar_Self)
def xlogy(self, other):
    x, y = to_float(self, other)
    safe = jnp.where(x == 0, 0, x * jnp.log(y))
    return jnp.where(jnp.isnan(y), jnp.nan, safe)


@signature_check
def _heaviside_dtypes(self, values):
    if self.dtype != values.dtype:
        raise RuntimeError("heaviside is not yet implemented for tensors with different dtypes.")


@lower(aten.heaviside.default, check=_heaviside_dtypes)
def heaviside(self, values):
    dtype, (x, v) = promote(self, values)
    return jnp.where(x == 0, v, (x > 0).astype(dtype))


@lower(aten.maximum.default)
def maximum(self, other):
    _, (a, b) = promote(self, other)
    return jnp.maximum(a, b)


@lower(aten.minimum.default)
def minimum(self, other):
    _, (a, b) = promote(self, other)
    return jnp.minimum(a, b)


@lower(aten.fmax.default)
def fmax(self, other):
    _, (a, b) = promote(self, other)
    return jnp.fmax(a, b)


@lower(aten.fmin.default)
def fmin(self, other):
    _, (a, b) = promote(self, other)
    return jnp.fmin(a, b)


@lower(aten.clamp.default, aten.clamp.Tensor, traced=("min", "max"))
def clamp(self, min=None, max=None):
    """max(x, min) then min(., max): NaN propagates, min > max gives max."""
    if jnp.issubdtype(self.dtype, jnp.complexfloating):
        raise NotImplementedError("clamp is not supported for complex types")
    _, (x, lo, hi) = promote(self, min, max)
    if lo is not None:
        x = jnp.maximum(x, lo)
    if hi is not None:
        x = jnp.minimum(x, hi)
    return x


@lower(aten.clamp_min.default, aten.clamp_min.Tensor, traced=("min",))
def clamp_min(self, min):
    return clamp(self, min, None)


@lower(aten.clamp_max.default, aten.clamp_max.Tensor, traced=("max",))
def clamp_max(self, max):
    return clamp(self, None, max)


# ---- selection --------------------------------------------------------------


@lower(aten.where.self)
def where(condition, self, other):
    _, (a, b) = promote(self, other)
    return jnp.where(cast(condition, np.bool_), a, b)


@lower(aten.masked_fill.Scalar, aten.masked_fill.Tensor, traced=("value",))
def masked_fill(self, mask, value):
    return jnp.where(cast(mask, np.bool_), cast(value, self.dtype), self)


# ---- comparisons, logical and bitwise ops -----------------------------------


def _comparison(fn):
    def lowering(self, other):
        _, (a, b) = promote(self, other)
        return fn(a, b)

    return lowering


for _name, _fn in {
    "eq": jnp.equal,
    "ne": jnp.not_equal,
    "lt": jnp.less,
    "le": jnp.less_equal,
    "gt": jnp.greater,
    "ge": jnp.greater_equal,
}.items():
    _packet = getattr(aten, _name)
    lower(_packet.Tensor, _packet.Scalar, traced=("other",))(_comparison(_fn))


@lower(aten.logical_and.default)
def logical_and(self, other):
    return (self != 0) & (other != 0)


@lower(aten.logical_or.default)
def logical_or(self, other):
    return (self != 0) | (other != 0)


@lower(aten.logical_xor.default)
def logical_xor(self, other):
    return (self != 0) ^ (other != 0)


@lower(aten.logical_not.default)
def logical_not(self):
    return self == 0


@lower(aten.bitwise_and.Tensor, aten.bitwise_and.Scalar, aten.bitwise_and.Scalar_Tensor)
def bitwise_and(self, other):
    dtype, (a, b) = promote(self, other)
    require("bitwise_and_cpu", dtype, float_ok=False)
    return a & b


@lower(aten.bitwise_or.Tensor, aten.bitwise_or.Scalar, aten.bitwise_or.Scalar_Tensor)
def bitwise_or(self, other):
    dtype, (a, b) = promote(self, other)
    require("bitwise_or_cpu", dtype, float_ok=False)
    return a | b


@lower(aten.bitwise_xor.Tensor, aten.bitwise_xor.Scalar, aten.bitwise_xor.Scalar_Tensor)
def bitwise_xor(self, other):
    dtype, (a, b) = promote(self, other)
    require("bitwise_xor_cpu", dtype, float_ok=False)
    return a ^ b


@lower(aten.bitwise_not.default)
def bitwise_not(self):
    require("bitwise_not_cpu", self.dtype, float_ok=False)
    return ~self


@lower(
    aten.bitwise_left_shift.Tensor,
    aten.bitwise_left_shift.Tensor_Scalar,
    aten.bitwise_left_shift.Scalar_Tensor,
    aten.__lshift__.Tensor,
    aten.__lshift__.Scalar,
)
def left_shift(self, other):
    """Shifts by a negative amount or by the bit width or more give 0."""
    dtype, (a, b) = promote(self, other)
    require("lshift_cpu", dtype, bool_ok=False, float_ok=False)
    return lax.shift_left(*jnp.broadcast_arrays(a, b))


@lower(
    aten.bitwise_right_shift.Tensor,
    aten.bitwise_right_shift.Tensor_Scalar,
    aten.bitwise_right_shift.Scalar_Tensor,
    aten.__rshift__.Tensor,
    aten.__rshift__.Scalar,
)
def right_shift(self, other):
    """Arithmetic for signed types; out-of-range shifts fill with the sign bit."""
    dtype, (a, b) = promote(self, other)
    require("rshift_cpu", dtype, bool_ok=False, float_ok=False)
    if jnp.issubdtype(dtype, jnp.signedinteger):
        return lax.shift_right_arithmetic(*jnp.broadcast_arrays(a, b))
    return lax.shift_right_logical(*jnp.broadcast_arrays(a, b))


@lower(aten.__ilshift__.Tensor, aten.__ilshift__.Scalar)
def ilshift(self, other):
    return left_shift(self, other)


@lower(aten.__irshift__.Tensor, aten.__irshift__.Scalar)
def irshift(self, other):
    return right_shift(self, other)
