"""Grouped matmul (Pallas, interpreted on the CPU client) against per-group matmuls on CPU."""

from __future__ import annotations

import pytest
import torch

from tests.helpers import same
from torch_tpu.kernels import gmm


def reference_gmm(lhs, rhs, group_sizes):
    """Row block g of lhs times rhs[g]; rows past sum(group_sizes) are zero."""
    out = lhs.new_zeros(lhs.shape[0], rhs.shape[2])
    start = 0
    for g, size in enumerate(group_sizes.tolist()):
        out = out.index_add(0, torch.arange(start, start + size), lhs[start : start + size] @ rhs[g])
        start += size
    return out


def _gmm_both(device, lhs, rhs, group_sizes):
    return gmm(lhs, rhs, group_sizes) if device == "tpu" else reference_gmm(lhs, rhs, group_sizes)


@pytest.mark.parametrize(
    ("dtype", "sizes", "tol"),
    [
        # Two 128-row tiles; an empty group; groups straddling the tile boundary.
        (torch.float32, [100, 0, 40, 10], {"rtol": 1e-4, "atol": 1e-4}),
        # Rows past the groups' total stay zero (and get no gradient).
        (torch.bfloat16, [3, 9, 5], {"rtol": 3e-2, "atol": 3e-2}),
    ],
)
def test_gmm_matches_per_group_matmuls(dtype, sizes, tol):
    m = 150 if dtype == torch.float32 else 20
    lhs = torch.randn(m, 16, dtype=dtype)
    rhs = torch.randn(len(sizes), 16, 24, dtype=dtype)
    group_sizes = torch.tensor(sizes, dtype=torch.int32)
    same(_gmm_both, lhs, rhs, group_sizes, grad=True, device_arg=True, seed=0, **tol)


@pytest.mark.parametrize(
    ("shapes", "message"),
    [
        (((6, 4), (2, 5, 3), (2,)), "k=4 columns"),
        (((6, 4), (2, 4, 3), (3,)), "3 group sizes for 2 groups"),
        (((6, 4), (4, 3), (2,)), "expected lhs"),
    ],
)
def test_gmm_bad_shapes_raise(shapes, message):
    lhs, rhs = torch.randn(shapes[0]).to("tpu"), torch.randn(shapes[1]).to("tpu")
    group_sizes = torch.ones(shapes[2], dtype=torch.int32).to("tpu")
    with pytest.raises(RuntimeError, match=message):
        gmm(lhs, rhs, group_sizes)


def test_gmm_bad_dtypes_raise():
    lhs, rhs = torch.randn(6, 4).to("tpu"), torch.randn(2, 4, 3).to("tpu")
    sizes = torch.tensor([2, 4], dtype=torch.int32).to("tpu")
    with pytest.raises(RuntimeError, match="one floating dtype"):
        gmm(lhs, rhs.bfloat16(), sizes)
    with pytest.raises(RuntimeError, match="group_sizes must be int32"):
        gmm(lhs, rhs, sizes.float())
