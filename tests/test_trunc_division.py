"""Float division with rounding_mode="trunc" (and so fmod's gradient wrt its divisor, which torch
computes as -grad * a.div(b, rounding_mode="trunc")) is exact where the quotient is an integer,
also where the division is not correctly rounded: XLA:TPU divides by a refined reciprocal, so
a / a came out as 1 - ulp and its trunc as 0 (on a v5e, fmod(a, a)'s divisor gradient lost the
whole cotangent at 3 of 12 elements). ops/lowerings/elementwise.py: truncated_quotient."""

from __future__ import annotations

import jax
import numpy as np
import pytest
import torch

from torch_tpu.ops.lowerings.elementwise import truncated_quotient

N = 4000


def _operands(dtype) -> tuple[np.ndarray, np.ndarray]:
    """Divisors of both signs and dividends k * b (k in [-60, 60]): the first half of the divisors
    have 12 significant bits, so k * b and its quotient k are exact; the others' k * b, rounded
    to dtype, is mostly not a multiple of b, its quotient within an ulp or so of k."""
    g = np.random.default_rng(0)
    b = g.uniform(0.01, 100, N) * g.choice([-1, 1], N)
    mantissa, exponent = np.frexp(b[: N // 2])
    b[: N // 2] = np.ldexp(np.round(mantissa * 2**12) / 2**12, exponent)
    b = b.astype(dtype)
    a = (g.integers(-60, 61, N) * b).astype(dtype)
    a[:8] = b[:8]  # a == b
    a[8:16] = g.uniform(-1, 1, 8) * np.abs(b[8:16])  # |quotient| < 1: a signed zero
    return a, b


def _exact(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The exact truncated quotient: float64 holds a - fmod(a, b) = n * b of float32 a, b exactly."""
    wide_a, wide_b = a.astype(np.float64), b.astype(np.float64)
    return ((wide_a - np.fmod(wide_a, wide_b)) / wide_b).astype(a.dtype)


def _run(a, b, quot) -> np.ndarray:
    return np.asarray(jax.jit(truncated_quotient)(a, b, quot))


def _same_bits(got: np.ndarray, want: np.ndarray) -> bool:
    return np.array_equal(got, want) and np.array_equal(np.signbit(got), np.signbit(want))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_correctly_rounded_quotient_truncates_as_cpu(dtype):
    a, b = _operands(dtype)
    assert _same_bits(_run(a, b, a / b), np.trunc(a / b))
    cpu = torch.div(torch.from_numpy(a), torch.from_numpy(b), rounding_mode="trunc").numpy()
    assert _same_bits(_run(a, b, a / b), cpu)


@pytest.mark.parametrize("off", ["toward zero", "away from zero", "reciprocal product"])
def test_a_quotient_an_ulp_off_truncates_to_the_exact_integer(off):
    a, b = _operands(np.float32)
    cpu = np.trunc(a / b)
    exact = _exact(a, b)
    quot = {
        "toward zero": np.nextafter(a / b, np.float32(0)),
        "away from zero": np.nextafter(a / b, np.copysign(np.float32(np.inf), a / b)),
        "reciprocal product": a * (np.float32(1) / b),
    }[off]
    got = _run(a, b, quot)
    integral = np.fmod(a, b) == 0
    assert integral.sum() > N // 2 and (~integral).sum() > N // 4
    assert np.array_equal(got[integral], cpu[integral])  # a == b gives 1
    assert np.all(np.abs(got) >= np.abs(exact))  # never the integer below
    # otherwise CPU's, but where CPU's correctly rounded quotient was an integer its operands are not
    # a multiple of (k * b rounded): there the nearest one is within the quotient's last bits
    near = np.abs(a / b - np.round(a / b)) <= 4 * np.spacing(np.abs(a / b))
    assert np.all((got == cpu) | near)
    if off != "away from zero":  # what the plain trunc(quot) gave: below the integer
        assert np.any(np.trunc(quot)[integral] != cpu[integral])


def _fmod_gradients(x: torch.Tensor, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    a = x.clone().to(device).requires_grad_()
    b = x.clone().to(device).requires_grad_()
    cotangent = torch.linspace(-2, 2, x.numel()).reshape(x.shape).to(device)
    torch.fmod(a, b).backward(cotangent)
    return a.grad.cpu(), b.grad.cpu()


def test_fmod_of_equal_operands_has_cpus_divisor_gradient():
    """Including values whose float32 reciprocal product x * (1 / x) is 1 - ulp."""
    x = torch.empty(2000).uniform_(0.5, 3, generator=torch.Generator().manual_seed(0))
    x[1000:] *= -7.25
    low = (x * (1 / x)) < 1
    assert low.sum() > 50, low.sum()
    assert torch.equal(torch.div(x.to("tpu"), x.to("tpu"), rounding_mode="trunc").cpu(), torch.ones_like(x))
    for got, want in zip(_fmod_gradients(x, "tpu"), _fmod_gradients(x, "cpu")):
        assert torch.equal(got, want)
