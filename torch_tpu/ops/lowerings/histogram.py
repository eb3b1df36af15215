"""histc, histogram, histogramdd: floats bin as CPU's histogram kernel does, integers as CUDA's (CPU has
no integer histc; models such as HF Mixtral count expert ids with an int32 histc on accelerators)."""

from __future__ import annotations

import builtins
import functools
import math

import jax.numpy as jnp
import numpy as np
import torch

from torch_tpu import metrics
from torch_tpu.ops.dtypes import rounded_to, type_name
from torch_tpu.ops.lowerings.factories import _linspace_values
from torch_tpu.ops.registry import aten, lower
from torch_tpu.ops.tensors import from_jax, to_jax
from torch_tpu.runtime import executable_cache


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
    r = (lambda v: rounded_to(v, x.dtype)) if compute != x.dtype else (lambda v: v)
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


# ---- histogram / histogramdd --------------------------------------------------
# No meta kernels: eager lowerings, each a host check then one jitted jax function.


def _fmt(v: float) -> str:
    return f"{v:g}"  # C++ ostream's default for a double


def _check_input(self, data_range: bool):
    """The dtype dispatch: CPU infers a range from the data for float and double only."""
    if data_range and self.numel() and self.dtype not in (torch.float32, torch.float64):
        raise NotImplementedError(f"\"histogramdd\" not implemented for '{type_name(self.dtype)}'")
    if not self.is_floating_point():
        raise NotImplementedError(f"\"histogram_cpu\" not implemented for '{type_name(self.dtype)}'")


def _check_weight(x2, weight):
    if weight is None:
        return
    if weight.dtype != x2.dtype:
        raise RuntimeError(
            "torch.histogramdd: if weight tensor is provided, input tensor and weight tensor should have the same "
            f"dtype, but got input({x2.dtype}), and weight({weight.dtype})"
        )
    if weight.numel() != x2.shape[0]:
        raise RuntimeError(
            "torch.histogramdd: if weight tensor is provided it should have the same shape as the input tensor "
            f"excluding its innermost dimension, but got input with shape {tuple(x2.shape)} and weight with shape "
            f"{tuple(weight.shape)}"
        )


def _check_outer(x2, range):
    """select_outer_bin_edges' checks: the range's length, a finite range, min <= max (a host sync for data)."""
    n = x2.shape[-1]
    if range is not None:
        if len(range) != 2 * n:
            raise RuntimeError(
                f"torch.histogramdd: for a {n}-dimensional histogram range should have {2 * n} elements, "
                f"but got {len(range)}"
            )
        lows, highs = list(range[0::2]), list(range[1::2])
    elif x2.numel():
        lo, hi = torch.aminmax(x2, dim=0)
        lows, highs = lo.cpu().tolist(), hi.cpu().tolist()
    else:
        return
    for d, (lo, hi) in enumerate(zip(lows, highs)):
        if not (math.isfinite(lo) and math.isfinite(hi)):
            raise RuntimeError(f"torch.histogramdd: dimension {d}'s range [{_fmt(lo)}, {_fmt(hi)}] is not finite")
        if lo > hi:
            raise RuntimeError(
                f"torch.histogramdd: min should not exceed max, but got min {_fmt(lo)} max {_fmt(hi)} for dimension {d}"
            )


def _check_bins(x2, bins):
    n = x2.shape[-1]
    if len(bins) != n:
        raise RuntimeError(
            f"torch.histogramdd: expected {n} sequences of bin edges for a {n}-dimensional histogram "
            f"but got {len(bins)}"
        )
    for d, b in enumerate(bins):
        if b.dtype != x2.dtype:
            raise RuntimeError(
                "torch.histogramdd: input tensor and bins tensors should have the same dtype, but got input with "
                f"dtype {x2.dtype} and bins for dimension {d} with dtype {b.dtype}"
            )
        if b.dim() != 1:
            raise RuntimeError(
                "torch.histogramdd: bins tensor should have one dimension, but got "
                f"{b.dim()} dimensions in the bins tensor for dimension {d}"
            )
        if b.numel() == 0:
            raise RuntimeError(
                "torch.histogramdd: bins tensor should have at least 1 element, but got 0 elements "
                f"in the bins tensor for dimension {d}"
            )


def _check_counts(bin_ct):
    for d, b in enumerate(bin_ct):
        if b <= 0:
            raise RuntimeError(f"torch.histogram(): bins must be > 0, but got {b} for dimension {d}")


def _as_2d(self):
    if self.dim() < 2:
        raise RuntimeError(f"torch.histogramdd: input tensor should have at least 2 dimensions, but got {self.dim()}")
    return self.reshape(-1, self.shape[-1])


def _linear_edges(x2, bin_ct, range):
    """CPU's bin edges: linspace over the range, or over each column's [min, max] (widened by 0.5 if equal)."""
    n = x2.shape[-1]
    if range is not None:
        low, high = jnp.asarray(range[0::2], jnp.float64), jnp.asarray(range[1::2], jnp.float64)
    elif x2.shape[0]:
        low, high = jnp.min(x2, axis=0).astype(jnp.float64), jnp.max(x2, axis=0).astype(jnp.float64)
    else:
        low, high = jnp.zeros((n,), jnp.float64), jnp.ones((n,), jnp.float64)
    same = low == high
    low, high = jnp.where(same, low - 0.5, low), jnp.where(same, high + 0.5, high)
    return [_linspace_values(low[d], high[d], bin_ct[d] + 1, x2.dtype) for d in builtins.range(n)]


