"""torch_tpu.distributed: SPMD over a device mesh, and the c10d backend "tpu".

- `initialize()`: joins the processes (jax.distributed) so that a Mesh spans every
  process's devices and sharded computations run as one SPMD program across them.

- `Mesh(shape, axis_names, devices=None)` and `mark_sharding(tensor, mesh, spec)`:
  one process drives all devices; a tensor's buffer is a jax array with a
  NamedSharding and XLA (GSPMD) propagates shardings through every op.
- `tensor_parallel`: Megatron-style column/row-parallel sharding of nn.Linear
  layers over a mesh axis, and data-parallel replication of a module.
- The c10d backend "tpu" (registered by `import torch_tpu`) for multi-process launchers
  (torchrun), DDP, DeviceMesh and DTensor.
"""

from __future__ import annotations

from torch_tpu.distributed import c10d, multihost
from torch_tpu.distributed.mesh import Mesh, topology_aware_mesh
from torch_tpu.distributed.multihost import initialize, is_initialized, process_count, process_index
from torch_tpu.distributed.sharding import mark_sharding, sharding_of, sharding_spec
from torch_tpu.distributed.tensor_parallel import column_parallel, replicate, row_parallel, shard_batch

__all__ = [
    "Mesh",
    "c10d",
    "column_parallel",
    "initialize",
    "is_initialized",
    "mark_sharding",
    "multihost",
    "process_count",
    "process_index",
    "replicate",
    "row_parallel",
    "shard_batch",
    "sharding_of",
    "sharding_spec",
    "topology_aware_mesh",
]
