"""A logical mesh of tpu devices with named axes (torch_xla's SPMD Mesh, over jax.sharding.Mesh)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import jax
import numpy as np
import torch

from torch_tpu.runtime import client


def _device_index(d: int | str | torch.device) -> int:
    if isinstance(d, int):
        return d
    d = torch.device(d)
    if d.type != "tpu":
        raise ValueError(f"a Mesh holds tpu devices, got {d}")
    return d.index if d.index is not None else 0


def _checked_index(d: int | str | torch.device) -> int:
    i = _device_index(d)
    count = len(client.devices())
    if not 0 <= i < count:
        raise ValueError(f"tpu:{i} is out of range: {count} tpu devices are visible")
    return i


class Mesh:
    """`shape` positions over `devices` (tpu device indices, or jax devices; default: all of them,
    in order: after `torch_tpu.distributed.initialize()`, every process's devices), each mesh
    dimension named by `axis_names` (e.g. ("data", "model"))."""

    def __init__(
        self,
        shape: Sequence[int],
        axis_names: Sequence[str],
        devices: Sequence[int | str | torch.device | jax.Device] | None = None,
    ) -> None:
        shape = tuple(int(s) for s in shape)
        axis_names = tuple(axis_names)
        if len(shape) != len(axis_names):
            raise ValueError(f"mesh shape {shape} has {len(shape)} dims but {len(axis_names)} axis names {axis_names}")
        if not all(isinstance(n, str) and n for n in axis_names):
            raise ValueError(f"mesh axis names must be non-empty strings, got {axis_names}")
        if len(set(axis_names)) != len(axis_names):
            raise ValueError(f"mesh axis names must be distinct, got {axis_names}")
        if any(s < 1 for s in shape):
            raise ValueError(f"mesh dims must be positive, got {shape}")
        if devices is None:
            chosen = list(client.global_devices())
        else:
            chosen = [d if isinstance(d, jax.Device) else client.jax_device(_checked_index(d)) for d in devices]
        ids = [d.id for d in chosen]
        if len(set(ids)) != len(ids):
            raise ValueError(f"mesh devices must be distinct, got {ids}")
        size = math.prod(shape)
        if size != len(ids):
            why = "does not divide" if len(ids) % size else "does not use all of"
            raise ValueError(
                f"mesh shape {shape} has {size} positions and {why} the {len(ids)} tpu devices; "
                "its product must equal the device count"
            )
        self.shape = shape
        self.axis_names = axis_names
        self.device_ids = tuple(ids)  # jax device ids: tpu indices in one process
        grid = np.empty(len(ids), dtype=object)
        grid[:] = chosen
        self.jax_mesh = jax.sharding.Mesh(grid.reshape(shape), axis_names)

    def size(self, axis: str | None = None) -> int:
        """Devices along `axis`, or in the whole mesh."""
        if axis is None:
            return math.prod(self.shape)
        return self.shape[self.axis_index(axis)]

    def axis_index(self, axis: str) -> int:
        if axis not in self.axis_names:
            raise ValueError(f"unknown mesh axis {axis!r}; this mesh has axes {self.axis_names}")
        return self.axis_names.index(axis)

    def __repr__(self) -> str:
        dims = ", ".join(f"{n}={s}" for n, s in zip(self.axis_names, self.shape))
        return f"Mesh({dims}, devices={list(self.device_ids)})"


def _physical_key(d: jax.Device) -> tuple:
    """A device's place in the machine: its TPU chip coordinates (z, y, x) then its core on the
    chip where the platform exposes them, else its process and id."""
    coords = getattr(d, "coords", None)
    if coords:
        return (0, *reversed(tuple(coords)), getattr(d, "core_on_chip", 0), d.id)
    return (1, d.process_index, d.id)


def topology_aware_mesh(shape: Sequence[int], axis_names: Sequence[str]) -> Mesh:
    """A Mesh over every process's devices whose last axis runs along neighbouring devices:
    devices are ordered by physical coordinates (TPU `coords`, then `core_on_chip`) where the
    platform exposes them, else by process and id, so the innermost (e.g. "model") axis stays
    within a host and on nearest neighbours, and the outer (e.g. "data") axis spans hosts."""
    devices = sorted(client.global_devices(), key=_physical_key)
    if devices and getattr(devices[0], "coords", None):
        from jax.experimental import mesh_utils

        try:  # jax's TPU topology map (ICI rings per axis) where it knows this slice
            devices = list(mesh_utils.create_device_mesh(tuple(shape), devices, allow_split_physical_axes=True).flat)
        except (ValueError, NotImplementedError, AssertionError):
            pass
    return Mesh(shape, axis_names, devices)
