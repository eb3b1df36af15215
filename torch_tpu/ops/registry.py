"""The lowering table: one function per ATen op, registered by decorator.

    @lower(aten.add.Tensor)
    def add(x, y, *, alpha=1):
        return x + y * alpha

A jit lowering receives jax arrays where the op takes tensors and plain Python
values elsewhere; it returns jax arrays. Its in-place (`add_.Tensor`) and
out= (`add.out`) variants are derived unless lowered explicitly.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch
from torch._ops import OpOverload

aten = torch.ops.aten


@dataclasses.dataclass(frozen=True)
class Lowering:
    fn: Callable
    # Runs in Python on torch tensors (host transfers, data-dependent shapes).
    eager: bool = False
    # Receives a jax PRNG key as `rng=`, drawn from the op's tpu generator.
    random: bool = False
    # Called with the op's own arguments before it runs; raises CPU's error for
    # data-dependent failures jax cannot report (a host sync, so use sparingly).
    check: Callable | None = None


_TABLE: dict[OpOverload, Lowering] = {}


def lower(*ops: OpOverload, eager: bool = False, random: bool = False, check: Callable | None = None) -> Callable:
    """Registers the decorated function as the lowering of `ops`."""

    def register(fn: Callable) -> Callable:
        for op in ops:
            if op in _TABLE:
                raise ValueError(f"{op} is lowered twice")
            _TABLE[op] = Lowering(fn, eager=eager, random=random, check=check)
        return fn

    return register


def table() -> dict[OpOverload, Lowering]:
    return dict(_TABLE)


# Graph-only lowerings (ops/lowerings/views.py): ops eager runs without a jax function (views,
# _to_copy, ...). Each takes the node's fake result first, then the node's own arguments.
_GRAPH_TABLE: dict[OpOverload, Callable] = {}
_GRAPH_RANDOM: set[OpOverload] = set()


def graph_lower(*ops: OpOverload, random: bool = False) -> Callable:
    """Registers a graph-only lowering; a random one receives a jax PRNG key as `rng=`."""

    def register(fn: Callable) -> Callable:
        for op in ops:
            _GRAPH_TABLE[op] = fn
            if random:
                _GRAPH_RANDOM.add(op)
        return fn

    return register


def graph_table() -> dict[OpOverload, Callable]:
    return dict(_GRAPH_TABLE)


def is_graph_random(op: OpOverload) -> bool:
    return op in _GRAPH_RANDOM


def _non_out_arguments(schema) -> list[tuple[str, str]]:
    return [(a.name, str(a.type)) for a in schema.arguments if not a.is_out]


def inplace_variant(op: OpOverload) -> OpOverload | None:
    packet = getattr(aten, op._schema.name.split("::")[1] + "_", None)
    if packet is None:
        return None
    variant = getattr(packet, op._overloadname, None)
    if variant is None or _non_out_arguments(variant._schema)[1:] != _non_out_arguments(op._schema)[1:]:
        return None
    return variant


def out_variant(op: OpOverload) -> OpOverload | None:
    packet = getattr(aten, op._schema.name.split("::")[1])
    wanted = _non_out_arguments(op._schema)
    for name in packet.overloads():
        candidate = getattr(packet, name)
        schema = candidate._schema
        if any(a.is_out for a in schema.arguments) and _non_out_arguments(schema) == wanted:
            return candidate
    return None


def is_composite_implicit(op: OpOverload) -> bool:
    return torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), "CompositeImplicitAutograd")
