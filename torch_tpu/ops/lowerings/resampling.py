"""Resampling: upsampling (nearest, linear, cubic, antialiased linear) and grid sampling, forward and backward."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from torch_tpu.ops.dtypes import opmath, to_opmath, type_name
from torch_tpu.ops.lowerings.common import HIGHEST
from torch_tpu.ops.registry import aten, lower

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


def _aa_weights(out_size: int, in_size: int, align_corners: bool, scale, dtype) -> np.ndarray:
    """CPU's antialiased linear weights along one dim, (out, in): a triangle filter whose support grows with
    the downsampling factor, normalized per output pixel (_compute_indices_min_size_weights_aa)."""
    t = np.float64 if dtype == np.float64 else np.float32
    f64 = np.float64
    if align_corners:
        s = t(in_size - 1) / t(out_size - 1) if out_size > 1 else t(0)
    else:
        s = t(1.0 / scale) if scale is not None and scale > 0 else t(in_size) / t(out_size)
    support = t(f64(s)) if s >= 1 else t(1.0)  # interp_size / 2 = 1, times the scale when downsampling
    invscale = t(1.0 / f64(s)) if s >= 1 else t(1.0)
    max_size = math.ceil(support) * 2 + 1
    weights = np.zeros((out_size, in_size), t)
    for i in range(out_size):
        center = t(f64(s) * (i + 0.5))
        xmin = max(int(f64(center - support) + 0.5), 0)
        xsize = min(max(min(int(f64(center + support) + 0.5), in_size) - xmin, 0), max_size)
        x = t((f64(t(np.arange(xmin, xmin + xsize)) - center) + 0.5) * f64(invscale))
        w = np.where(np.abs(x) < 1, t(1) - np.abs(x), t(0)).astype(t)
        total = t(0)
        for v in w:  # sequential, as the C++ loop
            total = t(total + v)
        weights[i, xmin : xmin + xsize] = w / total if total != 0 else w
    return weights


def _aa_int16_weights(weights: np.ndarray) -> tuple[np.ndarray, int]:
    """uint8's fixed-point weights: the double weights scaled by 2**precision, the largest precision (< 22)
    whose largest weight still fits int16, rounded half away from zero (_compute_index_ranges_int16_weights)."""
    wt_max = float(weights.max(initial=0.0))
    precision = 0
    while precision < 22 and int(0.5 + wt_max * (1 << (precision + 1))) < (1 << 15):
        precision += 1
    v = weights * (1 << precision)
    return np.where(v < 0, np.trunc(v - 0.5), np.trunc(v + 0.5)).astype(np.int32), precision


def _upsample_aa(x, output_size, align_corners, scales):
    """Separable: the last dim first, then the others; a dim whose size is unchanged is left as is (as on CPU)."""
    nd = len(output_size)
    byte = x.dtype == np.uint8
    y = x.astype(jnp.int32) if byte else x
    for d in reversed(range(nd)):
        axis = y.ndim - nd + d
        if y.shape[axis] == output_size[d]:
            continue
        w = _aa_weights(output_size[d], y.shape[axis], align_corners, scales[d], np.float64 if byte else y.dtype)
        if byte:  # integer accumulation from half an ulp, shifted back and clamped: each pass stores uint8
            w, precision = _aa_int16_weights(w)
            y = jnp.moveaxis(jnp.tensordot(y, jnp.asarray(w), axes=[[axis], [1]]), -1, axis)
            y = jnp.clip((y + (1 << precision >> 1)) >> precision, 0, 255)
        else:
            y = jnp.moveaxis(jnp.tensordot(y, jnp.asarray(w), axes=[[axis], [1]], precision=HIGHEST), -1, axis)
    return y.astype(x.dtype)


def _byte_or_float(x, kernel: str) -> None:
    """CPU's NotImplementedError for integer inputs other than uint8 (its upsampling kernels
    dispatch on floats and uint8)."""
    if (jnp.issubdtype(x.dtype, jnp.integer) and x.dtype != jnp.uint8) or x.dtype == jnp.bool_:
        raise NotImplementedError(f"\"{kernel}\" not implemented for '{type_name(x.dtype)}'")


@lower(aten._upsample_bilinear2d_aa.default)
def upsample_bilinear2d_aa(self, output_size, align_corners, scales_h=None, scales_w=None):
    _byte_or_float(self, "compute_index_ranges_weights")
    return _upsample_aa(self, tuple(output_size), align_corners, (scales_h, scales_w))


@lower(aten._upsample_bilinear2d_aa_backward.default)
def upsample_bilinear2d_aa_backward(grad_output, output_size, input_size, align_corners, scales_h=None, scales_w=None):
    return _upsample_backward(
        lambda x: _upsample_aa(x, tuple(output_size), align_corners, (scales_h, scales_w)), grad_output, input_size
    )


@lower(aten.upsample_bicubic2d.default)
def upsample_bicubic2d(self, output_size, align_corners, scales_h=None, scales_w=None):
    _byte_or_float(self, "compute_indices_weights_cubic")
    return _upsample_cubic(to_opmath(self), tuple(output_size), align_corners, (scales_h, scales_w))


@lower(aten.upsample_bicubic2d_backward.default)
def upsample_bicubic2d_backward(grad_output, output_size, input_size, align_corners, scales_h=None, scales_w=None):
    return _upsample_backward(
        lambda x: _upsample_cubic(x, tuple(output_size), align_corners, (scales_h, scales_w)), grad_output, input_size
    )


@lower(aten._upsample_nearest_exact1d.default)
def upsample_nearest_exact1d(self, output_size, scales=None):
    _byte_or_float(self, "compute_indices_weights_nearest")
    return _upsample_nearest(self, tuple(output_size), (scales,), exact=True)


@lower(aten._upsample_nearest_exact2d.default)
def upsample_nearest_exact2d(self, output_size, scales_h=None, scales_w=None):
    _byte_or_float(self, "compute_indices_weights_nearest")
    return _upsample_nearest(self, tuple(output_size), (scales_h, scales_w), exact=True)


@lower(aten._upsample_nearest_exact3d.default)
def upsample_nearest_exact3d(self, output_size, scales_d=None, scales_h=None, scales_w=None):
    _byte_or_float(self, "compute_indices_weights_nearest")
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
    _byte_or_float(self, "compute_indices_weights_nearest")
    return _upsample_nearest(self, tuple(output_size), (scales,))


@lower(aten.upsample_nearest2d.default)
def upsample_nearest2d(self, output_size, scales_h=None, scales_w=None):
    _byte_or_float(self, "compute_indices_weights_nearest")
    return _upsample_nearest(self, tuple(output_size), (scales_h, scales_w))


@lower(aten.upsample_nearest3d.default)
def upsample_nearest3d(self, output_size, scales_d=None, scales_h=None, scales_w=None):
    _byte_or_float(self, "compute_indices_weights_nearest")
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
    _byte_or_float(self, "compute_indices_weights_linear")
    return _upsample_linear(to_opmath(self), tuple(output_size), align_corners, (scales,))


@lower(aten.upsample_bilinear2d.default)
def upsample_bilinear2d(self, output_size, align_corners, scales_h=None, scales_w=None):
    _byte_or_float(self, "compute_indices_weights_linear")
    return _upsample_linear(to_opmath(self), tuple(output_size), align_corners, (scales_h, scales_w))


@lower(aten.upsample_trilinear3d.default)
def upsample_trilinear3d(self, output_size, align_corners, scales_d=None, scales_h=None, scales_w=None):
    _byte_or_float(self, "compute_indices_weights_linear")
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


def _gather(input, *indices):
    """input[n, :, *indices] with zeros outside; each index (N, *out) integer, one per spatial dim."""
    inside = True
    clipped = []
    for i, size in zip(indices, input.shape[2:]):
        inside = inside & (i >= 0) & (i < size)
        clipped.append(jnp.clip(i, 0, size - 1))
    n = jnp.arange(input.shape[0]).reshape((-1,) + (1,) * (indices[0].ndim - 1))
    v = input[(n, slice(None), *clipped)]  # (N, *out, C)
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
                v = _gather(input, py.astype(jnp.int32), px.astype(jnp.int32))
                out = out + v * (wy[i] * wx[j])[:, None]
        return out
    gx = _pad_coord(gx, W, padding_mode, align_corners)
    gy = _pad_coord(gy, H, padding_mode, align_corners)
    if interpolation_mode == _NEAREST:
        return _gather(input, jnp.round(gy).astype(jnp.int32), jnp.round(gx).astype(jnp.int32))
    x0, y0 = jnp.floor(gx), jnp.floor(gy)
    tx, ty = gx - x0, gy - y0
    x0i, y0i = x0.astype(jnp.int32), y0.astype(jnp.int32)
    out = 0
    for dy, wy in ((0, 1 - ty), (1, ty)):
        for dx, wx in ((0, 1 - tx), (1, tx)):
            out = out + _gather(input, y0i + dy, x0i + dx) * (wy * wx)[:, None]
    return out


@lower(aten.grid_sampler_2d.default)
def grid_sampler_2d(input, grid, interpolation_mode, padding_mode, align_corners):
    return _grid_sample(to_opmath(input), to_opmath(grid), interpolation_mode, padding_mode, align_corners)


def _sampler_backward(sample, grad_output, input, grid, output_mask):
    """(grad_input, grad_grid) of `sample(input, grid)`, the outputs output_mask asks for."""
    _, vjp = jax.vjp(sample, to_opmath(input), to_opmath(grid))
    grad_input, grad_grid = vjp(to_opmath(grad_output))
    return grad_input if output_mask[0] else None, grad_grid if output_mask[1] else None


@lower(aten.grid_sampler_2d_backward.default)
def grid_sampler_2d_backward(grad_output, input, grid, interpolation_mode, padding_mode, align_corners, output_mask):
    def sample(x, g):
        return _grid_sample(x, g, interpolation_mode, padding_mode, align_corners)

    return _sampler_backward(sample, grad_output, input, grid, output_mask)


def _grid_sample_3d(input, grid, interpolation_mode, padding_mode, align_corners):
    """Trilinear or nearest sampling of (N, C, D, H, W) at grid's (x, y, z) points (CPU has no
    bicubic in 3-D)."""
    sizes = input.shape[-3:]
    gz, gy, gx = (
        _pad_coord(_unnormalize(grid[..., axis], size, align_corners), size, padding_mode, align_corners)
        for axis, size in zip((2, 1, 0), sizes)
    )
    if interpolation_mode == _NEAREST:
        return _gather(input, *(jnp.round(g).astype(jnp.int32) for g in (gz, gy, gx)))
    z0, y0, x0 = jnp.floor(gz), jnp.floor(gy), jnp.floor(gx)
    tz, ty, tx = gz - z0, gy - y0, gx - x0
    z0i, y0i, x0i = (v.astype(jnp.int32) for v in (z0, y0, x0))
    out = 0
    for dz, wz in ((0, 1 - tz), (1, tz)):
        for dy, wy in ((0, 1 - ty), (1, ty)):
            for dx, wx in ((0, 1 - tx), (1, tx)):
                out = out + _gather(input, z0i + dz, y0i + dy, x0i + dx) * (wz * wy * wx)[:, None]
    return out


@lower(aten.grid_sampler_3d.default)
def grid_sampler_3d(input, grid, interpolation_mode, padding_mode, align_corners):
    if interpolation_mode == _BICUBIC:
        raise RuntimeError("grid_sampler(): bicubic interpolation only supports 4D input")
    return _grid_sample_3d(to_opmath(input), to_opmath(grid), interpolation_mode, padding_mode, align_corners)


@lower(aten.grid_sampler_3d_backward.default)
def grid_sampler_3d_backward(grad_output, input, grid, interpolation_mode, padding_mode, align_corners, output_mask):
    def sample(x, g):
        return _grid_sample_3d(x, g, interpolation_mode, padding_mode, align_corners)

    return _sampler_backward(sample, grad_output, input, grid, output_mask)
