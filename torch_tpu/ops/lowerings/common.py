"""Pieces the lowering families share."""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax

HIGHEST = lax.Precision.HIGHEST


def ntuple(value, n: int) -> tuple[int, ...]:
    if isinstance(value, (list, tuple)):
        value = tuple(int(v) for v in value)
        return value * n if len(value) == 1 else value
    return (int(value),) * n


def divide(a, b):
    """a / b rounded as CPU divides. XLA rewrites a division by a broadcast (a scalar divisor) into
    a product by its reciprocal, off by an ulp for ~1 in 5 elements; the barrier keeps the division."""
    shape = jnp.broadcast_shapes(jnp.shape(a), jnp.shape(b))
    if jnp.shape(b) != shape and jnp.issubdtype(jnp.result_type(a, b), jnp.inexact):
        b = lax.optimization_barrier(jnp.broadcast_to(jnp.asarray(b, jnp.result_type(a, b)), shape))
    return a / b
