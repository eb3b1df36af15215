"""torch.nn.functional.scaled_dot_product_attention on tpu tensors: one fused attention op where
the arguments allow, the math path (XLA ops) elsewhere.

The fused op is the Pallas flash kernel on TPU. Elsewhere, where Pallas only interprets, it is
kernels/attention_math.py's one-op XLA attention, unless TORCH_TPU_PALLAS_ON_CPU=1 asks for the
interpreted kernel (for testing kernels). SDPA never fails because of the kernel: arguments it
cannot take go to the XLA attention, and a kernel that fails to compile for a signature (Mosaic,
VMEM) sends that signature to the XLA attention from then on, counted ("sdpa_kernel_failures")
and logged.

PyTorch's route for a PrivateUse1 backend: SDPA asks `_fused_sdp_choice` (forwarded to the op's
tpu kernel by csrc/sdp_choice.cc); the "overrideable" answer makes it call
`_scaled_dot_product_fused_attention_overrideable`, whose autograd formula calls the
`..._backward` op. Each choice is counted (metrics "sdpa_flash" / "sdpa_xla" / "sdpa_math") and logged
(TORCH_TPU_DEBUG=1: "sdpa: ...").

The three entry points are registered through the one lowering table (`lower(..., eager=True)`),
the fused op and its backward with a graph form: where the kernel compiles, a torch.compile'd
graph holds the Pallas kernel too (attention is never materialized between forward and
backward: the backward keeps only the output and the logsumexp). `torch_tpu.ops.install()`
imports this module with the lowerings.
"""

from __future__ import annotations

import math
import os

import jax.numpy as jnp
import torch
from torch._subclasses.fake_tensor import is_fake
from torch.nn.attention import SDPBackend

from torch_tpu import debug, metrics
from torch_tpu.kernels import _pallas, attention_math, flash
from torch_tpu.ops.registry import aten, lower

_MATH = int(SDPBackend.MATH.value)
_OVERRIDEABLE = int(SDPBackend.OVERRIDEABLE.value)


def _pallas_flash() -> bool:
    """True where the fused path is the Pallas kernel, False where it is the one-op XLA attention."""
    return _pallas.compiled() or os.environ.get("TORCH_TPU_PALLAS_ON_CPU") == "1"


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


def _why_not_flash(query, key, value, attn_mask, dropout_p, is_causal, enable_gqa) -> str | None:
    """None if the flash kernel takes these arguments, else the reason it does not."""
    if not (torch._C._get_flash_sdp_enabled() or torch._C._get_overrideable_sdp_enabled()):
        return "flash/overrideable SDPA disabled (sdpa_kernel)"
    if attn_mask is not None:
        return "attn_mask is given (only is_causal masks are fused)"
    if dropout_p > 0.0:
        return f"dropout_p={dropout_p}"
    if query.dim() != 4 or key.dim() != 4 or value.dim() != 4:
        return "inputs are not 4-D (batch, heads, seq, head_dim)"
    if any(is_fake(t) for t in (query, key, value)) and not _pallas_flash():
        # Where the kernel only interprets, traced graphs keep the math decomposition (XLA fuses it).
        return "traced by torch.compile"
    if query.shape[1] != key.shape[1] and not enable_gqa:
        return "heads differ without enable_gqa"
    try:
        flash.check_inputs(query, key, value)
    except RuntimeError as e:
        return str(e)
    return None


@lower(aten._fused_sdp_choice.default, eager=True)
def _fused_sdp_choice(
    query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, *, scale=None, enable_gqa=False
):
    reason = _why_not_flash(query, key, value, attn_mask, dropout_p, is_causal, enable_gqa)
    if reason is None:
        pallas = _pallas_flash()
        kind = "flash attention" if pallas else "fused XLA attention (Pallas would only interpret here)"
        metrics.bump("sdpa_flash" if pallas else "sdpa_xla")
        if debug.enabled():
            debug.log("sdpa", f"{kind} for query {tuple(query.shape)} key {tuple(key.shape)} {query.dtype}")
        return _OVERRIDEABLE
    if not torch._C._get_math_sdp_enabled():
        raise RuntimeError(f"No viable backend for scaled_dot_product_attention was found (flash: {reason}).")
    metrics.bump("sdpa_math")
    if debug.enabled():
        debug.log("sdpa", f"math path: {reason}")
    return _MATH


def _scale(query, scale):
    return 1.0 / math.sqrt(query.shape[-1]) if scale is None else float(scale)


def _graph_forward(
    query, key, value, attn_bias=None, dropout_p=0.0, is_causal=False, return_debug_mask=False, *, scale=None
):
    """The fused forward in a compiled graph (jax arrays): the flash kernel. The meta kernel gives
    no cumulative lengths or debug mask, and 0-d seeds."""
    out, lse = flash.flash_attention_forward(query, key, value, bool(is_causal), _scale(query, scale))
    seed = jnp.zeros((), jnp.int64)
    return out, lse, None, None, query.shape[2], key.shape[2], seed, seed, None


def _graph_backward(
    grad_out, query, key, value, attn_bias, grad_input_mask, out, logsumexp, *unused, is_causal=False, scale=None
):
    dq, dk, dv = flash.flash_attention_backward(
        grad_out, query, key, value, out, logsumexp, bool(is_causal), _scale(query, scale)
    )
    return dq, dk, dv, None


@lower(aten._scaled_dot_product_fused_attention_overrideable.default, eager=True, graph=_graph_forward)
def _overrideable_forward(
    query, key, value, attn_bias=None, dropout_p=0.0, is_causal=False, return_debug_mask=False, *, scale=None
):
    if attn_bias is not None or dropout_p > 0.0:
        raise RuntimeError("torch_tpu's fused SDPA takes neither attn_bias nor dropout")
    bucketed = attention_math.bucketed_forward(query, key, value, bool(is_causal), _scale(query, scale))
    if bucketed is not None:  # over a growing KV cache
        out, lse = bucketed
    elif _pallas_flash():
        args = (query, key, value, bool(is_causal), _scale(query, scale))
        out, lse = _with_fallback(
            "forward", flash.forward_op, attention_math.forward_op, (query, key, value), args, bool(is_causal)
        )
    else:
        out, lse = attention_math.forward_op(query, key, value, bool(is_causal), _scale(query, scale))
    empty = torch.empty(0, dtype=torch.int32, device=query.device)
    seed = torch.empty((), dtype=torch.int64, device=query.device)
    return out, lse, empty, empty, query.shape[2], key.shape[2], seed, seed, empty


@lower(
    aten._scaled_dot_product_fused_attention_overrideable_backward.default,
    eager=True,
    graph=lambda *args, scale=None: _graph_backward(*args[:8], is_causal=args[13], scale=scale),
)
def _overrideable_backward(
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
    args = (grad_out, query, key, value, out, logsumexp, bool(is_causal), _scale(query, scale))
    if _pallas_flash():
        tensors = (query, key, value)
        dq, dk, dv = _with_fallback(
            "backward", flash.backward_op, attention_math.backward_op, tensors, args, bool(is_causal)
        )
    else:
        dq, dk, dv = attention_math.backward_op(*args)
    return dq, dk, dv, None
