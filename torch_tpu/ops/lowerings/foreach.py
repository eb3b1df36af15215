"""The _foreach_* family: a functional _foreach_ op returns `([one array per list element],)`; its
in-place (`_foreach_add_.List`) and out= variants are derived from it, so the whole list updates in one
executable."""

from __future__ import annotations

import math

import jax.numpy as jnp
import torch
from jax import lax

from torch_tpu.ops import precision
from torch_tpu.ops.dtypes import to_opmath
from torch_tpu.ops.lowerings.common import divide, sigmoid
from torch_tpu.ops.lowerings.elementwise import lerp as _lerp  # CPU's lerp, exact at both ends
from torch_tpu.ops.registry import aten, lower


def _map(fn, *lists):
    return ([fn(*xs) for xs in zip(*lists)],)


def _pow(x, exponent):
    """torch's pow with CPU's exact special cases for common exponents."""
    if isinstance(exponent, (int, float)) and not isinstance(exponent, bool):
        if jnp.issubdtype(x.dtype, jnp.inexact):
            if exponent == 2:
                return x * x
            if exponent == 3:
                return x * x * x
            if exponent == 0.5:
                return jnp.sqrt(x)
            if exponent == -0.5:
                return lax.rsqrt(x)
            if exponent == -1:
                return 1 / x
            if exponent == -2:
                return 1 / (x * x)
        integral = isinstance(exponent, int) or float(exponent).is_integer()
        if integral and (jnp.issubdtype(x.dtype, jnp.inexact) or exponent >= 0):
            return lax.integer_pow(x, int(exponent))
    return jnp.power(x, exponent)


# ---- binary: List / Scalar / ScalarList / Tensor overloads ------------------


@lower(aten._foreach_add.List, aten._foreach_add.Tensor)
def foreach_add_list(self, other, *, alpha=1):
    others = other if isinstance(other, (list, tuple)) else [other] * len(self)
    return _map(lambda x, y: x + (y * alpha if alpha != 1 else y), self, others)


@lower(aten._foreach_add.Scalar, traced=("scalar",))
def foreach_add_scalar(self, scalar):
    return _map(lambda x: x + scalar, self)


@lower(aten._foreach_add.ScalarList, traced=("scalars",))
def foreach_add_scalar_list(self, scalars):
    return _map(lambda x, s: x + s, self, scalars)


@lower(aten._foreach_sub.List)
def foreach_sub_list(self, other, *, alpha=1):
    return _map(lambda x, y: x - (y * alpha if alpha != 1 else y), self, other)


@lower(aten._foreach_sub.Scalar, traced=("scalar",))
def foreach_sub_scalar(self, scalar):
    return _map(lambda x: x - scalar, self)


@lower(aten._foreach_sub.ScalarList, traced=("scalars",))
def foreach_sub_scalar_list(self, scalars):
    return _map(lambda x, s: x - s, self, scalars)


def _broadcast_other(self, other):
    return other if isinstance(other, (list, tuple)) else [other] * len(self)


@lower(aten._foreach_mul.List, aten._foreach_mul.Tensor)
def foreach_mul_list(self, other):
    return _map(lambda x, y: x * y, self, _broadcast_other(self, other))


@lower(aten._foreach_mul.Scalar, traced=("scalar",))
def foreach_mul_scalar(self, scalar):
    return _map(lambda x: to_opmath(x) * scalar, self)  # CPU multiplies half floats in float32


@lower(aten._foreach_mul.ScalarList, traced=("scalars",))
def foreach_mul_scalar_list(self, scalars):
    return _map(lambda x, s: to_opmath(x) * s, self, scalars)


def _div(x, y):
    # torch's true division: integers divide as floats.
    if not jnp.issubdtype(jnp.result_type(x, y), jnp.inexact):
        x = x.astype(jnp.float32)
    return divide(to_opmath(x), y)


@lower(aten._foreach_div.List, aten._foreach_div.Tensor)
def foreach_div_list(self, other):
    return _map(_div, self, _broadcast_other(self, other))


@lower(aten._foreach_div.Scalar, traced=("scalar",))
def foreach_div_scalar(self, scalar):
    return _map(lambda x: _div(x, scalar), self)


@lower(aten._foreach_div.ScalarList, traced=("scalars",))
def foreach_div_scalar_list(self, scalars):
    return _map(_div, self, scalars)


@lower(aten._foreach_pow.List)
def foreach_pow_list(self, exponent):
    return _map(jnp.power, self, exponent)


@lower(aten._foreach_pow.Scalar)
def foreach_pow_scalar(self, exponent):
    return _map(lambda x: _pow(x, exponent), self)


@lower(aten._foreach_pow.ScalarList)
def foreach_pow_scalar_list(self, exponent):
    return _map(_pow, self, exponent)


@lower(aten._foreach_pow.ScalarAndTensor)
def foreach_pow_scalar_and_tensor(self, exponent):
    return _map(lambda e: jnp.power(self, e), exponent)


