"""Normalization: layer norm, batch norm, group norm (forward and backward), renorm."""

from __future__ import annotations

import jax.numpy as jnp
import torch
from jax import lax

from torch_tpu.ops.checks import dim_in_range
from torch_tpu.ops.dtypes import to_opmath
from torch_tpu.ops.lowerings.reductions import _HALF, linalg_vector_norm
from torch_tpu.ops.registry import aten, lower

# ---- normalization ----------------------------------------------------------


def _moments(x, axes):
    mean = jnp.mean(x, axis=axes, keepdims=True)
    var = jnp.mean(jnp.square(x - mean), axis=axes, keepdims=True)
    return mean, var


@lower(aten.native_layer_norm.default)
def native_layer_norm(input, normalized_shape, weight, bias, eps):
    x = to_opmath(input)
    axis = input.ndim - len(normalized_shape)
    axes = tuple(range(axis, input.ndim))
    mean, var = _moments(x, axes)
    rstd = lax.rsqrt(var + eps)
    out = (x - mean) * rstd
    if weight is not None:
        out = out * to_opmath(weight)
    if bias is not None:
        out = out + to_opmath(bias)
    return out, mean, rstd


@lower(aten.native_layer_norm_backward.default)
def native_layer_norm_backward(grad_out, input, normalized_shape, mean, rstd, weight, bias, output_mask):
    x, g = to_opmath(input), to_opmath(grad_out)
    axis = input.ndim - len(normalized_shape)
    axes = tuple(range(axis, input.ndim))
    x_hat = (x - mean) * rstd
    gw = g if weight is None else g * to_opmath(weight)
    grad_input = rstd * (
        gw - jnp.mean(gw, axis=axes, keepdims=True) - x_hat * jnp.mean(gw * x_hat, axis=axes, keepdims=True)
    )
    lead = tuple(range(axis))
    grad_weight = jnp.sum(g * x_hat, axis=lead) if output_mask[1] and weight is not None else None
    grad_bias = jnp.sum(g, axis=lead) if output_mask[2] and bias is not None else None
    return grad_input if output_mask[0] else None, grad_weight, grad_bias


def _channel(v, ndim):
    """A per-channel vector shaped to broadcast against (N, C, *)."""
    return v.reshape((1, -1) + (1,) * (ndim - 2))


def _bn_train(input, weight, bias, eps):
    x = to_opmath(input)
    axes = (0, *tuple(range(2, x.ndim)))
    mean, var = _moments(x, axes)
    invstd = lax.rsqrt(var + eps)
    out = (x - mean) * invstd
    if weight is not None:
        out = out * _channel(to_opmath(weight), x.ndim)
    if bias is not None:
        out = out + _channel(to_opmath(bias), x.ndim)
    return out, mean.reshape(-1), invstd.reshape(-1), var.reshape(-1)


def _bn_eval(input, weight, bias, running_mean, running_var, eps):
    x = to_opmath(input)
    invstd = lax.rsqrt(to_opmath(running_var) + eps)
    out = (x - _channel(to_opmath(running_mean), x.ndim)) * _channel(invstd, x.ndim)
    if weight is not None:
        out = out * _channel(to_opmath(weight), x.ndim)
    if bias is not None:
        out = out + _channel(to_opmath(bias), x.ndim)
    return out


def _updated_stats(input, mean, var, running_mean, running_var, momentum):
    n = input.size // input.shape[1]
    unbiased = var * (n / max(n - 1, 1))
    new_mean = (1 - momentum) * to_opmath(running_mean) + momentum * mean
    new_var = (1 - momentum) * to_opmath(running_var) + momentum * unbiased
    return new_mean, new_var


@lower(aten._native_batch_norm_legit.default)
def native_batch_norm_legit(input, weight, bias, running_mean, running_var, training, momentum, eps):
    if not training:
        out, mean, invstd = native_batch_norm_legit_no_training(
            input, weight, bias, running_mean, running_var, momentum, eps
        )
        return out, mean, invstd, running_mean, running_var
    out, mean, invstd, var = _bn_train(input, weight, bias, eps)
    new_mean, new_var = _updated_stats(input, mean, var, running_mean, running_var, momentum)
    return out, mean, invstd, new_mean, new_var


@lower(aten._native_batch_norm_legit_functional.default)
def native_batch_norm_legit_functional(input, weight, bias, running_mean, running_var, training, momentum, eps):
    """The functional form (torch.compile graphs): new running stats as outputs."""
    return native_batch_norm_legit(input, weight, bias, running_mean, running_var, training, momentum, eps)


@lower(aten._native_batch_norm_legit.no_stats)
def native_batch_norm_legit_no_stats(input, weight, bias, training, momentum, eps):
    out, mean, invstd, _ = _bn_train(input, weight, bias, eps)
    return out, mean, invstd


@lower(aten._native_batch_norm_legit_no_training.default)
def native_batch_norm_legit_no_training(input, weight, bias, running_mean, running_var, momentum, eps):
    out = _bn_eval(input, weight, bias, running_mean, running_var, eps)
    # PyTorch's meta kernel gives these (C,) outputs; they are the running statistics.
    return out, to_opmath(running_mean), lax.rsqrt(to_opmath(running_var) + eps)


@lower(aten._batch_norm_with_update.default)
def batch_norm_with_update(input, weight, bias, running_mean, running_var, momentum, eps):
    out, mean, invstd, var = _bn_train(input, weight, bias, eps)
    new_mean, new_var = _updated_stats(input, mean, var, running_mean, running_var, momentum)
    return out, mean, invstd, jnp.zeros((0,), jnp.uint8), new_mean, new_var


