"""Paged attention (Pallas, interpreted on the CPU client) against attention over each
sequence's gathered pages on CPU, and its input checks."""

from __future__ import annotations

import math

import pytest
import torch

import torch_tpu
from tests.helpers import assert_no_fallbacks
from torch_tpu.kernels import paged_attention

BATCH, HEADS, KV_HEADS, DIM, PAGES, PAGE_SIZE, PAGES_PER_SEQ = 3, 4, 2, 8, 10, 4, 3


def reference_paged(q, k_pages, v_pages, lengths, page_indices):
    outs = []
    group = q.shape[1] // k_pages.shape[0]
    for b in range(q.shape[0]):
        length = int(lengths[b])
        pages = page_indices[b].long()
        k = k_pages[:, pages].flatten(1, 2)[:, :length].repeat_interleave(group, 0)
        v = v_pages[:, pages].flatten(1, 2)[:, :length].repeat_interleave(group, 0)
        scores = torch.einsum("hd,hld->hl", q[b].float(), k.float()) / math.sqrt(q.shape[-1])
        outs.append(torch.einsum("hl,hld->hd", scores.softmax(-1), v.float()))
    return torch.stack(outs).to(q.dtype)


def cache(dtype=torch.float32):
    q = torch.randn(BATCH, HEADS, DIM, dtype=dtype)
    k_pages = torch.randn(KV_HEADS, PAGES, PAGE_SIZE, DIM, dtype=dtype)
    v_pages = torch.randn(KV_HEADS, PAGES, PAGE_SIZE, DIM, dtype=dtype)
    # Lengths inside a page, on a page boundary, and the full capacity; pages out of order.
    lengths = torch.tensor([5, 12, 1], dtype=torch.int32)
    page_indices = torch.tensor([[3, 7, 0], [1, 2, 9], [8, 0, 0]], dtype=torch.int32)
    return q, k_pages, v_pages, lengths, page_indices


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_paged_attention_matches_gathered_attention(dtype):
    inputs = cache(dtype)
    torch_tpu.metrics.reset()
    out = paged_attention(*(t.to("tpu") for t in inputs))
    assert_no_fallbacks()
    tol = {"rtol": 2e-2, "atol": 2e-2} if dtype == torch.bfloat16 else {"rtol": 1e-5, "atol": 1e-5}
    torch.testing.assert_close(out.cpu(), reference_paged(*inputs), **tol)


def test_paged_attention_lengths_past_the_cache_raise():
    q, k_pages, v_pages, lengths, page_indices = (t.to("tpu") for t in cache())
    too_long = torch.tensor([5, PAGES_PER_SEQ * PAGE_SIZE + 1, 1], dtype=torch.int32).to("tpu")
    with pytest.raises(ValueError, match=r"must lie in \[0, 12\]"):
        paged_attention(q, k_pages, v_pages, too_long, page_indices)
    bad_pages = page_indices.cpu().clone()
    bad_pages[0, 1] = PAGES
    with pytest.raises(IndexError, match="page indices"):
        paged_attention(q, k_pages, v_pages, lengths, bad_pages.to("tpu"))


def test_paged_attention_bad_shapes_and_dtypes_raise():
    q, k_pages, v_pages, lengths, page_indices = (t.to("tpu") for t in cache())
    with pytest.raises(RuntimeError, match="head dim 4 does not match"):
        paged_attention(q[..., :4], k_pages, v_pages, lengths, page_indices)
    with pytest.raises(RuntimeError, match="not a multiple"):
        paged_attention(q[:, :3], k_pages, v_pages, lengths, page_indices)
    with pytest.raises(RuntimeError, match="must share one of"):
        paged_attention(q.bfloat16(), k_pages, v_pages, lengths, page_indices)
    with pytest.raises(RuntimeError, match="must be int32"):
        paged_attention(q, k_pages, v_pages, lengths.float(), page_indices)
    with pytest.raises(RuntimeError, match="expected lengths"):
        paged_attention(q, k_pages, v_pages, lengths[:2], page_indices)
