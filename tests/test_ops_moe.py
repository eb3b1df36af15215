"""The mixture-of-experts ops: histc (integer counts included) and torch._grouped_mm, against CPU."""

from __future__ import annotations

import pytest
import torch

import torch_tpu
from tests.helpers import native_only, platform_rounding_tol, same, same_error

BF16 = torch.bfloat16


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("bins,low,high", [(10, 0, 0), (7, -1, 1), (5, 0.3, 0.3), (100, -2.5, 2.5)])
def test_histc_float(dtype, bins, low, high):
    x = torch.randn(500, generator=torch.Generator().manual_seed(0)).to(dtype)
    same(lambda x: torch.histc(x, bins, low, high), x, rtol=0, atol=0)


def test_histc_edges():
    x = torch.tensor([0.0, 1, 2, 3, 3, 4, -1, float("nan")])
    same(lambda x: torch.histc(x, 4, 0, 3), x, rtol=0, atol=0)
    same(lambda x: torch.histc(x, 3), torch.tensor([2.0, 2.0]), rtol=0, atol=0)
    same(lambda x: torch.histc(x, 3), torch.tensor([]), rtol=0, atol=0)


def test_histc_integer():
    """CUDA's integer histc, which CPU lacks: bin = (x - min) * bins // (max - min), max in the last bin."""
    x = torch.tensor([0, 1, 1, 3, 3, 3, 2, 4, -1], dtype=torch.int32)
    got = native_only(lambda: (torch.histc(x.to("tpu"), 4, 0, 4), torch.histc(x.to("tpu"), 4, 0, 3)))
    assert got[0].dtype == torch.int32
    assert got[0].cpu().tolist() == [1, 2, 1, 4]
    assert got[1].cpu().tolist() == [1, 2, 1, 3]
    assert torch.histc(torch.tensor([5, 5]).to("tpu"), 3).cpu().tolist() == [0, 2, 0]


def test_histc_errors():
    same_error(lambda x: torch.histc(x, bins=0), torch.ones(3))
    same_error(lambda x: torch.histc(x, min=2, max=1), torch.ones(3))
    same_error(lambda x: torch.histc(x), torch.tensor([1.0, float("inf")]))


def _offs(*ends):
    return torch.tensor(ends, dtype=torch.int32)


def _rand(*shape, dtype=BF16):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(sum(shape))).to(dtype)


def _product_tol(dtype) -> dict:
    """rtol=0, atol=1e-5 (CPU's float32 sums rounded once to `dtype`); on a TPU also its last-place
    differences (platform_rounding_tol: the MXU sums in another order, which can flip a rounding)."""
    tpu = platform_rounding_tol(dtype)
    return {"rtol": tpu["rtol"], "atol": max(1e-5, tpu["atol"])}


@pytest.mark.parametrize(
    "a,b,offs",
    [
        ((16, 32), (4, 32, 16), _offs(3, 3, 10, 16)),  # rows in groups, an empty group
        ((4, 8, 32), (32, 16), _offs(2, 8, 8, 16)),  # columns in groups
        ((8, 16), (16, 24), _offs(4, 8, 8, 16)),  # the contraction in groups
        ((4, 8, 32), (4, 32, 16), None),  # a batched matmul
    ],
)
@pytest.mark.parametrize("dtype", [BF16, torch.float32])
def test_grouped_mm(a, b, offs, dtype):
    same(
        lambda a, b, o: torch._grouped_mm(a, b, offs=o),
        _rand(*a, dtype=dtype),
        _rand(*b, dtype=dtype),
        offs,
        **_product_tol(dtype),
    )


def test_grouped_mm_backward_transposed():
    a, w = _rand(16, 32), _rand(4, 16, 32)
    same(
        lambda a, w: torch._grouped_mm(a, w.transpose(-2, -1), offs=_offs(3, 3, 10, 16).to(a.device)),
        a,
        w,
        grad=True,
        **_product_tol(BF16),
    )


def test_grouped_mm_compiled(fresh_dynamo):
    a, b, offs = _rand(16, 32), _rand(4, 32, 16), _offs(3, 3, 10, 16)
    fn = torch.compile(lambda a, b, o: torch._grouped_mm(a, b, offs=o) * 2, backend="tpu")
    torch_tpu.metrics.reset()
    got = fn(a.to("tpu"), b.to("tpu"), offs.to("tpu"))
    assert torch_tpu.metrics.counters().get("graph_eager_ops", 0) == 0  # lowered into the graph
    torch.testing.assert_close(got.cpu(), torch._grouped_mm(a, b, offs=offs) * 2, **platform_rounding_tol(BF16))


@pytest.mark.parametrize(
    "a,b,offs",
    [
        ((16, 32), (4, 32, 16), _offs(3, 3, 10, 16)),
        ((4, 8, 32), (32, 16), _offs(2, 8, 8, 16)),
        ((8, 16), (16, 24), _offs(4, 8, 8, 16)),
        ((4, 8, 32), (4, 32, 16), None),
    ],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_grouped_mm_compiled_in_every_eager_dtype(fresh_dynamo, a, b, offs, dtype):
    """torch's meta function takes bfloat16 only; tracing tpu inputs takes what eager takes."""
    a, b = _rand(*a, dtype=dtype).to("tpu"), _rand(*b, dtype=dtype).to("tpu")
    offs = None if offs is None else offs.to("tpu")
    fn = torch.compile(lambda a, b, o: torch._grouped_mm(a, b, offs=o) * 2, backend="tpu", fullgraph=True)
    got = fn(a, b, offs)
    assert torch_tpu.metrics.counters().get("graph_eager_ops", 0) == 0
    assert got.dtype == dtype and got.is_contiguous()
    torch.testing.assert_close(got.cpu(), (torch._grouped_mm(a, b, offs=offs) * 2).cpu(), rtol=0, atol=0)


def test_grouped_mm_compiled_errors_match_eager(fresh_dynamo):
    a, b = _rand(16, 32, dtype=torch.float32).to("tpu"), _rand(4, 32, 16, dtype=torch.float32).to("tpu")
    fn = torch.compile(lambda a, b, o: torch._grouped_mm(a, b, offs=o), backend="tpu", fullgraph=True)
    with pytest.raises(RuntimeError, match="Offsets have to be int32"):
        fn(a, b, _offs(3, 3, 10, 16).long().to("tpu"))
    with pytest.raises(RuntimeError, match="Expected mat_a to be Float32, BFloat16 or Float16 matrix"):
        fn(a.int(), b, _offs(3, 3, 10, 16).to("tpu"))


def test_grouped_mm_errors():
    a, b = _rand(16, 32), _rand(4, 32, 16)
    same_error(lambda a, b, o: torch._grouped_mm(a, b, offs=o), a, b, _offs(3, 3, 10, 16).long())
    same_error(lambda a, b: torch._grouped_mm(a, b), a, b)
    same_error(lambda a, b, o: torch._grouped_mm(a, b, offs=o), a, _rand(4, 16, 16), _offs(3, 3, 10, 16))
    same_error(lambda a, b, o: torch._grouped_mm(a, b, offs=o), a, b, _offs(3, 16))
    same_error(lambda a, b, o: torch._grouped_mm(a, b, offs=o), a.int(), b, _offs(3, 3, 10, 16))
