"""histc: floats bin as CPU's histogram kernel does, integers as CUDA's (CPU has no integer histc;
models such as HF Mixtral count expert ids with an int32 histc on accelerators)."""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np

from torch_tpu.ops.registry import aten, lower


def _range(x, low, high):
    """The outer edges: [min, max], the data's extrema when they are equal, widened by 1 if still equal."""
    dtype = jnp.float64 if x.dtype == np.float64 else jnp.float32
    low, high = jnp.asarray(low, dtype), jnp.asarray(high, dtype)
    if x.size:
        data = low == high
        low = jnp.where(data, jnp.min(x).astype(low.dtype), low)
        high = jnp.where(data, jnp.max(x).astype(low.dtype), high)
    same = low == high
    return jnp.where(same, low - 1, low), jnp.where(same, high + 1, high)


def _check(self, bins=100, min=0, max=0):
    if self.is_floating_point() and min == max and self.numel():
        low, high = (float(v) for v in self.aminmax())
        if not (math.isfinite(low) and math.isfinite(high)):
            raise RuntimeError(f"torch.histc: range of [{low}, {high}] is not finite")


def _bin_float(x, low, high, bins):
    """CPU's linear-interpolation bin: (x - lo) * bins / (hi - lo) in the input's float type."""
    compute = jnp.float32 if x.dtype.itemsize < 4 else x.dtype
    r = (lambda v: v.astype(x.dtype).astype(compute)) if compute != x.dtype else (lambda v: v)
    xc, lo, hi = x.astype(compute), r(low.astype(compute)), r(high.astype(compute))
    pos = r(r(r(xc - lo) * bins) / r(hi - lo))
    return jnp.floor(pos).astype(jnp.int64), (xc >= lo) & (xc <= hi)


def _bin_int(x, low, high, bins):
    """CUDA's integer bin: (x - lo) * bins / (hi - lo) in int64 arithmetic."""
    lo, hi = low.astype(jnp.int64), high.astype(jnp.int64)
    xi = x.astype(jnp.int64)
    return (xi - lo) * bins // (hi - lo), (xi >= lo) & (xi <= hi)


@lower(aten.histc.default, check=_check)
def histc(self, bins=100, min=0, max=0):
    if bins <= 0:
        raise RuntimeError(f"torch.histogram(): bins must be > 0, but got {bins} for dimension 0")
    if not (math.isfinite(min) and math.isfinite(max)):
        raise RuntimeError(f"torch.histc: range of [{min}, {max}] is not finite")
    if min > max:
        raise RuntimeError("torch.histc: max must be larger than min")
    x = self.reshape(-1)
    low, high = _range(x, min, max)
    floating = jnp.issubdtype(x.dtype, jnp.floating)
    pos, inside = (_bin_float if floating else _bin_int)(x, low, high, bins)
    pos = jnp.where(pos == bins, bins - 1, pos)
    counts = jnp.zeros((bins,), jnp.float32 if floating else jnp.int64)
    counts = counts.at[jnp.where(inside, pos, bins)].add(1, mode="drop")
    return counts.astype(self.dtype)
