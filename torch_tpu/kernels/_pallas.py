"""Shared Pallas helpers: interpret mode on the CPU client, padding to block multiples."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from torch_tpu.runtime import client

# A finite "minus infinity": masked scores stay NaN-free even when a whole row is masked.
NEG_INF = -1e30


def interpret() -> bool:
    """Pallas kernels compile with Mosaic on TPU and Triton on GPU; the CPU client interprets them."""
    return client.platform() == "cpu"


def next_power_of_2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def block_for(length: int, largest: int = 128, smallest: int = 16) -> int:
    """A power-of-two block for an axis of `length`: at most `largest`, at least `smallest`
    (Triton needs powers of two, Mosaic multiples of 8 or the whole padded axis)."""
    return min(largest, max(smallest, next_power_of_2(length)))


def pad_to(x: jax.Array, axis: int, size: int, value=0) -> jax.Array:
    """`x` zero-padded (or `value`-padded) at the end of `axis` to `size`."""
    extra = size - x.shape[axis]
    if extra == 0:
        return x
    widths = [(0, 0)] * x.ndim
    widths[axis] = (0, extra)
    return jnp.pad(x, widths, constant_values=value)


def scalar_spec() -> pl.BlockSpec:
    """The whole of a small int32 table (group offsets, page indices) read with scalar loads:
    SMEM under Mosaic, the plain whole-array block elsewhere."""
    if client.platform() == "tpu":
        from jax.experimental.pallas import tpu as pltpu

        return pl.BlockSpec(memory_space=pltpu.SMEM)
    return pl.BlockSpec()
