"""Random keys of tpu ops: a generator's (seed, offset) as threefry key data, and the key from it."""

from __future__ import annotations

import jax
import numpy as np

from torch_tpu import _C


def key_data(generator, device: int, count: int) -> np.ndarray:
    """Reserves `count` offsets of `generator` (the default one if None) on `device`: one row of
    uint32 key data (seed low, seed high, offset low, offset high) per random op."""
    seed, offset = _C._reserve_random(generator, device, count)
    offsets = offset + np.arange(count, dtype=np.uint64)
    return np.stack(
        [
            np.full(count, seed & 0xFFFFFFFF, np.uint64),
            np.full(count, seed >> 32, np.uint64),
            offsets & 0xFFFFFFFF,
            offsets >> 32,
        ],
        axis=1,
    ).astype(np.uint32)


def key_from_data(data):
    """The jax key of one row of `key_data`."""
    key = jax.random.wrap_key_data(data[:2], impl="threefry2x32")
    key = jax.random.fold_in(key, data[2])
    return jax.random.fold_in(key, data[3])


key_from_data_jit = jax.jit(key_from_data)
