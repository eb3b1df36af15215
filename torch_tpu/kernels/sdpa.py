"""torch.nn.functional.scaled_dot_product_attention on tpu tensors: one fused attention op where
the arguments allow, the math path (XLA ops) elsewhere.

Which fused op is a platform rule (ops/registry.py), the portable rules and TPU's side by side at
the bottom of this file. On TPU the fused op is the Pallas flash kernel, in eager calls and in
compiled graphs. Everywhere else Pallas only interprets, and the portable rules run
kernels/attention_math.py's one-op XLA attention; TORCH_TPU_PALLAS_ON_CPU=1 gives such a platform
TPU's rules, the kernel interpreted (for testing kernels; `platforms.lowering_platform()`). SDPA
never fails because of the kernel: arguments it cannot take go to the XLA attention, and a kernel
that fails to compile for a signature (Mosaic, VMEM) sends that signature to the XLA attention
from then on, counted ("sdpa_kernel_failures") and logged.

PyTorch's route for a PrivateUse1 backend: SDPA asks `_fused_sdp_choice` (forwarded to the op's
tpu kernel by csrc/sdp_choice.cc); the "overrideable" answer makes it call
`_scaled_dot_product_fused_attention_overrideable`, whose autograd formula calls the
`..._backward` op. Each choice is counted (metrics "sdpa_flash" / "sdpa_xla" / "sdpa_math") and logged
(TORCH_TPU_DEBUG=1: "sdpa: ...").

The three entry points are registered through the one lowering table (`lower(..., eager=True)`),
TPU's fused op and its backward with a graph form: a torch.compile'd graph holds the Pallas
kernel too (attention is never materialized between forward and backward: the backward keeps
only the output and the logsumexp). Where the kernel only interprets, traced graphs keep the
math decomposition (XLA fuses it). `torch_tpu.ops.install()` imports this module with the
lowerings.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
from collections.abc import Callable, Iterator

import jax.numpy as jnp
import torch
from torch._subclasses.fake_tensor import is_fake
from torch.nn.attention import SDPBackend

from torch_tpu import debug, metrics
from torch_tpu.kernels import attention_math, flash
from torch_tpu.ops.registry import aten, lower

_MATH = int(SDPBackend.MATH.value)
_OVERRIDEABLE = int(SDPBackend.OVERRIDEABLE.value)


# Signatures whose kernel failed to compile: they take the XLA attention from then on.
_kernel_failed: set[tuple] = set()


def _signature(which: str, *tensors: torch.Tensor, causal: bool) -> tuple:
    return (which, causal, *((tuple(t.shape), t.dtype) for t in tensors))


def _with_fallback(which: str, kernel, xla, tensors: tuple, args: tuple, causal: bool):
    """`kernel(*args)`, or `xla(*args)` where the kernel cannot compile this signature."""
    key = _signature(which, *tensors, causal=causal)
    if key not in _kernel_failed:
        try:
            return kernel(*args)
        except torch.OutOfMemoryError:
            raise
        except Exception as e:
            _kernel_failed.add(key)
            metrics.bump("sdpa_kernel_failures")
            debug.log("sdpa", f"flash {which} does not compile for {key[2:]}; XLA attention instead: {e}")
    return xla(*args)


def _why_not_fused(query, key, value, attn_mask, dropout_p, is_causal, enable_gqa, kernel: bool) -> str | None:
    """None if the fused op takes these arguments (`kernel`: it is the flash kernel, else the XLA
    attention), else the reason it does not."""
    if not (torch._C._get_flash_sdp_enabled() or torch._C._get_overrideable_sdp_enabled()):
        return "flash/overrideable SDPA disabled (sdpa_kernel)"
    if attn_mask is not None:
        return "attn_mask is given (only is_causal masks are fused)"
    if dropout_p > 0.0:
        return f"dropout_p={dropout_p}"
    if query.dim() != 4 or key.dim() != 4 or value.dim() != 4:
        return "inputs are not 4-D (batch, heads, seq, head_dim)"
    if any(is_fake(t) for t in (query, key, value)) and not kernel:
        # Where the kernel only interprets, traced graphs keep the math decomposition (XLA fuses it).
        return "traced by torch.compile"
    if query.shape[1] != key.shape[1] and not enable_gqa:
        return "heads differ without enable_gqa"
    try:
        flash.check_inputs(query, key, value)
    except RuntimeError as e:
        return str(e)
    return None


def _choice_rule(kernel: bool) -> Callable:
    """`_fused_sdp_choice` where the fused op is the flash kernel (`kernel`) or the XLA attention:
    the fused op where it takes the arguments, else the math path."""

    def choose(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, *, scale=None, enable_gqa=False):
        reason = _why_not_fused(query, key, value, attn_mask, dropout_p, is_causal, enable_gqa, kernel)
        if reason is None:
            kind = "flash attention" if kernel else "fused XLA attention (Pallas would only interpret here)"
            metrics.bump("sdpa_flash" if kernel else "sdpa_xla")
            if debug.enabled():
                debug.log("sdpa", f"{kind} for query {tuple(query.shape)} key {tuple(key.shape)} {query.dtype}")
            return _OVERRIDEABLE
        if not torch._C._get_math_sdp_enabled():
            raise RuntimeError(f"No viable backend for scaled_dot_product_attention was found (flash: {reason}).")
        metrics.bump("sdpa_math")
        if debug.enabled():
            debug.log("sdpa", f"math path: {reason}")
        return _MATH

    return choose


def _scale(query, scale):
    return 1.0 / math.sqrt(query.shape[-1]) if scale is None else float(scale)


# A traced key length while a bucketed graph (compile/buckets.py) evaluates the fused ops on
# keys padded past it; None elsewhere.
_key_length: contextvars.ContextVar = contextvars.ContextVar("torch_tpu_sdpa_key_length", default=None)


@contextlib.contextmanager
def keys_valid_to(length) -> Iterator[None]:
    """The fused ops' graph forms traced inside mask the keys at and past `length` (a traced int):
    padding that a bucketed graph added to the key length."""
    token = _key_length.set(length)
    try:
        yield
    finally:
        _key_length.reset(token)


def _graph_forward(
    query, key, value, attn_bias=None, dropout_p=0.0, is_causal=False, return_debug_mask=False, *, scale=None
):
    """The fused forward in a compiled graph (jax arrays): the flash kernel. The meta kernel gives
    no cumulative lengths or debug mask, and 0-d seeds."""
    out, lse = flash.flash_attention_forward(
        query, key, value, bool(is_causal), _scale(query, scale), kv_len=_key_length.get()
    )
    seed = jnp.zeros((), jnp.int64)
    return out, lse, None, None, query.shape[2], key.shape[2], seed, seed, None


def _graph_backward(
    grad_out, query, key, value, attn_bias, grad_input_mask, out, logsumexp, *unused, is_causal=False, scale=None
):
    dq, dk, dv = flash.flash_attention_backward(
        grad_out, query, key, value, out, logsumexp, bool(is_causal), _scale(query, scale), kv_len=_key_length.get()
    )
    return dq, dk, dv, None


def _xla_attention(query, key, value, causal: bool, sm_scale: float):
    return attention_math.forward_op(query, key, value, causal, sm_scale)


def _flash_attention(query, key, value, causal: bool, sm_scale: float):
    """The flash kernel, or the XLA attention for a signature it cannot compile."""
    args = (query, key, value, causal, sm_scale)
    return _with_fallback("forward", flash.forward_op, attention_math.forward_op, (query, key, value), args, causal)


def _xla_gradients(grad_out, query, key, value, out, logsumexp, causal: bool, sm_scale: float):
    return attention_math.backward_op(grad_out, query, key, value, out, logsumexp, causal, sm_scale)


def _flash_gradients(grad_out, query, key, value, out, logsumexp, causal: bool, sm_scale: float):
    """The flash kernel's backward, or the XLA attention's for a signature it cannot compile."""
    args = (grad_out, query, key, value, out, logsumexp, causal, sm_scale)
    return _with_fallback("backward", flash.backward_op, attention_math.backward_op, (query, key, value), args, causal)


def _forward_rule(attend: Callable) -> Callable:
    """The fused forward, attending with `attend(query, key, value, causal, sm_scale)` except over a
    growing KV cache (attention_math.bucketed_forward)."""

    def forward(
        query, key, value, attn_bias=None, dropout_p=0.0, is_causal=False, return_debug_mask=False, *, scale=None
    ):
        if attn_bias is not None or dropout_p > 0.0:
            raise RuntimeError("torch_tpu's fused SDPA takes neither attn_bias nor dropout")
        causal, sm_scale = bool(is_causal), _scale(query, scale)
        bucketed = attention_math.bucketed_forward(query, key, value, causal, sm_scale)
        out, lse = bucketed if bucketed is not None else attend(query, key, value, causal, sm_scale)
        empty = torch.empty(0, dtype=torch.int32, device=query.device)
        seed = torch.empty((), dtype=torch.int64, device=query.device)
        return out, lse, empty, empty, query.shape[2], key.shape[2], seed, seed, empty

    return forward


def _backward_rule(gradients: Callable) -> Callable:
    """The fused backward, with `gradients(grad_out, query, key, value, out, logsumexp, causal,
    sm_scale)` -> (dq, dk, dv)."""

    def backward(
        grad_out,
        query,
        key,
        value,
        attn_bias,
        grad_input_mask,
        out,
        logsumexp,
        cum_seq_q,
        cum_seq_k,
        max_q,
        max_k,
        dropout_p,
        is_causal,
        philox_seed,
        philox_offset,
        *,
        scale=None,
    ):
        dq, dk, dv = gradients(grad_out, query, key, value, out, logsumexp, bool(is_causal), _scale(query, scale))
        return dq, dk, dv, None

    return backward


def _graph_backward_call(*args, scale=None):
    """The fused backward op's graph form (its schema's arguments) as _graph_backward takes them."""
    return _graph_backward(*args[:8], is_causal=args[13], scale=scale)


# The portable rules, where Pallas only interprets (the fused op is one XLA attention op), and
# TPU's beside them (the flash kernel, in eager calls and compiled graphs).
FUSED = aten._scaled_dot_product_fused_attention_overrideable.default
FUSED_BACKWARD = aten._scaled_dot_product_fused_attention_overrideable_backward.default
lower(aten._fused_sdp_choice.default, eager=True)(_choice_rule(kernel=False))
lower(aten._fused_sdp_choice.default, eager=True, platform="tpu")(_choice_rule(kernel=True))
lower(FUSED, eager=True)(_forward_rule(_xla_attention))
lower(FUSED, eager=True, graph=_graph_forward, platform="tpu")(_forward_rule(_flash_attention))
lower(FUSED_BACKWARD, eager=True)(_backward_rule(_xla_gradients))
lower(FUSED_BACKWARD, eager=True, graph=_graph_backward_call, platform="tpu")(_backward_rule(_flash_gradients))
