"""Special functions and number theory: Bessel, error and gamma functions, polygamma, zeta, gcd/lcm."""

from __future__ import annotations

import math

import jax.numpy as jnp
import jax.scipy.special
import jax.scipy.special as jsp
import torch
from jax import lax

from torch_tpu.ops.checks import c_type_name as _c_name
from torch_tpu.ops.dtypes import type_name
from torch_tpu.ops.promotion import (
    float_args,
    promote,
    require,
    result_dtype,
    to_float,
)
from torch_tpu.ops.registry import aten, lower

# ---- special functions, number theory -----------------------------------------------------


def _special(fn):
    def lowering(self):
        (x,) = to_float(self)
        return fn(x)

    return lowering


for _op, _fn in {
    aten.i0.default: jax.scipy.special.i0,
    aten.special_i0e.default: jax.scipy.special.i0e,
    aten.special_i1.default: jax.scipy.special.i1,
    aten.special_i1e.default: jax.scipy.special.i1e,
    aten.special_ndtri.default: jax.scipy.special.ndtri,
}.items():
    lower(_op)(_special(_fn))


def _frexp_check(self, *, mantissa=None, exponent=None):
    """frexp.Tensor_out's dtype rules (the out= variant is derived from frexp.Tensor)."""
    if mantissa is not None and mantissa.dtype != self.dtype:
        raise RuntimeError(
            f"torch.frexp() expects mantissa to have dtype {_c_name(self.dtype)} but got {_c_name(mantissa.dtype)}"
        )
    if exponent is not None and exponent.dtype != torch.int32:
        raise RuntimeError(f"torch.frexp() expects exponent to have int dtype but got {_c_name(exponent.dtype)}")


@lower(aten.frexp.Tensor, check=_frexp_check)
def frexp(self):
    mantissa, exponent = jnp.frexp(self)
    return mantissa, exponent.astype(jnp.int32)


@lower(aten.gcd.default)
def gcd(self, other):
    require("gcd_cpu", result_dtype(self, other), bool_ok=False, float_ok=False)
    _, (a, b) = promote(self, other)
    return jnp.gcd(a, b)


@lower(aten.lcm.default)
def lcm(self, other):
    require("lcm_cpu", result_dtype(self, other), bool_ok=False, float_ok=False)
    _, (a, b) = promote(self, other)
    return jnp.lcm(a, b)


@lower(aten.complex.default)
def complex_(real, imag):
    if real.dtype != imag.dtype:
        raise RuntimeError(
            f"Expected object of scalar type {type_name(real.dtype)} but got scalar type {type_name(imag.dtype)} "
            "for second argument"
        )
    shape = jnp.broadcast_shapes(real.shape, imag.shape)
    return lax.complex(jnp.broadcast_to(real, shape), jnp.broadcast_to(imag, shape))


def _digamma(x):
    # torch: digamma(0) is -inf (of the sign of the zero: pole from the right), XLA gives nan.
    return jnp.where(x == 0, jnp.copysign(jnp.inf, -x), lax.digamma(x))


lower(aten.lgamma.default)(_special(lax.lgamma))
lower(aten.digamma.default)(_special(_digamma))


@lower(aten.igamma.default)
def igamma(self, other):
    a, x = float_args(self, other)
    return jax.scipy.special.gammainc(a, x)


@lower(aten.igammac.default)
def igammac(self, other):
    a, x = float_args(self, other)
    return jax.scipy.special.gammaincc(a, x)


@lower(aten.nextafter.default)
def nextafter(self, other):
    _, (a, b) = promote(self, other)
    return jnp.nextafter(a, b)


@lower(aten.angle.default)
def angle(self):
    if jnp.iscomplexobj(self):
        return jnp.angle(self)
    (x,) = to_float(self)
    return jnp.where(jnp.isnan(x), x, jnp.where(x < 0, jnp.asarray(math.pi, x.dtype), jnp.zeros_like(x)))


def _entr(x):
    return jnp.where(x > 0, -x * jnp.log(jnp.where(x > 0, x, 1)), jnp.where(x == 0, 0.0, -jnp.inf).astype(x.dtype))


def _spherical_j0(x):
    return jnp.where(jnp.isinf(x), 0.0, jnp.sin(x) / jnp.where(x == 0, 1, x)).astype(x.dtype) + (x == 0)


for _op, _fn in {
    aten.special_entr.default: _entr,
    aten.special_log_ndtr.default: jax.scipy.special.log_ndtr,
    aten.special_modified_bessel_i0.default: jax.scipy.special.i0,
    aten.special_modified_bessel_i1.default: jax.scipy.special.i1,
    aten.special_spherical_bessel_j0.default: _spherical_j0,
}.items():
    lower(_op)(_special(_fn))


@lower(aten.special_xlog1py.default)
def special_xlog1py(self, other):
    x, y = to_float(self, other)
    return jnp.where(jnp.isnan(y), y, jnp.where(x == 0, jnp.zeros_like(x), x * jnp.log1p(y)))


# ---- polygamma ---------------------------------------------------------------
# polygamma(n, x): digamma for n == 0, else (-1)^(n+1) n! zeta(n + 1, x).
#
# jax's zeta is only accurate for x > 0, so negative x first steps up with the recurrence
# psi_n(x) = psi_n(x + 1) - (-1)^n n! / x^(n+1), as CPU's kernels give the exact values there too.

_MAX_SHIFT = 4096  # steps of the recurrence; farther negative x keep jax's value


def _positive_polygamma(n: int, x):
    coefficient = -((-1.0) ** n) * math.factorial(n)

    def cond(state):
        i, x, _ = state
        return (i < _MAX_SHIFT) & jnp.any(x < 0)

    def body(state):
        i, x, total = state
        negative = x < 0
        total = total + jnp.where(negative, coefficient / x ** (n + 1), 0)
        return i + 1, jnp.where(negative, x + 1, x), total

    _, shifted, total = lax.while_loop(cond, body, (0, x, jnp.zeros_like(x)))
    pole = (x <= 0) & (x == jnp.floor(x))  # zeta(n + 1, q) is inf there, as on CPU
    return jnp.where(pole, (-1.0) ** (n + 1) * jnp.inf, jsp.polygamma(n, shifted) + total)


@lower(aten.polygamma.default)
def polygamma(n, self):
    if n < 0:
        raise RuntimeError("polygamma(n, x) does not support negative n.")
    (x,) = to_float(self)
    return _digamma(x) if n == 0 else _positive_polygamma(n, x)
