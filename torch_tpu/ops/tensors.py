"""Tpu tensors as jax arrays: a tensor's buffer and geometry, reading it as an array, writing
an array into it, wrapping an array as a new tensor."""

from __future__ import annotations

import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
import torch

from torch_tpu import _C, metrics, platforms
from torch_tpu.device import memory
from torch_tpu.ops import geometry as geo
from torch_tpu.ops import spmd, storage_locks
from torch_tpu.ops.dtypes import NUMPY_TO_TORCH, to_numpy_dtype
from torch_tpu.ops.geometry import check_no_internal_overlap
from torch_tpu.runtime import client, executable_cache

# Set by torch_tpu/compile/lazy.py while ops are recorded lazily (its _Recorder): the dispatcher
# records ops through it, and from_jax/write_jax record eager lowerings' pending values.
lazy = None


def buffer_of(t: torch.Tensor, recorded: bool = False) -> jax.Array:
    """The flat buffer behind a tpu tensor; unwritten storage becomes zeros. `recorded`: an op
    being recorded lazily reads it, so while ops are recorded the zeros are a pending value made
    inside the trace (an optimizer's state creation: no zeros executable per parameter size)."""
    buf = _C._get_buffer(t)
    if buf is None:
        with storage_locks.held((t,)):  # another thread may be writing it first
            buf = _C._get_buffer(t)
            if buf is None:
                n = _C._buffer_nbytes(t) // t.element_size()  # a storage slice's parent's whole buffer
                dtype = to_numpy_dtype(t.dtype)
                if recorded and lazy is not None:
                    buf = lazy.zeros(n, dtype, t.device.index)
                else:
                    buf = _zeros(n, dtype, t.device.index)
                _C._set_buffer(t, buf, t.dtype, n)
    return buf


@functools.cache
def _zeros_fn(n: int, dtype: np.dtype, device: int) -> Callable:
    sharding = jax.sharding.SingleDeviceSharding(client.jax_device(device))
    return executable_cache.jit(
        lambda: jnp.zeros(n, dtype), name="zeros", key=(n, np.dtype(dtype).name, device), out_shardings=sharding
    )


def _zeros(n: int, dtype: np.dtype, device: int) -> jax.Array:
    """Zeros made on the device (no host buffer, no transfer)."""
    nbytes = n * np.dtype(dtype).itemsize
    with memory.out_of_memory_as_torch(device, "materializing a never-written tensor's storage", nbytes):
        return _zeros_fn(n, dtype, device)()


def tensor_geometry(t: torch.Tensor, buf: jax.Array):
    dtype = to_numpy_dtype(t.dtype)
    return geo.Geometry(tuple(t.shape), tuple(t.stride()), _offset(t), dtype, buf.dtype, tuple(buf.shape))


def known_geometry(t: torch.Tensor) -> geo.Geometry:
    """`tensor_geometry` without reading the buffer where its dtype and length are known (a
    value the host tier made stays on the host)."""
    dtype, shape = _C._buffer_spec(t)
    if dtype is None:
        return tensor_geometry(t, buffer_of(t))
    return geo.Geometry(
        tuple(t.shape), tuple(t.stride()), _offset(t), to_numpy_dtype(t.dtype), to_numpy_dtype(dtype), shape
    )


def abstract_buffer(g: geo.Geometry, device: int) -> jax.ShapeDtypeStruct:
    """What the buffer of geometry `g` on tpu device `device` is to jax, without the buffer."""
    sharding = jax.sharding.SingleDeviceSharding(client.jax_device(device))
    return jax.ShapeDtypeStruct(g.buffer_shape, g.buffer_dtype, sharding=sharding)


def _offset(t: torch.Tensor) -> int:
    """`t`'s offset in elements into its buffer: a storage slice starts part-way into its parent's."""
    start = _C._buffer_offset(t)
    if start == 0:
        return t.storage_offset()
    itemsize = t.element_size()
    if start % itemsize:
        raise RuntimeError(
            f"a {t.dtype} tensor on a storage starting {start} bytes into its tpu buffer is misaligned "
            f"(the offset must be a multiple of {itemsize} bytes)"
        )
    return t.storage_offset() + start // itemsize


def from_jax(array: jax.Array, device: int, dtype: torch.dtype | None = None) -> torch.Tensor:
    """A new tpu tensor holding `array` (used by eager lowerings)."""
    if dtype is None:
        dtype = NUMPY_TO_TORCH[np.dtype(array.dtype)]
    if lazy is not None and lazy.pending(array):
        return lazy.wrap(array, device, dtype)
    if array.dtype != to_numpy_dtype(dtype):
        array = array.astype(to_numpy_dtype(dtype))
    sharded = spmd.layer is not None and len(array.sharding.device_set) > 1
    buf = array if sharded else reshape(array, (-1,))  # a sharded array keeps its shape
    return _C._wrap(buf, list(array.shape), dtype, device)


