"""Tensor geometry: how a tpu tensor's (sizes, strides, offset) reads from and
writes to its storage buffer, traced inside the op's jitted function.

A buffer is flat (storage-sized, 1-D), or, for a tensor that is its whole
storage, has the tensor's own shape: where buffers are shaped
(platforms.shaped_buffers(): on TPU, where a reshape between a flat and an N-D
array is a copy through HBM), and how a sharded buffer keeps its per-dim
sharding (torch_tpu.distributed). The buffer's shape is part of every key."""

from __future__ import annotations

import math
from typing import NamedTuple

import jax.numpy as jnp
import numpy as np
from jax import lax


class Geometry(NamedTuple):
    sizes: tuple[int, ...]
    strides: tuple[int, ...]
    offset: int
    dtype: np.dtype  # the tensor's element type
    buffer_dtype: np.dtype  # the buffer's element type
    buffer_shape: tuple[int, ...]  # flat (elements,), or the shape of the tensor that wrote it

    @property
    def numel(self) -> int:
        return math.prod(self.sizes)

    @property
    def buffer_len(self) -> int:
        """Elements in the buffer."""
        return math.prod(self.buffer_shape)

    @property
    def is_whole(self) -> bool:
        """True when the tensor is its whole buffer, in row-major order."""
        return (
            self.offset == 0
            and self.dtype == self.buffer_dtype
            and self.numel == self.buffer_len
            and is_contiguous(self.sizes, self.strides)
        )


def is_contiguous(sizes: tuple[int, ...], strides: tuple[int, ...]) -> bool:
    expected = 1
    for size, stride in zip(reversed(sizes), reversed(strides)):
        if size != 1 and stride != expected:
            return False
        expected *= size
    return True


def contiguous_strides(sizes: tuple[int, ...]) -> tuple[int, ...]:
    """Row-major strides of `sizes`."""
    strides, step = [], 1
    for size in reversed(sizes):
        strides.append(step)
        step *= max(size, 1)
    return tuple(reversed(strides))


def dense_order(sizes: tuple, strides: tuple) -> tuple[int, ...] | None:
    """The dims of a dense, non-overlapping but non-contiguous layout (channels_last, a
    transpose) outermost first: its buffer is the value transposed to that order. None
    for a contiguous layout, or one that overlaps or has gaps (laid out contiguous)."""
    if not all(isinstance(v, int) for v in (*sizes, *strides)) or is_contiguous(sizes, strides):
        return None
    order = tuple(sorted(range(len(sizes)), key=lambda d: -strides[d]))
    if math.prod(sizes) == 0:
        return order
    expected = 1
    for d in reversed(order):
        if sizes[d] != 1 and strides[d] != expected:
            return None
        expected *= sizes[d]
    return order


def storage_elements(geom: Geometry) -> int:
    """Elements of geom.dtype the view needs from the start of storage."""
    if geom.numel == 0:
        return 0
    return geom.offset + 1 + sum((s - 1) * st for s, st in zip(geom.sizes, geom.strides))


