"""Bounded dynamic shapes in graph mode: one executable per size bucket, exact results."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import torch_tpu
from tests.helpers import platform_tol
from torch_tpu import platforms
from torch_tpu.compile import buckets
from torch_tpu.compile import options as compile_options

pytestmark = pytest.mark.usefixtures("fresh_dynamo")


def _counts() -> dict:
    return torch_tpu.metrics.counters()


def test_bucket_sizes():
    assert [buckets.bucket(n, None) for n in (1, 2, 3, 9, 16, 17, 128)] == [1, 2, 4, 16, 16, 32, 128]
    assert [buckets.bucket(n, (16, 64)) for n in (1, 16, 17, 64, 65)] == [16, 16, 64, 64, None]
    assert compile_options.parse(None, {"dynamic_buckets": False}).dynamic_buckets == ()
    assert compile_options.parse(None, {"dynamic_buckets": False}).as_dict()["dynamic_buckets"] is False


@pytest.mark.parametrize("rules", ["client", "tpu"])
def test_encoder_layer_at_12_lengths_compiles_one_graph_per_bucket(rules, monkeypatch):
    """`rules="tpu"`: TPU's lowering rules (TORCH_TPU_PALLAS_ON_CPU=1 off a TPU): attention is
    the fused flash kernel (interpreted here), which masks the keys a bucket pads."""
    if rules == "tpu":
        if torch_tpu.platform() == "tpu":
            pytest.skip("the client's rules are TPU's here")
        monkeypatch.setenv("TORCH_TPU_PALLAS_ON_CPU", "1")
    torch.manual_seed(0)
    ref = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0).train()
    layer = copy.deepcopy(ref).to("tpu")
    compiled = torch.compile(layer, backend="tpu", dynamic=True)
    lengths = [9, 12, 16, 17, 24, 31, 33, 47, 64, 65, 100, 128]  # buckets 16, 32, 64, 128
    backward_at = (9, 12)  # the backward graph, at two sizes of one bucket (CI time)
    for length in lengths:
        x = torch.randn(length, 2, 16, requires_grad=True)
        xt = x.detach().to("tpu").requires_grad_()
        out = compiled(xt)
        expected = ref(x)
        torch.testing.assert_close(out.detach().cpu(), expected.detach(), rtol=1e-4, atol=1e-4)
        if length in backward_at:
            (out * out).sum().backward()
            (expected * expected).sum().backward()
            torch.testing.assert_close(xt.grad.cpu(), x.grad, rtol=1e-4, atol=1e-4)
    for p, p_ref in zip(layer.parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad.cpu(), p_ref.grad, rtol=1e-4, atol=1e-4)
    counts = _counts()
    # One forward executable per bucket, and one backward for the bucket it ran in.
    assert counts["bucket_compiles"] == counts["graph_compiles"] == 4 + 1, counts
    assert (counts.get("sdpa_flash", 0) > 0) == (platforms.lowering_platform() == "tpu"), counts
    assert counts.get("bucket_exact_graphs", 0) == 0
    assert counts["bucket_runs"] == len(lengths) + len(backward_at)
    # Saved activations reach the backward graph padded: only the input and the incoming
    # gradient are padded per call (and none at a bucket's own size).
    assert counts["bucket_pads"] <= len(lengths) + len(backward_at)


def test_fixed_length_compiles_one_graph():
    torch.manual_seed(0)
    ref = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0).train()
    compiled = torch.compile(copy.deepcopy(ref).to("tpu"), backend="tpu", dynamic=True)
    x = torch.randn(20, 2, 16)
    with torch.no_grad():
        for _ in range(3):
            torch.testing.assert_close(compiled(x.to("tpu")).cpu(), ref(x), rtol=1e-4, atol=1e-4)
    assert _counts()["graph_compiles"] == 1


def test_reductions_over_the_padded_dim_are_exact():
    def f(x):
        s = torch.softmax(x, 0)
        return (s * x).sum(0) + x.mean(0) + x.amax(0) - x.amin(0) + (x < 0).all(0).float() + x.logsumexp(0)

    compiled = torch.compile(f, backend="tpu", dynamic=True)
    for n in (5, 6, 7):  # one bucket: 8
        x = -torch.rand(n, 3) - 0.5  # all negative: a zero in the padding would win amax
        # softmax and logsumexp: TPU's exp differs from CPU's (platform_tol); a padded element
        # leaking into a reduction would be off by far more
        torch.testing.assert_close(compiled(x.to("tpu")).cpu(), f(x), **platform_tol({"rtol": 1e-5, "atol": 1e-5}))
    counts = _counts()
    assert counts["graph_compiles"] == 1 and counts["bucket_runs"] == 3


def test_user_buckets_and_sizes_above_them():
    compiled = torch.compile(
        lambda x: (x * 2).sum(0), backend="tpu", dynamic=True, options={"dynamic_buckets": [8, 32]}
    )
    for n in (3, 5, 20, 31):
        x = torch.randn(n, 4)
        torch.testing.assert_close(compiled(x.to("tpu")).cpu(), (x * 2).sum(0))
    assert _counts()["graph_compiles"] == 2  # 8 and 32
    compiled(torch.randn(40, 4).to("tpu"))  # above the largest bucket: its exact size
    assert _counts()["graph_compiles"] == 3 and _counts()["bucket_runs"] == 4


def test_an_op_that_cannot_be_padded_keeps_exact_sizes_visibly():
    def f(x):
        return x.var(0) + x.sum(0)

    compiled = torch.compile(f, backend="tpu", dynamic=True)
    with pytest.warns(UserWarning, match="cannot be padded safely"):
        compiled(torch.randn(5, 3).to("tpu"))
    for n in (5, 6, 7):
        x = torch.randn(n, 3)
        torch.testing.assert_close(compiled(x.to("tpu")).cpu(), f(x))
    counts = _counts()
    assert counts["bucket_exact_graphs"] == 1  # decided once for bucket 8
    assert counts["graph_compiles"] == 3  # one per exact size
    assert counts.get("bucket_runs", 0) == 0


def test_buckets_off():
    compiled = torch.compile(lambda x: x.sum(0), backend="tpu", dynamic=True, options={"dynamic_buckets": False})
    for n in (5, 6):
        compiled(torch.randn(n, 3).to("tpu"))
    assert _counts()["graph_compiles"] == 2 and _counts().get("bucket_runs", 0) == 0