_read_jit_cache: dict = {}


@functools.cache
def _reshaper(shape: tuple[int, ...]) -> Callable:
    return executable_cache.jit(lambda a: a.reshape(shape), name="reshape", key=shape)


def reshape(array: jax.Array, shape: tuple[int, ...]) -> jax.Array:
    """`array.reshape(shape)` through a cached executable: eager jnp reshapes cost ~5x more."""
    if tuple(array.shape) == tuple(shape):
        return array
    return _reshaper(tuple(shape))(array)


def math_bits(t: torch.Tensor) -> tuple[bool, bool]:
    """(conj bit, neg bit) of a tensor: its value is its buffer's, conjugated and/or negated."""
    return t.is_conj(), t.is_neg()


def apply_bits(value: jax.Array, conj: bool, neg: bool) -> jax.Array:
    """A buffer's value read through (or written back through) the bits: each is its own inverse."""
    if conj:
        value = jnp.conj(value)
    if neg:
        value = -value
    return value


@functools.cache
def _bits_fn(conj: bool, neg: bool) -> Callable:
    return executable_cache.jit(lambda a: apply_bits(a, conj, neg), name="math_bits", key=(conj, neg))


def _through_bits(t: torch.Tensor, value: jax.Array) -> jax.Array:
    conj, neg = math_bits(t)
    if not (conj or neg):
        return value
    if lazy is not None and lazy.pending(value):  # rare: run the pending value, then apply the bits
        value = lazy.concrete([value])[0]
    metrics.bump("executions")
    return _bits_fn(conj, neg)(value)


def to_jax(t: torch.Tensor) -> jax.Array:
    """The value of a tpu tensor as a jax array of its shape (eager lowerings); a conj or neg
    view reads as CPU reads it, conjugated or negated."""
    buf = buffer_of(t)
    g = tensor_geometry(t, buf)
    if g.is_whole:
        return _through_bits(t, reshape(buf, g.sizes))
    fn = _read_jit_cache.get(g)
    if fn is None:
        fn = _read_jit_cache[g] = executable_cache.jit(lambda b, g=g: geo.read(b, g), name="read", key=g)
    metrics.bump("executions")
    return _through_bits(t, fn(buf))


def elements(t: torch.Tensor) -> jax.Array:
    """The elements of a tpu tensor in row-major order, as a jax array of any shape: the buffer
    itself where the tensor is all of it (no reshape runs), else to_jax(t)."""
    buf = buffer_of(t)
    if tensor_geometry(t, buf).is_whole and math_bits(t) == (False, False):
        return buf
    return to_jax(t)


def write_jax(t: torch.Tensor, value: jax.Array) -> None:
    """Writes `value` into the tpu tensor `t` (a view writes through to its base; a conj or
    neg view stores the value conjugated or negated, so that it reads back as `value`)."""
    with storage_locks.held((t,)):  # the base's read and swap, atomic
        _write_jax(t, _through_bits(t, value))


def _write_jax(t: torch.Tensor, value: jax.Array) -> None:
    if lazy is not None and lazy.pending(value):
        return lazy.write(t, value)
    buf = buffer_of(t)
    g = tensor_geometry(t, buf)
    if g.is_whole and value.dtype == g.dtype and tuple(value.shape) == g.sizes:
        if buf.ndim != 1 or not platforms.shaped_buffers():
            value = reshape(value, buf.shape)
        _C._set_buffer(t, value if spmd.layer is None else spmd.layer.keep_layout(buf, value), t.dtype, g.numel)
        return
    check_no_internal_overlap(g)
    if spmd.layer is not None:
        pair = [buf, value]
        spmd.layer.place_inputs(pair, [])
        buf, value = pair
    shaped = platforms.shaped_buffers()
    key = ("write", g, value.shape, value.dtype, shaped)
    fn = _read_jit_cache.get(key)
    if fn is None:
        fn = _read_jit_cache[key] = executable_cache.jit(
            lambda b, v, g=g, s=shaped: geo.write(b, g, jnp.broadcast_to(v, g.sizes), s),
            name="write",
            key=(g, shaped),
        )
    metrics.bump("executions")
    new = fn(buf, value)
    if spmd.layer is not None:
        new = spmd.layer.keep_layout(buf, new)
    _C._set_buffer(t, new, t.dtype, new.size)
