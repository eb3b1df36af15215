"""polygamma(n, x): digamma for n == 0, else (-1)^(n+1) n! zeta(n + 1, x).

jax's zeta is only accurate for x > 0, so negative x first steps up with the recurrence
psi_n(x) = psi_n(x + 1) - (-1)^n n! / x^(n+1), as CPU's kernels give the exact values there too.
"""

from __future__ import annotations

import math

import jax.numpy as jnp
import jax.scipy.special as jsp
from jax import lax

from torch_tpu.ops.lowerings.elementwise import _digamma
from torch_tpu.ops.promotion import to_float
from torch_tpu.ops.registry import aten, lower

_MAX_SHIFT = 4096  # steps of the recurrence; farther negative x keep jax's value


def _positive_polygamma(n: int, x):
    coefficient = -((-1.0) ** n) * math.factorial(n)

    def cond(state):
        i, x, _ = state
        return (i < _MAX_SHIFT) & jnp.any(x < 0)

    def body(state):
        i, x, total = state
        negative = x < 0
        total = total + jnp.where(negative, coefficient / x ** (n + 1), 0)
        return i + 1, jnp.where(negative, x + 1, x), total

    _, shifted, total = lax.while_loop(cond, body, (0, x, jnp.zeros_like(x)))
    pole = (x <= 0) & (x == jnp.floor(x))  # zeta(n + 1, q) is inf there, as on CPU
    return jnp.where(pole, (-1.0) ** (n + 1) * jnp.inf, jsp.polygamma(n, shifted) + total)


@lower(aten.polygamma.default)
def polygamma(n, self):
    if n < 0:
        raise RuntimeError("polygamma(n, x) does not support negative n.")
    (x,) = to_float(self)
    return _digamma(x) if n == 0 else _positive_polygamma(n, x)
