"""Pieces the lowering families share."""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax

HIGHEST = lax.Precision.HIGHEST


def complex_divide(a, b):
    """a / b for complex values as c10::complex and NumPy divide (Smith's algorithm). XLA's complex
    division gives 0 for a divisor with two infinite parts (1 / (-inf + inf j)); CPU gives nan."""
    dtype = jnp.result_type(a, b)
    a, b = jnp.asarray(a, dtype), jnp.asarray(b, dtype)
    ar, ai, c, d = jnp.real(a), jnp.imag(a), jnp.real(b), jnp.imag(b)
    wide = jnp.abs(c) >= jnp.abs(d)
    rat = jnp.where(wide, d / c, c / d)
    scl = 1 / jnp.where(wide, c + d * rat, d + c * rat)
    re = jnp.where(wide, (ar + ai * rat) * scl, (ar * rat + ai) * scl)
    im = jnp.where(wide, (ai - ar * rat) * scl, (ai * rat - ar) * scl)
    zero = (c == 0) & (d == 0)  # CPU: each part over the zero divisor (inf or nan)
    re = jnp.where(zero, ar / jnp.abs(c), re)
    im = jnp.where(zero, ai / jnp.abs(d), im)
    return lax.complex(re, im)


def sigmoid(x):
    """Complex sigmoid as CPU computes it, 1 / (1 + exp(-x)): nan where exp(-x) overflows in both parts."""
    if jnp.issubdtype(x.dtype, jnp.complexfloating):
        return complex_divide(1, 1 + jnp.exp(-x))
    return lax.logistic(x)


def ntuple(value, n: int) -> tuple[int, ...]:
    if isinstance(value, (list, tuple)):
        value = tuple(int(v) for v in value)
        return value * n if len(value) == 1 else value
    return (int(value),) * n


def divide(a, b):
    """a / b rounded as CPU divides. XLA rewrites a division by a broadcast (a scalar divisor) into
    a product by its reciprocal, off by an ulp for ~1 in 5 elements; the barrier keeps the division.
    Complex quotients divide as CPU does (complex_divide)."""
    if jnp.issubdtype(jnp.result_type(a, b), jnp.complexfloating):
        return complex_divide(a, b)
    shape = jnp.broadcast_shapes(jnp.shape(a), jnp.shape(b))
    if jnp.shape(b) != shape and jnp.issubdtype(jnp.result_type(a, b), jnp.inexact):
        b = lax.optimization_barrier(jnp.broadcast_to(jnp.asarray(b, jnp.result_type(a, b)), shape))
    return a / b
