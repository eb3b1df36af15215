"""Orthogonal polynomials of torch.special: Chebyshev (T, U, V, W and their shifted forms), Hermite (H, He),
Laguerre and Legendre, evaluated as CPU's kernels in ATen/native/Math.h do.

Each takes (x, n) promoted to a float dtype (float32 or float64: CPU has no half kernels), with n then
truncated to int64. The special cases of CPU's kernel are selected elementwise, in its order; the rest run
its three-term recurrence in a while loop up to the largest n, stepping only the elements still inside
their own loop (CPU stops an element's loop once it is NaN, which a recurrence never leaves).
"""

from __future__ import annotations

from collections.abc import Callable

import jax.numpy as jnp
import numpy as np
from jax import lax

from torch_tpu.ops.dtypes import type_name
from torch_tpu.ops.promotion import cast, float_dtype, result_dtype
from torch_tpu.ops.registry import aten, lower

_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))


def _polynomial(packet) -> Callable:
    """Registers the lowering of `packet`'s Tensor overload and of its Python-number ones (CPU's
    composites pass the number as a wrapped tensor), which trace the number: one compile for all values."""

    def register(fn: Callable) -> Callable:
        lower(packet.n_scalar, traced=("n",))(fn)
        lower(packet.x_scalar, traced=("x",))(fn)
        return lower(packet.default)(fn)

    return register


def _args(name: str, x, n):
    """(x, n) in the op's float dtype, broadcast, with n as C's static_cast<int64_t>(n)."""
    dtype = float_dtype(result_dtype(x, n))
    if dtype not in _FLOATS:
        raise NotImplementedError(f"\"{name}_cpu\" not implemented for '{type_name(dtype)}'")
    x, n = jnp.broadcast_arrays(cast(x, dtype), cast(n, dtype))
    # NaN, inf and out-of-range n convert to INT64_MIN on x86: a negative n.
    invalid = jnp.isnan(n) | (jnp.abs(n) >= 2.0**63)
    return x, jnp.where(invalid, -1, lax.convert_element_type(n, np.int64))


def _t(i, x):
    """An int64 value converted to x's dtype, as C's int-to-float conversion in the kernels."""
    return lax.convert_element_type(i, x.dtype)


def _parity(n, even, odd):
    return jnp.where(n % 2 == 0, even, odd)


def _evaluate(x, n, cases: list, p, q, step: Callable):
    """CPU's kernel: the first case (condition, value) that holds, else its recurrence
    `for j in 1 .. n - 1: p, q = q, step(j, p, q)` started from (p, q), which returns q."""
    conditions = [c for c, _ in cases]
    recur = ~jnp.any(jnp.stack(conditions), axis=0)
    p = jnp.broadcast_to(p, x.shape).astype(x.dtype)
    q = jnp.broadcast_to(q, x.shape).astype(x.dtype)

    def active(j, q):
        return recur & (j < n) & ~jnp.isnan(q)

    def cond(state):
        j, _, q = state
        return jnp.any(active(j, q))

    def body(state):
        j, p, q = state
        stepping = active(j, q)
        return j + 1, jnp.where(stepping, q, p), jnp.where(stepping, step(j, p, q), q)

    # j per element: XLA turns a division by a broadcast scalar into a multiplication by its
    # reciprocal, which rounds differently from CPU's division by (k + 1).
    _, _, q = lax.while_loop(cond, body, (jnp.ones(x.shape, np.int64), p, q))
    values = [jnp.broadcast_to(jnp.asarray(v, x.dtype), x.shape) for _, v in cases]
    return jnp.select(conditions, values, q)


def _chebyshev(x, n, cases: list, first, coefficient):
    """The Chebyshev recurrence r = coefficient * q - p from (1, first), after CPU's special cases."""
    cases = [(n < 0, 0.0), *cases, (n == 0, 1.0), (n == 1, first)]
    return _evaluate(x, n, cases, 1.0, first, lambda j, p, q: coefficient * q - p)


