"""Growing-length buckets (torch_tpu/ops/growing.py): appends by torch.cat, and attention over
the grown tensor, run one executable per length bucket, and a bucketed tensor behaves as CPU's
in every other op."""

from __future__ import annotations

import pickle

import pytest
import torch
import torch.nn.functional as F

from tests.helpers import platform_tol
from torch_tpu import metrics
from torch_tpu.ops import growing

TPU = "tpu"
# Attention over a grown cache vs CPU's: softmax's exp on a TPU differs from CPU's (platform_tol).
_ATTENTION_TOL = {"rtol": 1e-5, "atol": 1e-5}


def _delta(before: dict, *keys: str) -> dict:
    after = metrics.counters()
    return {k: after.get(k, 0) - before.get(k, 0) for k in keys}


def _grow(steps: int, shape=(1, 2, 8, 4), dim: int = 2, dtype=torch.float32, seed: int = 0):
    """A KV cache grown `steps` times along `dim` on CPU and on tpu, one new slice a step."""
    g = torch.Generator().manual_seed(seed)
    cpu = torch.randn(shape, generator=g).to(dtype)
    tpu = cpu.to(TPU)
    new_shape = list(shape)
    new_shape[dim] = 1
    for _ in range(steps):
        new = torch.randn(new_shape, generator=g).to(dtype)
        cpu = torch.cat([cpu, new], dim=dim)
        tpu = torch.cat([tpu, new.to(TPU)], dim=dim)
        yield cpu, tpu


def test_bucket_sizes():
    assert [growing.bucket(n) for n in (1, 9, 16, 17, 33, 64, 65)] == [16, 16, 16, 32, 64, 64, 128]


@pytest.mark.parametrize("dim", [0, 1, 2, 3])
def test_appends_match_cpu_and_stay_plain_contiguous_tensors(dim):
    shape = [3, 2, 8, 4]
    shape[dim] = 8
    for cpu, tpu in _grow(20, tuple(shape), dim):
        assert tpu.shape == cpu.shape and tpu.stride() == cpu.stride() and tpu.is_contiguous()
        assert tpu.untyped_storage().nbytes() == cpu.untyped_storage().nbytes()
        torch.testing.assert_close(tpu.cpu(), cpu, rtol=0, atol=0)


def test_appends_compile_once_per_bucket_not_per_length():
    before = metrics.counters()
    for _ in _grow(40):  # lengths 9..48: buckets 16, 32, 64
        pass
    counts = _delta(before, "length_bucketed_ops", "length_bucket_compiles", "op_compiles")
    assert counts["length_bucketed_ops"] == 40
    # the first append from an exact buffer, then (into a bucket, across its boundary) per bucket
    assert counts["length_bucket_compiles"] <= 6, counts
    assert counts["op_compiles"] <= 2, counts  # the new slices' transfers, not the cats


def test_attention_over_a_grown_cache_matches_cpu_with_one_compile_per_bucket():
    torch.manual_seed(1)
    before = metrics.counters()
    steps = 0
    for (k_cpu, k_tpu), (v_cpu, v_tpu) in zip(_grow(24, (1, 2, 8, 16)), _grow(24, (1, 2, 8, 16), seed=5)):
        q = torch.randn(1, 4, 1, 16)
        expected = F.scaled_dot_product_attention(q, k_cpu, v_cpu, enable_gqa=True)
        got = F.scaled_dot_product_attention(q.to(TPU), k_tpu, v_tpu, enable_gqa=True)
        torch.testing.assert_close(got.cpu(), expected, **platform_tol(_ATTENTION_TOL))
        steps += 1
    counts = _delta(before, "length_bucketed_ops", "length_bucket_compiles")
    assert counts["length_bucketed_ops"] >= 2 * steps  # every append and every attention
    assert counts["length_bucket_compiles"] <= 8, counts


def test_causal_attention_of_several_queries_over_a_grown_cache():
    torch.manual_seed(2)
    k_cpu, k_tpu = list(_grow(5, (1, 2, 12, 8)))[-1]
    q = torch.randn(1, 2, 3, 8)
    expected = F.scaled_dot_product_attention(q, k_cpu, k_cpu, is_causal=True)
    before = metrics.counters()
    got = F.scaled_dot_product_attention(q.to(TPU), k_tpu, k_tpu, is_causal=True)
    assert _delta(before, "length_bucketed_ops")["length_bucketed_ops"] == 1
    torch.testing.assert_close(got.cpu(), expected, **platform_tol(_ATTENTION_TOL))


def test_a_bucketed_tensor_behaves_as_cpus_in_other_ops():
    cpu, tpu = list(_grow(11, (2, 3, 8), dim=1))[-1]
    torch.testing.assert_close((tpu * 2 + 1).sum(1).cpu(), (cpu * 2 + 1).sum(1))
    torch.testing.assert_close(tpu.view(-1)[5:40].cpu(), cpu.view(-1)[5:40])
    torch.testing.assert_close(tpu[:, -1].cpu(), cpu[:, -1])
    torch.testing.assert_close(tpu.transpose(0, 1).contiguous().cpu(), cpu.transpose(0, 1).contiguous())
    assert tpu.untyped_storage().cpu().tolist() == cpu.untyped_storage().tolist()
    torch.testing.assert_close(pickle.loads(pickle.dumps(tpu)).cpu(), cpu)
    view = tpu[1]
    view.add_(1.0)  # in place through a view: the base sees it
    cpu[1].add_(1.0)
    torch.testing.assert_close(tpu.cpu(), cpu)
    tpu.mul_(3.0)
    cpu.mul_(3.0)
    torch.testing.assert_close(tpu.cpu(), cpu)
    # appends continue from the in-place result
    new = torch.randn(2, 1, 8)
    torch.testing.assert_close(torch.cat([tpu, new.to(TPU)], 1).cpu(), torch.cat([cpu, new], 1))