@lower(aten.native_batch_norm.default, eager=True)
def native_batch_norm(input, weight, bias, running_mean, running_var, training, momentum, eps):
    """Routes to the _native_batch_norm_legit family, whose schemas declare that
    training updates running_mean/running_var in place (native_batch_norm's does not)."""
    if training and running_mean is not None and running_var is not None:
        return aten._native_batch_norm_legit.default(
            input, weight, bias, running_mean, running_var, True, momentum, eps
        )
    if training:
        return aten._native_batch_norm_legit.no_stats(input, weight, bias, True, momentum, eps)
    out, mean, _ = aten._native_batch_norm_legit_no_training.default(
        input, weight, bias, running_mean, running_var, momentum, eps
    )
    # As on CPU, evaluation saves no statistics.
    empty = mean.new_empty((0,))
    return out, empty, empty


def _bn_backward(grad_out, input, weight, running_mean, running_var, save_mean, save_invstd, train, eps, output_mask):
    x, g = to_opmath(input), to_opmath(grad_out)
    axes = (0, *tuple(range(2, x.ndim)))
    if train:
        mean, invstd = to_opmath(save_mean), to_opmath(save_invstd)
    else:
        mean, invstd = to_opmath(running_mean), lax.rsqrt(to_opmath(running_var) + eps)
    mean, invstd = _channel(mean, x.ndim), _channel(invstd, x.ndim)
    w = jnp.ones((), x.dtype) if weight is None else _channel(to_opmath(weight), x.ndim)
    x_hat = (x - mean) * invstd
    grad_input = None
    if output_mask[0]:
        if train:
            grad_input = (
                w
                * invstd
                * (g - jnp.mean(g, axis=axes, keepdims=True) - x_hat * jnp.mean(g * x_hat, axis=axes, keepdims=True))
            )
        else:
            grad_input = g * w * invstd
    grad_weight = jnp.sum(g * x_hat, axis=axes) if output_mask[1] else None
    grad_bias = jnp.sum(g, axis=axes) if output_mask[2] else None
    return grad_input, grad_weight, grad_bias


@lower(aten.native_batch_norm_backward.default)
def native_batch_norm_backward(
    grad_out, input, weight, running_mean, running_var, save_mean, save_invstd, train, eps, output_mask
):
    return _bn_backward(
        grad_out, input, weight, running_mean, running_var, save_mean, save_invstd, train, eps, output_mask
    )


@lower(aten.batch_norm_backward.default)
def batch_norm_backward(
    grad_out, input, weight, running_mean, running_var, save_mean, save_var, update, eps, output_mask, reserve
):
    train = save_mean is not None and save_mean.size > 0
    return _bn_backward(
        grad_out, input, weight, running_mean, running_var, save_mean, save_var, train, eps, output_mask
    )


@lower(aten.native_group_norm.default)
def native_group_norm(input, weight, bias, N, C, HxW, group, eps):
    x = to_opmath(input).reshape(N, group, -1)
    mean, var = _moments(x, (2,))
    rstd = lax.rsqrt(var + eps)
    out = ((x - mean) * rstd).reshape(N, C, -1)
    if weight is not None:
        out = out * to_opmath(weight)[None, :, None]
    if bias is not None:
        out = out + to_opmath(bias)[None, :, None]
    return out.reshape(input.shape), mean.reshape(N, group), rstd.reshape(N, group)


@lower(aten.native_group_norm_backward.default)
def native_group_norm_backward(grad_out, input, mean, rstd, weight, N, C, HxW, group, output_mask):
    x = to_opmath(input).reshape(N, group, -1)
    g = to_opmath(grad_out).reshape(N, C, -1)
    mean, rstd = to_opmath(mean)[..., None], to_opmath(rstd)[..., None]
    x_hat = (x - mean) * rstd
    gw = (g if weight is None else g * to_opmath(weight)[None, :, None]).reshape(N, group, -1)
    grad_input = rstd * (gw - jnp.mean(gw, axis=2, keepdims=True) - x_hat * jnp.mean(gw * x_hat, axis=2, keepdims=True))
    x_hat_c = x_hat.reshape(N, C, -1)
    grad_weight = jnp.sum(g * x_hat_c, axis=(0, 2)) if output_mask[1] else None
    grad_bias = jnp.sum(g, axis=(0, 2)) if output_mask[2] else None
    return grad_input.reshape(input.shape) if output_mask[0] else None, grad_weight, grad_bias


# ---- renorm -----------------------------------------------------------------


@lower(aten.renorm.default)
def renorm(self, p, dim, maxnorm):
    """Scales each slice along `dim` whose p-norm exceeds maxnorm to norm maxnorm (CPU's 1e-7 eps)."""
    if isinstance(p, complex):
        raise RuntimeError("renorm: p must be real-valued")
    if not p > 0:
        raise RuntimeError("renorm: non-positive-norm not supported")
    if isinstance(maxnorm, complex):
        raise RuntimeError("renorm: maxnorm must be real-valued")
    if not maxnorm >= 0:
        raise RuntimeError(f"renorm: expected maxnorm to be >= 0 but got {float(maxnorm):g}")
    if self.ndim <= 1:
        raise RuntimeError(f"renorm: input needs at least 2 dimensions, got {self.ndim} dimensions")
    dim_in_range(dim, self.ndim)
    axes = tuple(d for d in range(self.ndim) if d != dim % self.ndim)
    # Half inputs take a float32 norm; the factor is rounded to the input dtype, as on CPU.
    norm = linalg_vector_norm(self, float(p), axes, True, dtype=torch.float32 if self.dtype in _HALF else None)
    factor = jnp.where(norm > maxnorm, maxnorm / (norm + jnp.asarray(1e-7, norm.dtype)), 1).astype(norm.dtype)
    return self * factor.astype(self.dtype)
