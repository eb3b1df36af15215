"""The fast-path transformer ops of nn.MultiheadAttention and nn.TransformerEncoderLayer in eval.

They follow ATen's CPU kernels (native/transformers/attention.cpp, transformer.cpp): the
projection, a masked softmax whose fully masked rows are NaN, and the residual/norm/FFN
order, rounding half floats where CPU's gemms and norms do.
"""

from __future__ import annotations

import math

import jax.numpy as jnp
import torch
from jax import lax

from torch_tpu.ops.lowerings import linalg, normalization
from torch_tpu.ops.registry import aten, lower

# at::native mask types of _masked_softmax
_SRC_MASK, _PADDING_MASK, _GENERIC_MASK = 0, 1, 2


def _linear(x, weight, bias):
    """x @ weight.T + bias as CPU's addmm: half floats sum in float32 and round once."""
    return linalg.addmm(bias, x.reshape(-1, x.shape[-1]), weight.T).reshape(*x.shape[:-1], weight.shape[0])


def _mask_4d(mask, scores_shape, mask_type):
    """The boolean (True = masked) mask of a (B, H, L, S) score tensor, as masked_softmax_cpu reads it."""
    if mask.ndim != 2 or len(scores_shape) != 4:
        mask_type = _GENERIC_MASK
    b, _, length, _ = scores_shape if len(scores_shape) == 4 else (None,) * 4
    if mask_type == _PADDING_MASK:
        if (b, length) != tuple(mask.shape):
            raise RuntimeError("For mask_type == 1 mask shape should be (B, L)")
        return mask[:, None, None, :]
    if mask_type == _SRC_MASK:
        if mask.shape != (length, length):
            raise RuntimeError("For mask_type == 0 mask shape should be (L, L)")
        return mask[None, None]
    if tuple(mask.shape) != tuple(scores_shape):
        raise RuntimeError("For mask_type == 2 mask shape should match input shape")
    return mask


def _masked_softmax(scores, mask):
    """Softmax over the last dim with masked entries 0; a fully masked row is NaN, as on CPU."""
    x = scores.astype(jnp.float32)
    if mask is not None:
        x = jnp.where(mask, -jnp.inf, x)
    e = jnp.exp(x - jnp.max(x, axis=-1, keepdims=True))
    return (e / jnp.sum(e, axis=-1, keepdims=True)).astype(scores.dtype)


def _attention(query, key, value, embed_dim, num_head, qkv_weight, qkv_bias, proj_weight, proj_bias, mask, mask_type):
    """(projected output (B, L, D), attention weights (B, H, L, S))."""
    b, length, _ = query.shape
    head = embed_dim // num_head
    w_q, w_k, w_v = jnp.split(qkv_weight, 3)
    b_q, b_k, b_v = jnp.split(qkv_bias, 3)

    def heads(x, w, bias):
        y = _linear(x, w, bias)
        return y.reshape(b, -1, num_head, head).transpose(0, 2, 1, 3)

    q = heads(query, w_q, b_q)
    # _transform_bias_rescale_qkv scales q by 1/sqrt(head) in opmath and rounds.
    q = (q.astype(jnp.float32) / math.sqrt(head)).astype(q.dtype)
    k, v = heads(key, w_k, b_k), heads(value, w_v, b_v)
    scores = linalg.matmul(q, jnp.swapaxes(k, -1, -2))
    if mask is not None:
        mask = _mask_4d(mask.astype(bool), scores.shape, mask_type)
    weights = _masked_softmax(scores, mask)
    context = linalg.matmul(weights, v).transpose(0, 2, 1, 3).reshape(b, length, embed_dim)
    return _linear(context, proj_weight, proj_bias), weights


def _check_mha(query, key, value, embed_dim, num_head, qkv_weight, qkv_bias):
    if query.ndim != 3:
        raise RuntimeError(f"expected 3-D `query`, got {query.ndim}-D tensor")
    if query.shape[2] != embed_dim:
        raise RuntimeError(f"passed-in embed_dim {embed_dim} didn't match last dim of query {query.shape[2]}")
    if key.ndim != 3:
        raise RuntimeError(f"expected 3-D `key`, got {key.ndim}-D tensor")
    if value.ndim != 3:
        raise RuntimeError(f"expected 3-D `value`, got {value.ndim}-D tensor")
    if not (query.shape == key.shape == value.shape):
        raise RuntimeError("expected `query`/`key`/`value` shapes to match")
    if qkv_weight.ndim != 2 or qkv_weight.shape != (3 * embed_dim, embed_dim):
        raise RuntimeError(f"expected `qkv_weight` of shape ({3 * embed_dim}, {embed_dim})")
    if qkv_bias.ndim != 1 or qkv_bias.shape[0] != 3 * embed_dim:
        raise RuntimeError(f"expected `qkv_bias` of length {3 * embed_dim}")
    if embed_dim % num_head != 0:
        raise RuntimeError("embed_dim must be divisible by num_head")


@lower(aten._native_multi_head_attention.default)
def native_multi_head_attention(
    query,
    key,
    value,
    embed_dim,
    num_head,
    qkv_weight,
    qkv_bias,
    proj_weight,
    proj_bias,
    mask=None,
    need_weights=True,
    average_attn_weights=True,
    mask_type=None,
):
    _check_mha(query, key, value, embed_dim, num_head, qkv_weight, qkv_bias)
    if query.size == 0:
        return jnp.zeros_like(query), None
    out, weights = _attention(
        query, key, value, embed_dim, num_head, qkv_weight, qkv_bias, proj_weight, proj_bias, mask, mask_type
    )
    if not need_weights:
        return out, None
    if average_attn_weights:
        weights = (jnp.sum(weights.astype(jnp.float32), axis=1) / num_head).astype(weights.dtype)
    return out, weights


