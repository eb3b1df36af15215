"""Megatron-style tensor parallelism and data parallelism by sharding annotations (SPMD).

- Column-parallel Linear: the weight's output dim (and the bias) split over the model axis;
  each device computes a slice of the output features.
- Row-parallel Linear: the weight's input dim split over the model axis; each device computes
  a partial sum that XLA all-reduces (GSPMD inserts the collective).
An MLP is column- then row-parallel (one all-reduce per block); attention shards its q/k/v
projections by heads (column) and its output projection by rows.
Data parallel: parameters replicated, the batch split over the data axis; GSPMD all-reduces
each weight gradient over the data axis, because its contraction runs over the sharded batch.
"""

from __future__ import annotations

import torch
from torch import nn

from torch_tpu.distributed.mesh import Mesh
from torch_tpu.distributed.sharding import mark_sharding, sharding_spec


def column_parallel(linear: nn.Linear, mesh: Mesh, axis: str = "model") -> nn.Linear:
    """Splits `linear`'s output features over `axis`."""
    mark_sharding(linear.weight, mesh, (axis, None))
    if linear.bias is not None:
        mark_sharding(linear.bias, mesh, (axis,))
    return linear


def row_parallel(linear: nn.Linear, mesh: Mesh, axis: str = "model") -> nn.Linear:
    """Splits `linear`'s input features over `axis`; the bias stays replicated."""
    mark_sharding(linear.weight, mesh, (None, axis))
    if linear.bias is not None:
        mark_sharding(linear.bias, mesh, (None,))
    return linear


def replicate(module: nn.Module, mesh: Mesh) -> nn.Module:
    """Replicates every parameter and buffer of `module` that is not yet on the mesh."""
    for t in [*module.parameters(), *module.buffers()]:
        if t.device.type == "tpu" and sharding_spec(t) is None:
            mark_sharding(t, mesh, (None,) * t.dim())
    return module


def shard_batch(tensor: torch.Tensor, mesh: Mesh, axis: str | tuple[str, ...] = "data") -> torch.Tensor:
    """Splits `tensor`'s first dim over `axis` (data parallel); the other dims are replicated."""
    return mark_sharding(tensor, mesh, (axis,) + (None,) * (tensor.dim() - 1))
