"""torch.special's orthogonal polynomials on tpu against CPU: n a tensor, n a Python number
(n_scalar: re-dispatched to .out with a wrapped scalar) and x a Python number (x_scalar)."""

from __future__ import annotations

import warnings

import pytest
import torch

import torch_tpu  # noqa: F401

S = torch.special
POLYNOMIALS = [
    S.chebyshev_polynomial_t,
    S.chebyshev_polynomial_u,
    S.chebyshev_polynomial_v,
    S.chebyshev_polynomial_w,
    S.shifted_chebyshev_polynomial_t,
    S.shifted_chebyshev_polynomial_u,
    S.shifted_chebyshev_polynomial_v,
    S.shifted_chebyshev_polynomial_w,
    S.hermite_polynomial_h,
    S.hermite_polynomial_he,
    S.laguerre_polynomial_l,
    S.legendre_polynomial_p,
]
IDS = [f.__name__ for f in POLYNOMIALS]


def _check(got: torch.Tensor, expected: torch.Tensor) -> None:
    assert got.device.type == "tpu" and got.dtype == expected.dtype and got.shape == expected.shape
    torch.testing.assert_close(got.cpu(), expected, equal_nan=True)


@pytest.fixture(autouse=True)
def _quiet_fallback():
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "torch_tpu: .* has no tpu lowering yet")
        yield


@pytest.mark.parametrize("fn", POLYNOMIALS, ids=IDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_n_tensor(fn, dtype):
    x = torch.linspace(-1.5, 1.5, 13, dtype=dtype)
    n = torch.tensor([-1, 0, 1, 2, 3, 5, 8, 0, 1, 2, 3, 4, 6])
    _check(fn(x.to("tpu"), n.to("tpu")), fn(x, n))


@pytest.mark.parametrize("fn", POLYNOMIALS, ids=IDS)
@pytest.mark.parametrize("n", [-1, 0, 3, 6, 2.0])
def test_n_scalar(fn, n):
    x = torch.linspace(-1.5, 1.5, 13)
    _check(fn(x.to("tpu"), n), fn(x, n))


@pytest.mark.parametrize("fn", POLYNOMIALS, ids=IDS)
def test_x_scalar(fn):
    n = torch.tensor([0, 1, 2, 5])
    _check(fn(0.25, n.to("tpu")), fn(0.25, n))
