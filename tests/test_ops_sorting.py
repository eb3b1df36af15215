"""sort/argsort/msort/topk/kthvalue give CPU's indices, ties included, in low precision too.

CPU's order among equal elements is defined for stable=True (ascending original index, in
either direction) and for stable=False up to 16 elements (its std::sort is an insertion sort
there); elements compare in the tensor's own dtype, so values that round to the same bfloat16
are ties, -0.0 ties +0.0, and NaN sorts as the largest value. Beyond that, CPU's tie order
(std::sort, std::nth_element, std::partial_sort) is unspecified; there the indices must select
CPU's values.
"""

from __future__ import annotations

import pytest
import torch

from tests.helpers import same

NAN = float("nan")
DTYPES = [torch.bfloat16, torch.float16, torch.float32]


def _ties(dtype, shape):
    """Values in {0, 1, 2, 3} (many ties) with NaN, -0.0, inf and -inf mixed in."""
    x = torch.randint(0, 4, shape).to(dtype)
    if dtype.is_floating_point:
        u = torch.rand(shape)
        x[u < 0.1] = NAN
        x[(u >= 0.1) & (u < 0.2)] = -0.0
        x[(u >= 0.2) & (u < 0.25)] = float("inf")
        x[(u >= 0.25) & (u < 0.3)] = -float("inf")
    return x


def _same_sign(got: torch.Tensor, expected: torch.Tensor) -> None:
    assert torch.equal(torch.signbit(got.cpu()), torch.signbit(expected)), "-0.0 and +0.0 placed unlike CPU"


@pytest.mark.parametrize("dtype", [*DTYPES, torch.int64, torch.bool])
@pytest.mark.parametrize("descending", [False, True])
def test_stable_sort_indices_match_cpu_with_ties(dtype, descending):
    x = _ties(dtype, (3, 5, 40))
    for dim in range(-3, 3):
        got = same(lambda x, dim=dim: torch.sort(x, dim=dim, descending=descending, stable=True), x, rtol=0, atol=0)
        if dtype.is_floating_point:
            _same_sign(got.values, torch.sort(x, dim=dim, descending=descending, stable=True).values)
        same(lambda x, dim=dim: torch.argsort(x, dim=dim, descending=descending, stable=True), x)


@pytest.mark.parametrize("dtype", DTYPES)
def test_stable_sort_of_a_transposed_view(dtype):
    x = _ties(dtype, (40, 6))
    same(lambda x: torch.sort(x.t(), stable=True), x, rtol=0, atol=0)
    same(lambda x: torch.sort(x.t(), dim=0, descending=True, stable=True), x, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("descending", [False, True])
def test_values_that_round_alike_are_ties(dtype, descending):
    wide = 1000 + 16 * torch.rand(4, 200, dtype=torch.float64)  # all distinct
    x = wide.to(dtype)  # steps of 4 (bfloat16) or 0.5 (float16) there: many collisions
    assert x.unique().numel() < x.numel() // 4
    same(lambda x: torch.sort(x, descending=descending, stable=True), x, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", DTYPES)
def test_unstable_sort_of_up_to_16_elements_matches_cpu(dtype):
    for n in (2, 7, 16):
        x = _ties(dtype, (6, n))
        same(lambda x: torch.sort(x), x, rtol=0, atol=0)
        same(lambda x: torch.sort(x, descending=True, stable=False), x, rtol=0, atol=0)
        same(lambda x: torch.argsort(x, dim=0), x.t().contiguous())
        same(torch.msort, x.t().contiguous(), rtol=0, atol=0)


def _picks_cpu_values(x, dim, got_idx, expected_values):
    picked = torch.take_along_dim(x, got_idx.cpu(), dim)
    torch.testing.assert_close(picked, expected_values, rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("dtype", DTYPES)
def test_topk_values_and_selection(dtype):
    x = _ties(dtype, (5, 33))
    for dim in (0, 1):
        for k in (1, 3, x.shape[dim]):
            for largest in (True, False):
                expected = torch.topk(x, k, dim, largest)
                got = torch.topk(x.to("tpu"), k, dim, largest)
                torch.testing.assert_close(got.values.cpu(), expected.values, rtol=0, atol=0, equal_nan=True)
                _picks_cpu_values(x, dim, got.indices, expected.values)


@pytest.mark.parametrize("dtype", DTYPES)
def test_topk_and_kthvalue_without_ties_match_cpu_indices(dtype):
    x = torch.randperm(5 * 40).reshape(5, 40).to(dtype)  # distinct and exact in every dtype
    for largest in (True, False):
        same(lambda x, largest=largest: torch.topk(x, 7, largest=largest), x, rtol=0, atol=0)
        same(lambda x, largest=largest: torch.topk(x, 3, dim=0, largest=largest), x, rtol=0, atol=0)
    same(lambda x: torch.kthvalue(x, 9), x, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", DTYPES)
def test_kthvalue_values_and_selection(dtype):
    x = _ties(dtype, (5, 33))
    for dim in (0, 1):
        for k in (1, 4, x.shape[dim]):
            for keepdim in (False, True):
                expected = torch.kthvalue(x, k, dim, keepdim)
                got = torch.kthvalue(x.to("tpu"), k, dim, keepdim)
                torch.testing.assert_close(got.values.cpu(), expected.values, rtol=0, atol=0, equal_nan=True)
                idx = got.indices if keepdim else got.indices.unsqueeze(dim)
                want = expected.values if keepdim else expected.values.unsqueeze(dim)
                _picks_cpu_values(x, dim, idx, want)


def test_nan_and_signed_zero_placement():
    x = torch.tensor([0.0, -0.0, 1.0, -0.0, 0.0, NAN, 1.0, NAN, -1.0, -NAN])
    for dtype in DTYPES:
        for descending in (False, True):
            got = same(lambda x, d=descending: torch.sort(x, descending=d, stable=True), x.to(dtype), rtol=0, atol=0)
            _same_sign(got.values, torch.sort(x.to(dtype), descending=descending, stable=True).values)
