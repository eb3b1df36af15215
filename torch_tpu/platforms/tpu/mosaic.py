"""Mosaic's rules for a Pallas kernel's blocks: facts of the TPU's vector registers.

- the last two dims of every block divide by (8, 128) or equal the array's: `LANES` lanes per
  vector register row, `sublanes(dtype)` rows per packed register;
- the vector units compute in float32 and bfloat16 (`compute_dtype`);
- each grid dimension is declared parallel (its steps may run on either core) or arbitrary (its
  steps run in order: a reduction carried in scratch memory), `compiler_params`.

kernels/_pallas.py calls the kernels with these rules; where Pallas interprets a kernel (every
platform but TPU) they still hold, so a kernel tested there lowers for Mosaic unchanged.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax.numpy as jnp
from jax.experimental.pallas import tpu as pltpu

# Lanes of a TPU vector register: a block's last dim divides by this (or is the whole axis).
LANES = 128
PARALLEL, ARBITRARY = "parallel", "arbitrary"


def compiler_params(semantics: Sequence[str]) -> pltpu.CompilerParams:
    """Mosaic's parameters of a kernel whose grid dimensions have these semantics."""
    return pltpu.CompilerParams(dimension_semantics=tuple(semantics))


def round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def sublanes(dtype) -> int:
    """Rows of one packed vector register of `dtype`: a block's second-to-last dim divides by this."""
    return 8 * max(1, 4 // jnp.dtype(dtype).itemsize)


def row_block(length: int, dtype, largest: int) -> int:
    """A block along a row (second-to-last) axis: the padded axis if it is short, else `largest`."""
    return min(largest, round_up(max(length, 1), sublanes(dtype)))


def lane_block(length: int, largest: int) -> int:
    """A block along an axis that becomes lanes in the kernel (keys): a multiple of LANES."""
    return min(largest, round_up(max(length, 1), LANES))


def lane_dim(dim: int) -> int:
    """A feature dim as a kernel takes it: whole up to LANES, else padded to a multiple of LANES."""
    return dim if dim <= LANES else round_up(dim, LANES)


def compute_dtype(dtype):
    """The dtype a kernel computes in: float16 as float32 (Mosaic's vector units take float32 and
    bfloat16), others as given."""
    return jnp.float32 if jnp.dtype(dtype) == jnp.float16 else dtype
