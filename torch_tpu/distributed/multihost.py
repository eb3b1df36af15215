"""Multi-controller SPMD: jax's distributed runtime joins the processes into one device set.

`initialize()` wraps `jax.distributed.initialize`: each process keeps driving its own
(addressable) devices as tpu:0..tpu:M-1, and a `Mesh` built afterwards spans the global
devices of every process. A sharded tensor is then a global jax array: each process holds the
shards on its own devices, and every op on it is one SPMD program that all processes run in
the same order (XLA's collectives cross processes: gloo on the CPU client, ICI/DCN on TPU).
"""

from __future__ import annotations

import os

import jax
import numpy as np
import torch

from torch_tpu import _C, debug
from torch_tpu.runtime import client, global_arrays
from torch_tpu.runtime.global_arrays import before_program, fetchable, host_value

# The jax coordinator listens next to torchrun's store: MASTER_PORT + this offset.
COORDINATOR_PORT_OFFSET = 1


def is_initialized() -> bool:
    """True once the processes are joined (by `initialize()` or jax.distributed directly)."""
    return jax.distributed.is_initialized()


def process_index() -> int:
    return jax.process_index() if is_initialized() else 0


def process_count() -> int:
    return jax.process_count() if is_initialized() else 1


def _from_env() -> tuple[str | None, int | None, int | None]:
    """(coordinator address, process count, process id) from jax's or torchrun's variables."""
    address = os.environ.get("JAX_COORDINATOR_ADDRESS")
    if address is None and "MASTER_ADDR" in os.environ and "MASTER_PORT" in os.environ:
        port = os.environ.get("TORCH_TPU_COORDINATOR_PORT")
        port = int(port) if port else int(os.environ["MASTER_PORT"]) + COORDINATOR_PORT_OFFSET
        address = f"{os.environ['MASTER_ADDR']}:{port}"
    count = os.environ.get("JAX_NUM_PROCESSES", os.environ.get("WORLD_SIZE"))
    rank = os.environ.get("JAX_PROCESS_ID", os.environ.get("RANK"))
    return address, int(count) if count else None, int(rank) if rank else None


def initialize(
    coordinator_address: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
    *,
    timeout_s: int = 120,
    heartbeat_timeout_s: int = 30,
) -> None:
    """Joins this process to the others (jax.distributed.initialize) and recreates the tpu
    client over the joint device set. Arguments default to jax's variables
    (JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES, JAX_PROCESS_ID), else torchrun's (MASTER_ADDR,
    MASTER_PORT + 1 or TORCH_TPU_COORDINATOR_PORT, WORLD_SIZE, RANK). On the CPU client the
    cross-process collectives are gloo's. Call it before creating any tpu tensor; calling it
    again is a no-op. A peer that stops answering is reported after `heartbeat_timeout_s`."""
    if is_initialized():
        return
    env_address, env_count, env_rank = _from_env()
    coordinator_address = coordinator_address or env_address
    num_processes = num_processes if num_processes is not None else env_count
    process_id = process_id if process_id is not None else env_rank
    missing = [
        n
        for n, v in (
            ("coordinator_address", coordinator_address),
            ("num_processes", num_processes),
            ("process_id", process_id),
        )
        if v is None
    ]
    if missing:
        raise ValueError(
            f"torch_tpu.distributed.initialize: {', '.join(missing)} not given and not in the environment "
            "(torchrun's MASTER_ADDR/MASTER_PORT/WORLD_SIZE/RANK or JAX_COORDINATOR_ADDRESS/JAX_NUM_PROCESSES/"
            "JAX_PROCESS_ID)"
        )
    live = [a for a in jax.live_arrays() if not a.is_deleted()]
    if live:
        raise RuntimeError(
            f"torch_tpu.distributed.initialize must run before any tpu tensor exists ({len(live)} device "
            "buffers are alive): the tpu client is recreated over every process's devices"
        )
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    from jax._src import api as jax_api  # jax.clear_backends left the public API

    jax_api.clear_backends()
    jax.distributed.initialize(
        coordinator_address,
        num_processes,
        process_id,
        initialization_timeout=timeout_s,
        heartbeat_timeout_seconds=heartbeat_timeout_s,
    )
    client.reset()
    from torch_tpu import _register

    _C._set_devices(_register._device_list())
    devices = client.devices()
    global_arrays.serialize_programs = None  # decided again over the joint client
    debug.log(
        "distributed",
        f"process {process_id} of {num_processes}: {len(devices)} local, {len(client.global_devices())} global devices",
    )


def shutdown() -> None:
    """Leaves the distributed runtime (waits for the other processes, as jax does)."""
    if is_initialized():
        jax.distributed.shutdown()


def place(value: jax.Array, sharding: jax.sharding.Sharding) -> jax.Array:
    """`value` (on one local device, the same on every process) laid out by `sharding`, which
    may span other processes' devices: each process places its own shards, device to device."""
    if sharding.is_fully_addressable:
        return jax.device_put(value, sharding)
    indices = sharding.addressable_devices_indices_map(value.shape)
    shards = [jax.device_put(value[index], device) for device, index in indices.items()]
    return jax.make_array_from_single_device_arrays(value.shape, sharding, shards)


def local_shards(tensor: torch.Tensor) -> list[tuple[tuple[slice, ...], torch.Tensor]]:
    """(index into the global tensor, CPU copy of the shard) for each of this process's shards."""
    from torch_tpu.ops.tensors import buffer_of

    buf = buffer_of(tensor)
    return [(s.index, torch.from_numpy(np.asarray(s.data).copy())) for s in buf.addressable_shards]


__all__ = [
    "before_program",
    "fetchable",
    "host_value",
    "initialize",
    "is_initialized",
    "local_shards",
    "place",
    "process_count",
]
