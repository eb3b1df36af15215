"""Neural-network ops: convolution, pooling, softmax, losses, normalization,
embedding backward, upsampling, grid sampling and cdist (forward and backward)."""

from __future__ import annotations

import functools
import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np
import torch
from jax import lax

from torch_tpu import metrics
from torch_tpu.ops.dtypes import opmath, to_opmath
from torch_tpu.ops.registry import aten, lower
from torch_tpu.ops.tensors import from_jax, to_jax

_HIGHEST = lax.Precision.HIGHEST

# at::Reduction
_NONE, _MEAN, _SUM = 0, 1, 2


def _ntuple(value, n: int) -> tuple[int, ...]:
    if isinstance(value, (list, tuple)):
        value = tuple(int(v) for v in value)
        return value * n if len(value) == 1 else value
    return (int(value),) * n


def _reduce(loss, reduction: int):
    if reduction == _MEAN:
        return jnp.mean(loss)
    if reduction == _SUM:
        return jnp.sum(loss)
    return loss


def _sum_to(x, shape):
    """Sums a broadcast result back down to `shape`."""
    shape = tuple(shape)
    lead = x.ndim - len(shape)
    axes = tuple(range(lead)) + tuple(i + lead for i, s in enumerate(shape) if s == 1 and x.shape[i + lead] != 1)
    return jnp.sum(x, axis=axes, keepdims=True).reshape(shape) if axes else x.reshape(shape)


# ---- convolution ------------------------------------------------------------


