"""Length buckets for in-place random fills. `torch.empty(shape).uniform_()` (what torch.rand,
randn, randint and torch.testing.make_tensor do) on a small contiguous tensor draws into a buffer
of the next power-of-two length: one executable per (op, bucket, dtype, arguments) instead of
one per shape, each of which compiled before the op ran (random ops do not run on the host tier:
CPU's generator draws other numbers).

The tensor keeps its exact shape and storage; its buffer is longer, as a growing tensor's is
(ops/growing.py), and ops read it through its geometry. Its numbers are the first numel() of the
bucket's draw: the same seed gives the same numbers for a given shape. Counted in metrics as
"bucketed_random_fills". Not under lazy recording or SPMD placement (growing.active()).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import jax.numpy as jnp
import torch

from torch_tpu import _C, metrics
from torch_tpu.ops import growing, storage_locks
from torch_tpu.ops.dtypes import TORCH_TO_NUMPY
from torch_tpu.ops.registry import FrontPath
from torch_tpu.ops.rng import key_data, key_from_data
from torch_tpu.runtime import executable_cache

# Tensors up to this many elements are filled through a bucket (at most twice their memory).
MAX_ELEMENTS = 1 << 20

_FILLS: dict[str, Callable] = {}  # the lowering of each bucketed fill, by name
_valid: set = set()  # (fill, dtype, args, kwargs) whose meta kernel ran without an error


def _fillable(self) -> bool:
    """Whether `self` is a small tpu tensor laid out row-major over its whole storage."""
    if not isinstance(self, torch.Tensor) or self.device.type != "tpu" or self.dtype not in TORCH_TO_NUMPY:
        return False
    if not 0 < self.numel() <= MAX_ELEMENTS or not growing.active():
        return False
    if self.is_conj() or self.is_neg() or self.storage_offset() != 0 or not self.is_contiguous():
        return False
    return _C._buffer_offset(self) == 0 and self.untyped_storage().nbytes() == self.numel() * self.element_size()


def _static(value) -> bool:
    return value is None or isinstance(value, (bool, int, float))


@functools.partial(executable_cache.jit, static_argnames=("fill", "capacity", "dtype", "args", "kwargs"))
def _draw(data, fill, capacity, dtype, args, kwargs):
    """`capacity` numbers of fill `fill` as a flat array of `dtype`, drawn with the key of `data`
    (a row of rng.key_data: a uint32 array keys the persistent cache, a jax key array would not)."""
    blank = jnp.zeros((capacity,), dtype)  # the lowering reads only its shape and dtype
    key = key_from_data(data)
    return jnp.asarray(_FILLS[fill](blank, *args, rng=key, **dict(kwargs))).astype(dtype).reshape(-1)


def _meta_accepts(op, name: str, self: torch.Tensor, args: tuple, kwargs: tuple) -> bool:
    """Whether `op`'s meta kernel takes the call (once per dtype and arguments); a call it
    rejects takes the op's own path, which raises CPU's error."""
    key = (name, self.dtype, args, kwargs)
    if key not in _valid:
        try:
            op(torch.empty(0, dtype=self.dtype, device="meta"), *args, **dict(kwargs))
        except Exception:
            return False
        _valid.add(key)
    return True


def _complex_fill(self) -> bool:
    return isinstance(self, torch.Tensor) and self.device.type == "tpu" and self.is_complex() and not self.is_conj()


def bucketed(fn: Callable, op, complex_parts: Callable | None = None) -> FrontPath:
    """The front path of in-place random fill `fn`, the lowering of `op` (it reads only self's
    shape and dtype, with Python-number arguments): calls on a fillable tensor draw through a
    bucket. `complex_parts(parts, *args, generator=, **kwargs)`, if given, fills a complex
    tensor as CPU defines it, through its real view (`torch.view_as_real`): its parts are drawn
    as real numbers, and no executable draws complex numbers (on XLA:TPU, drawing complex128
    parts and joining them in one program aborts the compile)."""
    name = f"{fn.__module__}.{fn.__qualname__}"
    _FILLS[name] = fn

    def takes(self, *args, generator=None, **kwargs) -> bool:
        if complex_parts is not None and _complex_fill(self):
            return True
        return _fillable(self) and all(_static(v) for v in (*args, *kwargs.values()))

    def run(self, *args, generator=None, **kwargs):
        if complex_parts is not None and _complex_fill(self):
            complex_parts(torch.view_as_real(self), *args, generator=generator, **kwargs)
            return self
        statics = tuple(sorted(kwargs.items()))
        if not takes(self, *args, **kwargs) or not _meta_accepts(op, name, self, args, statics):
            return None
        device = self.device.index
        data = key_data(generator, device, 1)[0]
        capacity = growing.bucket(self.numel())
        dtype = TORCH_TO_NUMPY[self.dtype]
        flat = _draw(data, name, capacity, dtype, args, statics)
        with storage_locks.held([self]):
            _C._set_buffer(self, flat, self.dtype, capacity)  # the buffer is longer than the storage
        metrics.bump("bucketed_random_fills")
        metrics.bump("executions")
        return self

    return FrontPath(takes, run)
