"""ops/sign_bit.py: float64 sign bits without 64-bit shifts (XLA:TPU failed to compile
jnp.signbit's for float64), exact on every value, and so floor division of float64 on tpu."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from torch_tpu.ops import sign_bit

VALUES = [-1.5, -0.0, 0.0, 1.5, np.nan, -np.nan, np.inf, -np.inf, 5e-324, -5e-324, -1e308]


@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.float16])
def test_signbit_is_numpys(dtype):
    with np.errstate(over="ignore"):  # -1e308 is -inf in the narrower floats
        x = np.array(VALUES, np.float64).astype(dtype)
    got = jax.jit(sign_bit.signbit)(jnp.asarray(x))
    np.testing.assert_array_equal(np.asarray(got), np.signbit(x))


def test_copysign_is_jnps():
    magnitudes = jnp.asarray([1.0, -2.0, 0.0, 3.0, -0.0, np.inf, 7.0, 1.0, 2.0, 3.0, 4.0], jnp.float64)
    signs = jnp.asarray(VALUES, jnp.float64)
    np.testing.assert_array_equal(np.asarray(sign_bit.copysign(magnitudes, signs)), np.copysign(magnitudes, signs))
    ints = jnp.asarray([3], jnp.int32)
    assert sign_bit.copysign(ints, -1.0).dtype == jnp.copysign(ints, -1.0).dtype


def test_float64_lowers_for_tpu_without_64_bit_shifts():
    x = jax.ShapeDtypeStruct((8,), jnp.float64)
    text = jax.jit(sign_bit.signbit).trace(x).lower(lowering_platforms=("tpu",)).as_text()
    shifts = re.findall(r"stablehlo\.shift_right\w*.*", text)
    assert shifts and all("i64" not in line for line in shifts), shifts
    jnp_text = jax.jit(jnp.signbit).trace(x).lower(lowering_platforms=("tpu",)).as_text()
    assert any("i64" in line for line in re.findall(r"stablehlo\.shift_right\w*.*", jnp_text))  # what it replaces


def test_float64_division_signs_match_cpu():
    a = torch.tensor([7, -7, 7, -7, 0, 5, -5, 6, -0.0, 0.0], dtype=torch.float64)
    b = torch.tensor([2, 2, -2, -2, 3, 5, 3, -4, 3, -3], dtype=torch.float64)
    for fn in (torch.floor_divide, lambda x, y: torch.div(x, y, rounding_mode="floor"), torch.copysign):
        expected = fn(a, b)
        got = fn(a.to("tpu"), b.to("tpu")).cpu()
        torch.testing.assert_close(got, expected)
        assert torch.equal(torch.signbit(got), torch.signbit(expected))
    assert torch.equal(torch.signbit(a.to("tpu")).cpu(), torch.signbit(a))