def _conv(input, weight, stride, padding, dilation, transposed, output_padding, groups):
    nd = input.ndim - 2
    stride, padding, dilation = _ntuple(stride, nd), _ntuple(padding, nd), _ntuple(dilation, nd)
    spatial = "DHW"[3 - nd :]
    dn = lax.conv_dimension_numbers(input.shape, weight.shape, ("NC" + spatial, "OI" + spatial, "NC" + spatial))
    out_dtype = input.dtype
    preferred = jnp.float32 if opmath(out_dtype) != out_dtype else None
    if not transposed:
        out = lax.conv_general_dilated(
            input,
            weight,
            stride,
            [(p, p) for p in padding],
            rhs_dilation=dilation,
            dimension_numbers=dn,
            feature_group_count=groups,
            precision=_HIGHEST,
            preferred_element_type=preferred,
        )
        return out.astype(out_dtype)
    # A transposed conv is the conv with a dilated input and the flipped, in/out-swapped kernel.
    output_padding = _ntuple(output_padding, nd)
    cin, cout_g, *kernel = weight.shape
    w = weight.reshape(groups, cin // groups, cout_g, *kernel)
    w = jnp.swapaxes(w, 1, 2).reshape(groups * cout_g, cin // groups, *kernel)
    w = jnp.flip(w, axis=tuple(range(2, 2 + nd)))
    pads = [(d * (k - 1) - p, d * (k - 1) - p + op) for k, p, d, op in zip(kernel, padding, dilation, output_padding)]
    out = lax.conv_general_dilated(
        input,
        w,
        (1,) * nd,
        pads,
        lhs_dilation=stride,
        rhs_dilation=dilation,
        dimension_numbers=dn,
        feature_group_count=groups,
        precision=_HIGHEST,
        preferred_element_type=preferred,
    )
    return out.astype(out_dtype)


def _check_conv_params(stride, padding, dilation) -> None:
    """CPU's ConvParams checks, which PyTorch's meta kernel leaves out."""
    if any(s <= 0 for s in stride):
        raise RuntimeError("non-positive stride is not supported")
    if any(p < 0 for p in padding):
        raise RuntimeError("negative padding is not supported")
    if any(d <= 0 for d in dilation):
        raise RuntimeError("dilation should be greater than zero")


@lower(aten.convolution.default)
def convolution(input, weight, bias, stride, padding, dilation, transposed, output_padding, groups):
    _check_conv_params(stride, padding, dilation)
    out = _conv(input, weight, stride, padding, dilation, transposed, output_padding, groups)
    if bias is not None:
        out = out + bias.reshape((1, -1) + (1,) * (out.ndim - 2)).astype(out.dtype)
    return out


@lower(aten.convolution_backward.default)
def convolution_backward(
    grad_output, input, weight, bias_sizes, stride, padding, dilation, transposed, output_padding, groups, output_mask
):
    def f(x, w):
        return _conv(x, w, stride, padding, dilation, transposed, output_padding, groups)

    _, vjp = jax.vjp(f, input, weight)
    grad_input, grad_weight = vjp(grad_output.astype(input.dtype))
    grad_bias = None
    if output_mask[2]:
        axes = (0, *tuple(range(2, grad_output.ndim)))
        grad_bias = jnp.sum(to_opmath(grad_output), axis=axes)
    return (
        grad_input if output_mask[0] else None,
        grad_weight if output_mask[1] else None,
        grad_bias,
    )


# ---- pooling ----------------------------------------------------------------


def _pool_out_size(size, k, pad, stride, dilation, ceil_mode) -> int:
    """at::pooling_output_shape."""
    out = (size + 2 * pad - dilation * (k - 1) - 1 + (stride - 1 if ceil_mode else 0)) // stride + 1
    if ceil_mode and (out - 1) * stride >= size + pad:
        out -= 1
    return out


def _pool_params(nd, kernel_size, stride, padding, dilation):
    kernel = _ntuple(kernel_size, nd)
    stride = _ntuple(stride, nd) if stride not in (None, [], ()) else kernel
    return kernel, stride, _ntuple(padding, nd), _ntuple(dilation, nd)


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
        coords = np.meshgrid(
            *[np.arange(o) * st - p + off * d for o, st, p, off, d in zip(outs, stride, padding, offs, dilation)],
            indexing="ij",
        )
        inside = np.ones(outs, bool)
        flat = np.zeros(outs, np.int64)
        for c, s in zip(coords, sizes):
            inside &= (c >= 0) & (c < s)
            flat = flat * s + c
        valid.append(inside)
        index.append(flat)
    return jnp.stack(taps, axis=lead), np.stack(valid), np.stack(index)


def _lowest(dtype):
    if jnp.issubdtype(dtype, jnp.floating):
        return -np.inf
    return jnp.iinfo(dtype).min


def _max_select(taps, valid, index, axis):
    """Max over the tap axis and CPU's index: the first max, or the last nan."""
    valid = jnp.asarray(valid)
    m = jnp.max(taps, axis=axis)
    hit = (taps == jnp.expand_dims(m, axis)) & valid
    k = jnp.argmax(hit, axis=axis)
    if jnp.issubdtype(taps.dtype, jnp.floating):
        nan = jnp.isnan(taps) & valid
        last_nan = taps.shape[axis] - 1 - jnp.argmax(jnp.flip(nan, axis), axis=axis)
        k = jnp.where(jnp.any(nan, axis=axis), last_nan, k)
    idx = jnp.take_along_axis(jnp.broadcast_to(jnp.asarray(index), taps.shape), jnp.expand_dims(k, axis), axis)
    return m, jnp.squeeze(idx, axis).astype(jnp.int64)


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


@lower(aten.max_pool2d_with_indices_backward.default)
def max_pool2d_with_indices_backward(grad_output, self, kernel_size, stride, padding, dilation, ceil_mode, indices):
    return _scatter_to_plane(grad_output, indices, self.shape, 2)


@lower(aten.max_pool3d_with_indices_backward.default)
def max_pool3d_with_indices_backward(grad_output, self, kernel_size, stride, padding, dilation, ceil_mode, indices):
    return _scatter_to_plane(grad_output, indices, self.shape, 3)


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


@lower(aten.avg_pool2d_backward.default)
def avg_pool2d_backward(
    grad_output, self, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override
):
    return _linear_backward(
        lambda x: _avg_pool(2, x, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override),
        grad_output,
        self,
    )


@lower(aten.avg_pool3d_backward.default)
def avg_pool3d_backward(
    grad_output, self, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override
):
    return _linear_backward(
        lambda x: _avg_pool(3, x, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override),
        grad_output,
        self,
    )


def _adaptive_bounds(size: int, out: int):
    i = np.arange(out)
    return (i * size) // out, -((-(i + 1) * size) // out)


def _adaptive_avg_pool(nd, self, output_size):
    x = to_opmath(self)
    for d, out in enumerate(_ntuple(output_size, nd)):
        axis = x.ndim - nd + d
        size = x.shape[axis]
        start, end = _adaptive_bounds(size, out)
        j = np.arange(size)
        m = ((j[None, :] >= start[:, None]) & (j[None, :] < end[:, None])) / (end - start)[:, None]
        x = jnp.moveaxis(jnp.tensordot(x, jnp.asarray(m.T, x.dtype), axes=([axis], [0]), precision=_HIGHEST), -1, axis)
    return x


@lower(aten._adaptive_avg_pool2d.default)
def adaptive_avg_pool2d(self, output_size):
    return _adaptive_avg_pool(2, self, output_size)


@lower(aten._adaptive_avg_pool3d.default)
def adaptive_avg_pool3d(self, output_size):
    return _adaptive_avg_pool(3, self, output_size)


@lower(aten._adaptive_avg_pool2d_backward.default)
def adaptive_avg_pool2d_backward(grad_output, self):
    return _linear_backward(lambda x: _adaptive_avg_pool(2, x, grad_output.shape[-2:]), grad_output, self)


@lower(aten._adaptive_avg_pool3d_backward.default)
def adaptive_avg_pool3d_backward(grad_output, self):
    return _linear_backward(lambda x: _adaptive_avg_pool(3, x, grad_output.shape[-3:]), grad_output, self)


def _adaptive_max_pool(nd, self, output_size):
    sizes = self.shape[-nd:]
    outs = _ntuple(output_size, nd)
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


@lower(aten.adaptive_max_pool2d.default)
def adaptive_max_pool2d(self, output_size):
    return _adaptive_max_pool(2, self, output_size)


@lower(aten.adaptive_max_pool3d.default)
def adaptive_max_pool3d(self, output_size):
    return _adaptive_max_pool(3, self, output_size)


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


@lower(aten.max_unpool2d.default)
def max_unpool2d(self, indices, output_size):
    return _max_unpool(self, indices, tuple(output_size))


@lower(aten.max_unpool3d.default)
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
    k = math.prod(_ntuple(kernel_size, 2))
    shape = (*self.shape[:-2], self.shape[-2] // k, *tuple(_ntuple(output_size, 2)))
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


@lower(aten.fractional_max_pool2d.default)
def fractional_max_pool2d(self, kernel_size, output_size, random_samples):
    x = self if self.ndim == 4 else self[None]
    (kh, kw), (oh, ow) = _ntuple(kernel_size, 2), _ntuple(output_size, 2)
    H, W = x.shape[-2:]
    samples = random_samples.reshape(x.shape[0], x.shape[1], 2)
    hidx = (_fractional_starts(samples[..., 1], H, oh, kh)[..., None] + jnp.arange(kh)).reshape(*x.shape[:2], -1)
    widx = (_fractional_starts(samples[..., 0], W, ow, kw)[..., None] + jnp.arange(kw)).reshape(*x.shape[:2], -1)
    rows = jnp.take_along_axis(x, hidx[..., None], axis=2)  # (N, C, oh*kh, W)
    taps = jnp.take_along_axis(rows, widx[:, :, None, :], axis=3).reshape(*x.shape[:2], oh, kh, ow, kw)
    flat = (hidx[..., None] * W + widx[:, :, None, :]).reshape(taps.shape)
    order = (0, 1, 3, 5, 2, 4)  # -> (N, C, kh, kw, oh, ow)
    taps = jnp.transpose(taps, order).reshape(*x.shape[:2], -1, oh, ow)
    flat = jnp.transpose(flat, order).reshape(taps.shape)
    out, idx = _max_select(taps, np.ones(taps.shape[-3:], bool), flat, 2)
    return (out, idx) if self.ndim == 4 else (out[0], idx[0])


@lower(aten.fractional_max_pool2d_backward.default)
def fractional_max_pool2d_backward(grad_output, self, kernel_size, output_size, indices):
    return _scatter_to_plane(grad_output, indices, self.shape, 2)


# ---- softmax ----------------------------------------------------------------


def _softmax_impl(x, dim, log):
    if x.ndim == 0:
        return jnp.zeros_like(x) if log else jnp.ones_like(x)
    x = to_opmath(x)
    return jax.nn.log_softmax(x, axis=dim) if log else jax.nn.softmax(x, axis=dim)


@lower(aten._softmax.default)
def softmax(self, dim, half_to_float):
    return _softmax_impl(self, dim, log=False)


@lower(aten._log_softmax.default)
def log_softmax(self, dim, half_to_float):
    return _softmax_impl(self, dim, log=True)


@lower(aten._softmax_backward_data.default)
def softmax_backward_data(grad_output, output, dim, input_dtype):
    g, y = to_opmath(grad_output), to_opmath(output)
    if y.ndim == 0:
        return g * 0
    return y * (g - jnp.sum(g * y, axis=dim, keepdims=True))


@lower(aten._log_softmax_backward_data.default)
def log_softmax_backward_data(grad_output, output, dim, input_dtype):
    g, y = to_opmath(grad_output), to_opmath(output)
    if y.ndim == 0:
        return g * 0
    return g - jnp.exp(y) * jnp.sum(g, axis=dim, keepdims=True)


# ---- losses -----------------------------------------------------------------


def _nll_parts(self, target, weight, ignore_index):
    """Per-sample picked log-probabilities and weights; self has classes last."""
    keep = target != ignore_index
    safe = jnp.where(keep, target, 0).astype(jnp.int32)
    x = to_opmath(self)
    picked = jnp.take_along_axis(x, safe[..., None], axis=-1)[..., 0]
    w = jnp.ones((), x.dtype) if weight is None else to_opmath(weight)[safe]
    return picked, jnp.where(keep, w, 0).astype(x.dtype), safe


def _nll_forward(self, target, weight, reduction, ignore_index, batched):
    picked, w, _ = _nll_parts(self, target, weight, ignore_index)
    w = jnp.broadcast_to(w, picked.shape)
    loss = -picked * w
    total = jnp.sum(w)
    if reduction == _NONE:
        return loss, (jnp.zeros((), total.dtype) if batched else total)
    if reduction == _MEAN:
        return jnp.sum(loss) / total, total
    return jnp.sum(loss), total


def _nll_backward(grad_output, self, target, weight, reduction, ignore_index, total_weight):
    _, w, safe = _nll_parts(self, target, weight, ignore_index)
    g = to_opmath(grad_output)
    if reduction == _MEAN:
        g = g / total_weight
    scale = -jnp.broadcast_to(w, safe.shape) * g
    return jax.nn.one_hot(safe, self.shape[-1], dtype=scale.dtype) * scale[..., None]


@functools.partial(jax.jit, static_argnums=(1, 2))
def _first_bad_target(target, classes: int, ignore_index: int):
    bad = ((target < 0) | (target >= classes)) & (target != ignore_index)
    flat = bad.reshape(-1)
    return jnp.any(flat), target.reshape(-1)[jnp.argmax(flat)]


def _check_targets(self, target, weight, reduction, ignore_index):
    """CPU raises IndexError for a class target out of range; XLA would read garbage (one host sync)."""
    if target.numel() == 0 or target.device.type != "tpu" or target.dtype not in (torch.int64, torch.int32):
        return
    classes = self.shape[1] if self.dim() >= 2 else self.shape[0]
    metrics.bump("executions")
    metrics.bump("host_transfers")
    any_bad, value = _first_bad_target(to_jax(target), int(classes), int(ignore_index))
    if bool(any_bad):
        raise IndexError(f"Target {int(value)} is out of bounds.")


@lower(aten.nll_loss_forward.default, check=_check_targets)
def nll_loss_forward(self, target, weight, reduction, ignore_index):
    return _nll_forward(self, target, weight, reduction, ignore_index, batched=self.ndim == 2)


@lower(aten.nll_loss_backward.default)
def nll_loss_backward(grad_output, self, target, weight, reduction, ignore_index, total_weight):
    return _nll_backward(grad_output, self, target, weight, reduction, ignore_index, total_weight)


@lower(aten.nll_loss2d_forward.default, check=_check_targets)
def nll_loss2d_forward(self, target, weight, reduction, ignore_index):
    return _nll_forward(jnp.moveaxis(self, 1, -1), target, weight, reduction, ignore_index, batched=True)


@lower(aten.nll_loss2d_backward.default)
def nll_loss2d_backward(grad_output, self, target, weight, reduction, ignore_index, total_weight):
    grad = _nll_backward(grad_output, jnp.moveaxis(self, 1, -1), target, weight, reduction, ignore_index, total_weight)
    return jnp.moveaxis(grad, -1, 1)


def _loss_grad_scale(grad_output, diff, reduction):
    g = to_opmath(grad_output)
    if reduction == _MEAN:
        g = g / diff.size
    return g


@lower(aten.mse_loss.default)
def mse_loss(self, target, reduction=_MEAN):
    d = to_opmath(self) - to_opmath(target)
    return _reduce(d * d, reduction)


@lower(aten.mse_loss_backward.default)
def mse_loss_backward(grad_output, self, target, reduction):
    d = to_opmath(self) - to_opmath(target)
    return _sum_to(2 * d * _loss_grad_scale(grad_output, d, reduction), self.shape)


@lower(aten.smooth_l1_loss.default)
def smooth_l1_loss(self, target, reduction=_MEAN, beta=1.0):
    d = jnp.abs(to_opmath(self) - to_opmath(target))
    if beta == 0:
        return _reduce(d, reduction)
    return _reduce(jnp.where(d < beta, 0.5 * d * d / beta, d - 0.5 * beta), reduction)


@lower(aten.smooth_l1_loss_backward.default)
def smooth_l1_loss_backward(grad_output, self, target, reduction, beta):
    d = to_opmath(self) - to_opmath(target)
    if beta == 0:
        local = jnp.sign(d)
    else:
        local = jnp.where(d < -beta, -1.0, jnp.where(d > beta, 1.0, d / beta)).astype(d.dtype)
    return _sum_to(local * _loss_grad_scale(grad_output, d, reduction), self.shape)


@lower(aten.huber_loss.default)
def huber_loss(self, target, reduction=_MEAN, delta=1.0):
    d = jnp.abs(to_opmath(self) - to_opmath(target))
    return _reduce(jnp.where(d < delta, 0.5 * d * d, delta * (d - 0.5 * delta)), reduction)


@lower(aten.huber_loss_backward.default)
def huber_loss_backward(grad_output, self, target, reduction, delta):
    d = to_opmath(self) - to_opmath(target)
    return _sum_to(jnp.clip(d, -delta, delta) * _loss_grad_scale(grad_output, d, reduction), self.shape)


@lower(aten.binary_cross_entropy.default)
def binary_cross_entropy(self, target, weight=None, reduction=_MEAN):
    x, t = to_opmath(self), to_opmath(target)
    loss = -(t * jnp.maximum(jnp.log(x), -100.0) + (1 - t) * jnp.maximum(jnp.log1p(-x), -100.0))
    if weight is not None:
        loss = loss * to_opmath(weight)
    return _reduce(loss, reduction)


@lower(aten.binary_cross_entropy_backward.default)
def binary_cross_entropy_backward(grad_output, self, target, weight=None, reduction=_MEAN):
    x, t = to_opmath(self), to_opmath(target)
    grad = (x - t) / jnp.maximum((1 - x) * x, 1e-12) * _loss_grad_scale(grad_output, x, reduction)
    if weight is not None:
        grad = grad * to_opmath(weight)
    return grad


@lower(aten.binary_cross_entropy_with_logits.default)
def binary_cross_entropy_with_logits(self, target, weight=None, pos_weight=None, reduction=_MEAN):
    x, t = to_opmath(self), to_opmath(target)
    log_weight = 1.0 if pos_weight is None else (to_opmath(pos_weight) - 1) * t + 1
    loss = (1 - t) * x - log_weight * jax.nn.log_sigmoid(x)
    if weight is not None:
        loss = loss * to_opmath(weight)
    return _reduce(loss, reduction)


def _multi_margin(x, target, p, margin, weight):
    """Per-sample multi-class hinge loss; x is (N, C)."""
    C = x.shape[-1]
    t = target.astype(jnp.int32)
    xy = jnp.take_along_axis(x, t[:, None], axis=1)
    z = jnp.maximum(margin - xy + x, 0)
    if p == 2:
        z = z * z
    if weight is not None:
        z = z * to_opmath(weight)[t][:, None]
    z = jnp.where(jax.nn.one_hot(t, C, dtype=bool), 0, z)
    return jnp.sum(z, axis=1) / C


def _as_batch(self, target):
    if self.ndim == 0:
        return self.reshape(1, 1), target.reshape(1)
    return (self[None], target.reshape(1)) if self.ndim == 1 else (self, target)


@lower(aten.multi_margin_loss.default)
def multi_margin_loss(self, target, p=1, margin=1, weight=None, reduction=_MEAN):
    x, t = _as_batch(to_opmath(self), target)
    loss = _multi_margin(x, t, p, margin, weight)
    return _reduce(loss if self.ndim > 1 else loss[0], reduction)


@functools.partial(jax.jit, static_argnums=(4, 5, 6))
def _multi_margin_grad(grad_output, self, target, weight, p, margin, reduction):
    def f(x):
        return multi_margin_loss(x, target, p, margin, weight, reduction)

    out, vjp = jax.vjp(f, to_opmath(self))
    return vjp(jnp.broadcast_to(to_opmath(grad_output), out.shape))[0].astype(self.dtype)


# PyTorch has no meta kernel for the margin losses' backward ops: they run eagerly.
@lower(aten.multi_margin_loss_backward.default, eager=True)
def multi_margin_loss_backward(grad_output, self, target, p, margin, weight=None, reduction=_MEAN):
    w = None if weight is None else to_jax(weight)
    out = _multi_margin_grad(to_jax(grad_output), to_jax(self), to_jax(target), w, p, margin, reduction)
    metrics.bump("executions")
    return from_jax(out, self.device.index, self.dtype)


def _multilabel_margin(x, target):
    """Per-sample multi-label hinge loss and the is_target mask; x, target (N, C)."""
    C = x.shape[-1]
    valid = jnp.cumprod(target >= 0, axis=1).astype(bool)  # labels before the first -1
    t = jnp.where(valid, target, 0).astype(jnp.int32)
    is_target = jnp.any(jax.nn.one_hot(t, C, dtype=bool) & valid[..., None], axis=1)
    xt = jnp.take_along_axis(x, t, axis=1)  # (N, K)
    hinge = jnp.maximum(1 - xt[:, :, None] + x[:, None, :], 0)  # (N, K, C)
    hinge = jnp.where(valid[:, :, None] & ~is_target[:, None, :], hinge, 0)
    return jnp.sum(hinge, axis=(1, 2)) / C, is_target


@functools.partial(jax.jit, static_argnums=2)
def _multilabel_margin_forward(self, target, reduction):
    x, t = (self.reshape(1, -1), target.reshape(1, -1)) if self.ndim <= 1 else (self, target)
    loss, is_target = _multilabel_margin(to_opmath(x), t)
    if self.ndim <= 1:
        loss, is_target = loss[0], is_target[0].reshape(self.shape)
    return _reduce(loss, reduction).astype(self.dtype), is_target.astype(self.dtype)


# Eager: for a 1-D input and reduction="none" PyTorch's meta kernel says (1,), CPU gives ().
@lower(aten.multilabel_margin_loss_forward.default, eager=True)
def multilabel_margin_loss_forward(self, target, reduction):
    aten.multilabel_margin_loss_forward.default(_meta_like(self), _meta_like(target), reduction)  # CPU's checks
    metrics.bump("executions")
    loss, is_target = _multilabel_margin_forward(to_jax(self), to_jax(target), reduction)
    return from_jax(loss, self.device.index), from_jax(is_target, self.device.index)


def _meta_like(t):
    return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta")


@functools.partial(jax.jit, static_argnums=2)
def _multilabel_margin_grad(grad_output, self, reduction, target):
    def f(x):
        return _multilabel_margin_forward(x, target, reduction)[0]

    out, vjp = jax.vjp(f, to_opmath(self))
    return vjp(jnp.broadcast_to(to_opmath(grad_output), out.shape))[0].astype(self.dtype)


@lower(aten.multilabel_margin_loss_backward.default, eager=True)
def multilabel_margin_loss_backward(grad_output, self, target, reduction, is_target):
    out = _multilabel_margin_grad(to_jax(grad_output), to_jax(self), reduction, to_jax(target))
    metrics.bump("executions")
    return from_jax(out, self.device.index, self.dtype)


def _lse(*xs):
    """CPU CTC's log-sum-exp: exact -inf when every term is -inf."""
    m = xs[0]
    for x in xs[1:]:
        m = jnp.maximum(m, x)
    m = jnp.where(jnp.isneginf(m), 0, m)
    return jnp.log(sum(jnp.exp(x - m) for x in xs)) + m


def _ctc_setup(log_probs, targets, input_lengths, target_lengths, blank):
    """Extended labels (N, 2S+1) (blank, l1, blank, l2, ...), their masks and the lengths."""
    il = jnp.asarray(input_lengths, jnp.int32)
    tl = jnp.asarray(target_lengths, jnp.int32)
    S = max(int(max(target_lengths, default=0)), 0)
    s = jnp.arange(2 * S + 1)
    k = jnp.clip((s - 1) // 2, 0, max(S - 1, 0))
    if targets.ndim == 1:
        starts = jnp.cumsum(tl) - tl
        flat = jnp.clip(starts[:, None] + k[None, :], 0, max(targets.shape[0] - 1, 0))
        labels = targets[flat] if targets.shape[0] else jnp.zeros(flat.shape, targets.dtype)
    else:
        labels = targets[:, k] if targets.shape[1] else jnp.zeros((targets.shape[0], k.shape[0]), targets.dtype)
    ext = jnp.where(s[None, :] % 2 == 1, labels, blank).astype(jnp.int32)
    in_range = s[None, :] <= 2 * tl[:, None]
    # s-2 -> s skips a blank only between different labels.
    skip = (s[None, :] >= 2) & (ext != jnp.roll(ext, 2, axis=1))
    return ext, in_range, skip, il, tl


def _ctc_alpha(log_probs, ext, in_range, skip, il):
    lp = jnp.moveaxis(to_opmath(log_probs), 0, 1)  # (N, T, C)
    lpe = jnp.take_along_axis(lp, jnp.broadcast_to(ext[:, None, :], lp.shape[:2] + ext.shape[1:]), axis=2)
    ninf = jnp.full(ext.shape, -jnp.inf, lpe.dtype)
    first = jnp.where(jnp.arange(ext.shape[1])[None, :] < 2, lpe[:, 0], -jnp.inf)
    first = jnp.where(in_range, first, -jnp.inf)

    def step(prev, xs):
        lpe_t, t = xs
        a1 = prev
        a2 = jnp.concatenate([ninf[:, :1], prev[:, :-1]], axis=1)
        a3 = jnp.where(skip, jnp.concatenate([ninf[:, :2], prev[:, :-2]], axis=1), -jnp.inf)
        cur = jnp.where(in_range & (t < il)[:, None], _lse(a1, a2, a3) + lpe_t, -jnp.inf)
        return cur, cur

    ts = jnp.arange(1, lp.shape[1])
    _, rest = lax.scan(step, first, (jnp.moveaxis(lpe[:, 1:], 1, 0), ts))
    return jnp.concatenate([first[:, None], jnp.moveaxis(rest, 0, 1)], axis=1), lpe  # (N, T, 2S+1)


@lower(aten._ctc_loss.default)
def ctc_loss(log_probs, targets, input_lengths, target_lengths, blank=0, zero_infinity=False):
    ext, in_range, skip, il, tl = _ctc_setup(log_probs, targets, input_lengths, target_lengths, blank)
    alpha, _ = _ctc_alpha(log_probs, ext, in_range, skip, il)
    last = jnp.take_along_axis(alpha, jnp.clip(il - 1, 0)[:, None, None], axis=1)[:, 0]  # (N, 2S+1)
    end = jnp.take_along_axis(last, (2 * tl)[:, None], axis=1)[:, 0]
    before = jnp.take_along_axis(last, jnp.clip(2 * tl - 1, 0)[:, None], axis=1)[:, 0]
    nll = -jnp.where(tl > 0, _lse(end, jnp.where(tl > 0, before, -jnp.inf)), end)
    return nll, alpha


@functools.partial(jax.jit, static_argnums=(5, 6, 7))
def _ctc_grad(grad, log_probs, targets, neg_log_likelihood, log_alpha, lengths, blank, zero_infinity):
    input_lengths, target_lengths = lengths
    ext, in_range, skip, il, tl = _ctc_setup(log_probs, targets, input_lengths, target_lengths, blank)
    lp = jnp.moveaxis(to_opmath(log_probs), 0, 1)  # (N, T, C)
    lpe = jnp.take_along_axis(lp, jnp.broadcast_to(ext[:, None, :], lp.shape[:2] + ext.shape[1:]), axis=2)
    n, T, width = lpe.shape
    s = jnp.arange(width)[None, :]
    start = (s == 2 * tl[:, None]) | ((s == 2 * tl[:, None] - 1) & (tl[:, None] > 0))
    skip_next = jnp.concatenate([skip[:, 2:], jnp.zeros((n, 2), bool)], axis=1)  # s -> s+2 allowed
    ninf = jnp.full((n, width), -jnp.inf, lpe.dtype)

    def step(nxt, xs):
        lpe_t, t = xs
        b1 = nxt
        b2 = jnp.concatenate([nxt[:, 1:], ninf[:, :1]], axis=1)
        b3 = jnp.where(skip_next, jnp.concatenate([nxt[:, 2:], ninf[:, :2]], axis=1), -jnp.inf)
        rec = jnp.where(in_range, _lse(b1, b2, b3) + lpe_t, -jnp.inf)
        init = jnp.where(start, lpe_t, -jnp.inf)
        cur = jnp.where((t == il - 1)[:, None], init, jnp.where((t < il - 1)[:, None], rec, -jnp.inf))
        return cur, cur

    _, beta = lax.scan(step, ninf, (jnp.moveaxis(lpe, 1, 0), jnp.arange(T)), reverse=True)
    ab = to_opmath(log_alpha)[:, :, :width] + jnp.moveaxis(beta, 0, 1)  # (N, T, 2S+1)
    m = jnp.max(ab, axis=2, keepdims=True)
    m = jnp.where(jnp.isneginf(m), 0, m)
    onehot = jax.nn.one_hot(ext, lp.shape[2], dtype=ab.dtype)  # (N, 2S+1, C)
    total = jnp.einsum("nts,nsc->ntc", jnp.exp(ab - m), onehot, precision=_HIGHEST)
    lcab = jnp.log(total) + m
    nll = to_opmath(neg_log_likelihood)[:, None, None]
    res = (jnp.exp(lp) - jnp.exp(lcab + nll - lp)) * to_opmath(grad)[:, None, None]
    res = jnp.where((jnp.arange(T)[None, :] < il[:, None])[..., None], res, 0)
    if zero_infinity:
        res = jnp.where(jnp.isinf(nll), 0, res)
    return jnp.moveaxis(res, 1, 0).astype(log_probs.dtype)


# Eager: PyTorch has no meta kernel for _ctc_loss_backward.
@lower(aten._ctc_loss_backward.default, eager=True)
def ctc_loss_backward(
    grad, log_probs, targets, input_lengths, target_lengths, neg_log_likelihood, log_alpha, blank, zero_infinity=False
):
    lengths = (tuple(input_lengths), tuple(target_lengths))
    out = _ctc_grad(
        to_jax(grad),
        to_jax(log_probs),
        to_jax(targets),
        to_jax(neg_log_likelihood),
        to_jax(log_alpha),
        lengths,
        blank,
        zero_infinity,
    )
    metrics.bump("executions")
    return from_jax(out, log_probs.device.index, log_probs.dtype)


# ---- normalization ----------------------------------------------------------


def _moments(x, axes):
    mean = jnp.mean(x, axis=axes, keepdims=True)
    var = jnp.mean(jnp.square(x - mean), axis=axes, keepdims=True)
    return mean, var


@lower(aten.native_layer_norm.default)
def native_layer_norm(input, normalized_shape, weight, bias, eps):
    x = to_opmath(input)
    axis = input.ndim - len(normalized_shape)
    axes = tuple(range(axis, input.ndim))
    mean, var = _moments(x, axes)
    rstd = lax.rsqrt(var + eps)
    out = (x - mean) * rstd
    if weight is not None:
        out = out * to_opmath(weight)
    if bias is not None:
        out = out + to_opmath(bias)
    return out, mean, rstd


@lower(aten.native_layer_norm_backward.default)
def native_layer_norm_backward(grad_out, input, normalized_shape, mean, rstd, weight, bias, output_mask):
    x, g = to_opmath(input), to_opmath(grad_out)
    axis = input.ndim - len(normalized_shape)
    axes = tuple(range(axis, input.ndim))
    x_hat = (x - mean) * rstd
    gw = g if weight is None else g * to_opmath(weight)
    grad_input = rstd * (
        gw - jnp.mean(gw, axis=axes, keepdims=True) - x_hat * jnp.mean(gw * x_hat, axis=axes, keepdims=True)
    )
    lead = tuple(range(axis))
    grad_weight = jnp.sum(g * x_hat, axis=lead) if output_mask[1] and weight is not None else None
    grad_bias = jnp.sum(g, axis=lead) if output_mask[2] and bias is not None else None
    return grad_input if output_mask[0] else None, grad_weight, grad_bias


def _channel(v, ndim):
    """A per-channel vector shaped to broadcast against (N, C, *)."""
    return v.reshape((1, -1) + (1,) * (ndim - 2))


def _bn_train(input, weight, bias, eps):
    x = to_opmath(input)
    axes = (0, *tuple(range(2, x.ndim)))
    mean, var = _moments(x, axes)
    invstd = lax.rsqrt(var + eps)
    out = (x - mean) * invstd
    if weight is not None:
        out = out * _channel(to_opmath(weight), x.ndim)
    if bias is not None:
        out = out + _channel(to_opmath(bias), x.ndim)
    return out, mean.reshape(-1), invstd.reshape(-1), var.reshape(-1)


def _bn_eval(input, weight, bias, running_mean, running_var, eps):
    x = to_opmath(input)
    invstd = lax.rsqrt(to_opmath(running_var) + eps)
    out = (x - _channel(to_opmath(running_mean), x.ndim)) * _channel(invstd, x.ndim)
    if weight is not None:
        out = out * _channel(to_opmath(weight), x.ndim)
    if bias is not None:
        out = out + _channel(to_opmath(bias), x.ndim)
    return out


def _updated_stats(input, mean, var, running_mean, running_var, momentum):
    n = input.size // input.shape[1]
    unbiased = var * (n / max(n - 1, 1))
    new_mean = (1 - momentum) * to_opmath(running_mean) + momentum * mean
    new_var = (1 - momentum) * to_opmath(running_var) + momentum * unbiased
    return new_mean, new_var


@lower(aten._native_batch_norm_legit.default)
def native_batch_norm_legit(input, weight, bias, running_mean, running_var, training, momentum, eps):
    if not training:
        out, mean, invstd = native_batch_norm_legit_no_training(
            input, weight, bias, running_mean, running_var, momentum, eps
        )
        return out, mean, invstd, running_mean, running_var
    out, mean, invstd, var = _bn_train(input, weight, bias, eps)
    new_mean, new_var = _updated_stats(input, mean, var, running_mean, running_var, momentum)
    return out, mean, invstd, new_mean, new_var


@lower(aten._native_batch_norm_legit_functional.default)
def native_batch_norm_legit_functional(input, weight, bias, running_mean, running_var, training, momentum, eps):
    """The functional form (torch.compile graphs): new running stats as outputs."""
    return native_batch_norm_legit(input, weight, bias, running_mean, running_var, training, momentum, eps)


@lower(aten._native_batch_norm_legit.no_stats)
def native_batch_norm_legit_no_stats(input, weight, bias, training, momentum, eps):
    out, mean, invstd, _ = _bn_train(input, weight, bias, eps)
    return out, mean, invstd


@lower(aten._native_batch_norm_legit_no_training.default)
def native_batch_norm_legit_no_training(input, weight, bias, running_mean, running_var, momentum, eps):
    out = _bn_eval(input, weight, bias, running_mean, running_var, eps)
    # PyTorch's meta kernel gives these (C,) outputs; they are the running statistics.
    return out, to_opmath(running_mean), lax.rsqrt(to_opmath(running_var) + eps)


@lower(aten._batch_norm_with_update.default)
def batch_norm_with_update(input, weight, bias, running_mean, running_var, momentum, eps):
    out, mean, invstd, var = _bn_train(input, weight, bias, eps)
    new_mean, new_var = _updated_stats(input, mean, var, running_mean, running_var, momentum)
    return out, mean, invstd, jnp.zeros((0,), jnp.uint8), new_mean, new_var


@lower(aten.native_batch_norm.default, eager=True)
def native_batch_norm(input, weight, bias, running_mean, running_var, training, momentum, eps):
    """Routes to the _native_batch_norm_legit family, whose schemas declare that
    training updates running_mean/running_var in place (native_batch_norm's does not)."""
    if training and running_mean is not None and running_var is not None:
        return aten._native_batch_norm_legit.default(
            input, weight, bias, running_mean, running_var, True, momentum, eps
        )
    if training:
        return aten._native_batch_norm_legit.no_stats(input, weight, bias, True, momentum, eps)
    out, mean, _ = aten._native_batch_norm_legit_no_training.default(
        input, weight, bias, running_mean, running_var, momentum, eps
    )
    # As on CPU, evaluation saves no statistics.
    empty = mean.new_empty((0,))
    return out, empty, empty


def _bn_backward(grad_out, input, weight, running_mean, running_var, save_mean, save_invstd, train, eps, output_mask):
    x, g = to_opmath(input), to_opmath(grad_out)
    axes = (0, *tuple(range(2, x.ndim)))
    if train:
        mean, invstd = to_opmath(save_mean), to_opmath(save_invstd)
    else:
        mean, invstd = to_opmath(running_mean), lax.rsqrt(to_opmath(running_var) + eps)
    mean, invstd = _channel(mean, x.ndim), _channel(invstd, x.ndim)
    w = jnp.ones((), x.dtype) if weight is None else _channel(to_opmath(weight), x.ndim)
    x_hat = (x - mean) * invstd
    grad_input = None
    if output_mask[0]:
        if train:
            grad_input = (
                w
                * invstd
                * (g - jnp.mean(g, axis=axes, keepdims=True) - x_hat * jnp.mean(g * x_hat, axis=axes, keepdims=True))
            )
        else:
            grad_input = g * w * invstd
    grad_weight = jnp.sum(g * x_hat, axis=axes) if output_mask[1] else None
    grad_bias = jnp.sum(g, axis=axes) if output_mask[2] else None
    return grad_input, grad_weight, grad_bias


@lower(aten.native_batch_norm_backward.default)
def native_batch_norm_backward(
    grad_out, input, weight, running_mean, running_var, save_mean, save_invstd, train, eps, output_mask
):
    return _bn_backward(
        grad_out, input, weight, running_mean, running_var, save_mean, save_invstd, train, eps, output_mask
    )


@lower(aten.batch_norm_backward.default)
def batch_norm_backward(
    grad_out, input, weight, running_mean, running_var, save_mean, save_var, update, eps, output_mask, reserve
):
    train = save_mean is not None and save_mean.size > 0
    return _bn_backward(
        grad_out, input, weight, running_mean, running_var, save_mean, save_var, train, eps, output_mask
    )


@lower(aten.native_group_norm.default)
def native_group_norm(input, weight, bias, N, C, HxW, group, eps):
    x = to_opmath(input).reshape(N, group, -1)
    mean, var = _moments(x, (2,))
    rstd = lax.rsqrt(var + eps)
    out = ((x - mean) * rstd).reshape(N, C, -1)
    if weight is not None:
        out = out * to_opmath(weight)[None, :, None]
    if bias is not None:
        out = out + to_opmath(bias)[None, :, None]
    return out.reshape(input.shape), mean.reshape(N, group), rstd.reshape(N, group)


@lower(aten.native_group_norm_backward.default)
def native_group_norm_backward(grad_out, input, mean, rstd, weight, N, C, HxW, group, output_mask):
    x = to_opmath(input).reshape(N, group, -1)
    g = to_opmath(grad_out).reshape(N, C, -1)
    mean, rstd = to_opmath(mean)[..., None], to_opmath(rstd)[..., None]
    x_hat = (x - mean) * rstd
    gw = (g if weight is None else g * to_opmath(weight)[None, :, None]).reshape(N, group, -1)
    grad_input = rstd * (gw - jnp.mean(gw, axis=2, keepdims=True) - x_hat * jnp.mean(gw * x_hat, axis=2, keepdims=True))
    x_hat_c = x_hat.reshape(N, C, -1)
    grad_weight = jnp.sum(g * x_hat_c, axis=(0, 2)) if output_mask[1] else None
    grad_bias = jnp.sum(g, axis=(0, 2)) if output_mask[2] else None
    return grad_input.reshape(input.shape) if output_mask[0] else None, grad_weight, grad_bias


# ---- embedding --------------------------------------------------------------


@lower(aten.embedding_dense_backward.default)
def embedding_dense_backward(grad_output, indices, num_weights, padding_idx, scale_grad_by_freq):
    idx = indices.reshape(-1)
    g = to_opmath(grad_output).reshape(idx.shape[0], -1)
    if padding_idx >= 0:
        g = jnp.where((idx == padding_idx)[:, None], 0, g)
    if scale_grad_by_freq:
        counts = jnp.zeros((num_weights,), g.dtype).at[idx].add(1)
        g = g / counts[idx][:, None]
    return jnp.zeros((num_weights, g.shape[1]), g.dtype).at[idx].add(g)


_BAG_SUM, _BAG_MEAN, _BAG_MAX = 0, 1, 2


def _bag_of(indices, offsets, include_last_offset):
    bags = offsets.shape[0] - (1 if include_last_offset else 0)
    starts = offsets[:bags]
    bag = jnp.searchsorted(starts, jnp.arange(indices.shape[0], dtype=starts.dtype), side="right") - 1
    return jnp.clip(bag, 0, max(bags - 1, 0)).astype(jnp.int64), bags


def _embedding_bag_impl(weight, indices, offsets, mode, per_sample_weights, include_last_offset, padding_idx):
    bag, bags = _bag_of(indices, offsets, include_last_offset)
    valid = indices != padding_idx if padding_idx >= 0 else jnp.ones(indices.shape, bool)
    rows = to_opmath(weight)[indices]
    # bag_size has one entry per offset, also with include_last_offset (the last is 0).
    bag_size = jnp.zeros((offsets.shape[0],), jnp.int64).at[bag].add(valid.astype(jnp.int64))
    max_indices = jnp.zeros((0,), jnp.int64)
    if mode == _BAG_MAX:
        masked = jnp.where(valid[:, None], rows, -jnp.inf)
        top = jax.ops.segment_max(masked, bag, num_segments=bags)
        first = jnp.where(
            valid[:, None] & (masked == top[bag]), jnp.arange(indices.shape[0])[:, None], indices.shape[0]
        )
        arg = jax.ops.segment_min(first, bag, num_segments=bags)
        empty = (bag_size[:bags] == 0)[:, None]
        max_indices = jnp.where(empty, 0, indices[jnp.clip(arg, 0, max(indices.shape[0] - 1, 0))])
        return jnp.where(empty, 0, top), bag, bag_size, max_indices
    if per_sample_weights is not None:
        rows = rows * to_opmath(per_sample_weights)[:, None]
    out = jax.ops.segment_sum(jnp.where(valid[:, None], rows, 0), bag, num_segments=bags)
    if mode == _BAG_MEAN:
        out = out / jnp.maximum(bag_size[:bags], 1)[:, None].astype(out.dtype)
    return out, bag, bag_size, max_indices


@lower(aten._embedding_bag.default, aten._embedding_bag_forward_only.default)
def embedding_bag(
    weight,
    indices,
    offsets,
    scale_grad_by_freq=False,
    mode=_BAG_SUM,
    sparse=False,
    per_sample_weights=None,
    include_last_offset=False,
    padding_idx=-1,
):
    return _embedding_bag_impl(weight, indices, offsets, mode, per_sample_weights, include_last_offset, padding_idx)


def _embedding_bag_grad(
    grad,
    indices,
    offset2bag,
    bag_size,
    maximum_indices,
    num_weights,
    scale_grad_by_freq,
    mode,
    per_sample_weights,
    padding_idx,
):
    g = to_opmath(grad)
    valid = indices != padding_idx if padding_idx >= 0 else jnp.ones(indices.shape, bool)
    if mode == _BAG_MAX:
        dims = jnp.arange(g.shape[1])[None, :]
        keep = (bag_size[: g.shape[0]] > 0)[:, None] & ((maximum_indices != padding_idx) if padding_idx >= 0 else True)
        return jnp.zeros((num_weights, g.shape[1]), g.dtype).at[maximum_indices, dims].add(jnp.where(keep, g, 0))
    rows = g[offset2bag]
    if mode == _BAG_MEAN:
        rows = rows / jnp.maximum(bag_size[offset2bag], 1)[:, None].astype(rows.dtype)
    elif per_sample_weights is not None:
        rows = rows * to_opmath(per_sample_weights)[:, None]
    if scale_grad_by_freq:
        counts = jnp.zeros((num_weights,), rows.dtype).at[indices].add(1)
        rows = rows / counts[indices][:, None]
    return jnp.zeros((num_weights, g.shape[1]), g.dtype).at[indices].add(jnp.where(valid[:, None], rows, 0))


@lower(aten._embedding_bag_backward.default)
def embedding_bag_backward(
    grad,
    indices,
    offsets,
    offset2bag,
    bag_size,
    maximum_indices,
    num_weights,
    scale_grad_by_freq,
    mode,
    sparse,
    per_sample_weights,
    padding_idx=-1,
):
    if sparse:
        raise NotImplementedError("torch_tpu: sparse embedding_bag gradients are not supported on the tpu")
    return _embedding_bag_grad(
        grad,
        indices,
        offset2bag,
        bag_size,
        maximum_indices,
        num_weights,
        scale_grad_by_freq,
        mode,
        per_sample_weights,
        padding_idx,
    )


@lower(aten._embedding_bag_dense_backward.default)
def embedding_bag_dense_backward(
    grad,
    indices,
    offset2bag,
    bag_size,
    maximum_indices,
    num_weights,
    scale_grad_by_freq,
    mode,
    per_sample_weights,
    padding_idx=-1,
):
    return _embedding_bag_grad(
        grad,
        indices,
        offset2bag,
        bag_size,
        maximum_indices,
        num_weights,
        scale_grad_by_freq,
        mode,
        per_sample_weights,
        padding_idx,
    )


@lower(aten._embedding_bag_per_sample_weights_backward.default)
def embedding_bag_per_sample_weights_backward(grad, weight, indices, offsets, offset2bag, mode, padding_idx=-1):
    dots = jnp.sum(to_opmath(grad)[offset2bag] * to_opmath(weight)[indices], axis=1)
    return jnp.where(indices != padding_idx, dots, 0) if padding_idx >= 0 else dots


# ---- upsampling -------------------------------------------------------------


def _nearest_index(out_size: int, in_size: int, scale) -> np.ndarray:
    """at::native::nearest_idx, in float32 as on CPU."""
    i = np.arange(out_size)
    if out_size == in_size:
        return i
    if out_size == 2 * in_size:
        return i >> 1
    s = np.float32(1.0 / scale) if scale is not None and scale > 0 else np.float32(in_size) / np.float32(out_size)
    return np.minimum(np.floor(i.astype(np.float32) * s).astype(np.int64), in_size - 1)


def _nearest_exact_index(out_size: int, in_size: int, scale) -> np.ndarray:
    """at::native::nearest_exact_idx, in float32 as on CPU."""
    s = np.float32(1.0 / scale) if scale is not None and scale > 0 else np.float32(in_size) / np.float32(out_size)
    src = np.floor((np.arange(out_size, dtype=np.float32) + np.float32(0.5)) * s).astype(np.int64)
    return np.minimum(src, in_size - 1)


def _upsample_nearest(x, output_size, scales, exact=False):
    nd = len(output_size)
    index = _nearest_exact_index if exact else _nearest_index
    for d, (out, scale) in enumerate(zip(output_size, scales)):
        axis = x.ndim - nd + d
        x = jnp.take(x, index(out, x.shape[axis], scale), axis=axis)
    return x


def _linear_taps(out_size: int, in_size: int, align_corners: bool, scale, dtype):
    """Source indices and weights of linear interpolation along one dim (CPU's
    area_pixel_compute_source_index, in the op's compute type)."""
    dtype = np.float64 if dtype == np.float64 else np.float32
    if align_corners:
        s = dtype(in_size - 1) / dtype(out_size - 1) if out_size > 1 else dtype(0)
        src = s * np.arange(out_size, dtype=dtype)
    else:
        s = dtype(1.0 / scale) if scale is not None and scale > 0 else dtype(in_size) / dtype(out_size)
        src = np.maximum(s * (np.arange(out_size, dtype=dtype) + dtype(0.5)) - dtype(0.5), dtype(0))
    i0 = src.astype(np.int64)
    i1 = i0 + (i0 < in_size - 1)
    l1 = np.clip(src - i0, 0, 1).astype(dtype)
    return i0, i1, (1 - l1).astype(dtype), l1


def _upsample_linear(x, output_size, align_corners, scales):
    nd = len(output_size)
    for d, (out, scale) in enumerate(zip(output_size, scales)):
        axis = x.ndim - nd + d
        i0, i1, l0, l1 = _linear_taps(out, x.shape[axis], align_corners, scale, x.dtype)
        shape = [1] * x.ndim
        shape[axis] = out
        l0, l1 = jnp.asarray(l0.reshape(shape), x.dtype), jnp.asarray(l1.reshape(shape), x.dtype)
        x = jnp.take(x, i0, axis=axis) * l0 + jnp.take(x, i1, axis=axis) * l1
    return x


def _cubic_taps(out_size: int, in_size: int, align_corners: bool, scale, dtype):
    """Source indices (out, 4) and cubic weights of bicubic upsampling along one dim (CPU's
    compute_indices_weights_cubic)."""
    dtype = np.float64 if dtype == np.float64 else np.float32
    i = np.arange(out_size, dtype=dtype)
    if align_corners:
        s = dtype(in_size - 1) / dtype(out_size - 1) if out_size > 1 else dtype(0)
        src = s * i
    else:
        s = dtype(1.0 / scale) if scale is not None and scale > 0 else dtype(in_size) / dtype(out_size)
        src = s * (i + dtype(0.5)) - dtype(0.5)
    base = np.minimum(np.floor(src), in_size - 1).astype(np.int64)
    t = np.clip(src - base, 0, 1).astype(dtype)
    a = dtype(-0.75)

    def near(x):
        return ((a + 2) * x - (a + 3)) * x * x + 1

    def far(x):
        return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a

    weights = np.stack([far(t + 1), near(t), near(1 - t), far(2 - t)], axis=1).astype(dtype)
    index = np.clip(base[:, None] + np.arange(-1, 3)[None, :], 0, in_size - 1)
    return index, weights


def _upsample_cubic(x, output_size, align_corners, scales):
    nd = len(output_size)
    for d, (out, scale) in enumerate(zip(output_size, scales)):
        axis = x.ndim - nd + d
        index, weights = _cubic_taps(out, x.shape[axis], align_corners, scale, x.dtype)
        shape = [1] * x.ndim
        shape[axis] = out
        total = 0
        for j in range(4):
            total = total + jnp.take(x, index[:, j], axis=axis) * jnp.asarray(weights[:, j].reshape(shape), x.dtype)
        x = total
    return x


@lower(aten.upsample_bicubic2d.default)
def upsample_bicubic2d(self, output_size, align_corners, scales_h=None, scales_w=None):
    return _upsample_cubic(to_opmath(self), tuple(output_size), align_corners, (scales_h, scales_w))


@lower(aten.upsample_bicubic2d_backward.default)
def upsample_bicubic2d_backward(grad_output, output_size, input_size, align_corners, scales_h=None, scales_w=None):
    return _upsample_backward(
        lambda x: _upsample_cubic(x, tuple(output_size), align_corners, (scales_h, scales_w)), grad_output, input_size
    )


@lower(aten._upsample_nearest_exact1d.default)
def upsample_nearest_exact1d(self, output_size, scales=None):
    return _upsample_nearest(self, tuple(output_size), (scales,), exact=True)


@lower(aten._upsample_nearest_exact2d.default)
def upsample_nearest_exact2d(self, output_size, scales_h=None, scales_w=None):
    return _upsample_nearest(self, tuple(output_size), (scales_h, scales_w), exact=True)


@lower(aten._upsample_nearest_exact3d.default)
def upsample_nearest_exact3d(self, output_size, scales_d=None, scales_h=None, scales_w=None):
    return _upsample_nearest(self, tuple(output_size), (scales_d, scales_h, scales_w), exact=True)


@lower(aten._upsample_nearest_exact1d_backward.default)
def upsample_nearest_exact1d_backward(grad_output, output_size, input_size, scales=None):
    return _upsample_backward(
        lambda x: _upsample_nearest(x, tuple(output_size), (scales,), exact=True), grad_output, input_size
    )


@lower(aten._upsample_nearest_exact2d_backward.default)
def upsample_nearest_exact2d_backward(grad_output, output_size, input_size, scales_h=None, scales_w=None):
    return _upsample_backward(
        lambda x: _upsample_nearest(x, tuple(output_size), (scales_h, scales_w), exact=True), grad_output, input_size
    )


@lower(aten._upsample_nearest_exact3d_backward.default)
def upsample_nearest_exact3d_backward(
    grad_output, output_size, input_size, scales_d=None, scales_h=None, scales_w=None
):
    return _upsample_backward(
        lambda x: _upsample_nearest(x, tuple(output_size), (scales_d, scales_h, scales_w), exact=True),
        grad_output,
        input_size,
    )


@lower(aten.upsample_nearest1d.default)
def upsample_nearest1d(self, output_size, scales=None):
    return _upsample_nearest(self, tuple(output_size), (scales,))


@lower(aten.upsample_nearest2d.default)
def upsample_nearest2d(self, output_size, scales_h=None, scales_w=None):
    return _upsample_nearest(self, tuple(output_size), (scales_h, scales_w))


@lower(aten.upsample_nearest3d.default)
def upsample_nearest3d(self, output_size, scales_d=None, scales_h=None, scales_w=None):
    return _upsample_nearest(self, tuple(output_size), (scales_d, scales_h, scales_w))


def _upsample_backward(f, grad_output, input_size):
    _, vjp = jax.vjp(f, jnp.zeros(tuple(input_size), opmath(grad_output.dtype)))
    return vjp(to_opmath(grad_output))[0]


@lower(aten.upsample_nearest1d_backward.default)
def upsample_nearest1d_backward(grad_output, output_size, input_size, scales=None):
    return _upsample_backward(lambda x: _upsample_nearest(x, tuple(output_size), (scales,)), grad_output, input_size)


@lower(aten.upsample_nearest2d_backward.default)
def upsample_nearest2d_backward(grad_output, output_size, input_size, scales_h=None, scales_w=None):
    return _upsample_backward(
        lambda x: _upsample_nearest(x, tuple(output_size), (scales_h, scales_w)), grad_output, input_size
    )


@lower(aten.upsample_nearest3d_backward.default)
def upsample_nearest3d_backward(grad_output, output_size, input_size, scales_d=None, scales_h=None, scales_w=None):
    return _upsample_backward(
        lambda x: _upsample_nearest(x, tuple(output_size), (scales_d, scales_h, scales_w)), grad_output, input_size
    )


@lower(aten.upsample_linear1d.default)
def upsample_linear1d(self, output_size, align_corners, scales=None):
    return _upsample_linear(to_opmath(self), tuple(output_size), align_corners, (scales,))


@lower(aten.upsample_bilinear2d.default)
def upsample_bilinear2d(self, output_size, align_corners, scales_h=None, scales_w=None):
    return _upsample_linear(to_opmath(self), tuple(output_size), align_corners, (scales_h, scales_w))


@lower(aten.upsample_trilinear3d.default)
def upsample_trilinear3d(self, output_size, align_corners, scales_d=None, scales_h=None, scales_w=None):
    return _upsample_linear(to_opmath(self), tuple(output_size), align_corners, (scales_d, scales_h, scales_w))


@lower(aten.upsample_linear1d_backward.default)
def upsample_linear1d_backward(grad_output, output_size, input_size, align_corners, scales=None):
    return _upsample_backward(
        lambda x: _upsample_linear(x, tuple(output_size), align_corners, (scales,)), grad_output, input_size
    )


@lower(aten.upsample_bilinear2d_backward.default)
def upsample_bilinear2d_backward(grad_output, output_size, input_size, align_corners, scales_h=None, scales_w=None):
    return _upsample_backward(
        lambda x: _upsample_linear(x, tuple(output_size), align_corners, (scales_h, scales_w)), grad_output, input_size
    )


@lower(aten.upsample_trilinear3d_backward.default)
def upsample_trilinear3d_backward(
    grad_output, output_size, input_size, align_corners, scales_d=None, scales_h=None, scales_w=None
):
    return _upsample_backward(
        lambda x: _upsample_linear(x, tuple(output_size), align_corners, (scales_d, scales_h, scales_w)),
        grad_output,
        input_size,
    )


# ---- grid sampling ----------------------------------------------------------

_BILINEAR, _NEAREST, _BICUBIC = 0, 1, 2
_ZEROS, _BORDER, _REFLECTION = 0, 1, 2


def _unnormalize(coord, size, align_corners):
    if align_corners:
        return (coord + 1) / 2 * (size - 1)
    return ((coord + 1) * size - 1) / 2


def _reflect(coord, twice_low, twice_high):
    if twice_low == twice_high:
        return jnp.zeros_like(coord)
    low = twice_low / 2
    span = (twice_high - twice_low) / 2
    coord = jnp.abs(coord - low)
    extra = jnp.fmod(coord, span)
    flips = jnp.floor(coord / span)
    return jnp.where(flips % 2 == 0, extra + low, span - extra + low)


def _pad_coord(coord, size, padding_mode, align_corners):
    """at::native::compute_coordinates."""
    if padding_mode == _BORDER:
        return jnp.clip(coord, 0, size - 1)
    if padding_mode == _REFLECTION:
        if align_corners:
            coord = _reflect(coord, 0, 2 * (size - 1))
        else:
            coord = _reflect(coord, -1, 2 * size - 1)
        return jnp.clip(coord, 0, size - 1)
    return coord


def _gather2d(input, iy, ix):
    """input[n, :, iy, ix] with zeros outside; iy/ix (N, Ho, Wo) integer."""
    H, W = input.shape[-2:]
    inside = (iy >= 0) & (iy < H) & (ix >= 0) & (ix < W)
    cy, cx = jnp.clip(iy, 0, H - 1), jnp.clip(ix, 0, W - 1)
    n = jnp.arange(input.shape[0])[:, None, None]
    v = input[n, :, cy, cx]  # (N, Ho, Wo, C)
    return jnp.moveaxis(jnp.where(inside[..., None], v, 0), -1, 1)


def _cubic_weights(t):
    a = -0.75
    x1 = t + 1
    x2 = t
    x3 = 1 - t
    x4 = 2 - t

    def near(x):
        return ((a + 2) * x - (a + 3)) * x * x + 1

    def far(x):
        return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a

    return far(x1), near(x2), near(x3), far(x4)


def _grid_sample(input, grid, interpolation_mode, padding_mode, align_corners):
    H, W = input.shape[-2:]
    gx = _unnormalize(grid[..., 0], W, align_corners)
    gy = _unnormalize(grid[..., 1], H, align_corners)
    if interpolation_mode == _BICUBIC:
        x0, y0 = jnp.floor(gx), jnp.floor(gy)
        wx, wy = _cubic_weights(gx - x0), _cubic_weights(gy - y0)
        out = 0
        for i in range(4):
            for j in range(4):
                py = _pad_coord(y0 - 1 + i, H, padding_mode, align_corners)
                px = _pad_coord(x0 - 1 + j, W, padding_mode, align_corners)
                v = _gather2d(input, py.astype(jnp.int32), px.astype(jnp.int32))
                out = out + v * (wy[i] * wx[j])[:, None]
        return out
    gx = _pad_coord(gx, W, padding_mode, align_corners)
    gy = _pad_coord(gy, H, padding_mode, align_corners)
    if interpolation_mode == _NEAREST:
        return _gather2d(input, jnp.round(gy).astype(jnp.int32), jnp.round(gx).astype(jnp.int32))
    x0, y0 = jnp.floor(gx), jnp.floor(gy)
    tx, ty = gx - x0, gy - y0
    x0i, y0i = x0.astype(jnp.int32), y0.astype(jnp.int32)
    out = 0
    for dy, wy in ((0, 1 - ty), (1, ty)):
        for dx, wx in ((0, 1 - tx), (1, tx)):
            out = out + _gather2d(input, y0i + dy, x0i + dx) * (wy * wx)[:, None]
    return out


@lower(aten.grid_sampler_2d.default)
def grid_sampler_2d(input, grid, interpolation_mode, padding_mode, align_corners):
    return _grid_sample(to_opmath(input), to_opmath(grid), interpolation_mode, padding_mode, align_corners)


@lower(aten.grid_sampler_2d_backward.default)
def grid_sampler_2d_backward(grad_output, input, grid, interpolation_mode, padding_mode, align_corners, output_mask):
    _, vjp = jax.vjp(
        lambda x, g: _grid_sample(x, g, interpolation_mode, padding_mode, align_corners),
        to_opmath(input),
        to_opmath(grid),
    )
    grad_input, grad_grid = vjp(to_opmath(grad_output))
    return grad_input if output_mask[0] else None, grad_grid if output_mask[1] else None


# ---- cdist ------------------------------------------------------------------


def _pairwise_diff(x1, x2):
    batch = jnp.broadcast_shapes(x1.shape[:-2], x2.shape[:-2])
    x1 = jnp.broadcast_to(x1, batch + x1.shape[-2:])
    x2 = jnp.broadcast_to(x2, batch + x2.shape[-2:])
    return x1[..., :, None, :] - x2[..., None, :, :]


@lower(aten._cdist_forward.default)
def cdist_forward(x1, x2, p, compute_mode):
    d = jnp.abs(_pairwise_diff(to_opmath(x1), to_opmath(x2)))
    if p == 0:
        return jnp.sum(d != 0, axis=-1).astype(d.dtype)
    if p == 1:
        return jnp.sum(d, axis=-1)
    if p == 2:
        return jnp.sqrt(jnp.sum(d * d, axis=-1))
    if math.isinf(p):
        return jnp.max(d, axis=-1, initial=0)
    return jnp.sum(d**p, axis=-1) ** (1 / p)


@lower(aten._cdist_backward.default)
def cdist_backward(grad, x1, x2, p, cdist):
    diff = _pairwise_diff(to_opmath(x1), to_opmath(x2))
    g, dist = to_opmath(grad)[..., None], to_opmath(cdist)[..., None]
    if p == 0:
        local = jnp.zeros_like(diff)
    elif p == 1:
        local = jnp.sign(diff)
    elif p == 2:
        local = jnp.where(dist == 0, 0, diff / jnp.where(dist == 0, 1, dist))
    elif math.isinf(p):
        local = jnp.sign(diff) * (jnp.abs(diff) == dist)
    else:
        safe = jnp.where(dist == 0, 1, dist)
        local = jnp.sign(diff) * jnp.abs(diff) ** (p - 1) / safe ** (p - 1)
        local = jnp.where((dist == 0) | ((diff == 0) & (p < 1)), 0, local)
    return jnp.sum(local * g, axis=-2).reshape(x1.shape)


# ---- activations without their own module: glu, prelu, log_sigmoid, rrelu ---------------------


@lower(aten.glu.default)
def glu(self, dim=-1):
    a, b = jnp.split(to_opmath(self), 2, axis=dim)
    return a * jax.nn.sigmoid(b)


@lower(aten.glu_backward.default)
def glu_backward(grad_output, self, dim):
    _, vjp = jax.vjp(lambda x: glu(x, dim), to_opmath(self))
    return vjp(to_opmath(grad_output))[0]


@lower(aten._prelu_kernel.default)
def prelu_kernel(self, weight):
    x, w = to_opmath(self), to_opmath(weight)
    return jnp.where(x > 0, x, w * x)


@lower(aten._prelu_kernel_backward.default)
def prelu_kernel_backward(grad_output, self, weight):
    x, w, g = to_opmath(self), to_opmath(weight), to_opmath(grad_output)
    return jnp.where(x > 0, g, w * g), jnp.where(x > 0, 0, x * g)


@lower(aten.log_sigmoid_forward.default)
def log_sigmoid_forward(self):
    x = to_opmath(self)
    # The buffer CPU saves for backward; this lowering's backward recomputes from x instead.
    return jax.nn.log_sigmoid(x), jnp.zeros_like(x)


@lower(aten.log_sigmoid_backward.default)
def log_sigmoid_backward(grad_output, self, buffer):
    x, g = to_opmath(self), to_opmath(grad_output)
    return g * jax.nn.sigmoid(-x)


@lower(aten.softshrink.default)
def softshrink(self, lambd=0.5):
    x = to_opmath(self)
    return jnp.where(x > lambd, x - lambd, jnp.where(x < -lambd, x + lambd, jnp.zeros_like(x)))


@lower(aten.softshrink_backward.default)
def softshrink_backward(grad_output, self, lambd):
    return jnp.where(jnp.abs(self) > lambd, grad_output, jnp.zeros_like(grad_output))


@lower(aten.hardshrink.default)
def hardshrink(self, lambd=0.5):
    return jnp.where(jnp.abs(self) > lambd, self, jnp.zeros_like(self))


@lower(aten.hardshrink_backward.default)
def hardshrink_backward(grad_out, self, lambd):
    return jnp.where(jnp.abs(self) > lambd, grad_out, jnp.zeros_like(grad_out))


@lower(aten.channel_shuffle.default)
def channel_shuffle(self, groups):
    n, c = self.shape[:2]
    x = self.reshape(n, groups, c // groups, *self.shape[2:])
    return jnp.swapaxes(x, 1, 2).reshape(self.shape)
