"""Autocast's linear on tpu as one executable each way: the casts fused with the matmul.

Under torch.autocast, PyTorch's linear casts its input, weight and bias to the autocast dtype
(three ops), runs the product, and its backward casts each gradient back (three more): on TPU,
where every eager execution has a fixed cost, the casts were most of an autocast model's eager
executions. This kernel on AutocastPrivateUse1 runs the same arithmetic as two fused ops,
`tpu_kernels::autocast_linear` (forward; also returning the casts the backward reads, as
autocast's path keeps them) and `autocast_linear_backward`. Results are those of the unfused
path: the product of the cast operands, summed in float32 and rounded once, gradients rounded
to the autocast dtype, then cast to each input's dtype.

A double backward (create_graph=True) runs the backward as differentiable ops, reaching the
inputs through the casts. Other calls take autocast's own policy (cast what it casts, then
linear below autocast): tensors that are not plain tpu tensors (a torch.compile trace,
functorch), float64, and every call while TORCH_TPU_FUSE_AUTOCAST_LINEAR=0 (or `FUSED = False`).
"""

from __future__ import annotations

import os
import warnings

import jax.numpy as jnp
import torch
from jax import lax

from torch_tpu import metrics
from torch_tpu.kernels import _custom_ops
from torch_tpu.ops.dtypes import to_numpy_dtype

FUSED = os.environ.get("TORCH_TPU_FUSE_AUTOCAST_LINEAR", "1").strip().lower() not in ("0", "false", "no", "off")
_AUTOCAST_KEY = torch._C.DispatchKey.AutocastPrivateUse1
_LOW = (torch.bfloat16, torch.float16)
_PLAIN = (torch.Tensor, torch.nn.Parameter)  # not a trace's tensors (fake, functional) nor a subclass


def _product(a, b_t):
    """a @ b_t.T in float32 sums (the half-float operands' exact products)."""
    return lax.dot_general(
        a, b_t, (((a.ndim - 1,), (1,)), ((), ())), precision=lax.Precision.HIGHEST, preferred_element_type=jnp.float32
    )


def _forward(x, weight, bias, dtype):
    low = to_numpy_dtype(dtype)
    x_low, w_low = x.astype(low), weight.astype(low)
    out = _product(x_low, w_low)
    if bias is not None:
        out = out + bias.astype(low).astype(jnp.float32)
    return out.astype(low), x_low, w_low


def _forward_fake(x, weight, bias, dtype):
    out = x.new_empty((*x.shape[:-1], weight.shape[0]), dtype=dtype)
    return out, x.new_empty(x.shape, dtype=dtype), weight.new_empty(weight.shape, dtype=dtype)


def _inference(x, weight, bias, dtype):
    return _forward(x, weight, bias, dtype)[0]


def _inference_fake(x, weight, bias, dtype):
    return _forward_fake(x, weight, bias, dtype)[0]


def _backward(grad, x_low, w_low, x_dtype, w_dtype, b_dtype, has_bias: bool):
    """(grad of x, of weight, of bias): rounded to the autocast dtype, then cast to each input's."""
    low = grad.dtype
    grad_x = _product(grad, w_low.T).astype(low).astype(to_numpy_dtype(x_dtype))
    rows = grad.reshape(-1, grad.shape[-1])
    grad_w = _product(rows.T, x_low.reshape(-1, x_low.shape[-1]).T).astype(low).astype(to_numpy_dtype(w_dtype))
    grad_b = jnp.sum(rows.astype(jnp.float32), axis=0).astype(low).astype(to_numpy_dtype(b_dtype))
    return grad_x, grad_w, grad_b if has_bias else jnp.zeros((0,), to_numpy_dtype(b_dtype))


def _backward_fake(grad, x_low, w_low, x_dtype, w_dtype, b_dtype, has_bias: bool):
    bias_shape = (w_low.shape[0],) if has_bias else (0,)
    return (
        grad.new_empty(x_low.shape, dtype=x_dtype),
        grad.new_empty(w_low.shape, dtype=w_dtype),
        grad.new_empty(bias_shape, dtype=b_dtype),
    )


