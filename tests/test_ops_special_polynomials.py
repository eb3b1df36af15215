"""torch.special's orthogonal polynomials on tpu against CPU: n a tensor, n a Python number
(n_scalar: re-dispatched to .out with a wrapped scalar) and x a Python number (x_scalar), all
native (no CPU fallback)."""

from __future__ import annotations

import pytest
import torch

import torch_tpu
from tests.helpers import platform_tol

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


def _tpu(x):
    return x.to("tpu") if isinstance(x, torch.Tensor) else x


def _check(fn, x, n, **kwargs) -> None:
    """fn(x, n) on tpu, native, against CPU; float32 within platform_tol (on a TPU: its cos and
    acos, and the recurrences' a*b+c rounded twice)."""
    expected = fn(x, n)
    torch_tpu.metrics.reset()
    got = fn(_tpu(x), _tpu(n), **kwargs)
    fallbacks = torch_tpu.metrics.counters()["cpu_fallback_ops"]
    assert not [op for op in fallbacks if "polynomial" in op], f"fell back to CPU: {fallbacks}"
    assert got.device.type == "tpu" and got.dtype == expected.dtype and got.shape == expected.shape
    tol = platform_tol({}) if expected.dtype == torch.float32 else {}
    torch.testing.assert_close(got.cpu(), expected, equal_nan=True, **tol)


@pytest.mark.parametrize("fn", POLYNOMIALS, ids=IDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_n_tensor(fn, dtype):
    x = torch.linspace(-1.5, 1.5, 13, dtype=dtype)
    n = torch.tensor([-1, 0, 1, 2, 3, 5, 8, 0, 1, 2, 3, 4, 6])
    _check(fn, x, n)


@pytest.mark.parametrize("fn", POLYNOMIALS, ids=IDS)
@pytest.mark.parametrize("n", [-1, 0, 3, 6, 2.0])
def test_n_scalar(fn, n):
    _check(fn, torch.linspace(-1.5, 1.5, 13), n)


@pytest.mark.parametrize("fn", POLYNOMIALS, ids=IDS)
def test_x_scalar(fn):
    _check(fn, 0.25, torch.tensor([0, 1, 2, 5]))


@pytest.mark.parametrize("fn", POLYNOMIALS, ids=IDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_special_values(fn, dtype):
    """The kernels' special cases: x at -1, 0, 1 and +-inf, n past the closed-form switch, n NaN or infinite."""
    x = torch.tensor([-1.0, 0.0, 1.0, 0.5, -0.3, 0.9, 2.0, float("inf"), -float("inf"), 0.7, 0.2, 0.5], dtype=dtype)
    n = torch.tensor([7, 9, 12, 20, 11, 30, 40, 3, 4, float("nan"), float("inf"), -float("inf")], dtype=dtype)
    _check(fn, x, n)


@pytest.mark.parametrize("fn", POLYNOMIALS, ids=IDS)
def test_broadcast_and_promotion(fn):
    """Integer operands compute in the default dtype; float64 x with float32 n in float64; n broadcasts."""
    x = torch.arange(-3, 4).reshape(7, 1)
    _check(fn, x, torch.tensor([0, 1, 2, 4]))
    _check(fn, torch.linspace(-1.2, 1.2, 7, dtype=torch.float64).reshape(7, 1), torch.tensor([1.0, 3.0, 10.0]))
    _check(fn, torch.linspace(-1.2, 1.2, 5), torch.tensor(4, dtype=torch.int32))


@pytest.mark.parametrize("fn", POLYNOMIALS, ids=IDS)
def test_out(fn):
    x, n = torch.linspace(-1.5, 1.5, 13), torch.arange(13) % 7
    out = torch.empty(13, device="tpu")
    _check(fn, x, n, out=out)
    torch.testing.assert_close(out.cpu(), fn(x, n), **platform_tol({}))


@pytest.mark.parametrize("fn", POLYNOMIALS, ids=IDS)
def test_half_is_rejected_as_on_cpu(fn):
    x = torch.ones(3, dtype=torch.float16)
    with pytest.raises(NotImplementedError, match="not implemented for 'Half'"):
        fn(x, 2)
    with pytest.raises(NotImplementedError, match="not implemented for 'Half'"):
        fn(x.to("tpu"), 2)


@pytest.mark.parametrize("fn", POLYNOMIALS, ids=IDS)
def test_nan_x(fn):
    """NaN x gives NaN for n >= 1 (torch 2.14's CPU kernels; 2.13's read an uninitialized value)."""
    torch_tpu.metrics.reset()
    got = fn(torch.full((4,), float("nan"), device="tpu"), torch.tensor([0, 1, 3, 9], device="tpu")).cpu()
    assert not torch_tpu.metrics.counters()["cpu_fallback_ops"]
    assert got[0] == 1 and got[1:].isnan().all()


@pytest.mark.parametrize("fn", POLYNOMIALS, ids=IDS)
def test_compiled(fn):
    x, n = torch.linspace(-1.5, 1.5, 13), torch.tensor([-1, 0, 1, 2, 3, 5, 8, 0, 1, 2, 9, 4, 12])
    torch._dynamo.reset()
    torch_tpu.metrics.reset()
    got = torch.compile(lambda x, n: fn(x, n) + fn(x, 3), backend="tpu")(x.to("tpu"), n.to("tpu"))
    assert not torch_tpu.metrics.counters()["cpu_fallback_ops"]
    torch.testing.assert_close(got.cpu(), fn(x, n) + fn(x, 3), equal_nan=True, **platform_tol({}))
