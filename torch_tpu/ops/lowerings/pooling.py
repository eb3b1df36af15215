"""Pooling: max, avg, adaptive, fractional, unpooling, im2col/col2im (forward and backward)."""

from __future__ import annotations

import functools
import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from torch_tpu import metrics
from torch_tpu.ops.checks import check_ranges, first_outside
from torch_tpu.ops.dtypes import opmath, to_opmath
from torch_tpu.ops.lowerings.common import HIGHEST, ntuple
from torch_tpu.ops.registry import Check, aten, lower
from torch_tpu.ops.tensors import from_jax, to_jax
from torch_tpu.runtime import executable_cache

# ---- pooling ----------------------------------------------------------------


def _pool_out_size(size, k, pad, stride, dilation, ceil_mode) -> int:
    """at::pooling_output_shape."""
    out = (size + 2 * pad - dilation * (k - 1) - 1 + (stride - 1 if ceil_mode else 0)) // stride + 1
    if ceil_mode and (out - 1) * stride >= size + pad:
        out -= 1
    return out


def _pool_params(nd, kernel_size, stride, padding, dilation):
    kernel = ntuple(kernel_size, nd)
    stride = ntuple(stride, nd) if stride not in (None, [], ()) else kernel
    return kernel, stride, ntuple(padding, nd), ntuple(dilation, nd)


def _windows(x, nd, kernel, stride, padding, dilation, ceil_mode, fill):
    """Every kernel tap's strided view of the padded input, stacked on axis -nd-1:
    (..., K, *out); with a static (K, *out) mask of taps inside the input and
    their flat in-plane indices."""
    sizes = x.shape[-nd:]
    outs = [
        _pool_out_size(s, k, p, st, d, ceil_mode) for s, k, p, st, d in zip(sizes, kernel, padding, stride, dilation)
    ]
    lead = x.ndim - nd
    pads = [(0, 0, 0)] * lead
    for s, k, p, st, d, o in zip(sizes, kernel, padding, stride, dilation, outs):
        pads.append((p, (o - 1) * st + (k - 1) * d + 1 - s - p, 0))
    xp = lax.pad(x, jnp.array(fill, x.dtype), pads)
    taps, valid, index = [], [], []
    for offs in itertools.product(*[range(k) for k in kernel]):
        start = [0] * lead + [o * d for o, d in zip(offs, dilation)]
        limit = list(xp.shape[:lead]) + [s + (o - 1) * st + 1 for s, o, st in zip(start[lead:], outs, stride)]
        taps.append(lax.slice(xp, start, limit, [1] * lead + list(stride)))
        inside, flat = _tap_positions(offs, sizes, outs, stride, padding, dilation)
        valid.append(inside)
        index.append(flat)
    return jnp.stack(taps, axis=lead), np.stack(valid), np.stack(index)


def _tap_positions(offs, sizes, outs, stride, padding, dilation) -> tuple[np.ndarray, np.ndarray]:
    """For kernel tap `offs`, over the output grid `outs`: a static mask of the outputs whose tap
    lies inside the input plane `sizes`, and the tap's flat in-plane index (int64)."""
    coords = np.meshgrid(
        *[np.arange(o) * st - p + off * d for o, st, p, off, d in zip(outs, stride, padding, offs, dilation)],
        indexing="ij",
    )
    inside = np.ones(outs, bool)
    flat = np.zeros(outs, np.int64)
    for c, size in zip(coords, sizes):
        inside &= (c >= 0) & (c < size)
        flat = flat * size + c
    return inside, flat


def _lowest(dtype):
    if jnp.issubdtype(dtype, jnp.floating):
        return -np.inf
    return jnp.iinfo(dtype).min


def _narrow_index(index):
    """A static index table in int32 where it fits: TPU has no native int64 (a pair of u32 words)."""
    if isinstance(index, np.ndarray) and index.size and -(2**31) <= index.min() and index.max() < 2**31:
        return index.astype(np.int32)
    return index


