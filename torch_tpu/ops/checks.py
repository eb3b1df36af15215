"""Data-dependent checks: the errors CPU raises (an index out of range) that jax cannot.

Each check has two forms, declared together as a `registry.Check` on the op's `lower(...)` line:
the host form runs before the eager kernel (one host sync), and the graph form computes
`Failure`s (a traced error predicate each) inside a compiled graph, which compile/graph.py
returns as extra outputs of the executable and reads once after it runs."""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import jax.numpy as jnp
import numpy as np
import torch

from torch_tpu import metrics
from torch_tpu.ops.registry import Check
from torch_tpu.ops.tensors import to_jax
from torch_tpu.runtime import executable_cache
from torch_tpu.runtime.global_arrays import host_value


@executable_cache.jit
def _minmax(arrays):
    return jnp.stack([jnp.stack([jnp.min(a).astype(jnp.int64), jnp.max(a).astype(jnp.int64)]) for a in arrays])


def to_host(array) -> np.ndarray:
    metrics.bump("host_transfers")
    return host_value(array)


def index_bounds(index: torch.Tensor) -> tuple[int, int]:
    """(min, max) of a non-empty integer tpu tensor: one host sync."""
    metrics.bump("executions")
    lo, hi = to_host(_minmax((to_jax(index),)))[0]
    return int(lo), int(hi)


def check_ranges(checks: list[tuple[torch.Tensor, int, int, Callable[[int], Exception]]]) -> None:
    """Raises `error(value)` for the first index outside [low, high); one sync."""
    checks = [c for c in checks if c[0].numel() > 0 and not c[0].is_floating_point() and c[0].dtype != torch.bool]
    if not checks:
        return
    device = [c for c in checks if c[0].device.type != "cpu"]
    bounds = {}
    if device:
        metrics.bump("executions")
        values = to_host(_minmax(tuple(to_jax(c[0]) for c in device)))
        bounds = {id(c): values[i] for i, c in enumerate(device)}
    for c in checks:
        index, low, high, error = c
        if index.device.type == "cpu":
            lo, hi = int(index.min()), int(index.max())
        else:
            lo, hi = (int(v) for v in bounds[id(c)])
        if lo < low or hi >= high:
            flat = to_host(to_jax(index)).reshape(-1) if index.device.type != "cpu" else index.reshape(-1).numpy()
            bad = (flat < low) | (flat >= high)
            raise error(int(flat[int(np.argmax(bad))]))


class Failure(NamedTuple):
    """A graph check's verdict: `error(message.format(value=value))` is raised when `bad` holds."""

    bad: object  # a traced bool scalar
    value: object  # a traced integer scalar (the offending index)
    error: type[Exception]
    message: str


def first_outside(index, low: int, high: int, error: type[Exception], message: str) -> list[Failure]:
    """The graph form of check_ranges: a failure when some element of `index` is outside [low, high)."""
    index = jnp.asarray(index)
    if index.size == 0 or not jnp.issubdtype(index.dtype, jnp.integer):
        return []
    flat = index.reshape(-1)
    outside = (flat < low) | (flat >= high)
    return [Failure(jnp.any(outside), flat[jnp.argmax(outside)].astype(jnp.int64), error, message)]


def dim_size(self, dim: int) -> tuple[int, int] | None:
    """(normalized dim, size) as torch sees it (a 0-dim tensor has size 1), or
    None for a bad dim, which the kernel's meta pass then reports."""
    ndim = max(self.ndim, 1)
    if not -ndim <= dim < ndim:
        return None
    dim %= ndim
    return dim, (self.shape[dim] if self.ndim else 1)


def range_check(
    low_negative: bool,
    error: type[Exception] = RuntimeError,
    message: str = "index {value} is out of bounds for dimension {dim} with size {size}",
) -> Check:
    """A check of `index` (third argument) against self.size(dim); `message` names {value}, {dim}, {size}."""

    def host(self, dim, index, *args, **kwargs):
        found = dim_size(self, dim)
        if found is None or not isinstance(index, torch.Tensor):
            return
        d, size = found
        low = -size if low_negative else 0
        check_ranges([(index, low, size, lambda v: error(message.format(value=v, dim=d, size=size)))])

    def graph(self, dim, index, *args, **kwargs):
        found = dim_size(jnp.asarray(self), dim)
        if found is None or index is None:
            return []
        d, size = found
        text = message.replace("{dim}", str(d)).replace("{size}", str(size))
        return first_outside(index, -size if low_negative else 0, size, error, text)

    return Check(host, graph)