# ---- Chebyshev polynomials ----------------------------------------------------


@_polynomial(aten.special_chebyshev_polynomial_t)
def chebyshev_polynomial_t(x, n):
    x, n = _args("chebyshev_polynomial_t", x, n)
    ends = jnp.abs(x) == 1
    cases = [
        (ends, jnp.where((x > 0) | (n % 2 == 0), 1.0, -1.0)),
        ((n > 6) & (jnp.abs(x) < 1), jnp.cos(_t(n, x) * jnp.arccos(x))),
    ]
    return _chebyshev(x, n, cases, x, x + x)


@_polynomial(aten.special_chebyshev_polynomial_u)
def chebyshev_polynomial_u(x, n):
    x, n = _args("chebyshev_polynomial_u", x, n)
    theta = jnp.arccos(x)
    m = _t(n + 1, x)
    closed = jnp.where(jnp.sin(theta) != 0, jnp.sin(m * theta) / jnp.sin(theta), m * jnp.cos(m * theta) / x)
    cases = [
        (jnp.abs(x) == 1, jnp.where((x > 0) | (n % 2 == 0), m, _t(-(n + 1), x))),
        ((n > 8) & (jnp.abs(x) < 1), closed),
    ]
    return _chebyshev(x, n, cases, x + x, x + x)


@_polynomial(aten.special_chebyshev_polynomial_v)
def chebyshev_polynomial_v(x, n):
    x, n = _args("chebyshev_polynomial_v", x, n)
    theta = jnp.arccos(x)
    odd = _parity(n, _t(n + n + 1, x), _t(-(n + n + 1), x))
    closed = jnp.where(jnp.sin(theta / 2) != 1, jnp.cos((_t(n, x) + 0.5) * theta) / jnp.cos(theta / 2), odd)
    cases = [
        (jnp.abs(x) == 1, jnp.where(x > 0, 1.0, odd)),
        ((n > 8) & (jnp.abs(x) < 1), closed),
    ]
    return _chebyshev(x, n, cases, x + x - 1, x + x)


@_polynomial(aten.special_chebyshev_polynomial_w)
def chebyshev_polynomial_w(x, n):
    x, n = _args("chebyshev_polynomial_w", x, n)
    theta = jnp.arccos(x)
    ends = jnp.where(x > 0, _t(n + n + 1, x), _parity(n, 1.0, -1.0))
    closed = jnp.where(jnp.cos(theta / 2) != 1, jnp.sin((_t(n, x) + 0.5) * theta) / jnp.sin(theta / 2), ends)
    cases = [
        (jnp.abs(x) == 1, ends),
        ((n > 8) & (jnp.abs(x) < 1), closed),
    ]
    return _chebyshev(x, n, cases, x + x + 1, x + x)


# ---- shifted Chebyshev polynomials: the above at y = 2x - 1 ------------------------------------


@_polynomial(aten.special_shifted_chebyshev_polynomial_t)
def shifted_chebyshev_polynomial_t(x, n):
    x, n = _args("shifted_chebyshev_polynomial_t", x, n)
    y = x + x - 1
    cases = [
        (x == 1, 1.0),
        (x == 0, _parity(n, 1.0, -1.0)),
        ((n > 6) & (jnp.abs(y) < 1), jnp.cos(_t(n, x) * jnp.arccos(y))),
    ]
    return _chebyshev(x, n, cases, y, y + y)


@_polynomial(aten.special_shifted_chebyshev_polynomial_u)
def shifted_chebyshev_polynomial_u(x, n):
    x, n = _args("shifted_chebyshev_polynomial_u", x, n)
    y = x + x - 1
    theta = jnp.arccos(y)
    m = _t(n + 1, x)
    closed = jnp.where(jnp.sin(theta) != 0, jnp.sin(m * theta) / jnp.sin(theta), m * jnp.cos(m * theta) / y)
    cases = [
        (x == 1, m),
        (x == 0, _parity(n, m, _t(-(n + 1), x))),
        ((n > 6) & (jnp.abs(y) < 1), closed),
    ]
    return _chebyshev(x, n, cases, y + y, y + y)


