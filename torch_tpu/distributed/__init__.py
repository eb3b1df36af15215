"""torch_tpu.distributed: SPMD over a device mesh in one process, and the c10d backend "tpu".

- `Mesh(shape, axis_names, devices=None)` and `mark_sharding(tensor, mesh, spec)`:
  one process drives all devices; a tensor's buffer is a jax array with a
  NamedSharding and XLA (GSPMD) propagates shardings through every op.
- `tensor_parallel`: Megatron-style column/row-parallel sharding of nn.Linear
  layers over a mesh axis, and data-parallel replication of a module.
- The c10d backend "tpu" (registered by `import torch_tpu`) for multi-process launchers
  (torchrun), DDP, DeviceMesh and DTensor.
"""

from __future__ import annotations

from torch_tpu.distributed import c10d
from torch_tpu.distributed.mesh import Mesh
from torch_tpu.distributed.sharding import mark_sharding, sharding_of, sharding_spec
from torch_tpu.distributed.tensor_parallel import column_parallel, replicate, row_parallel, shard_batch

__all__ = [
    "Mesh",
    "c10d",
    "column_parallel",
    "mark_sharding",
    "replicate",
    "row_parallel",
    "shard_batch",
    "sharding_of",
    "sharding_spec",
]