def _register_extremum(name: str, clamp: str, fn) -> None:
    """_foreach_{maximum,minimum} and _foreach_{clamp_min,clamp_max}: they agree elementwise (NaN
    propagates in both)."""
    packets = (getattr(aten, f"_foreach_{name}"), getattr(aten, f"_foreach_{clamp}"))

    @lower(*(p.List for p in packets), *(p.ScalarList for p in packets), traced=("scalars",))
    def foreach_list(self, other):
        return _map(fn, self, other)

    @lower(*(p.Scalar for p in packets), traced=("scalar",))
    def foreach_scalar(self, scalar):
        return _map(lambda x: fn(x, scalar), self)

    for f, kind in ((foreach_list, "list"), (foreach_scalar, "scalar")):
        f.__name__ = f.__qualname__ = f"foreach_{name}_{kind}"


_register_extremum("maximum", "clamp_min", jnp.maximum)
_register_extremum("minimum", "clamp_max", jnp.minimum)


# ---- ternary ----------------------------------------------------------------


def _rounded(scalar, x):
    """`scalar` (a Python number or a traced one) rounded to x's dtype."""
    return jnp.asarray(scalar).astype(x.dtype)


def _addcmul(x, t1, t2, value):
    if not jnp.issubdtype(x.dtype, jnp.inexact):  # CPU truncates the value to the integer dtype
        value = _rounded(value, x)
    return to_opmath(x) + value * to_opmath(t1) * to_opmath(t2)


def _addcdiv(x, t1, t2, value):
    return to_opmath(x) + value * to_opmath(t1) / to_opmath(t2)


@lower(aten._foreach_addcmul.Scalar, traced=("value",))
def foreach_addcmul_scalar(self, tensor1, tensor2, value=1):
    return _map(lambda x, a, b: _addcmul(x, a, b, value), self, tensor1, tensor2)


@lower(aten._foreach_addcmul.ScalarList, traced=("scalars",))
def foreach_addcmul_scalar_list(self, tensor1, tensor2, scalars):
    return _map(_addcmul, self, tensor1, tensor2, scalars)


@lower(aten._foreach_addcdiv.Scalar, traced=("value",))
def foreach_addcdiv_scalar(self, tensor1, tensor2, value=1):
    return _map(lambda x, a, b: _addcdiv(x, a, b, value), self, tensor1, tensor2)


@lower(aten._foreach_addcdiv.ScalarList, traced=("scalars",))
def foreach_addcdiv_scalar_list(self, tensor1, tensor2, scalars):
    return _map(_addcdiv, self, tensor1, tensor2, scalars)


@lower(aten._foreach_lerp.List, aten._foreach_lerp.ScalarList, traced=("weight",))
def foreach_lerp_list(self, tensors1, weights):
    return _map(_lerp, self, tensors1, weights)


@lower(aten._foreach_lerp.Scalar, traced=("weight",))
def foreach_lerp_scalar(self, tensors1, weight):
    return _map(lambda x, e: _lerp(x, e, weight), self, tensors1)


# ---- in place with CPU's rounding ---------------------------------------------
# The other in-place and out= forms are derived from the functional lowerings above. CPU's
# in-place add/sub/mul round the scalar to the tensor's dtype first (a half float's), which its
# functional forms do not; its in-place div does not round. The scalars are traced, so an
# optimizer whose step sizes change every step (Adam's bias correction, an LR schedule) reuses
# one executable.


def _scaled(y, alpha):
    return y if isinstance(alpha, (int, float)) and alpha == 1 else y * alpha


@lower(aten._foreach_add_.Scalar, traced=("scalar",))
def foreach_add_scalar_(self, scalar):
    return _map(lambda x: x + _rounded(scalar, x), self)


@lower(aten._foreach_add_.ScalarList, traced=("scalars",))
def foreach_add_scalar_list_(self, scalars):
    return _map(lambda x, s: x + _rounded(s, x), self, scalars)


@lower(aten._foreach_sub_.Scalar, traced=("scalar",))
def foreach_sub_scalar_(self, scalar):
    return _map(lambda x: x - _rounded(scalar, x), self)


@lower(aten._foreach_sub_.ScalarList, traced=("scalars",))
def foreach_sub_scalar_list_(self, scalars):
    return _map(lambda x, s: x - _rounded(s, x), self, scalars)


@lower(aten._foreach_mul_.Scalar, traced=("scalar",))
def foreach_mul_scalar_(self, scalar):
    return _map(lambda x: x * _rounded(scalar, x), self)


@lower(aten._foreach_mul_.ScalarList, traced=("scalars",))
def foreach_mul_scalar_list_(self, scalars):
    return _map(lambda x, s: x * _rounded(s, x), self, scalars)


@lower(aten._foreach_add_.List, traced=("alpha",))
def foreach_add_list_(self, other, *, alpha=1):
    return _map(lambda x, y: to_opmath(x) + _scaled(to_opmath(y), alpha), self, other)


