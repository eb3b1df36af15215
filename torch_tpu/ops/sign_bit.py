"""signbit and copysign without 64-bit integer shifts.

jnp.signbit reads a float's sign by bitcasting it to an integer of its width and shifting right;
for float64 that is a 64-bit shift, which XLA:TPU (emulating 64-bit integers in 32-bit halves)
failed to compile on a v5e ("shift-right-arithmetic with different element types: s32 and
u32"). Here a float64 is bitcast to its two 32-bit words instead, and the sign is the top bit of
the word that holds it: which word that is comes from the bits of -0.0 in the same program, so
the platform's word order does not matter. Every other dtype takes jnp.signbit.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax


def signbit(x: jax.Array) -> jax.Array:
    """jnp.signbit(x): the sign bit of each element (of -0.0 and of signed NaNs too)."""
    x = jnp.asarray(x)
    if not (jnp.issubdtype(x.dtype, jnp.floating) and jnp.dtype(x.dtype).itemsize == 8):
        return jnp.signbit(x)
    words = lax.bitcast_convert_type(x, jnp.uint32)  # [..., 2]
    probe = lax.bitcast_convert_type(jnp.asarray(-0.0, x.dtype), jnp.uint32)  # one word is 0x80000000
    high = jnp.where(probe[1] != 0, words[..., 1], words[..., 0])
    return (high >> jnp.uint32(31)).astype(jnp.bool_)


def copysign(x1, x2) -> jax.Array:
    """jnp.copysign(x1, x2): |x1| with x2's sign bit."""
    dtype = jnp.result_type(x1, x2)
    if not jnp.issubdtype(dtype, jnp.inexact):
        dtype = jnp.result_type(dtype, float)  # integers take the default float, as in jnp.copysign
    x1, x2 = jnp.asarray(x1, dtype), jnp.asarray(x2, dtype)
    magnitude = jnp.abs(x1)
    return jnp.where(signbit(x2), -magnitude, magnitude)
