"""Host-side checks: the data-dependent errors CPU raises (an index out of range) that jax cannot,
each one host sync; and lower_checked, which puts a check in front of a jit lowering."""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
import torch

from torch_tpu import metrics
from torch_tpu.ops import dispatcher
from torch_tpu.ops.registry import Lowering, inplace_variant, lower, out_variant
from torch_tpu.ops.tensors import to_jax
from torch_tpu.runtime.global_arrays import host_value


@jax.jit
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


def dim_size(self: torch.Tensor, dim: int) -> tuple[int, int] | None:
    """(normalized dim, size) as torch sees it (a 0-dim tensor has size 1), or
    None for a bad dim, which the kernel's meta pass then reports."""
    ndim = max(self.dim(), 1)
    if not -ndim <= dim < ndim:
        return None
    dim %= ndim
    return dim, (self.shape[dim] if self.dim() else 1)


def range_check(low_negative: bool, make_error: Callable[[int, int, int], Exception]):
    """A check of `index` (third argument) against self.size(dim)."""

    def check(self, dim, index, *args, **kwargs):
        found = dim_size(self, dim)
        if found is None or not isinstance(index, torch.Tensor):
            return
        d, size = found
        low = -size if low_negative else 0
        check_ranges([(index, low, size, lambda v: make_error(v, d, size))])

    return check


def out_of_bounds(v, d, size):
    return RuntimeError(f"index {v} is out of bounds for dimension {d} with size {size}")


def lower_checked(op, check: Callable, *, variants: bool = True) -> Callable:
    """Registers jax function `fn` as `op`'s kernel behind the eager host `check`,
    and likewise for its in-place and out= variants. `check` raises, or returns
    None or replacement (args, kwargs) for the kernel."""

    def register(fn: Callable) -> Callable:
        ops = [(op, False)]
        if variants:
            ops += [(v, True) for v in (inplace_variant(op), out_variant(op)) if v is not None]
        for variant, derived in ops:
            kernel = dispatcher.make_kernel(variant, Lowering(fn), derived)
            lower(variant, eager=True)(_guarded(kernel, check, fn))
        return fn

    return register


def _guarded(kernel: Callable, check: Callable, fn: Callable) -> Callable:
    def run(*args, **kwargs):
        replaced = check(*args, **kwargs)
        if replaced is not None:
            args, kwargs = replaced
        return kernel(*args, **kwargs)

    run.__name__ = kernel.__name__
    run.jit_lowering = fn  # the unchecked jax function, for graph compilers
    return run
