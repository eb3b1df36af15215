"""c10d collectives as XLA collectives over the devices of a process group (no host staging).

After `torch_tpu.distributed.initialize()`, every rank's tpu tensor lives on one device of the
global device set. A collective stacks the ranks' tensors into one global array over a 1-D
mesh of those devices (one row per rank, each rank supplying its own row, in place on its
device), runs one jitted `shard_map` program of `lax.psum` / `all_gather` / `psum_scatter` /
`all_to_all` across processes, and each rank reads back its own row. Every call is counted in
metrics "c10d_device_collectives"; what this path does not cover (an op like BAND, an unequal
all_to_all, a dtype outside `DTYPES`) goes through the host transport and is counted in
"c10d_host_collectives".
"""

from __future__ import annotations

import contextlib
import functools

import jax
import jax.numpy as jnp
import numpy as np
import torch
import torch.distributed as dist
from jax import lax
from jax.sharding import NamedSharding, PartitionSpec

from torch_tpu.distributed import multihost
from torch_tpu.ops.tensors import to_jax, write_jax
from torch_tpu.runtime import client

AXIS = "ranks"
DTYPES = (torch.float32, torch.float64, torch.int32, torch.int64)
_REDUCERS = {
    dist.ReduceOp.SUM: lax.psum,
    dist.ReduceOp.AVG: lax.pmean,
    dist.ReduceOp.MAX: lax.pmax,
    dist.ReduceOp.MIN: lax.pmin,
}


def op_type(op) -> object:
    """A reduce op as its RedOpType (c10d hands over ReduceOp objects, which hash apart)."""
    return getattr(op, "op", op)


def _shard_map(fn, mesh: jax.sharding.Mesh):
    return jax.jit(jax.shard_map(fn, mesh=mesh, in_specs=PartitionSpec(AXIS), out_specs=PartitionSpec(AXIS)))


@functools.cache
def _all_reduce(mesh: jax.sharding.Mesh, op) -> object:
    reducer = _REDUCERS[op]
    return _shard_map(lambda x: reducer(x, AXIS), mesh)


@functools.cache
def _all_gather(mesh: jax.sharding.Mesh) -> object:
    return _shard_map(lambda x: lax.all_gather(x[0], AXIS)[None], mesh)


@functools.cache
def _reduce_scatter(mesh: jax.sharding.Mesh, op) -> object:
    if op in (dist.ReduceOp.SUM, dist.ReduceOp.AVG):
        size = mesh.size

        def scatter(x):
            part = lax.psum_scatter(x[0], AXIS, scatter_dimension=0, tiled=False)
            return (part / size if op == dist.ReduceOp.AVG else part)[None]

        return _shard_map(scatter, mesh)
    reducer = _REDUCERS[op]
    return _shard_map(lambda x: reducer(x[0], AXIS)[lax.axis_index(AXIS)][None], mesh)


@functools.cache
def _all_to_all(mesh: jax.sharding.Mesh) -> object:
    return _shard_map(lambda x: lax.all_to_all(x[0], AXIS, 0, 0, tiled=True)[None], mesh)


@contextlib.contextmanager
def _reported(name: str):
    """An XLA collective that fails (e.g. a peer process exited: gloo's connection closed)
    raises torch's DistBackendError naming the collective."""
    try:
        yield
    except (jax.errors.JaxRuntimeError, ValueError) as error:  # jax raises runtime failures as ValueError too
        raise dist.DistBackendError(
            f"tpu device collective {name} failed; a peer process may have exited or stopped answering: {error}"
        ) from error