def _layer_norm(x, weight, bias, eps):
    return normalization.native_layer_norm(x, (x.shape[-1],), weight, bias, eps)[0].astype(x.dtype)


def _ffn(x, w1, b1, w2, b2, use_gelu):
    h = linalg.addmm(b1, x.reshape(-1, x.shape[-1]), w1.T)
    # _addmm_activation applies the activation to the rounded addmm result
    h32 = h.astype(jnp.float32)
    h = (h32 * 0.5 * (1 + lax.erf(h32 * math.sqrt(0.5))) if use_gelu else jnp.maximum(h32, 0)).astype(h.dtype)
    return linalg.addmm(b2, h, w2.T).reshape(x.shape)


@lower(aten._transformer_encoder_layer_fwd.default)
def transformer_encoder_layer_fwd(
    src,
    embed_dim,
    num_heads,
    qkv_weight,
    qkv_bias,
    proj_weight,
    proj_bias,
    use_gelu,
    norm_first,
    eps,
    norm_weight_1,
    norm_bias_1,
    norm_weight_2,
    norm_bias_2,
    ffn_weight_1,
    ffn_bias_1,
    ffn_weight_2,
    ffn_bias_2,
    mask=None,
    mask_type=None,
):
    if src.size == 0:
        return src
    x = _layer_norm(src, norm_weight_1, norm_bias_1, eps) if norm_first else src
    _check_mha(x, x, x, embed_dim, num_heads, qkv_weight, qkv_bias)
    x, _ = _attention(x, x, x, embed_dim, num_heads, qkv_weight, qkv_bias, proj_weight, proj_bias, mask, mask_type)
    x = x + src
    if not norm_first:
        x = _layer_norm(x, norm_weight_1, norm_bias_1, eps)
    residual = x
    if norm_first:
        x = _layer_norm(x, norm_weight_2, norm_bias_2, eps)
    x = _ffn(x, ffn_weight_1, ffn_bias_1, ffn_weight_2, ffn_bias_2, use_gelu) + residual
    if not norm_first:
        x = _layer_norm(x, norm_weight_2, norm_bias_2, eps)
    return x


# ---- the NestedTensor fast path of nn.TransformerEncoder ----------------------
# TransformerEncoder(enable_nested_tensor=True) in eval packs a padded batch into a
# NestedTensor (its sizes live on the host), runs each layer on it and pads it again
# with zeros. A tpu NestedTensor keeps a flat tpu buffer: ATen's NestedTensorCPU
# kernels of the metadata ops run on it unchanged, and a layer runs as the dense
# layer with the padding as key padding mask.

_NESTED_CPU = torch._C.DispatchKeySet(torch._C.DispatchKey.NestedTensorCPU)


def _lengths(mask: torch.Tensor) -> list[int]:
    return [int(n) for n in mask.sum(dim=1).cpu()]


def _check_nested_mask(t: torch.Tensor, mask: torch.Tensor) -> None:
    if mask.dtype != torch.bool:
        raise RuntimeError("Mask must be bool")
    if mask.dim() != 2:
        raise RuntimeError("Padding mask should be 2D")
    if t.dim() != 3:
        raise RuntimeError("Input should be a 3D tensor, N * L * D")
    if tuple(mask.shape) != tuple(t.shape[:2]):
        raise RuntimeError("Mask size should match input size")


@lower(aten._nested_tensor_from_mask_left_aligned.default, eager=True)
def nested_tensor_from_mask_left_aligned(t, mask):
    _check_nested_mask(t, mask)
    prefix = torch.arange(mask.shape[1], device=mask.device)[None, :] < mask.sum(dim=1, keepdim=True)
    return bool(torch.equal(prefix, mask))


@lower(aten._nested_tensor_from_mask.default, eager=True)
def nested_tensor_from_mask(t, mask, mask_check=True):
    _check_nested_mask(t, mask)
    if mask_check and not nested_tensor_from_mask_left_aligned(t, mask):
        raise RuntimeError("Mask must be left aligned without gaps")
    rows = [t[i, :n] for i, n in enumerate(_lengths(mask))]
    return aten._nested_tensor_from_tensor_list.default(rows)


def _nested_lengths(nt: torch.Tensor) -> list[int]:
    return [int(n) for n in aten._nested_tensor_size.default.redispatch(_NESTED_CPU, nt)[:, 0]]


@lower(aten.to_padded_tensor.default, eager=True, dispatch_key="NestedTensorPrivateUse1")
def _nested_to_padded_tensor(self, padding, output_size=None):
    return aten.to_padded_tensor.default.redispatch(_NESTED_CPU, self, padding, output_size)


@lower(aten._transformer_encoder_layer_fwd.default, eager=True, dispatch_key="NestedTensorPrivateUse1")
def _nested_encoder_layer_fwd(src, *args, **kwargs):
    # args: the 17 arguments from embed_dim to ffn_bias_2, then maybe mask and mask_type
    args, rest = args[:17], args[17:]
    mask = rest[0] if rest else kwargs.get("mask")
    if mask is not None:
        raise RuntimeError("_transformer_encoder_layer_fwd: a mask is not supported with NestedTensor input")
    lengths = _nested_lengths(src)
    if not lengths or sum(lengths) == 0:
        return src.clone()
    padded = _nested_to_padded_tensor(src, 0.0)
    padding = torch.arange(padded.shape[1])[None, :] >= torch.tensor(lengths)[:, None]
    out = aten._transformer_encoder_layer_fwd.default(
        padded, *args, mask=padding.to(padded.device), mask_type=_PADDING_MASK
    )
    return aten._nested_tensor_from_tensor_list.default([out[i, :n] for i, n in enumerate(lengths)])