def _max_tap(taps, valid, axis):
    """Max over the tap axis and which tap CPU picks: the first max, or the last nan."""
    valid = jnp.asarray(valid)
    m = jnp.max(taps, axis=axis)
    hit = (taps == jnp.expand_dims(m, axis)) & valid
    k = jnp.argmax(hit, axis=axis)
    if jnp.issubdtype(taps.dtype, jnp.floating):
        nan = jnp.isnan(taps) & valid
        last_nan = taps.shape[axis] - 1 - jnp.argmax(jnp.flip(nan, axis), axis=axis)
        k = jnp.where(jnp.any(nan, axis=axis), last_nan, k)
    return m, k


def _max_select(taps, valid, index, axis):
    """Max over the tap axis and CPU's index of it (`_max_tap`).

    The index is picked with a one-hot sum over the taps, not a gather: XLA:TPU runs a gather
    over every output element ~100x slower (ResNet-50's first max pool: 0.8 s a step)."""
    m, k = _max_tap(taps, valid, axis)
    tap = lax.broadcasted_iota(k.dtype, taps.shape, axis if axis >= 0 else taps.ndim + axis)
    index = jnp.asarray(_narrow_index(index))
    idx = jnp.sum(jnp.where(tap == jnp.expand_dims(k, axis), index, jnp.zeros((), index.dtype)), axis=axis)
    return m, idx.astype(jnp.int64)


def _max_pool(nd, self, kernel_size, stride, padding, dilation, ceil_mode):
    kernel, stride, padding, dilation = _pool_params(nd, kernel_size, stride, padding, dilation)
    taps, valid, index = _windows(self, nd, kernel, stride, padding, dilation, ceil_mode, _lowest(self.dtype))
    return _max_select(taps, valid, index, self.ndim - nd)


