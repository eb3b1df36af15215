"""Activations: softmax, relu-family, gelu, silu and the rest, forward and backward."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import jax.scipy.special
import numpy as np
import torch
from jax import lax

from torch_tpu.ops.checks import dim_in_range
from torch_tpu.ops.dtypes import to_opmath, type_name
from torch_tpu.ops.lowerings.elementwise import clamp
from torch_tpu.ops.promotion import (
    BOOL_UNSUPPORTED,
    cast,
    float_args,
)
from torch_tpu.ops.registry import aten, lower, signature_check

# ---- softmax ----------------------------------------------------------------


def _softmax_impl(x, dim, log):
    if x.ndim == 0:
        return jnp.zeros_like(x) if log else jnp.ones_like(x)
    x = to_opmath(x)
    return jax.nn.log_softmax(x, axis=dim) if log else jax.nn.softmax(x, axis=dim)


def _softmax_check(name: str):
    """CPU has no integer softmax kernel: NotImplementedError, as its dispatch macro raises."""

    def check(self, dim, *args, **kwargs):
        dim_in_range(dim, self.dim())
        if not (self.is_floating_point() or self.is_complex()):
            last = dim in (-1, self.dim() - 1) or self.dim() == 0
            kernel = f"{name}_lastdim_kernel_impl" if last else f"{name}_kernel_impl"
            raise NotImplementedError(f"\"{kernel}\" not implemented for '{type_name(self.dtype)}'")

    return signature_check(check)


@lower(aten._softmax.default, check=_softmax_check("softmax"))
def softmax(self, dim, half_to_float):
    return _softmax_impl(self, dim, log=False)


@lower(aten._log_softmax.default, check=_softmax_check("log_softmax"))
def log_softmax(self, dim, half_to_float):
    return _softmax_impl(self, dim, log=True)


@lower(aten._softmax_backward_data.default)
def softmax_backward_data(grad_output, output, dim, input_dtype):
    g, y = to_opmath(grad_output), to_opmath(output)
    if y.ndim == 0:
        return g * 0
    return y * (g - jnp.sum(g * y, axis=dim, keepdims=True))


@lower(aten._log_softmax_backward_data.default)
def log_softmax_backward_data(grad_output, output, dim, input_dtype):
    g, y = to_opmath(grad_output), to_opmath(output)
    if y.ndim == 0:
        return g * 0
    return g - jnp.exp(y) * jnp.sum(g, axis=dim, keepdims=True)


# ---- glu, prelu, log_sigmoid, softshrink, hardshrink ----------------------------------------


@lower(aten.glu.default)
def glu(self, dim=-1):
    a, b = jnp.split(to_opmath(self), 2, axis=dim)
    return a * jax.nn.sigmoid(b)


@lower(aten.glu_backward.default)
def glu_backward(grad_output, self, dim):
    _, vjp = jax.vjp(lambda x: glu(x, dim), to_opmath(self))
    return vjp(to_opmath(grad_output))[0]


@lower(aten._prelu_kernel.default)
def prelu_kernel(self, weight):
    x, w = to_opmath(self), to_opmath(weight)
    return jnp.where(x > 0, x, w * x)


@lower(aten._prelu_kernel_backward.default)
def prelu_kernel_backward(grad_output, self, weight):
    x, w, g = to_opmath(self), to_opmath(weight), to_opmath(grad_output)
    return jnp.where(x > 0, g, w * g), jnp.where(x > 0, 0, x * g)


@lower(aten.log_sigmoid_forward.default)
def log_sigmoid_forward(self):
    x = to_opmath(self)
    # The buffer CPU saves for backward; this lowering's backward recomputes from x instead.
    return jax.nn.log_sigmoid(x), jnp.zeros_like(x)


@lower(aten.log_sigmoid_backward.default)
def log_sigmoid_backward(grad_output, self, buffer):
    x, g = to_opmath(self), to_opmath(grad_output)
    return g * jax.nn.sigmoid(-x)


def _check_softshrink(self, lambd=0.5, *args, **kwargs):
    if not self.dtype.is_floating_point:
        raise RuntimeError(f"\"softshrink_check\" not implemented for '{type_name(self.dtype)}'")
    top = torch.finfo(self.dtype).max
    if not 0 <= lambd <= top:
        raise RuntimeError(
            f"lambda must be in range [0, {top:g}] for input dtype {type_name(self.dtype)}, but found {lambd:g}"
        )


def _inside(x, lambd):
    """-lambd <= x <= lambd, as CPU compares (nan is outside)."""
    return (x >= -lambd) & (x <= lambd)


@lower(aten.softshrink.default, traced=("lambd",), check=_check_softshrink)
def softshrink(self, lambd=0.5):
    x = to_opmath(self)
    lambd = cast(lambd, x.dtype)
    return jnp.where(x > lambd, x - lambd, jnp.where(x < -lambd, x + lambd, x * 0))


@lower(aten.softshrink_backward.default, traced=("lambd",))
def softshrink_backward(grad_output, self, lambd):
    return _shrink_backward(grad_output, self, lambd)


@lower(aten.hardshrink.default, traced=("lambd",))
def hardshrink(self, lambd=0.5):
    return jnp.where(_inside(self, cast(lambd, self.dtype)), jnp.zeros_like(self), self)


@lower(aten.hardshrink_backward.default, traced=("lambd",))
def hardshrink_backward(grad_out, self, lambd):
    return _shrink_backward(grad_out, self, lambd)


def _shrink_backward(grad, self, lambd):
    """grad where |self| > lambd (nan included, as CPU's vectorized loop), else 0."""
    return jnp.where(jnp.abs(self) > cast(lambd, self.dtype), grad, jnp.zeros_like(grad))


# ---- activations ------------------------------------------------------------


@lower(aten.relu.default)
def relu(self):
    if self.dtype == np.bool_:
        raise BOOL_UNSUPPORTED("Boolean inputs not supported for relu")
    return jnp.maximum(self, jnp.zeros((), self.dtype))


@lower(aten.threshold.default, traced=("threshold", "value"))
def threshold(self, threshold, value):
    """x <= threshold ? value : x."""
    if jnp.issubdtype(self.dtype, jnp.complexfloating):
        raise NotImplementedError(f"\"threshold_cpu\" not implemented for '{type_name(self.dtype)}'")
    return jnp.where(self <= cast(threshold, self.dtype), cast(value, self.dtype), self)


@lower(aten.leaky_relu.default, traced=("negative_slope",))
def leaky_relu(self, negative_slope=0.01):
    (x,) = float_args(self)
    return jnp.where(x > 0, x, x * negative_slope)


@lower(aten.elu.default, traced=("alpha", "scale", "input_scale"))
def elu(self, alpha=1, scale=1, input_scale=1):
    (x,) = float_args(self)
    negcoef, poscoef, negiptcoef = _elu_coefficients(x.dtype, alpha, scale, input_scale)
    return jnp.where(x <= 0, jnp.expm1(x * negiptcoef) * negcoef, x * poscoef)


def _elu_coefficients(dtype, alpha, scale, input_scale):
    """CPU's (alpha * scale, scale, input_scale), each in the op math dtype."""
    alpha, scale, input_scale = (cast(v, dtype) for v in (alpha, scale, input_scale))
    return alpha * scale, scale, input_scale


@lower(aten.hardtanh.default, traced=("min_val", "max_val"))
def hardtanh(self, min_val=-1, max_val=1):
    return clamp(self, min_val, max_val)


@lower(aten.hardsigmoid.default)
def hardsigmoid(self):
    (x,) = float_args(self)
    return jnp.clip(x + 3, 0, 6) / 6


@lower(aten.hardswish.default)
def hardswish(self):
    (x,) = float_args(self)
    return x * jnp.clip(x + 3, 0, 6) / 6


@lower(aten.softplus.default, traced=("beta", "threshold"))
def softplus(self, beta=1, threshold=20):
    (x,) = float_args(self)
    return jnp.where(x * beta > threshold, x, jnp.log1p(jnp.exp(x * beta)) / beta)


@lower(aten.mish.default)
def mish(self):
    (x,) = float_args(self)
    return x * jnp.tanh(jnp.log1p(jnp.exp(x)))


_SQRT_2_OVER_PI = math.sqrt(2 / math.pi)
_GELU_KAPPA = 0.044715


@lower(aten.gelu.default)
def gelu(self, *, approximate="none"):
    (x,) = float_args(self)
    if approximate == "tanh":
        return 0.5 * x * (1 + jnp.tanh(_SQRT_2_OVER_PI * (x + _GELU_KAPPA * x * x * x)))
    return x * 0.5 * (1 + lax.erf(x * math.sqrt(0.5)))


@lower(aten.silu.default)
def silu(self):
    (x,) = float_args(self)
    return x / (1 + jnp.exp(-x))


# ---- activation backward ops ------------------------------------------------


@lower(aten.threshold_backward.default, traced=("threshold",))
def threshold_backward(grad_output, self, threshold):
    return jnp.where(self <= cast(threshold, self.dtype), jnp.zeros((), grad_output.dtype), grad_output)


@lower(aten.sigmoid_backward.default)
def sigmoid_backward(grad_output, output):
    g, y = float_args(grad_output, output)
    return g * (1 - y) * y


@lower(aten.tanh_backward.default)
def tanh_backward(grad_output, output):
    g, y = float_args(grad_output, output)
    return g * (1 - y * y)


@lower(aten.leaky_relu_backward.default, traced=("negative_slope",))
def leaky_relu_backward(grad_output, self, negative_slope, self_is_result):
    g, x = float_args(grad_output, self)
    return jnp.where(x > 0, g, g * negative_slope)


@lower(aten.elu_backward.default, traced=("alpha", "scale", "input_scale"))
def elu_backward(grad_output, alpha, scale, input_scale, is_result, self_or_result):
    g, x = float_args(grad_output, self_or_result)
    negcoef, poscoef, negiptcoef = _elu_coefficients(x.dtype, alpha, scale, input_scale)
    if is_result:
        negative = g * negiptcoef * (x + negcoef)
    else:
        negative = g * negiptcoef * negcoef * jnp.exp(x * negiptcoef)
    return jnp.where(x <= 0, negative, g * poscoef)


@lower(aten.hardtanh_backward.default, traced=("min_val", "max_val"))
def hardtanh_backward(grad_output, self, min_val, max_val):
    g, x = float_args(grad_output, self)
    return jnp.where((x <= min_val) | (x >= max_val), jnp.zeros_like(g), g)


@lower(aten.softplus_backward.default, traced=("beta", "threshold"))
def softplus_backward(grad_output, self, beta, threshold):
    g, x = float_args(grad_output, self)
    z = jnp.exp(x * beta)
    return jnp.where(x * beta > threshold, g, g * z / (z + 1))


@lower(aten.hardsigmoid_backward.default)
def hardsigmoid_backward(grad_output, self):
    g, x = float_args(grad_output, self)
    return jnp.where((x > -3) & (x < 3), g / 6, jnp.zeros_like(g))


@lower(aten.hardswish_backward.default)
def hardswish_backward(grad_output, self):
    g, x = float_args(grad_output, self)
    return jnp.where(x < -3, jnp.zeros_like(g), jnp.where(x <= 3, g * (x / 3 + 0.5), g))


@lower(aten.logit_backward.default)
def logit_backward(grad_output, self, eps=None):
    g, x = float_args(grad_output, self)
    grad = g / (x * (1 - x))
    if eps is None:
        return jnp.where((x < 0) | (x > 1), jnp.nan, grad)
    return jnp.where((x < eps) | (x > 1 - eps), jnp.zeros_like(g), grad)


@lower(aten.gelu_backward.default)
def gelu_backward(grad_output, self, *, approximate="none"):
    g, x = float_args(grad_output, self)
    if approximate == "tanh":
        inner = _SQRT_2_OVER_PI * (x + _GELU_KAPPA * x * x * x)
        t = jnp.tanh(inner)
        left = 0.5 * x
        right = 1 + t
        d_inner = _SQRT_2_OVER_PI * (1 + 3 * _GELU_KAPPA * x * x)
        return g * (0.5 * right + left * (1 - t * t) * d_inner)
    cdf = 0.5 * (1 + lax.erf(x * math.sqrt(0.5)))
    pdf = jnp.exp(-0.5 * x * x) / math.sqrt(2 * math.pi)
    return g * (cdf + x * pdf)