def test_token_ids_grow_as_on_cpu():
    ids_cpu = torch.arange(8).reshape(1, 8)
    ids = ids_cpu.to(TPU)
    for i in range(30):
        ids_cpu = torch.cat([ids_cpu, torch.tensor([[i]])], dim=-1)
        ids = torch.cat([ids, torch.tensor([[i]], device=TPU)], dim=-1)
        assert ids[:, -1].item() == i
    assert torch.equal(ids.cpu(), ids_cpu)


def test_other_cats_keep_exact_buffers():
    x = torch.randn(4, 6)
    before = metrics.counters()
    halves = torch.cat([x[:, :3].to(TPU), x[:, 3:].to(TPU)], dim=1)  # rotate_half's shape: no append
    promoted = torch.cat([torch.ones(8, 2, device=TPU), torch.ones(1, 2, dtype=torch.float64, device=TPU)])
    three = torch.cat([x.to(TPU), x[:1].to(TPU), x[:1].to(TPU)])
    assert _delta(before, "length_bucketed_ops")["length_bucketed_ops"] == 0
    torch.testing.assert_close(halves.cpu(), x)
    assert promoted.dtype == torch.float64 and three.shape == (6, 6)


def test_autograd_through_bucketed_appends():
    torch.manual_seed(3)
    a = torch.randn(1, 2, 8, 4, requires_grad=True)
    b = torch.randn(1, 2, 1, 4, requires_grad=True)
    q = torch.randn(1, 2, 1, 4)
    at, bt = (t.detach().to(TPU).requires_grad_() for t in (a, b))
    F.scaled_dot_product_attention(q, torch.cat([a, b], 2), torch.cat([a, b], 2)).sum().backward()
    F.scaled_dot_product_attention(q.to(TPU), torch.cat([at, bt], 2), torch.cat([at, bt], 2)).sum().backward()
    torch.testing.assert_close(at.grad.cpu(), a.grad, **platform_tol(_ATTENTION_TOL))
    torch.testing.assert_close(bt.grad.cpu(), b.grad, **platform_tol(_ATTENTION_TOL))


def test_pointwise_ops_on_a_grown_cache_compile_once_per_bucket():
    before = metrics.counters()
    for cpu, tpu in _grow(40):
        got = torch.where(tpu > 0, (tpu * 0.5 + 1).exp(), -tpu)
        want = torch.where(cpu > 0, (cpu * 0.5 + 1).exp(), -cpu)
        torch.testing.assert_close(got.cpu(), want, **platform_tol({}))  # a TPU's exp
        assert got.shape == cpu.shape and got.is_contiguous()
    counts = _delta(before, "length_bucketed_ops", "op_compiles")
    assert counts["length_bucketed_ops"] >= 40 * 6  # the append and five pointwise ops a step
    # Six ops per bucket (16, 32, 64), and again at lengths 16 and 32, where the buffer is full
    # (an exact buffer): not once per length (40 x 6).
    assert counts["op_compiles"] <= 5 * 6, counts


def test_in_place_pointwise_on_a_grown_cache_keeps_views_and_threads_right():
    cpu, tpu = list(_grow(12, (2, 3, 8), dim=1))[-1]
    view = tpu[1]
    tpu.mul_(2.0)
    cpu.mul_(2.0)
    torch.testing.assert_close(view.cpu(), cpu[1])  # the view sees the base's new buffer
    tpu.add_(tpu)
    cpu.add_(cpu)
    torch.testing.assert_close(tpu.cpu(), cpu)
    new = torch.randn(2, 1, 8)
    torch.testing.assert_close(torch.cat([tpu, new.to(TPU)], 1).cpu(), torch.cat([cpu, new], 1))


def test_checked_pointwise_ops_never_see_the_padding():
    """Integer floor division checks for zero divisors on the host: over the padded buffer its
    zeros would raise. Such ops keep the exact-shape path."""
    ids_cpu, ids = torch.arange(1, 9).reshape(1, 8), torch.arange(1, 9).reshape(1, 8).to(TPU)
    for i in range(3):
        ids_cpu = torch.cat([ids_cpu, torch.tensor([[i + 2]])], 1)
        ids = torch.cat([ids, torch.tensor([[i + 2]], device=TPU)], 1)
    assert torch.equal((ids // ids).cpu(), ids_cpu // ids_cpu)
    assert torch.equal((100 // ids).cpu(), 100 // ids_cpu)


def test_a_prefix_view_is_not_a_bucketed_tensor():
    """x[:2] starts its base's buffer and is contiguous, like a bucketed tensor: a pointwise op on
    it must still touch only its own elements."""
    base_cpu = torch.arange(24.0).reshape(6, 4)
    base = base_cpu.to(TPU)
    view, view_cpu = base[:2], base_cpu[:2]
    view.mul_(10.0)
    view_cpu.mul_(10.0)
    torch.testing.assert_close(base.cpu(), base_cpu)
    torch.testing.assert_close((base[:3] + 1).cpu(), base_cpu[:3] + 1)
    assert (base[:3] + 1).untyped_storage().nbytes() == 12 * 4
