"""`jax_op(fn)`: one's own jax (or Pallas) function as a torch op on tpu tensors.

    @torch_tpu.kernels.jax_op
    def scaled_sum(x, y):
        return jnp.sin(x) + 2 * y

    z = scaled_sum(a, b)  # a, b: tpu tensors

Each decorated function becomes a `tpu_kernels::jax_op_<name>_<n>` custom op: eager calls run
it through the op dispatcher (jitted, cached per shapes and dtypes), its jax function is in
the lowering table for torch.compile(backend="tpu"), and its fake kernel gets output shapes
from jax.eval_shape. Positional tensor arguments only (close over other values with
functools.partial); the result is a tensor, or a tuple of them if fn returns a tuple or list.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable

import jax
import numpy as np
import torch

from torch_tpu.kernels import _custom_ops
from torch_tpu.ops.dtypes import TORCH_TO_NUMPY

_NUMPY_TO_TORCH = {np.dtype(v): k for k, v in TORCH_TO_NUMPY.items()}
_counter = itertools.count()


class JaxOp:
    """A jax function wrapped as a torch op; call it with tpu tensors."""

    def __init__(self, fn: Callable, name: str | None = None):
        self.fn = fn
        base = re.sub(r"\W", "_", name or getattr(fn, "__name__", "fn"))
        self.op_name = f"jax_op_{base}_{next(_counter)}"
        self.returns_tuple: bool | None = None  # known once the fake kernel has seen fn's result
        self.op = _custom_ops.define(f"{self.op_name}(Tensor[] inputs) -> Tensor[]", self._lowering, self._fake)
        self.__doc__ = getattr(fn, "__doc__", None)
        self.__name__ = base

    def _lowering(self, inputs):
        result = self.fn(*inputs)
        return (list(result) if isinstance(result, (tuple, list)) else [result],)

    def _fake(self, inputs):
        if not inputs:
            raise RuntimeError(f"{self.__name__}: a jax_op needs at least one tensor argument")
        structs = [jax.ShapeDtypeStruct(tuple(t.shape), TORCH_TO_NUMPY[t.dtype]) for t in inputs]
        result = jax.eval_shape(self.fn, *structs)
        self.returns_tuple = isinstance(result, (tuple, list))
        results = list(result) if self.returns_tuple else [result]
        device = inputs[0].device
        return [torch.empty(r.shape, dtype=_NUMPY_TO_TORCH[np.dtype(r.dtype)], device=device) for r in results]

    def __call__(self, *tensors: torch.Tensor):
        for t in tensors:
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"{self.__name__}: jax_op arguments must be tensors, got {type(t).__name__}")
        outputs = self.op(list(tensors))
        return tuple(outputs) if self.returns_tuple else outputs[0]


def jax_op(fn: Callable | None = None, *, name: str | None = None):
    """Decorator: `fn` (jax arrays in, a jax array or tuple of them out) as a torch op on tpu
    tensors, in eager mode and inside torch.compile(backend="tpu"). Not differentiable."""
    if fn is None:
        return lambda f: JaxOp(f, name)
    return JaxOp(fn, name)