def _upper_bound(edges, x, first, count):
    """std::upper_bound over edges[first:first + count], per element: its exact halving steps."""
    for _ in builtins.range(int(edges.shape[0]).bit_length()):
        step = count // 2
        it = first + step
        right = ~(x < jnp.take(edges, it, mode="clip"))
        live = count > 0
        first = jnp.where(live & right, it + 1, first)
        count = jnp.where(live, jnp.where(right, count - step - 1, step), 0)
    return first


def _positions(x, edges, linear: bool):
    """Each element's bin along one dim and whether it lies in [first edge, last edge] (NaN does not)."""
    nb = edges.shape[0] - 1
    lo, hi = edges[0], edges[-1]
    inside = (x >= lo) & (x <= hi)
    if linear:  # linear interpolation, then a local search among the neighbouring edges
        pos = jnp.clip(_bin_float(x, lo, hi, nb)[0], 0, nb)
        first = jnp.maximum(pos - 1, 0)
        pos = _upper_bound(edges, x, first, jnp.minimum(pos + 2, nb + 1) - first) - 1
    else:
        pos = _upper_bound(edges, x, jnp.zeros(x.shape, jnp.int64), jnp.full(x.shape, nb + 1, jnp.int64)) - 1
    return jnp.where(pos == nb, nb - 1, pos), inside


def _histogramdd(x2, weight, edges, density, linear):
    shape = tuple(e.shape[0] - 1 for e in edges)
    flat, inside = jnp.zeros(x2.shape[:1], jnp.int64), jnp.ones(x2.shape[:1], bool)
    for d, e in enumerate(edges):
        pos, ok = _positions(x2[:, d], e, linear)
        flat, inside = flat * shape[d] + pos, inside & ok
    w = jnp.ones(x2.shape[:1], x2.dtype) if weight is None else weight.reshape(-1)
    size = math.prod(shape)
    hist = jnp.zeros((size,), x2.dtype).at[jnp.where(inside, flat, size)].add(w, mode="drop").reshape(shape)
    if density:
        hist = hist / hist.sum()
        for d, e in enumerate(edges):
            hist = hist / jnp.diff(e).reshape([-1 if i == d else 1 for i in builtins.range(len(edges))])
    return hist


@functools.partial(executable_cache.jit, static_argnames=("bin_ct", "range", "density", "want"))
def _from_counts(x2, weight, bin_ct, range, density, want):
    edges = _linear_edges(x2, bin_ct, range)
    return _histogramdd(x2, weight, edges, density, True) if want == "hist" else edges


@functools.partial(executable_cache.jit, static_argnames=("density",))
def _from_edges(x2, weight, edges, density):
    return _histogramdd(x2, weight, edges, density, False)


def _run_counts(self, x2, bin_ct, range, weight, density, want):
    if len(bin_ct) != x2.shape[-1]:
        raise RuntimeError("histogramdd: The size of bins must be equal to the innermost dimension of the input.")
    _check_input(self, range is None)
    _check_counts(bin_ct)
    _check_outer(x2, range)
    _check_weight(x2, weight)
    rng = None if range is None else tuple(float(v) for v in range)
    w = None if weight is None else to_jax(weight)
    metrics.bump("executions")
    return _from_counts(to_jax(x2), w, tuple(bin_ct), rng, bool(density), want)


def _run_edges(self, x2, bins, weight, density):
    _check_bins(x2, bins)
    _check_weight(x2, weight)
    _check_input(self, False)
    w = None if weight is None else to_jax(weight)
    metrics.bump("executions")
    return _from_edges(to_jax(x2), w, [to_jax(b) for b in bins], bool(density))


@lower(aten.histogram.bin_ct, eager=True)
def histogram_bin_ct(self, bins=100, *, range=None, weight=None, density=False):
    x2, dev = self.reshape(-1, 1), self.device.index
    hist = _run_counts(self, x2, (bins,), range, weight, density, "hist")
    edges = _run_counts(self, x2, (bins,), range, None, False, "edges")[0]
    return from_jax(hist, dev), from_jax(edges, dev)


@lower(aten.histogram.bins_tensor, eager=True)
def histogram_bins_tensor(self, bins, *, weight=None, density=False):
    hist = _run_edges(self, self.reshape(-1, 1), [bins], weight, density)
    return from_jax(hist, self.device.index), bins.clone()


@lower(aten._histogramdd_bin_edges.default, eager=True)
def histogramdd_bin_edges(self, bins, *, range=None, weight=None, density=False):
    x2 = _as_2d(self)
    return [from_jax(e, self.device.index) for e in _run_counts(self, x2, tuple(bins), range, None, False, "edges")]


@lower(aten._histogramdd_from_bin_cts.default, eager=True)
def histogramdd_from_bin_cts(self, bins, *, range=None, weight=None, density=False):
    x2 = _as_2d(self)
    return from_jax(_run_counts(self, x2, tuple(bins), range, weight, density, "hist"), self.device.index)


@lower(aten._histogramdd_from_bin_tensors.default, eager=True)
def histogramdd_from_bin_tensors(self, bins, *, weight=None, density=False):
    x2 = _as_2d(self)
    return from_jax(_run_edges(self, x2, list(bins), weight, density), self.device.index)