@lower(aten._foreach_sub_.List, traced=("alpha",))
def foreach_sub_list_(self, other, *, alpha=1):
    return _map(lambda x, y: to_opmath(x) - _scaled(to_opmath(y), alpha), self, other)


# .Tensor overloads take the scalars as a CPU tensor: read once, then the Scalar[] form.
@lower(aten._foreach_addcmul.Tensor, eager=True)
def foreach_addcmul_tensor(self, tensor1, tensor2, scalars):
    return aten._foreach_addcmul.ScalarList(self, tensor1, tensor2, _values(scalars))


@lower(aten._foreach_addcdiv.Tensor, eager=True)
def foreach_addcdiv_tensor(self, tensor1, tensor2, scalars):
    return aten._foreach_addcdiv.ScalarList(self, tensor1, tensor2, _values(scalars))


@lower(aten._foreach_addcmul_.Tensor, eager=True)
def foreach_addcmul_tensor_(self, tensor1, tensor2, scalars):
    aten._foreach_addcmul_.ScalarList(self, tensor1, tensor2, _values(scalars))


@lower(aten._foreach_addcdiv_.Tensor, eager=True)
def foreach_addcdiv_tensor_(self, tensor1, tensor2, scalars):
    aten._foreach_addcdiv_.ScalarList(self, tensor1, tensor2, _values(scalars))


def _values(scalars: torch.Tensor) -> list:
    if scalars.dim() != 1:
        raise RuntimeError(f"Expected scalars to be a 1D tensor, got {scalars.dim()}D")
    return scalars.detach().cpu().tolist()


# ---- unary ------------------------------------------------------------------


def _float_unary(fn):
    def apply(x):
        if not jnp.issubdtype(x.dtype, jnp.inexact):
            x = x.astype(jnp.float32)
        return fn(x)

    return apply


def _sign(x):
    return x if x.dtype == jnp.bool_ else jnp.sign(x)


_UNARY = {
    "abs": jnp.abs,
    "neg": jnp.negative,
    "sign": _sign,
    "sqrt": _float_unary(jnp.sqrt),
    "rsqrt": _float_unary(lax.rsqrt),
    "reciprocal": _float_unary(lambda x: divide(1, x)),
    "exp": _float_unary(jnp.exp),
    "expm1": _float_unary(jnp.expm1),
    "log": _float_unary(jnp.log),
    "log1p": _float_unary(jnp.log1p),
    "log2": _float_unary(jnp.log2),
    "log10": _float_unary(jnp.log10),
    "sigmoid": _float_unary(sigmoid),
    "tanh": _float_unary(jnp.tanh),
    "sin": _float_unary(jnp.sin),
    "cos": _float_unary(jnp.cos),
    "tan": _float_unary(jnp.tan),
    "erf": _float_unary(lax.erf),
    "erfc": _float_unary(lax.erfc),
    "floor": jnp.floor,
    "ceil": jnp.ceil,
    "round": jnp.round,
    "trunc": jnp.trunc,
    "frac": lambda x: x - jnp.trunc(x),
}


def _register_unary(name, fn):
    @lower(getattr(aten, f"_foreach_{name}").default)
    def foreach_unary(self):
        return _map(fn, self)

    foreach_unary.__name__ = f"foreach_{name}"


for _name, _fn in _UNARY.items():
    _register_unary(_name, _fn)


@lower(aten._foreach_zero.default)
def foreach_zero(self):
    return _map(jnp.zeros_like, self)


@lower(aten._foreach_copy.default)
def foreach_copy(self, src, non_blocking=False):
    return _map(lambda x, s: jnp.broadcast_to(s, x.shape).astype(x.dtype), self, src)


@lower(aten._foreach_clone.default)
def foreach_clone(self, *, memory_format=None):
    return _map(lambda x: x, self)


@lower(aten._foreach_mm.default)
def foreach_mm(self, mat2):
    return _map(lambda a, b: jnp.matmul(a, b, precision=precision.matmul(a, b)), self, mat2)


# ---- reductions -------------------------------------------------------------


def _norm(x, ord):
    a = jnp.abs(to_opmath(x))
    if a.size == 0:
        return jnp.zeros((), a.dtype) if ord != -math.inf else jnp.full((), jnp.inf, a.dtype)
    if ord == 2:
        return jnp.sqrt(jnp.sum(a * a))
    if ord == 1:
        return jnp.sum(a)
    if ord == math.inf:
        return jnp.max(a)
    if ord == -math.inf:
        return jnp.min(a)
    if ord == 0:
        return jnp.sum(a != 0).astype(a.dtype)
    return jnp.sum(a**ord) ** (1.0 / ord)


@lower(aten._foreach_norm.Scalar)
def foreach_norm(self, ord=2, dtype=None):
    return _map(lambda x: _norm(x, ord), self)


@lower(aten._foreach_max.default)
def foreach_max(self):
    return _map(jnp.max, self)
