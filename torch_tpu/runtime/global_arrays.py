"""Host reads of arrays whose shards live on several processes (multi-controller SPMD)."""

from __future__ import annotations

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from torch_tpu import platforms
from torch_tpu.runtime import client

# Whether programs wait for the previous ones (platforms.serializes_programs).
# None: not decided yet (decided on first use, after jax.distributed.initialize if any).
serialize_programs: bool | None = None


def before_program() -> None:
    """Called before each eager op on sharded tensors and each compiled segment: where the
    platform serializes programs (the CPU client across processes: its gloo collectives deadlock
    when two multi-device programs are in flight at once, seen with 2 processes x 4 devices), the
    previous programs finish first. On TPU programs stay queued asynchronously."""
    global serialize_programs
    if serialize_programs is None:
        serialize_programs = platforms.serializes_programs()
    if serialize_programs:
        client.synchronize()


def fetchable(array: jax.Array) -> jax.Array:
    """`array`, or a replicated copy of it where its value is split over processes (a collective:
    every process reads the same tensor, as SPMD programs do)."""
    if array.is_fully_addressable or array.is_fully_replicated:
        return array
    if serialize_programs:  # the replicating program must not be in flight beside the one making `array`
        array.block_until_ready()
    sharding = array.sharding
    if isinstance(sharding, NamedSharding):
        mesh = sharding.mesh
    else:
        grid = np.empty(len(sharding.device_set), dtype=object)
        grid[:] = sorted(sharding.device_set, key=lambda d: d.id)
        mesh = jax.sharding.Mesh(grid, ("all",))
    return _replicator(mesh)(array)


_replicators: dict = {}


def _replicator(mesh: jax.sharding.Mesh):
    fn = _replicators.get(mesh)
    if fn is None:
        fn = _replicators[mesh] = jax.jit(lambda a: a, out_shardings=NamedSharding(mesh, PartitionSpec()))
    return fn


def host_value(array: jax.Array) -> np.ndarray:
    """The whole value of `array` on the host, whichever process holds its shards."""
    client.host_read()
    return np.asarray(fetchable(array))