@lower(aten.max_pool2d_with_indices.default)
def max_pool2d_with_indices(self, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
    return _max_pool(2, self, kernel_size, stride, padding, dilation, ceil_mode)


@lower(aten.max_pool3d_with_indices.default)
def max_pool3d_with_indices(self, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
    return _max_pool(3, self, kernel_size, stride, padding, dilation, ceil_mode)


def _scatter_to_plane(grad, indices, input_shape, nd):
    """grad_input: each grad element added at its flat in-plane index."""
    lead = input_shape[: len(input_shape) - nd]
    plane = math.prod(input_shape[len(input_shape) - nd :])
    batch = math.prod(lead)
    g = to_opmath(grad).reshape(batch, -1)
    idx = indices.reshape(batch, -1)
    out = jnp.zeros((batch, plane), g.dtype).at[jnp.arange(batch)[:, None], idx].add(g, mode="drop")
    return out.reshape(input_shape)


def _taps_to_plane(tap_grads, input_shape, outs, kernel, stride, padding, dilation, dtype):
    """grad_input in `dtype` from each kernel tap's grads, `(offs, (..., *outs) array)` pairs: tap
    `offs` of output o lies on input position o * stride + offs * dilation - padding.

    Dense, without a scatter (which XLA:TPU runs ~100x slower than a copy) and without one
    full-plane write per tap: the plane is cut into stride^nd phases (the positions congruent
    to each phase modulo the stride), every tap adds, shifted, to one phase's grid, and one
    interleave of the phase grids writes the plane."""
    nd = len(kernel)
    lead_shape = tuple(input_shape[: len(input_shape) - nd])
    lead = len(lead_shape)
    cells = [-(-size // st) for size, st in zip(input_shape[lead:], stride)]  # a phase grid's extent
    grids: dict[tuple[int, ...], jax.Array] = {}
    zero = None
    for offs, value in tap_grads:
        zero = jnp.zeros((), value.dtype)
        phase, pads = [], [(0, 0, 0)] * lead
        for off, d, p, st, o, c in zip(offs, dilation, padding, stride, outs, cells):
            shift, ph = divmod(off * d - p, st)
            phase.append(ph)
            pads.append((shift, c - o - shift, 0))  # negative pads crop what falls outside the plane
        shifted = lax.pad(value, zero, pads)
        key = tuple(phase)
        grids[key] = shifted if key not in grids else grids[key] + shifted
    if zero is None:
        raise ValueError("no kernel tap lies inside the input")
    blank = jnp.zeros(lead_shape + tuple(cells), dtype)
    phases = itertools.product(*[range(st) for st in stride])
    stacked = jnp.stack([grids[ph].astype(dtype) if ph in grids else blank for ph in phases], lead)
    stacked = stacked.reshape(lead_shape + tuple(stride) + tuple(cells))
    # (..., s1..sn, c1..cn) -> (..., c1, s1, ..., cn, sn): position c * s + phase
    order = list(range(lead)) + [axis for i in range(nd) for axis in (lead + nd + i, lead + i)]
    plane = stacked.transpose(order).reshape(lead_shape + tuple(c * st for c, st in zip(cells, stride)))
    return lax.slice(plane, [0] * len(input_shape), list(input_shape))


def _inside_taps(nd, input_shape, outs, kernel, stride, padding, dilation):
    """(tap number, offs, static mask of the outputs whose tap lies inside the input, flat index)
    for every tap that lies inside the input for some output."""
    sizes = input_shape[-nd:]
    for number, offs in enumerate(itertools.product(*[range(k) for k in kernel])):
        inside, flat = _tap_positions(offs, sizes, outs, stride, padding, dilation)
        if inside.any():
            yield number, offs, inside, flat


def _max_pool_backward(nd, grad, self, kernel_size, stride, padding, dilation, ceil_mode, indices):
    """grad_input: each output's grad on the input position `indices` names, tap by tap."""
    kernel, stride, padding, dilation = _pool_params(nd, kernel_size, stride, padding, dilation)
    g = to_opmath(grad)
    index_dtype = jnp.int32 if math.prod(self.shape[-nd:]) < 2**31 else indices.dtype
    indices = indices.astype(index_dtype)
    zero = jnp.zeros((), g.dtype)
    parts = [
        (offs, jnp.where((indices == jnp.asarray(flat.astype(index_dtype))) & jnp.asarray(inside), g, zero))
        for _, offs, inside, flat in _inside_taps(nd, self.shape, grad.shape[-nd:], kernel, stride, padding, dilation)
    ]
    if not parts:
        return jnp.zeros(self.shape, grad.dtype)
    return _taps_to_plane(parts, self.shape, grad.shape[-nd:], kernel, stride, padding, dilation, grad.dtype)


def _from_input_by_taps(grad, self, kernel, stride, padding, dilation, ceil_mode):
    """The pool's backward from its input, every case: the taps' argmax (`_max_tap`), spread."""
    nd = len(kernel)
    taps, valid, _ = _windows(self, nd, kernel, stride, padding, dilation, ceil_mode, _lowest(self.dtype))
    _, k = _max_tap(taps, valid, self.ndim - nd)
    g = to_opmath(grad)
    zero = jnp.zeros((), g.dtype)
    outs = grad.shape[-nd:]
    parts = [
        (offs, jnp.where(k == number, g, zero))
        for number, offs, _, _ in _inside_taps(nd, self.shape, outs, kernel, stride, padding, dilation)
    ]
    return _taps_to_plane(parts, self.shape, outs, kernel, stride, padding, dilation, grad.dtype)


def _from_input_by_select_and_scatter(grad, self, kernel, stride, padding):
    """The pool's backward as XLA's select-and-scatter (jax's max pool vjp): each window's first
    max takes its grad, as on CPU, for inputs without nan and -inf."""
    nd = len(kernel)
    lead = self.ndim - nd
    sizes, outs = self.shape[lead:], grad.shape[lead:]
    highs = [(o - 1) * st + k - size - p for size, o, k, st, p in zip(sizes, outs, kernel, stride, padding)]
    # rows no window reaches (a negative high padding) get no grad: cropped, then padded back
    used = [size + min(h, 0) for size, h in zip(sizes, highs)]
    x = lax.slice(self, [0] * self.ndim, list(self.shape[:lead]) + used)
    window = (1,) * lead + tuple(kernel)
    strides = (1,) * lead + tuple(stride)
    pads = ((0, 0),) * lead + tuple((p, max(h, 0)) for p, h in zip(padding, highs))

    def pool(x):
        return lax.reduce_window(x, np.array(-np.inf, x.dtype), lax.max, window, strides, pads)

    _, vjp = jax.vjp(pool, x)
    (out,) = vjp(grad.astype(x.dtype))
    return lax.pad(out, jnp.zeros((), out.dtype), [(0, 0, 0)] * lead + [(0, -min(h, 0), 0) for h in highs])


def max_pool_backward_from_input(grad, self, kernel_size, stride, padding, dilation, ceil_mode):
    """max_pool{2,3}d_with_indices_backward with the indices found again from `self` (the same
    first max, or last nan): compiled graphs take this one, so the forward's int64 indices
    (emulated with u32 pairs on TPU) are neither kept for the backward nor computed. Each size
    has one entry per dim.

    XLA's select-and-scatter picks each window's first max too, at a fraction of the taps' cost
    on TPU (ResNet-50's stem pool: ~1 ms against ~15 ms), but not CPU's last nan, and it ranks
    the padding (-inf) with an input's -inf; inputs holding either take the taps at run time."""
    nd = len(kernel_size)
    kernel, stride, padding, dilation = _pool_params(nd, kernel_size, stride, padding, dilation)
    by_taps = functools.partial(
        _from_input_by_taps, kernel=kernel, stride=stride, padding=padding, dilation=dilation, ceil_mode=ceil_mode
    )
    if any(d != 1 for d in dilation) or not jnp.issubdtype(self.dtype, jnp.floating):
        return by_taps(grad, self)
    fast = functools.partial(_from_input_by_select_and_scatter, kernel=kernel, stride=stride, padding=padding)
    special = jnp.any(jnp.isnan(self) | (self == -jnp.inf))
    return lax.cond(special, by_taps, fast, grad, self)


@lower(aten.max_pool2d_with_indices_backward.default)
def max_pool2d_with_indices_backward(grad_output, self, kernel_size, stride, padding, dilation, ceil_mode, indices):
    return _max_pool_backward(2, grad_output, self, kernel_size, stride, padding, dilation, ceil_mode, indices)


@lower(aten.max_pool3d_with_indices_backward.default)
def max_pool3d_with_indices_backward(grad_output, self, kernel_size, stride, padding, dilation, ceil_mode, indices):
    return _max_pool_backward(3, grad_output, self, kernel_size, stride, padding, dilation, ceil_mode, indices)


def _avg_divisor(size, k, pad, stride, out, count_include_pad):
    """Per-output divisor along one dim, as in CPU's avg_pool kernels."""
    start = np.arange(out) * stride - pad
    end = np.minimum(start + k, size + pad)
    pool = end - start
    valid = np.minimum(end, size) - np.maximum(start, 0)
    return pool if count_include_pad else valid


def _avg_pool(nd, self, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override):
    kernel, stride, padding, _ = _pool_params(nd, kernel_size, stride, padding, 1)
    x = to_opmath(self)
    sizes = x.shape[-nd:]
    outs = [_pool_out_size(s, k, p, st, 1, ceil_mode) for s, k, p, st in zip(sizes, kernel, padding, stride)]
    lead = x.ndim - nd
    pads = [(0, 0, 0)] * lead + [
        (p, (o - 1) * st + k - s - p, 0) for s, k, p, st, o in zip(sizes, kernel, padding, stride, outs)
    ]
    xp = lax.pad(x, jnp.array(0, x.dtype), pads)
    total = lax.reduce_window(xp, np.array(0, x.dtype), lax.add, (1,) * lead + kernel, (1,) * lead + stride, "VALID")
    if divisor_override:
        return total / divisor_override
    divisor = np.ones(outs, np.float64)
    for d, (s, k, p, st, o) in enumerate(zip(sizes, kernel, padding, stride, outs)):
        shape = [1] * nd
        shape[d] = o
        divisor = divisor * _avg_divisor(s, k, p, st, o, count_include_pad).reshape(shape)
    # Windows lying wholly in the padding give 0, not 0/0.
    divisor = np.where(divisor > 0, divisor, 1)
    return total / jnp.asarray(divisor, x.dtype)


@lower(aten.avg_pool2d.default)
def avg_pool2d(self, kernel_size, stride=(), padding=0, ceil_mode=False, count_include_pad=True, divisor_override=None):
    return _avg_pool(2, self, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override)


@lower(aten.avg_pool3d.default)
def avg_pool3d(self, kernel_size, stride=(), padding=0, ceil_mode=False, count_include_pad=True, divisor_override=None):
    return _avg_pool(3, self, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override)


def _linear_backward(f, grad_output, self):
    """The vjp of a linear function f of self at grad_output."""
    _, vjp = jax.vjp(f, jnp.zeros(self.shape, opmath(self.dtype)))
    return vjp(to_opmath(grad_output))[0]


@lower(aten.avg_pool2d_backward.default, aten.avg_pool3d_backward.default)
def avg_pool_backward(grad_output, self, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override):
    nd = len(kernel_size)  # the schema's int[2] or int[3]
    return _linear_backward(
        lambda x: _avg_pool(nd, x, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override),
        grad_output,
        self,
    )


def _adaptive_bounds(size: int, out: int):
    i = np.arange(out)
    return (i * size) // out, -((-(i + 1) * size) // out)


def _adaptive_avg_pool(nd, self, output_size):
    x = to_opmath(self)
    for d, out in enumerate(ntuple(output_size, nd)):
        axis = x.ndim - nd + d
        size = x.shape[axis]
        start, end = _adaptive_bounds(size, out)
        j = np.arange(size)
        m = ((j[None, :] >= start[:, None]) & (j[None, :] < end[:, None])) / (end - start)[:, None]
        x = jnp.moveaxis(jnp.tensordot(x, jnp.asarray(m.T, x.dtype), axes=([axis], [0]), precision=HIGHEST), -1, axis)
    return x


@lower(aten._adaptive_avg_pool2d.default, aten._adaptive_avg_pool3d.default)
def adaptive_avg_pool(self, output_size):
    return _adaptive_avg_pool(len(output_size), self, output_size)  # the schema's SymInt[2] or SymInt[3]


@lower(aten._adaptive_avg_pool2d_backward.default)
def adaptive_avg_pool2d_backward(grad_output, self):
    return _linear_backward(lambda x: _adaptive_avg_pool(2, x, grad_output.shape[-2:]), grad_output, self)


@lower(aten._adaptive_avg_pool3d_backward.default)
def adaptive_avg_pool3d_backward(grad_output, self):
    return _linear_backward(lambda x: _adaptive_avg_pool(3, x, grad_output.shape[-3:]), grad_output, self)


def _adaptive_max_pool(nd, self, output_size):
    sizes = self.shape[-nd:]
    outs = ntuple(output_size, nd)
    lead = self.ndim - nd
    # Per dim: the (out, k) input positions of each window, padded by repeating its
    # last position (a repeat never changes the max or the first index of it).
    taps = []
    for size, out in zip(sizes, outs):
        start, end = _adaptive_bounds(size, out)
        k = int(np.max(end - start))
        taps.append(np.minimum(start[:, None] + np.arange(k)[None, :], end[:, None] - 1))
    grids = []
    for d, t in enumerate(taps):
        shape = [1] * (2 * nd)
        shape[2 * d : 2 * d + 2] = t.shape
        grids.append(t.reshape(shape))
    # (..., o1, k1, o2, k2, ...) -> (..., k1, k2, ..., o1, o2, ...)
    g = self[(Ellipsis, *grids)]
    order = [2 * d + 1 for d in range(nd)] + [2 * d for d in range(nd)]
    g = jnp.transpose(g, list(range(lead)) + [lead + i for i in order]).reshape((*self.shape[:lead], -1, *outs))
    flat = 0
    for size, grid in zip(sizes, grids):
        flat = flat * size + grid
    flat = np.broadcast_to(flat, [x for t in taps for x in t.shape]).transpose(order).reshape(-1, *outs)
    return _max_select(g, np.ones(flat.shape, bool), flat, lead)


@lower(aten.adaptive_max_pool2d.default, aten.adaptive_max_pool3d.default)
def adaptive_max_pool(self, output_size):
    return _adaptive_max_pool(len(output_size), self, output_size)  # the schema's SymInt[2] or SymInt[3]


@lower(aten.adaptive_max_pool2d_backward.default)
def adaptive_max_pool2d_backward(grad_output, self, indices):
    return _scatter_to_plane(grad_output, indices, self.shape, 2)


@lower(aten.adaptive_max_pool3d_backward.default)
def adaptive_max_pool3d_backward(grad_output, self, indices):
    return _scatter_to_plane(grad_output, indices, self.shape, 3)


def _max_unpool(self, indices, output_size):
    nd = len(output_size)
    lead = self.shape[: self.ndim - nd]
    batch = math.prod(lead)
    x = self.reshape(batch, -1)
    idx = indices.reshape(batch, -1)
    out = jnp.zeros((batch, math.prod(output_size)), self.dtype)
    out = out.at[jnp.arange(batch)[:, None], idx].set(x, mode="drop")
    return out.reshape(tuple(lead) + tuple(output_size))


def _unpool_check() -> Check:
    """CPU's error for an index outside the output volume (jax would drop that write)."""

    def message(output_size) -> str:
        return (
            "Found an invalid max index: {value} (output volumes are of size " + "x".join(map(str, output_size)) + ")"
        )

    def host(self, indices, output_size, *args, **kwargs):
        text = message(output_size)
        check_ranges([(indices, 0, math.prod(output_size), lambda v: RuntimeError(text.format(value=v)))])

    def graph(self, indices, output_size, *args, **kwargs):
        return first_outside(indices, 0, math.prod(output_size), RuntimeError, message(output_size))

    return Check(host, graph)


@lower(aten.max_unpool2d.default, check=_unpool_check())
def max_unpool2d(self, indices, output_size):
    return _max_unpool(self, indices, tuple(output_size))


@lower(aten.max_unpool3d.default, check=_unpool_check())
def max_unpool3d(self, indices, output_size, stride, padding):
    return _max_unpool(self, indices, tuple(output_size))


def _im2col(x, kernel_size, dilation, padding, stride):
    kernel, stride, padding, dilation = _pool_params(2, kernel_size, stride, padding, dilation)
    taps, _, _ = _windows(x, 2, kernel, stride, padding, dilation, False, 0)  # (N, C, K, oh, ow)
    lead = x.shape[:-3]
    return taps.reshape((*lead, x.shape[-3] * taps.shape[-3], taps.shape[-2] * taps.shape[-1]))


@lower(aten.im2col.default)
def im2col(self, kernel_size, dilation, padding, stride):
    return _im2col(self, kernel_size, dilation, padding, stride)


@lower(aten.col2im.default)
def col2im(self, output_size, kernel_size, dilation, padding, stride):
    k = math.prod(ntuple(kernel_size, 2))
    shape = (*self.shape[:-2], self.shape[-2] // k, *tuple(ntuple(output_size, 2)))
    _, vjp = jax.vjp(lambda x: _im2col(x, kernel_size, dilation, padding, stride), jnp.zeros(shape, self.dtype))
    return vjp(self)[0]


def _fractional_starts(sample, size: int, out: int, k: int):
    """CPU's generate_intervals: window starts (..., out) from a sample in [0, 1)."""
    if out == 1:
        return jnp.full((*sample.shape, 1), size - k, jnp.int32)
    alpha = (size - k) / (out - 1)
    i = jnp.arange(out - 1, dtype=sample.dtype)
    starts = ((i + sample[..., None]) * alpha).astype(jnp.int32) - (sample * alpha).astype(jnp.int32)[..., None]
    return jnp.concatenate([starts, jnp.full((*sample.shape, 1), size - k, jnp.int32)], axis=-1)


def _fractional_max_pool(nd, self, kernel_size, output_size, random_samples, columns):
    """Max over the windows at CPU's pseudo-random starts; dim d takes its sample from column columns[d]."""
    x = self if self.ndim == nd + 2 else self[None]
    kernel, out = ntuple(kernel_size, nd), ntuple(output_size, nd)
    lead, sizes = x.shape[:2], x.shape[2:]
    samples = random_samples.reshape(*lead, nd)
    taps, flat = x, 0
    for d in range(nd):
        starts = _fractional_starts(samples[..., columns[d]], sizes[d], out[d], kernel[d])
        idx = starts[..., None] + jnp.arange(kernel[d])  # (N, C, out, k)
        axis = 2 + 2 * d  # dims before d are already split into (out, k)
        taps = jnp.take_along_axis(taps, idx.reshape(*lead, *[1] * (2 * d), -1, *[1] * (nd - d - 1)), axis=axis)
        taps = taps.reshape(*taps.shape[:axis], out[d], kernel[d], *taps.shape[axis + 1 :])
        stride = math.prod(sizes[d + 1 :])
        flat = flat + (idx * stride).reshape(*lead, *[1] * (2 * d), out[d], kernel[d], *[1] * (2 * (nd - d - 1)))
    order = (0, 1, *range(3, 2 * nd + 2, 2), *range(2, 2 * nd + 2, 2))  # (N, C, o0, k0, ...) -> (N, C, *k, *out)
    flat = jnp.transpose(jnp.broadcast_to(flat, taps.shape), order)
    taps = jnp.transpose(taps, order).reshape(*lead, -1, *out)
    out_v, idx = _max_select(taps, np.ones(taps.shape[-nd - 1 :], bool), flat.reshape(taps.shape), 2)
    return (out_v, idx) if self.ndim == nd + 2 else (out_v[0], idx[0])


@lower(aten.fractional_max_pool2d.default)
def fractional_max_pool2d(self, kernel_size, output_size, random_samples):
    return _fractional_max_pool(2, self, kernel_size, output_size, random_samples, (1, 0))


@lower(aten.fractional_max_pool3d.default)
def fractional_max_pool3d(self, kernel_size, output_size, random_samples):
    return _fractional_max_pool(3, self, kernel_size, output_size, random_samples, (0, 1, 2))


@lower(aten.fractional_max_pool2d_backward.default)
def fractional_max_pool2d_backward(grad_output, self, kernel_size, output_size, indices):
    return _scatter_to_plane(grad_output, indices, self.shape, 2)


def _fractional_max_pool3d_backward(grad_output, self, kernel_size, output_size, indices):
    return _scatter_to_plane(grad_output, indices, self.shape, 3).astype(self.dtype)


_fractional_max_pool3d_backward_jit = executable_cache.jit(_fractional_max_pool3d_backward, static_argnums=(2, 3))


# No meta kernel: eager, with CPU's size checks.
@lower(aten.fractional_max_pool3d_backward.default, eager=True, graph=_fractional_max_pool3d_backward)
def fractional_max_pool3d_backward(grad_output, self, kernel_size, output_size, indices):
    off = self.dim() - 3
    for d, name in enumerate(("time", "height", "width")):
        if output_size[d] != grad_output.shape[off + d]:
            raise RuntimeError(f"fractional_max_pool3d_backward_out(): gradOutput {name} unexpected")
    metrics.bump("executions")
    grad = _fractional_max_pool3d_backward_jit(
        to_jax(grad_output), to_jax(self), tuple(kernel_size), tuple(output_size), to_jax(indices)
    )
    return from_jax(grad, self.device.index)
