"""option "async_compile": a new input signature runs op by op while its executable compiles.

The first call with a new signature submits the segment's compile to the compile
queue (runtime/compile_queue.py) and evaluates the segment's nodes eagerly through the
dispatcher (counted in `async_eager_runs`); calls that arrive while the compile
is pending do the same; the first call after it finishes uses the executable.
Eager and compiled evaluation give the same numbers except for random ops,
which draw from the eager generator while the compile is pending.
"""

from __future__ import annotations

import concurrent.futures

import jax
import numpy as np
import torch

from torch_tpu import metrics
from torch_tpu.compile import saved_layouts
from torch_tpu.runtime import compile_queue

_pending: dict[tuple[int, tuple], concurrent.futures.Future] = {}


def _abstract(value):
    """What lowering needs of an argument, without holding its buffer (which may be donated)."""
    if isinstance(value, jax.Array):
        # a saved tensor in XLA's layout (saved_layouts.py): compiled for that layout
        placed = value.sharding if saved_layouts.is_default(value) else value.format
        return jax.ShapeDtypeStruct(value.shape, value.dtype, sharding=placed)
    if isinstance(value, np.ndarray):
        return jax.ShapeDtypeStruct(value.shape, value.dtype)
    return value


def run_while_compiling(segment, values: list, dyn: list, signature: tuple, device: int) -> list | None:
    """The segment's outputs computed eagerly while its executable compiles; None once it is ready."""
    key = (id(segment), signature)
    future = _pending.get(key)
    if future is None:
        abstract = [_abstract(v) for v in dyn]
        future = _pending[key] = compile_queue.submit(segment._compile, values, abstract, signature, device)
    if future.done():
        del _pending[key]
        future.result()  # a compile error surfaces here
        return None
    metrics.bump("async_eager_runs")
    return _evaluate_eagerly(segment, values)


def _evaluate_eagerly(segment, values: list) -> list:
    env = dict(zip(segment.inputs, values))
    for node in segment.nodes:
        args = torch.fx.node.map_aggregate(node.args, lambda a: env[a] if isinstance(a, torch.fx.Node) else a)
        kwargs = torch.fx.node.map_aggregate(node.kwargs, lambda a: env[a] if isinstance(a, torch.fx.Node) else a)
        if segment.lowered[node].kind == "copy_":
            env[node] = args[0].copy_(args[1])  # the functionalized input mutation, done in place
        else:
            env[node] = node.target(*args, **kwargs)
    return [env[n] for n in segment.outputs]


def wait_all() -> None:
    """Blocks until every pending background compile has finished."""
    for future in list(_pending.values()):
        concurrent.futures.wait([future])
