"""Paged attention in Pallas: one decode step's attention against a paged KV cache.

Layouts (as jax.experimental.pallas.ops.tpu.paged_attention):
  q            [batch, heads, head_dim]            this step's queries
  k_pages      [kv_heads, total_pages, page_size, head_dim]
  v_pages      [kv_heads, total_pages, page_size, head_dim]
  lengths      [batch] int32                       tokens cached per sequence
  page_indices [batch, pages_per_sequence] int32   the pages of each sequence, in order
heads must be a multiple of kv_heads (grouped-query attention). The kernel visits only the
ceil(length / page_size) pages each sequence uses.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import torch
from jax import lax
from jax.experimental import pallas as pl

from torch_tpu.kernels import _custom_ops, _pallas

SUPPORTED_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _paged_kernel(lengths_ref, page_indices_ref, q_ref, k_ref, v_ref, o_ref, *, sm_scale, page_size):
    b = pl.program_id(0)
    length = lengths_ref[b]
    q = q_ref[...]
    rows = q.shape[0]

    def body(i, carry):
        m, denom, acc = carry
        page = page_indices_ref[b, i]
        k, v = k_ref[page], v_ref[page]
        s = lax.dot_general(q, k, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32) * sm_scale
        cols = i * page_size + lax.broadcasted_iota(jnp.int32, (rows, page_size), 1)
        valid = cols < length
        s = jnp.where(valid, s, _pallas.NEG_INF)
        m_new = jnp.maximum(m, s.max(axis=1))
        p = jnp.where(valid, jnp.exp(s - m_new[:, None]), 0.0)
        alpha = jnp.exp(m - m_new)
        pv = lax.dot_general(p.astype(v.dtype), v, (((1,), (0,)), ((), ())), preferred_element_type=jnp.float32)
        return m_new, alpha * denom + p.sum(axis=1), acc * alpha[:, None] + pv

    init = (
        jnp.full((rows,), _pallas.NEG_INF, jnp.float32),
        jnp.zeros((rows,), jnp.float32),
        jnp.zeros(o_ref.shape, jnp.float32),
    )
    num_pages = (length + page_size - 1) // page_size
    _, denom, acc = lax.fori_loop(jnp.int32(0), num_pages, body, init)
    denom = jnp.where(denom == 0.0, 1.0, denom)  # an empty sequence attends to nothing: zeros
    o_ref[...] = (acc / denom[:, None]).astype(o_ref.dtype)


def paged_attention_jax(q, k_pages, v_pages, lengths, page_indices, sm_scale: float):
    """Paged attention on jax arrays; see the module docstring for the layouts."""
    batch, heads, head_dim = q.shape
    kv_heads, total_pages, page_size, _ = k_pages.shape
    group = heads // kv_heads
    group_pad = _pallas.block_for(group, largest=1 << 30)
    d_pad = _pallas.block_for(head_dim, largest=1 << 30)
    qg = _pallas.pad_to(_pallas.pad_to(q.reshape(batch, kv_heads, group, head_dim), 2, group_pad), 3, d_pad)
    kp, vp = _pallas.pad_to(k_pages, 3, d_pad), _pallas.pad_to(v_pages, 3, d_pad)
    cache_spec = pl.BlockSpec((None, total_pages, page_size, d_pad), lambda b, h: (h, 0, 0, 0))
    q_spec = pl.BlockSpec((None, None, group_pad, d_pad), lambda b, h: (b, h, 0, 0))
    out = pl.pallas_call(
        functools.partial(_paged_kernel, sm_scale=sm_scale, page_size=page_size),
        grid=(batch, kv_heads),
        in_specs=[_pallas.scalar_spec(), _pallas.scalar_spec(), q_spec, cache_spec, cache_spec],
        out_specs=q_spec,
        out_shape=jax.ShapeDtypeStruct(qg.shape, q.dtype),
        interpret=_pallas.interpret(),
        name="paged_attention",
    )(lengths.astype(jnp.int32), page_indices.astype(jnp.int32), qg, kp, vp)
    return out[:, :, :group, :head_dim].reshape(batch, heads, head_dim)


def _paged_fake(q, k_pages, v_pages, lengths, page_indices, sm_scale):
    return torch.empty_like(q)


paged_attention_op = _custom_ops.define(
    "paged_attention(Tensor q, Tensor k_pages, Tensor v_pages, Tensor lengths, Tensor page_indices, "
    "float sm_scale) -> Tensor",
    paged_attention_jax,
    _paged_fake,
)

_INDEX_DTYPES = (torch.int32, torch.int64)


def _check_shapes(q, k_pages, v_pages, lengths, page_indices) -> None:
    if q.dim() != 3 or k_pages.dim() != 4:
        raise RuntimeError(
            "paged_attention: expected q [batch, heads, head_dim] and k_pages/v_pages [kv_heads, pages, "
            f"page_size, head_dim], got {tuple(q.shape)} and {tuple(k_pages.shape)}"
        )
    if k_pages.shape != v_pages.shape:
        raise RuntimeError(f"paged_attention: k_pages {tuple(k_pages.shape)} and v_pages {tuple(v_pages.shape)} differ")
    if q.shape[2] != k_pages.shape[3]:
        raise RuntimeError(
            f"paged_attention: query head dim {q.shape[2]} does not match the cache's head dim {k_pages.shape[3]}"
        )
    if q.shape[1] % k_pages.shape[0] != 0:
        raise RuntimeError(
            f"paged_attention: {q.shape[1]} query heads are not a multiple of {k_pages.shape[0]} kv heads"
        )
    if lengths.shape != (q.shape[0],) or page_indices.dim() != 2 or page_indices.shape[0] != q.shape[0]:
        raise RuntimeError(
            f"paged_attention: expected lengths [{q.shape[0]}] and page_indices [{q.shape[0]}, pages_per_sequence], "
            f"got {tuple(lengths.shape)} and {tuple(page_indices.shape)}"
        )
    if not (q.dtype == k_pages.dtype == v_pages.dtype) or q.dtype not in SUPPORTED_DTYPES:
        raise RuntimeError(
            "paged_attention: q, k_pages and v_pages must share one of float32, bfloat16, float16, got "
            f"{q.dtype}, {k_pages.dtype}, {v_pages.dtype}"
        )
    if lengths.dtype not in _INDEX_DTYPES or page_indices.dtype not in _INDEX_DTYPES:
        raise RuntimeError(
            f"paged_attention: lengths and page_indices must be int32, got {lengths.dtype} and {page_indices.dtype}"
        )
    devices = {t.device for t in (q, k_pages, v_pages, lengths, page_indices)}
    if len(devices) != 1 or q.device.type != "tpu":
        raise RuntimeError(f"paged_attention: expected all tensors on one tpu device, got {sorted(map(str, devices))}")


def _check_values(k_pages, lengths, page_indices) -> None:
    """Lengths within the pages each sequence has, and page indices within the cache (a host read)."""
    page_size, total_pages = k_pages.shape[2], k_pages.shape[1]
    capacity = page_indices.shape[1] * page_size
    lengths_host, pages_host = lengths.cpu(), page_indices.cpu()
    if lengths_host.numel() and (int(lengths_host.min()) < 0 or int(lengths_host.max()) > capacity):
        raise ValueError(
            f"paged_attention: lengths {lengths_host.tolist()} must lie in [0, {capacity}] "
            f"({page_indices.shape[1]} pages of {page_size} tokens per sequence)"
        )
    used = (lengths_host.to(torch.int64) + page_size - 1) // page_size
    in_use = torch.arange(pages_host.shape[1])[None, :] < used[:, None]
    bad = in_use & ((pages_host < 0) | (pages_host >= total_pages))
    if bool(bad.any()):
        raise IndexError(
            f"paged_attention: page indices in use must lie in [0, {total_pages}), got {pages_host[bad].tolist()}"
        )


def paged_attention(
    q: torch.Tensor,
    k_pages: torch.Tensor,
    v_pages: torch.Tensor,
    lengths: torch.Tensor,
    page_indices: torch.Tensor,
    *,
    sm_scale: float | None = None,
    check_values: bool = True,
) -> torch.Tensor:
    """softmax(q @ K.T * sm_scale) @ V per sequence, K and V gathered from its cache pages.

    Layouts are in the module docstring; sm_scale defaults to 1/sqrt(head_dim). With
    check_values (the default, a small host read) lengths past a sequence's pages raise
    ValueError and page indices outside the cache raise IndexError.
    """
    _check_shapes(q, k_pages, v_pages, lengths, page_indices)
    if check_values:
        _check_values(k_pages, lengths, page_indices)
    if sm_scale is None:
        sm_scale = 1.0 / math.sqrt(q.shape[-1])
    return paged_attention_op(q, k_pages, v_pages, lengths, page_indices, float(sm_scale))