def _reinterpret(buf: jnp.ndarray, dtype: np.dtype) -> jnp.ndarray:
    """Bit-level reinterpretation of a flat buffer as another element type."""
    if buf.dtype == dtype:
        return buf
    if jnp.issubdtype(buf.dtype, jnp.complexfloating):
        # complex -> interleaved (real, imag) floats, then on as a float buffer.
        buf = jnp.stack([jnp.real(buf), jnp.imag(buf)], axis=-1).reshape(-1)
        return _reinterpret(buf, dtype)
    if jnp.issubdtype(dtype, jnp.complexfloating):
        parts = _reinterpret(buf, np.dtype(np.float32 if dtype == np.complex64 else np.float64))
        parts = parts[: parts.size // 2 * 2].reshape(-1, 2)
        flat = lax.complex(parts[:, 0], parts[:, 1])
        # complex128 stays flat where it is built: XLA:TPU moved the view's reshape before the
        # complex op, whose float64-pair emitter then failed on the two layouts it got (7b3f6d2)
        return lax.optimization_barrier(flat) if dtype == np.complex128 else flat
    if buf.dtype == np.bool_:
        buf = buf.astype(np.uint8)
    target = np.dtype(np.uint8) if dtype == np.bool_ else dtype
    src, dst = np.dtype(buf.dtype).itemsize, np.dtype(target).itemsize
    if src > dst:
        buf = lax.bitcast_convert_type(buf, target).reshape(-1)
    elif src < dst:
        ratio = dst // src
        usable = (buf.size // ratio) * ratio
        buf = lax.bitcast_convert_type(buf[:usable].reshape(-1, ratio), target)
    else:
        buf = lax.bitcast_convert_type(buf, target)
    return buf != 0 if dtype == np.bool_ else buf


def _as_dtype(buf: jnp.ndarray, dtype: np.dtype, needed: int) -> jnp.ndarray:
    """The buffer, flattened, as `dtype`, padded with zeros to at least `needed` elements."""
    buf = _reinterpret(buf.reshape(-1), dtype)
    if buf.size < needed:
        buf = jnp.concatenate([buf, jnp.zeros(needed - buf.size, dtype)])
    return buf


def _flat_indices(geom: Geometry) -> jnp.ndarray:
    index_dtype = np.int32 if storage_elements(geom) < 2**31 else np.int64
    idx = jnp.full(geom.sizes, geom.offset, dtype=index_dtype)
    for dim, (size, stride) in enumerate(zip(geom.sizes, geom.strides)):
        if size > 1 and stride != 0:
            idx = idx + lax.broadcasted_iota(index_dtype, geom.sizes, dim) * stride
    return idx


def _permuted_block(geom: Geometry):
    """If the view is a permutation (plus broadcasts) of a contiguous block,
    returns (block sizes, permutation back to the view, broadcast dims)."""
    dims = [d for d, s in enumerate(geom.sizes) if s != 1 and geom.strides[d] != 0]
    order = sorted(dims, key=lambda d: -geom.strides[d])
    expected = 1
    for d in reversed(order):
        if geom.strides[d] != expected:
            return None
        expected *= geom.sizes[d]
    return order


class _Grid(NamedTuple):
    """A strided view as a slice of a reshaped window of the buffer: the window
    flat[offset : offset + length] reshaped to `shape` holds the view's elements at
    [0:sizes[order[0]], 0:sizes[order[1]], ..., 0:1] (dims in `order`: outermost first)."""

    order: tuple[int, ...]  # the view's dims of size > 1 and stride != 0, by stride, largest first
    shape: tuple[int, ...]  # the window's shape: (size of order[0], stride ratios..., innermost stride)
    length: int  # elements in the window


def _grid(geom: Geometry) -> _Grid | None:
    """The view as a window slice (reshape + slice: what TPUs copy fast, where a gather is
    slow), or None for a layout whose strides do not nest (an overlapping view, unfold)."""
    order = tuple(
        sorted((d for d, s in enumerate(geom.sizes) if s != 1 and geom.strides[d] != 0), key=lambda d: -geom.strides[d])
    )
    if not order:
        return _Grid((), (1,), 1)
    strides = [geom.strides[d] for d in order]
    sizes = [geom.sizes[d] for d in order]
    for i in range(len(order) - 1):
        if strides[i] % strides[i + 1] or strides[i] < strides[i + 1] * sizes[i + 1]:
            return None
    shape = (sizes[0], *(strides[i] // strides[i + 1] for i in range(len(order) - 1)), strides[-1])
    return _Grid(order, shape, sizes[0] * strides[0])


def _window(flat: jnp.ndarray, geom: Geometry, grid: _Grid) -> jnp.ndarray:
    """flat[offset : offset + grid.length] (zero-padded past the buffer's end), as grid.shape."""
    end = geom.offset + grid.length
    if end > flat.size:
        flat = jnp.concatenate([flat, jnp.zeros(end - flat.size, flat.dtype)])
    return lax.slice(flat, (geom.offset,), (end,)).reshape(grid.shape)


def _grid_limits(geom: Geometry, grid: _Grid) -> tuple[int, ...]:
    return (*(geom.sizes[d] for d in grid.order), 1)


def _to_view(value: jnp.ndarray, geom: Geometry, order) -> jnp.ndarray:
    """`value` with dims `order` (outermost first) moved to their view positions and the view's
    other dims (size 1, or stride 0) broadcast."""
    positions = sorted(order)
    value = lax.transpose(value, [order.index(p) for p in positions])
    return lax.broadcast_in_dim(value, geom.sizes, positions)


class _Box(NamedTuple):
    """A view as a box of a shaped buffer of its rank: buf[starts : starts + sizes * steps : steps]."""

    starts: tuple[int, ...]
    steps: tuple[int, ...]


def _box(buf_shape: tuple[int, ...], geom: Geometry) -> _Box | None:
    """The view as a strided slice of the shaped buffer (no copy to a flat layout: on TPU a
    reshape between shapes is a relayout), or None."""
    if len(buf_shape) != len(geom.sizes) or len(buf_shape) < 2 or geom.dtype != geom.buffer_dtype or geom.numel == 0:
        return None
    starts, steps, rest = [], [], geom.offset
    for size, stride, step_of_dim, n in zip(geom.sizes, geom.strides, contiguous_strides(buf_shape), buf_shape):
        start, rest = divmod(rest, step_of_dim)
        step = 1 if size == 1 else stride // step_of_dim
        if step < 1 or (size != 1 and stride % step_of_dim) or start + (size - 1) * step >= n:
            return None
        starts.append(start)
        steps.append(step)
    return _Box(tuple(starts), tuple(steps)) if rest == 0 else None


def _from_shaped(buf: jnp.ndarray, geom: Geometry) -> jnp.ndarray | None:
    """The view read straight from a shaped buffer (a transpose of it, or a box), or None."""
    order = dense_order(geom.sizes, geom.strides)
    if (
        order is not None
        and geom.offset == 0
        and geom.dtype == geom.buffer_dtype
        and tuple(buf.shape) == tuple(geom.sizes[d] for d in order)
    ):
        return lax.transpose(buf, [order.index(d) for d in range(len(order))])
    box = _box(tuple(buf.shape), geom)
    if box is None:
        return None
    limits = [s + (n - 1) * st + 1 for s, n, st in zip(box.starts, geom.sizes, box.steps)]
    return lax.slice(buf, box.starts, limits, box.steps)


def read(buf: jnp.ndarray, geom: Geometry) -> jnp.ndarray:
    """The view's value, traced: a reshape, a transpose or slice of a shaped buffer, a
    slice/transpose/broadcast, a slice of a reshaped window of the buffer, or (overlapping
    strides) a gather."""
    if geom.is_whole:
        return buf.reshape(geom.sizes)
    if buf.ndim > 1:
        value = _from_shaped(buf, geom)
        if value is not None:
            return value
    flat = _as_dtype(buf, geom.dtype, storage_elements(geom))
    if geom.numel == 0:
        return jnp.zeros(geom.sizes, geom.dtype)
    order = _permuted_block(geom)
    if order is not None:
        block = math.prod(geom.sizes[d] for d in order)
        value = lax.slice(flat, (geom.offset,), (geom.offset + block,))
        return _to_view(value.reshape([geom.sizes[d] for d in order]), geom, order)
    grid = _grid(geom)
    if grid is not None:
        value = lax.slice(_window(flat, geom, grid), (0,) * len(grid.shape), _grid_limits(geom, grid))
        return _to_view(value.reshape(_grid_limits(geom, grid)[:-1]), geom, list(grid.order))
    return flat[_flat_indices(geom)]


def write(buf: jnp.ndarray, geom: Geometry, value: jnp.ndarray, shaped: bool = False) -> jnp.ndarray:
    """The new buffer after writing `value` into the view, traced; it keeps the buffer's shape
    where its size and dtype allow (else it is flat), except that with `shaped`
    (platforms.shaped_buffers()) a flat buffer written whole takes the value's shape."""
    value = value.astype(geom.dtype)
    if geom.is_whole:
        return value if shaped and buf.ndim == 1 else value.reshape(buf.shape)
    box = _box(tuple(buf.shape), geom) if buf.ndim > 1 else None
    if box is not None and all(st == 1 for st in box.steps):  # a box of a shaped buffer: updated in place
        return lax.dynamic_update_slice(buf, value, box.starts)
    flat = _as_dtype(buf, geom.dtype, storage_elements(geom))
    grid = None if geom.numel == 0 or is_contiguous(geom.sizes, geom.strides) else _grid(geom)
    if geom.numel == 0:
        new = flat
    elif is_contiguous(geom.sizes, geom.strides):
        new = lax.dynamic_update_slice(flat, value.reshape(-1), (geom.offset,))
    elif grid is not None and all(geom.strides[d] != 0 for d, n in enumerate(geom.sizes) if n > 1):
        new = _write_window(flat, geom, grid, value)
    else:
        new = flat.at[_flat_indices(geom).reshape(-1)].set(value.reshape(-1))
    if buf.ndim != 1 and new.dtype == buf.dtype and new.size == buf.size:
        return new.reshape(buf.shape)
    return new


def _write_window(flat: jnp.ndarray, geom: Geometry, grid: _Grid, value: jnp.ndarray) -> jnp.ndarray:
    """`flat` with the view's elements replaced by `value`, through the view's window (an update
    slice, not a scatter)."""
    limits = _grid_limits(geom, grid)
    value = lax.transpose(value.reshape([n for n in geom.sizes if n != 1] or [1]), _squeezed_order(geom, grid.order))
    window = lax.dynamic_update_slice(_window(flat, geom, grid), value.reshape(limits), (0,) * len(limits))
    size = flat.size
    if geom.offset + grid.length > size:  # the window ran past the buffer's end: back to its length
        flat = jnp.concatenate([flat, jnp.zeros(geom.offset + grid.length - size, flat.dtype)])
    return lax.dynamic_update_slice(flat, window.reshape(-1), (geom.offset,))[:size]


def _squeezed_order(geom: Geometry, order) -> list[int]:
    """The permutation taking the view's dims of size > 1 (in view order) to `order`."""
    kept = [d for d, n in enumerate(geom.sizes) if n != 1]
    return [kept.index(d) for d in order] if order else [0]


def check_no_internal_overlap(geom) -> None:
    """CPU's assert_no_internal_overlap: an expanded (stride-0) tensor cannot be written."""
    if any(size > 1 and stride == 0 for size, stride in zip(geom.sizes, geom.strides)):
        raise RuntimeError(
            "unsupported operation: more than one element of the written-to tensor refers to a single "
            "memory location. Please clone() the tensor before performing the operation."
        )
