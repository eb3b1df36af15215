"""Paged attention in Pallas: one decode step's attention against a paged KV cache.

Layouts (as jax.experimental.pallas.ops.tpu.paged_attention):
  q            [batch, heads, head_dim]            this step's queries
  k_pages      [kv_heads, total_pages, page_size, head_dim]
  v_pages      [kv_heads, total_pages, page_size, head_dim]
  lengths      [batch] int32                       tokens cached per sequence
  page_indices [batch, pages_per_sequence] int32   the pages of each sequence, in order
heads must be a multiple of kv_heads (grouped-query attention). The grid walks (sequence, key
head, page): each step's page comes from the page table (scalar prefetch) straight into VMEM,
and the steps past a sequence's ceil(length / page_size) pages repeat its last page without
computing, so they cost no DMA. Pages hold at most 128 tokens or a multiple of 128.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import torch
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from torch_tpu.kernels import _custom_ops, _pallas
from torch_tpu.kernels._pallas import NEG_INF
from torch_tpu.platforms.tpu import mosaic
from torch_tpu.platforms.tpu.mosaic import ARBITRARY, LANES, PARALLEL

SUPPORTED_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _paged_kernel(
    lengths_ref, pages_ref, q_ref, k_ref, v_ref, o_ref, m_scr, l_scr, acc_scr, *, sm_scale, page_size, d, precision
):
    # Grid (sequence b, key head h, page i): one page of the sequence's cache per step.
    b, i = pl.program_id(0), pl.program_id(2)
    length = lengths_ref[b]

    @pl.when(i == 0)
    def _start():
        m_scr[...] = jnp.full(m_scr.shape, -jnp.inf, jnp.float32)
        l_scr[...] = jnp.zeros(l_scr.shape, jnp.float32)
        acc_scr[...] = jnp.zeros(acc_scr.shape, jnp.float32)

    @pl.when(i * page_size < length)
    def _step():
        q, k, v = q_ref[...], k_ref[...], v_ref[...]
        s = lax.dot_general(q, k, (((1,), (1,)), ((), ())), precision=precision, preferred_element_type=jnp.float32)
        s = s * sm_scale
        cols = i * page_size + lax.broadcasted_iota(jnp.int32, s.shape, 1)
        valid = cols < length
        s = jnp.where(valid, s, NEG_INF)
        m_prev = m_scr[...]
        m_next = jnp.maximum(m_prev, jnp.max(s, axis=1)[:, None])
        probs = jnp.where(valid, jnp.exp(s - _pallas.to_lanes(m_next, page_size)), 0.0)
        alpha = jnp.exp(m_prev - m_next)
        l_scr[...] = alpha * l_scr[...] + jnp.sum(probs, axis=1)[:, None]
        m_scr[...] = m_next
        pv = lax.dot(probs.astype(v.dtype), v, precision=precision, preferred_element_type=jnp.float32)
        acc_scr[...] = acc_scr[...] * _pallas.to_lanes(alpha, d) + pv

    @pl.when(i == pl.num_programs(2) - 1)
    def _finish():
        denom = l_scr[...]
        denom = jnp.where(denom == 0.0, 1.0, denom)  # an empty sequence attends to nothing: zeros
        o_ref[...] = (acc_scr[...] * _pallas.to_lanes(1.0 / denom, d)).astype(o_ref.dtype)


def paged_attention_jax(q, k_pages, v_pages, lengths, page_indices, sm_scale: float):
    """Paged attention on jax arrays; see the module docstring for the layouts."""
    out_dtype = q.dtype
    q, k_pages, v_pages = _pallas.as_computed(q, k_pages, v_pages)
    dtype = q.dtype
    batch, heads, head_dim = q.shape
    kv_heads, total_pages, page_size, _ = k_pages.shape
    pages_per_sequence = page_indices.shape[1]
    group = heads // kv_heads
    rows = mosaic.round_up(group, mosaic.sublanes(dtype))
    d = mosaic.lane_dim(head_dim)
    if page_size > LANES and page_size % LANES:
        raise ValueError(f"paged_attention: a page of {page_size} tokens must be at most {LANES} or a multiple of it")
    qg = _pallas.pad_to(_pallas.pad_to(q.reshape(batch, kv_heads, group, head_dim), 2, rows), 3, d)
    kp, vp = _pallas.pad_to(k_pages, 3, d), _pallas.pad_to(v_pages, 3, d)

    def page_of(b, h, i, lengths, pages):
        # Past the sequence's last page: that page again (no new DMA; the step computes nothing).
        # A page no step computes with may hold any index: clipped, so its DMA stays in the cache.
        used = jnp.maximum(lax.div(lengths[b] + page_size - 1, page_size), 1)
        page = pages[b * pages_per_sequence + jnp.minimum(i, used - 1)]
        return (h, jnp.clip(page, 0, total_pages - 1), 0, 0)

    q_spec = pl.BlockSpec((None, None, rows, d), lambda b, h, i, *_: (b, h, 0, 0))
    page_spec = pl.BlockSpec((None, None, page_size, d), page_of)
    grid_spec = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=2,
        grid=(batch, kv_heads, pages_per_sequence),
        in_specs=[q_spec, page_spec, page_spec],
        out_specs=q_spec,
        scratch_shapes=[
            pltpu.VMEM((rows, LANES), jnp.float32),
            pltpu.VMEM((rows, LANES), jnp.float32),
            pltpu.VMEM((rows, d), jnp.float32),
        ],
    )
    out = _pallas.call(
        functools.partial(
            _paged_kernel, sm_scale=sm_scale, page_size=page_size, d=d, precision=_pallas.dot_precision(q, k_pages)
        ),
        grid_spec=grid_spec,
        out_shape=jax.ShapeDtypeStruct(qg.shape, dtype),
        semantics=(PARALLEL, PARALLEL, ARBITRARY),
        name="paged_attention",
    )(lengths.astype(jnp.int32), page_indices.astype(jnp.int32).reshape(-1), qg, kp, vp)
    return out[:, :, :group, :head_dim].reshape(batch, heads, head_dim).astype(out_dtype)


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
