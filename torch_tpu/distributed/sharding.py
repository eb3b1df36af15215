"""mark_sharding: a tpu tensor's buffer becomes a jax array laid out over a Mesh.

SPMD, as in torch_xla (one process, or every process after torch_tpu.distributed.initialize(),
each placing the shards on its own devices): the tensor stays one tensor of its global
shape; its storage's buffer is an N-D jax array with a NamedSharding. Every op
on it runs one jitted computation over the mesh's devices, and XLA's sharding
propagation (GSPMD) picks the outputs' shardings and inserts the collectives
(e.g. the all-reduce of a weight gradient whose batch dim was sharded).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import jax
import numpy as np
import torch
from jax.sharding import NamedSharding, PartitionSpec

from torch_tpu import _C, debug
from torch_tpu.distributed import multihost
from torch_tpu.distributed.mesh import Mesh
from torch_tpu.ops import op_entries, spmd, tensors
from torch_tpu.ops.dtypes import NUMPY_TO_TORCH

SpecEntry = str | Sequence[str] | None


def _normalize_spec(tensor: torch.Tensor, mesh: Mesh, spec: Sequence[SpecEntry]) -> tuple:
    spec = tuple(spec)
    if len(spec) != tensor.dim():
        raise ValueError(f"sharding spec {spec} has {len(spec)} entries for a tensor with {tensor.dim()} dims")
    used: set[str] = set()
    out = []
    for dim, entry in enumerate(spec):
        if entry is None:
            out.append(None)
            continue
        names = (entry,) if isinstance(entry, str) else tuple(entry)
        for name in names:
            if not isinstance(name, str) or name not in mesh.axis_names:
                raise ValueError(
                    f"sharding spec {spec} names unknown mesh axis {name!r}; the mesh has {mesh.axis_names}"
                )
            if name in used:
                raise ValueError(f"sharding spec {spec} uses mesh axis {name!r} twice")
            used.add(name)
        ways = math.prod(mesh.size(n) for n in names)
        if tensor.shape[dim] % ways:
            raise ValueError(
                f"dim {dim} of size {tensor.shape[dim]} is not divisible by {ways}, the size of mesh axis "
                f"{names if len(names) > 1 else names[0]!r}"
            )
        out.append(names[0] if len(names) == 1 else names)
    return tuple(out)


def mark_sharding(tensor: torch.Tensor, mesh: Mesh, spec: Sequence[SpecEntry]) -> torch.Tensor:
    """Lays `tensor` out over `mesh`, in place: dim i is split over the mesh axis (or axes) `spec[i]`,
    or replicated where `spec[i]` is None. Returns `tensor`."""
    if not isinstance(tensor, torch.Tensor) or tensor.device.type != "tpu":
        raise ValueError(f"mark_sharding needs a tpu tensor, got {getattr(tensor, 'device', type(tensor))}")
    if not isinstance(mesh, Mesh):
        raise TypeError(f"mark_sharding needs a torch_tpu.distributed.Mesh, got {type(mesh).__name__}")
    spec = _normalize_spec(tensor, mesh, spec)
    whole = _C._buffer_nbytes(tensor) == tensor.numel() * tensor.element_size()  # not on a storage slice
    if tensor.storage_offset() != 0 or not tensor.is_contiguous() or not whole:
        raise ValueError("mark_sharding needs a contiguous tensor that is its whole storage (not a view); clone() it")
    value = tensors.to_jax(tensor)
    array = multihost.place(value, NamedSharding(mesh.jax_mesh, PartitionSpec(*spec)))
    _C._set_buffer(tensor, array, tensor.dtype, tensor.numel())
    spmd.install(_hooks)
    if debug.enabled():
        debug.log("sharding", f"{tuple(tensor.shape)} {tensor.dtype} over {mesh} as {spec}")
    return tensor


def sharding_of(tensor: torch.Tensor) -> jax.sharding.Sharding:
    """The jax sharding of a tpu tensor's buffer."""
    return tensors.buffer_of(tensor).sharding


def sharding_spec(tensor: torch.Tensor) -> tuple | None:
    """Per dim, the mesh axis (or axes, or None) it is split over; None for a tensor on one device."""
    buf = tensors.buffer_of(tensor)
    if len(buf.sharding.device_set) == 1:
        return None
    if buf.shape != tuple(tensor.shape):  # a view, or a reshaped whole buffer: as XLA lays out its read
        buf = tensors.to_jax(tensor)
    sharding = buf.sharding
    if not isinstance(sharding, NamedSharding):
        raise ValueError(f"the tensor's buffer is laid out as {sharding}, not by tensor dim")
    spec = tuple(sharding.spec) + (None,) * (tensor.dim() - len(sharding.spec))
    return tuple(
        s[0] if isinstance(s, tuple) and len(s) == 1 else (tuple(s) if isinstance(s, tuple) else s) for s in spec
    )


def _tpu_tensors(bound: list, out: list) -> None:
    """The call's inputs in op_entries.Call.walk order: a tpu tensor, or None for other inputs."""
    for x in bound:
        if isinstance(x, op_entries.WrappedNumber):
            out.append(None)
        elif isinstance(x, torch.Tensor):
            out.append(x if x.device.type == "tpu" else None)
        elif isinstance(x, (list, tuple)):
            _tpu_tensors(x, out)


def _place_inputs(inputs: list, bound: list) -> None:
    """A call mixing sharded and single-device buffers (a factory's output, a fresh host copy)
    runs over the mesh: the single-device buffers are replicated onto it, for good."""
    multihost.before_program()
    mesh_sharding = None
    single = []
    for i, a in enumerate(inputs):
        if isinstance(a, jax.Array):
            sharding = a.sharding
            if len(sharding.device_set) > 1:
                if mesh_sharding is None:
                    mesh_sharding = sharding
            elif a.committed:
                single.append(i)
    if mesh_sharding is None or not single:
        return
    if isinstance(mesh_sharding, NamedSharding):
        replicated = NamedSharding(mesh_sharding.mesh, PartitionSpec())
    else:
        grid = np.empty(len(mesh_sharding.device_set), dtype=object)
        grid[:] = sorted(mesh_sharding.device_set, key=lambda d: d.id)
        replicated = NamedSharding(jax.sharding.Mesh(grid, ("all",)), PartitionSpec())
    tensors: list = []
    _tpu_tensors(bound, tensors)
    for i in single:
        a = inputs[i]
        placed = multihost.place(a, replicated)
        inputs[i] = placed
        t = tensors[i] if i < len(tensors) else None
        if t is not None:
            _C._set_buffer(t.untyped_storage(), placed, NUMPY_TO_TORCH[np.dtype(a.dtype)], a.size)
        if debug.enabled():
            debug.log("sharding", f"replicated a single-device {tuple(a.shape)} input onto the mesh")


def _keep_layout(old: jax.Array | None, new: jax.Array) -> jax.Array:
    """A write into a sharded tensor keeps its sharding, as mark_sharding left it: XLA may
    pick another layout for an op's output (e.g. replicated after a partial write)."""
    if old is None or old.shape != new.shape:
        return new
    layout = old.sharding
    if len(layout.device_set) == 1 or new.sharding.is_equivalent_to(layout, new.ndim):
        return new
    if debug.enabled():
        debug.log("sharding", f"resharded a written {tuple(new.shape)} buffer back to {layout}")
    return jax.device_put(new, layout)


class _Hooks:
    place_inputs = staticmethod(_place_inputs)
    keep_layout = staticmethod(_keep_layout)


_hooks = _Hooks()