@_polynomial(aten.special_shifted_chebyshev_polynomial_v)
def shifted_chebyshev_polynomial_v(x, n):
    x, n = _args("shifted_chebyshev_polynomial_v", x, n)
    y = x + x - 1
    theta = jnp.arccos(y)
    odd = _parity(n, _t(n + n + 1, x), _t(-(n + n + 1), x))
    closed = jnp.where(jnp.sin(theta / 2) != 1, jnp.cos((_t(n, x) + 0.5) * theta) / jnp.cos(theta / 2), odd)
    cases = [
        (x == 1, 1.0),
        (x == 0, odd),
        ((n > 6) & (jnp.abs(y) < 1), closed),
    ]
    return _chebyshev(x, n, cases, y + y - 1, y + y)


@_polynomial(aten.special_shifted_chebyshev_polynomial_w)
def shifted_chebyshev_polynomial_w(x, n):
    x, n = _args("shifted_chebyshev_polynomial_w", x, n)
    y = x + x - 1
    theta = jnp.arccos(y)
    sign = _parity(n, 1.0, -1.0)
    closed = jnp.where(jnp.cos(theta / 2) != 1, jnp.sin((_t(n, x) + 0.5) * theta) / jnp.sin(theta / 2), sign)
    cases = [
        (x == 1, _t(n + n + 1, x)),
        (x == 0, sign),
        ((n > 4) & (jnp.abs(y) < 1), closed),
    ]
    return _chebyshev(x, n, cases, y + y + 1, y + y)


# ---- Hermite, Laguerre and Legendre polynomials -------------------------------------------------


def _hermite_limit(x) -> int:
    """CPU returns NaN above this degree."""
    return 128 if x.dtype == np.float32 else 512


@_polynomial(aten.special_hermite_polynomial_h)
def hermite_polynomial_h(x, n):
    x, n = _args("hermite_polynomial_h", x, n)
    cases = [(n < 0, 0.0), (n == 0, 1.0), (n == 1, x + x), (n > _hermite_limit(x), np.nan)]
    return _evaluate(x, n, cases, 1.0, x + x, lambda j, p, q: (x + x) * q - _t(j + j, x) * p)


@_polynomial(aten.special_hermite_polynomial_he)
def hermite_polynomial_he(x, n):
    x, n = _args("hermite_polynomial_he", x, n)
    cases = [(n < 0, 0.0), (n == 0, 1.0), (n == 1, x), (n > _hermite_limit(x), np.nan)]
    return _evaluate(x, n, cases, 1.0, x, lambda j, p, q: x * q - _t(j, x) * p)


@_polynomial(aten.special_laguerre_polynomial_l)
def laguerre_polynomial_l(x, n):
    x, n = _args("laguerre_polynomial_l", x, n)
    cases = [(n < 0, 0.0), (jnp.abs(x) == 0, 1.0), (n == 0, 1.0), (n == 1, 1 - x)]

    def step(j, p, q):
        return ((_t(j + j, x) + (1 - x)) * q - _t(j, x) * p) / _t(j + 1, x)

    return _evaluate(x, n, cases, 1.0, 1 - x, step)


@_polynomial(aten.special_legendre_polynomial_p)
def legendre_polynomial_p(x, n):
    x, n = _args("legendre_polynomial_p", x, n)
    cases = [
        (n < 0, 0.0),
        (jnp.abs(x) == 1, jnp.where((x > 0) | (n % 2 == 0), 1.0, -1.0)),
        (n == 0, 1.0),
        (n == 1, x),
    ]

    def step(j, p, q):
        return (_t(j + j + 1, x) * x * q - _t(j, x) * p) / _t(j + 1, x)

    return _evaluate(x, n, cases, 1.0, x, step)
