"""Pieces the lowering families share."""

from __future__ import annotations

from jax import lax

HIGHEST = lax.Precision.HIGHEST


def ntuple(value, n: int) -> tuple[int, ...]:
    if isinstance(value, (list, tuple)):
        value = tuple(int(v) for v in value)
        return value * n if len(value) == 1 else value
    return (int(value),) * n