_FORWARD = _custom_ops.define(
    "autocast_linear(Tensor x, Tensor weight, Tensor? bias, ScalarType dtype) -> (Tensor, Tensor, Tensor)",
    _forward,
    _forward_fake,
)
_INFERENCE = _custom_ops.define(
    "autocast_linear_inference(Tensor x, Tensor weight, Tensor? bias, ScalarType dtype) -> Tensor",
    _inference,
    _inference_fake,
)
_BACKWARD = _custom_ops.define(
    "autocast_linear_backward(Tensor grad, Tensor x_low, Tensor w_low, ScalarType x_dtype, ScalarType w_dtype, "
    "ScalarType b_dtype, bool has_bias) -> (Tensor, Tensor, Tensor)",
    _backward,
    _backward_fake,
)


class _AutocastLinear(torch.autograd.Function):
    """out = linear of the casts; the casts are outputs too (saved, not returned to the user), so
    a double backward reaches the inputs through them, as through autocast's cast ops."""

    @staticmethod
    def forward(ctx, x, weight, bias, dtype):
        out, x_low, w_low = _FORWARD(x, weight, bias, dtype)
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(x_low, w_low)
        ctx.dtypes = (x.dtype, weight.dtype, weight.dtype if bias is None else bias.dtype)
        ctx.has_bias = bias is not None
        return out, x_low, w_low

    @staticmethod
    def backward(ctx, grad, grad_x_low, grad_w_low):
        x_low, w_low = ctx.saved_tensors
        x_dtype, w_dtype, b_dtype = ctx.dtypes
        grad_x = grad_w = grad_b = None
        if grad is not None and torch.is_grad_enabled():  # create_graph=True: differentiable ops
            grad_x = (grad @ w_low).to(x_dtype)
            rows = grad.reshape(-1, grad.shape[-1])
            grad_w = (rows.t() @ x_low.reshape(-1, x_low.shape[-1])).to(w_dtype)
            grad_b = rows.sum(0).to(b_dtype) if ctx.has_bias else None
        elif grad is not None:
            grad_x, grad_w, grad_b = _BACKWARD(grad.contiguous(), x_low, w_low, x_dtype, w_dtype, b_dtype, ctx.has_bias)
            grad_b = grad_b if ctx.has_bias else None
        if grad_x_low is not None:  # a double backward's gradient of the casts
            grad_x = grad_x_low.to(x_dtype) if grad_x is None else grad_x + grad_x_low.to(x_dtype)
        if grad_w_low is not None:
            grad_w = grad_w_low.to(w_dtype) if grad_w is None else grad_w + grad_w_low.to(w_dtype)
        return grad_x, grad_w, grad_b, None


def _fusable(tensors: tuple) -> bool:
    for t in tensors:
        if t is None:
            continue
        if type(t) not in _PLAIN or t.device.type != "tpu" or t.dtype not in (torch.float32, *_LOW):
            return False
        if torch._C._functorch.is_functorch_wrapped_tensor(t):
            return False
    return True


def _autocast_policy(x, weight, bias, dtype):
    """What autocast does for linear: cast floating, non-float64 tpu tensors, then linear."""

    def cast(t):
        if t is None or not t.is_floating_point() or t.dtype == torch.float64 or t.device.type != "tpu":
            return t
        return t.to(dtype)

    return torch.ops.aten.linear.default(cast(x), cast(weight), cast(bias))


def autocast_linear(x, weight, bias=None):
    """linear's AutocastPrivateUse1 kernel."""
    dtype = torch.get_autocast_dtype("tpu")
    with torch._C._ExcludeDispatchKeyGuard(torch._C.DispatchKeySet(_AUTOCAST_KEY)):
        if not FUSED or dtype not in _LOW or weight.dim() != 2 or x.dim() < 1 or not _fusable((x, weight, bias)):
            return _autocast_policy(x, weight, bias, dtype)
        metrics.bump("autocast_linear_fused")
        needs_grad = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (x, weight, bias))
        if needs_grad:
            return _AutocastLinear.apply(x, weight, bias, dtype)[0]
        return _INFERENCE(x, weight, bias, dtype)


_lib = torch.library.Library("aten", "IMPL")


def install() -> None:
    """Registers the kernel over autocast's own (PyTorch warns of the override; it is meant)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _lib.impl("linear", autocast_linear, "AutocastPrivateUse1")


install()
