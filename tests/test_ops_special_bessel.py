"""torch.special's Bessel and Airy functions (ported Cephes code, torch_tpu/ops/lowerings/bessel.py), erfcx and zeta
(torch_tpu/ops/lowerings/special.py) on tpu against CPU over all their branches and special values, with no CPU
fallback."""

from __future__ import annotations

import pytest
import torch

import torch_tpu
from tests.helpers import platform_rounding_tol, platform_tol

S = torch.special
FUNCTIONS = [
    S.bessel_j0,
    S.bessel_j1,
    S.bessel_y0,
    S.bessel_y1,
    S.modified_bessel_k0,
    S.modified_bessel_k1,
    S.scaled_modified_bessel_k0,
    S.scaled_modified_bessel_k1,
    S.airy_ai,
    S.erfcx,
]
IDS = [f.__name__ for f in FUNCTIONS]
# Past the values near the branch points (Bessel 2, 5; Ai 2.09, 8.32) and the zeros of J and Y, with the special cases.
SPECIAL = [0.0, -0.0, 1e-30, 1e-6, 1e-5, 2.0, 2.09, -2.09, 5.0, -5.0, 8.3203353, 103.0, 104.0, 1e3, 1e8]
SPECIAL += [-6.1, -26.7, 49.9, 50.0, 50.1, 4e7, 6e7]  # erfcx's branch points
SPECIAL += [float("inf"), float("-inf"), float("nan")]


def _inputs(dtype: torch.dtype) -> torch.Tensor:
    grid = torch.linspace(-30, 30, 1201, dtype=torch.float64)
    return torch.cat([grid, torch.tensor(SPECIAL, dtype=torch.float64)]).to(dtype)


def _run(fn, x: torch.Tensor) -> torch.Tensor:
    torch_tpu.metrics.reset()
    got = fn(x.to("tpu")).cpu()
    assert not torch_tpu.metrics.counters()["cpu_fallback_ops"]
    return got


@pytest.mark.parametrize("fn", FUNCTIONS, ids=IDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_against_cpu(fn, dtype):
    x = _inputs(dtype)
    expected = fn(x)
    got = _run(fn, x)
    assert got.dtype == expected.dtype
    # The same Cephes formulas: a few ulps apart (libm vs XLA's exp/log/sin, FMA contraction), more where a
    # function crosses zero (relative error of an absolute rounding), hence the atol.
    if dtype == torch.float32:
        torch.testing.assert_close(got, expected, **platform_tol({"rtol": 1e-5, "atol": 1e-6}), equal_nan=True)
    else:
        torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-14, equal_nan=True)


@pytest.mark.parametrize("fn", FUNCTIONS, ids=IDS)
def test_integer_input(fn):
    x = torch.arange(-3, 12)
    expected = fn(x)
    got = _run(fn, x)
    assert got.dtype == expected.dtype == torch.float32
    torch.testing.assert_close(got, expected, **platform_tol({"rtol": 1e-5, "atol": 1e-6}), equal_nan=True)


@pytest.mark.parametrize("fn", FUNCTIONS, ids=IDS)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_types_rejected(fn, dtype):
    x = torch.ones(3, dtype=dtype)
    with pytest.raises(NotImplementedError) as expected:
        fn(x)
    with pytest.raises(NotImplementedError, match=str(expected.value).replace('"', ".")):
        fn(x.to("tpu"))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_zeta(dtype):
    nan, inf = float("nan"), float("inf")
    # The special cases (x == 1, x < 1, poles at q <= 0, q < 0 with x fractional), then a grid with negative q.
    x = [1.0, 0.5, -1.0, 2.0, 2.0, 2.0, 3.0, 4.5, 1.0001, 30.0, 2.0, 2.0, 2.0, nan, 2.0, inf, 2.0, 3.0, 1.5, 2.0, 100.0]
    q = [
        1.0,
        1.0,
        1.0,
        1.0,
        0.0,
        -1.0,
        -2.5,
        -2.5,
        1.0,
        2.0,
        1e-3,
        0.5,
        1e5,
        1.0,
        nan,
        2.0,
        -inf,
        -1000.5,
        -3.5,
        inf,
        0.7,
    ]
    x = torch.cat([torch.tensor(x, dtype=dtype), torch.linspace(1.01, 12, 200, dtype=dtype).repeat(3)])
    q = torch.cat([torch.tensor(q, dtype=dtype), torch.linspace(-5.25, 20, 600, dtype=dtype)])
    expected = S.zeta(x, q)
    torch_tpu.metrics.reset()
    got = S.zeta(x.to("tpu"), q.to("tpu")).cpu()
    assert not torch_tpu.metrics.counters()["cpu_fallback_ops"]
    assert got.dtype == expected.dtype
    # CPU's algorithm in CPU's precision (float64 for float32 too): equal but for libm's pow vs XLA's.
    # On a TPU: its pow (platform_tol); float64 as float32 pairs (platform_rounding_tol).
    tol = {"rtol": 4 * torch.finfo(dtype).eps, "atol": 0}
    if dtype == torch.float32:
        tol = platform_tol(tol)
    else:
        tol = {k: max(v, platform_rounding_tol(dtype)[k]) for k, v in tol.items()}
    torch.testing.assert_close(got, expected, **tol, equal_nan=True)
    assert S.zeta(torch.tensor([2, 3]).to("tpu"), torch.tensor([1, 2]).to("tpu")).dtype == torch.float32


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_zeta_half_types_rejected(dtype):
    x = torch.full((3,), 2.0, dtype=dtype)
    with pytest.raises(NotImplementedError, match='"zeta_cpu" not implemented'):
        S.zeta(x.to("tpu"), x.to("tpu"))


@pytest.mark.parametrize("fn", FUNCTIONS, ids=IDS)
def test_shapes_and_out(fn):
    for x in (torch.tensor(3.5, dtype=torch.float64), torch.empty(0), torch.rand(2, 3, 4) * 10 - 2):
        got = _run(fn, x)
        assert got.shape == x.shape
        torch.testing.assert_close(got, fn(x), **platform_tol({"rtol": 1e-5, "atol": 1e-6}), equal_nan=True)
    x = torch.linspace(-3, 9, 7)
    out = torch.empty(7, device="tpu")
    fn(x.to("tpu"), out=out)
    torch.testing.assert_close(out.cpu(), fn(x), **platform_tol({"rtol": 1e-5, "atol": 1e-6}), equal_nan=True)
