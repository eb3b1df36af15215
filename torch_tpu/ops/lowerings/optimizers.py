"""Fused optimizer steps: SGD, Adam and AdamW as one executable per parameter list."""

from __future__ import annotations

import functools

import jax.numpy as jnp
import torch

from torch_tpu import metrics
from torch_tpu.ops import spmd, tensors
from torch_tpu.ops.dtypes import to_opmath
from torch_tpu.ops.registry import aten, lower
from torch_tpu.ops.tensors import to_jax, write_jax
from torch_tpu.runtime import executable_cache

# ---- fused optimizer steps --------------------------------------------------


def _skip_if_inf(found_inf, new, old):
    """found_inf == 1 leaves every tensor as it was (AMP's skipped step)."""
    if found_inf is None:
        return new
    skip = found_inf.reshape(()) == 1
    return [jnp.where(skip, o, n) for n, o in zip(new, old)]


# The fused steps run eagerly with their own jitted function: PyTorch has no meta
# kernel for _fused_sgd_ or the tensor_lr overloads, and a traced lr lets a
# scheduler change it without recompiling.


def _value(t):
    if t is None:
        return None
    if isinstance(t, torch.Tensor) and t.device.type == "tpu":
        return to_jax(t)
    return jnp.asarray(t.detach().cpu().numpy() if isinstance(t, torch.Tensor) else t, jnp.float32)


def _recordable(lists, scalars) -> bool:
    """While ops are recorded lazily (not under SPMD), a fused step records as one op too: an
    eager run would first run everything recorded (the step's `state_steps += 1`), then itself."""
    if tensors.lazy is None or spmd.layer is not None:
        return False
    every = [t for ts in lists for t in ts] + [t for t in scalars if isinstance(t, torch.Tensor)]
    return all(t.device.type == "tpu" and not t.is_conj() and not t.is_neg() for t in every)


def _record(step: executable_cache.Jit, static: tuple, lists, scalars, device: int) -> None:
    values = [tensors.lazy.read(t) if isinstance(t, torch.Tensor) else t for t in scalars]
    tensors.lazy.update(step.fn, static, lists, *values, device=device)


def _write_lists(lists, values):
    metrics.bump("executions")
    for ts, vs in zip(lists, values):
        for t, v in zip(ts, vs):
            write_jax(t, v)


@functools.partial(executable_cache.jit, static_argnums=0)
def _fused_sgd_step(static, lists, lr, grad_scale, found_inf):
    self, grads, momentum_buffer_list = lists
    weight_decay, momentum, dampening, nesterov, maximize, is_first_step = static
    lr = lr.reshape(())
    params, new_grads, bufs = [], [], []
    for i, (p, g) in enumerate(zip(self, grads)):
        p32, g32 = to_opmath(p), to_opmath(g)
        if grad_scale is not None:
            g32 = g32 / grad_scale.reshape(())
        new_grads.append(g32)
        if maximize:
            g32 = -g32
        if weight_decay != 0:
            g32 = g32 + weight_decay * p32
        if momentum != 0:
            buf = g32 if is_first_step else momentum * to_opmath(momentum_buffer_list[i]) + (1 - dampening) * g32
            bufs.append(buf)
            g32 = g32 + momentum * buf if nesterov else buf
        params.append(p32 - lr * g32)
    return (
        _skip_if_inf(found_inf, params, self),
        _skip_if_inf(found_inf, new_grads, grads) if grad_scale is not None else list(grads),
        _skip_if_inf(found_inf, bufs, momentum_buffer_list),
    )


@lower(aten._fused_sgd_.default, aten._fused_sgd_.tensor_lr, eager=True)
def fused_sgd_(
    self,
    grads,
    momentum_buffer_list,
    *,
    weight_decay,
    momentum,
    lr,
    dampening,
    nesterov,
    maximize,
    is_first_step,
    grad_scale=None,
    found_inf=None,
):
    if not self:
        return
    lists = (self, grads, momentum_buffer_list)
    static = (weight_decay, momentum, dampening, nesterov, maximize, is_first_step)
    if _recordable(lists, (lr, grad_scale, found_inf)):
        _record(_fused_sgd_step, (static,), lists, (lr, grad_scale, found_inf), self[0].device.index)
        return
    values = _fused_sgd_step(
        static, [[to_jax(t) for t in ts] for ts in lists], _value(lr), _value(grad_scale), _value(found_inf)
    )
    _write_lists(lists, values)