class DeviceCollectives:
    """XLA collectives over the devices of a group's ranks (rank i's tensors on devices[i])."""

    def __init__(self, gloo, rank: int, size: int):
        self.gloo = gloo  # only to agree once on which device each rank computes on
        self.rank = rank
        self.size = size
        self._meshes: dict[int, jax.sharding.Mesh | None] = {}

    def mesh_for(self, tensors: list[torch.Tensor]) -> jax.sharding.Mesh | None:
        """The ranks' mesh for tensors on one local tpu device, or None where the device path
        cannot run them (the decision is the same on every rank: it rests on what they share)."""
        if not tensors or any(t.device.type != "tpu" for t in tensors):
            return None
        index = tensors[0].device.index or 0
        if any((t.device.index or 0) != index for t in tensors):
            return None
        if index not in self._meshes:
            self._meshes[index] = self._agree(client.jax_device(index))
        return self._meshes[index]

    def _agree(self, device: jax.Device) -> jax.sharding.Mesh | None:
        ids = [torch.zeros(1, dtype=torch.int64) for _ in range(self.size)]
        self.gloo.allgather([ids], [torch.tensor([device.id])]).wait()
        by_id = {d.id: d for d in client.global_devices()}
        ranks = [int(i.item()) for i in ids]
        if len(set(ranks)) != len(ranks) or any(i not in by_id for i in ranks):
            return None  # two ranks on one device, or a device outside the joint set
        grid = np.empty(len(ranks), dtype=object)
        grid[:] = [by_id[i] for i in ranks]
        return jax.sharding.Mesh(grid, (AXIS,))

    @staticmethod
    def supports(tensors: list[torch.Tensor], op=None) -> bool:
        if op is not None and op_type(op) not in _REDUCERS:
            return False
        return all(t.dtype in DTYPES and multihost.is_initialized() for t in tensors)

    # ---- the collectives: each runs one SPMD program over the ranks' devices ----------------

    def _global(self, mesh: jax.sharding.Mesh, value: jax.Array) -> jax.Array:
        multihost.before_program()
        row = value[None]
        sharding = NamedSharding(mesh, PartitionSpec(AXIS))
        return jax.make_array_from_single_device_arrays((self.size, *value.shape), sharding, [row])

    @staticmethod
    def _row(array: jax.Array) -> jax.Array:
        return array.addressable_data(0)[0]

    def run(self, name: str, *args) -> None:
        """Runs the collective `name` (allreduce, allgather, reduce_scatter, broadcast, all_to_all)."""
        with _reported(name):
            getattr(self, "_" + name)(*args)
            multihost.before_program()  # the results are ready when the call returns

    def _allreduce(self, mesh: jax.sharding.Mesh, tensors: list[torch.Tensor], op) -> None:
        fn = _all_reduce(mesh, op_type(op))
        for t in tensors:
            write_jax(t, self._row(fn(self._global(mesh, to_jax(t)))))

    def _allgather(self, mesh: jax.sharding.Mesh, outputs: list[list[torch.Tensor]], inputs: list[torch.Tensor]):
        fn = _all_gather(mesh)
        for outs, t in zip(outputs, inputs):
            gathered = self._row(fn(self._global(mesh, to_jax(t))))
            for i, o in enumerate(outs):
                write_jax(o, gathered[i].reshape(tuple(o.shape)))

    def _reduce_scatter(self, mesh: jax.sharding.Mesh, outputs: list[torch.Tensor], inputs, op) -> None:
        fn = _reduce_scatter(mesh, op_type(op))
        for out, chunks in zip(outputs, inputs):
            stacked = jnp.stack([to_jax(c) for c in chunks])
            write_jax(out, self._row(fn(self._global(mesh, stacked))).reshape(tuple(out.shape)))

    def _broadcast(self, mesh: jax.sharding.Mesh, tensors: list[torch.Tensor], root: int) -> None:
        fn = _all_gather(mesh)
        for t in tensors:
            gathered = self._row(fn(self._global(mesh, to_jax(t))))
            if self.rank != root:
                write_jax(t, gathered[root])

    def _all_to_all(self, mesh: jax.sharding.Mesh, output: torch.Tensor, input: torch.Tensor) -> None:
        fn = _all_to_all(mesh)
        write_jax(output, self._row(fn(self._global(mesh, to_jax(input)))))


__all__ = ["DTYPES", "DeviceCollectives"]
