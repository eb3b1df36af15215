"""SPMD placement: the layer eager ops call through once a tensor is sharded.

The dispatcher and tensors.py own this interface; torch_tpu.distributed provides the layer
(distributed/sharding.py) and installs it with `install` when it first shards a tensor.
"""

from __future__ import annotations

from typing import Protocol

import jax


class Placement(Protocol):
    def place_inputs(self, inputs: list, bound: list) -> None:
        """Moves a call's single-device inputs onto the mesh of its sharded ones, in place
        (jax.jit refuses mixed device sets)."""

    def keep_layout(self, old: jax.Array | None, new: jax.Array) -> jax.Array:
        """`new`, laid out as the tensor's old buffer `old` was (a write keeps the sharding)."""


# None until a tensor is sharded: single-device programs pay one attribute read per op.
layer: Placement | None = None


def install(placement: Placement) -> None:
    """Makes `placement` the SPMD layer of every later eager op."""
    global layer
    layer = placement
    from torch_tpu import _C

    _C._set_eager_fast_path(False)  # placement runs in Python, per op