@functools.partial(executable_cache.jit, static_argnums=(0, 1))
def _fused_adam_step(decoupled, static, lists, lr, grad_scale, found_inf):
    self, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps = lists
    beta1, beta2, weight_decay, eps, amsgrad, maximize = static
    lr = lr.reshape(()).astype(jnp.float32)
    params, new_grads, avgs, sqs, maxes = [], [], [], [], []
    for i, (p, g, m, v, step) in enumerate(zip(self, grads, exp_avgs, exp_avg_sqs, state_steps)):
        p32, g32, m32, v32 = to_opmath(p), to_opmath(g), to_opmath(m), to_opmath(v)
        if grad_scale is not None:
            g32 = g32 / grad_scale.reshape(())
        new_grads.append(g32)
        if maximize:
            g32 = -g32
        step = step.reshape(()).astype(jnp.float32)
        bias1 = 1 - jnp.power(jnp.float32(beta1), step)
        bias2_sqrt = jnp.sqrt(1 - jnp.power(jnp.float32(beta2), step))
        if weight_decay != 0:
            if decoupled:
                p32 = p32 * (1 - lr * weight_decay)
            else:
                g32 = g32 + weight_decay * p32
        m32 = m32 + (1 - beta1) * (g32 - m32)
        v32 = beta2 * v32 + (1 - beta2) * g32 * g32
        if amsgrad:
            top = jnp.maximum(to_opmath(max_exp_avg_sqs[i]), v32)
            maxes.append(top)
        else:
            top = v32
        denom = jnp.sqrt(top) / bias2_sqrt + eps
        params.append(p32 - (lr / bias1) * m32 / denom)
        avgs.append(m32)
        sqs.append(v32)
    return (
        _skip_if_inf(found_inf, params, self),
        _skip_if_inf(found_inf, new_grads, grads) if grad_scale is not None else list(grads),
        _skip_if_inf(found_inf, avgs, exp_avgs),
        _skip_if_inf(found_inf, sqs, exp_avg_sqs),
        _skip_if_inf(found_inf, maxes, max_exp_avg_sqs) if amsgrad else list(max_exp_avg_sqs),
    )


def _run_fused_adam(
    decoupled, self, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps, lr, static, grad_scale, found_inf
):
    if not self:
        return
    lists = (self, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs)
    if _recordable((*lists, state_steps), (lr, grad_scale, found_inf)):
        scalars = (lr, grad_scale, found_inf)
        _record(_fused_adam_step, (decoupled, static), (*lists, state_steps), scalars, self[0].device.index)
        return
    read = [[to_jax(t) for t in ts] for ts in lists] + [[_value(t) for t in state_steps]]
    values = _fused_adam_step(decoupled, static, read, _value(lr), _value(grad_scale), _value(found_inf))
    _write_lists(lists, values)


def _fused_adam_kernel(decoupled: bool):
    """The eager kernel of _fused_adam_ (decoupled=False) or _fused_adamw_ (decoupled weight decay)."""

    def fused_adam_(
        self,
        grads,
        exp_avgs,
        exp_avg_sqs,
        max_exp_avg_sqs,
        state_steps,
        *,
        lr,
        beta1,
        beta2,
        weight_decay,
        eps,
        amsgrad,
        maximize,
        grad_scale=None,
        found_inf=None,
    ):
        _run_fused_adam(
            decoupled,
            self,
            grads,
            exp_avgs,
            exp_avg_sqs,
            max_exp_avg_sqs,
            state_steps,
            lr,
            (beta1, beta2, weight_decay, eps, amsgrad, maximize),
            grad_scale,
            found_inf,
        )

    return fused_adam_


fused_adamw_ = lower(aten._fused_adamw_.default, aten._fused_adamw_.tensor_lr, eager=True)(_fused_adam_kernel(True))
fused_adam_ = lower(aten._fused_adam_.default, aten._fused_adam_.tensor_lr, eager=True)(_fused_adam_kernel(False))
