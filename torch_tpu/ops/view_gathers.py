"""Small views gathered on the host instead of compiled into every op that reads them.

An op's executable is keyed by its inputs' geometry, and a view's geometry holds its storage
offset and its base's length. A view that moves each step (`input_ids[:, -1:]` of a growing
sequence) would compile every op that reads it, every step. When an op misses the cache for a
view of a geometry it has already compiled for at other offsets, the small view is copied
into a new contiguous tensor on the host (one transfer each way, no compile), and the op runs
on that: its executable for contiguous inputs is then found again. Counted as
`view_host_gathers`.
"""

from __future__ import annotations

import itertools

import jax
import numpy as np
import torch

from torch_tpu import _C, metrics
from torch_tpu.ops import geometry as geo
from torch_tpu.ops.dtypes import NUMPY_TO_TORCH
from torch_tpu.ops.tensors import buffer_of, tensor_geometry
from torch_tpu.runtime import client

# Views up to this many elements, of buffers up to MAX_BUFFER elements, are gathered.
MAX_ELEMENTS = 4096
MAX_BUFFER = 1 << 16

_seen: dict[tuple, set] = {}  # (op, signature with views reduced to (sizes, dtype)) -> view placements seen


def _row_major(t: torch.Tensor) -> bool:
    """Whether t's dims (of size > 1) lie in row-major order in memory. A contiguous copy keeps
    the layout ops give their results only then: clone or x + 1 of `x.t()` keep it transposed."""
    strides = [s for n, s in zip(t.shape, t.stride()) if n != 1]
    return all(a > b for a, b in itertools.pairwise(strides))


def _small_view(t: torch.Tensor):
    """(buffer, geometry) if t is a small plain view (not its whole buffer) we may gather, else None."""
    if t.is_conj() or t.is_neg() or t.numel() > MAX_ELEMENTS or not _row_major(t):
        return None
    buf = buffer_of(t)
    if buf.ndim != 1 or buf.size > MAX_BUFFER:
        return None
    geom = tensor_geometry(t, buf)
    if geom.is_whole or geom.buffer_dtype != geom.dtype:
        return None
    return buf, geom


def _shape_sig(sig) -> object:
    if isinstance(sig, geo.Geometry):
        return ("view", sig.sizes, sig.dtype)
    if isinstance(sig, tuple):
        return tuple(_shape_sig(s) for s in sig)
    return sig


def _placements(sig) -> list:
    found = []
    if isinstance(sig, geo.Geometry):
        found.append((sig.strides, sig.offset, sig.buffer_shape))
    elif isinstance(sig, tuple):
        for s in sig:
            found.extend(_placements(s))
    return found


def moving_views(op, sig: tuple) -> bool:
    """True if `op` already missed for views of this signature's sizes at other placements."""
    placements = tuple(_placements(sig))
    if not placements:
        return False
    seen = _seen.setdefault((op, _shape_sig(sig)), set())
    seen.add(placements)
    return len(seen) > 1


def gather(t: torch.Tensor) -> torch.Tensor | None:
    """A contiguous copy of the small view `t`, made on the host; None if `t` does not qualify."""
    found = _small_view(t)
    if found is None:
        return None
    buf, geom = found
    host = np.asarray(buf)
    itemsize = host.dtype.itemsize
    view = np.lib.stride_tricks.as_strided(
        host[geom.offset :], shape=geom.sizes, strides=[s * itemsize for s in geom.strides], writeable=False
    )
    value = jax.device_put(np.ascontiguousarray(view).reshape(-1), client.jax_device(t.device.index))
    metrics.bump("view_host_gathers")
    return _C._wrap(value, list(geom.sizes), NUMPY_TO_TORCH[geom.dtype], t.device.index)


def substitute(args: tuple, kwargs: dict, skip: set[int]) -> tuple[tuple, dict] | None:
    """args/kwargs with each small view (other than the tensors whose id is in `skip`) gathered;
    None if none was."""
    changed: list[bool] = []
    new_args = tuple(_swap(a, skip, changed) for a in args)
    new_kwargs = {k: _swap(v, skip, changed) for k, v in kwargs.items()}
    return (new_args, new_kwargs) if changed else None


def _swap(x, skip: set[int], changed: list[bool]):
    """`x` with its small views gathered (a recursive function, not a closure: no reference
    cycle); appends to `changed` for each."""
    if isinstance(x, torch.Tensor) and x.device.type == "tpu" and id(x) not in skip:
        copy = gather(x)
        if copy is None:
            return x
        changed.append(True)
        return copy
    if isinstance(x, (list, tuple)):
        return type(x)(_swap(v, skip, changed) for v in x)
    return x
