"""`jax_op(fn)`: one's own jax (or Pallas) function as a torch op on tpu tensors.

    @torch_tpu.kernels.jax_op
    def scaled_sum(x, y):
        return jnp.sin(x) + 2 * y

    z = scaled_sum(a, b)  # a, b: tpu tensors

Each decorated function becomes a `tpu_kernels::jax_op_<name>_<n>` custom op: eager calls run
it through the op dispatcher (jitted, cached per shapes and dtypes), its jax function is in
the lowering table for torch.compile(backend="tpu"), and its fake kernel gets output shapes
from jax.eval_shape. Gradients come from jax.vjp of fn, run as a second op. Positional tensor
arguments only (close over other values with functools.partial); the result is a tensor, or
a tuple of them if fn returns a tuple or list.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
import torch

from torch_tpu.kernels import _custom_ops
from torch_tpu.ops.dtypes import NUMPY_TO_TORCH, TORCH_TO_NUMPY

_counter = itertools.count()


class JaxOp:
    """A jax function wrapped as a torch op; call it with tpu tensors."""

    def __init__(self, fn: Callable, name: str | None = None):
        self.fn = fn
        base = re.sub(r"\W", "_", name or getattr(fn, "__name__", "fn"))
        self.op_name = f"jax_op_{base}_{next(_counter)}"
        self.returns_tuple: bool | None = None  # known once the fake kernel has seen fn's result
        self.op = _custom_ops.define(f"{self.op_name}(Tensor[] inputs) -> Tensor[]", self._lowering, self._fake)
        self.vjp_op = _custom_ops.define(
            f"{self.op_name}_vjp(Tensor[] inputs, Tensor[] cotangents) -> Tensor[]", self._vjp_lowering, self._vjp_fake
        )
        torch.library.register_autograd(self.op, self._backward, setup_context=self._setup_context)
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
        return [torch.empty(r.shape, dtype=NUMPY_TO_TORCH[np.dtype(r.dtype)], device=device) for r in results]

    def _vjp_lowering(self, inputs, cotangents):
        result, pullback = jax.vjp(self.fn, *inputs)
        if isinstance(result, (tuple, list)):
            cotangent = type(result)(c.astype(r.dtype) for c, r in zip(cotangents, result))
        else:
            cotangent = cotangents[0].astype(result.dtype)
        grads = pullback(cotangent)
        # Integer inputs get float0 cotangents from jax: their (unused) gradient is zeros.
        return ([jnp.zeros(x.shape, x.dtype) if g.dtype == jax.dtypes.float0 else g for g, x in zip(grads, inputs)],)

    def _vjp_fake(self, inputs, cotangents):
        return [torch.empty_like(x) for x in inputs]

    def _setup_context(self, ctx, inputs, output):
        (tensors,) = inputs
        ctx.num_inputs = len(tensors)
        ctx.save_for_backward(*tensors, *output)

    def _backward(self, ctx, grads):
        saved = ctx.saved_tensors
        inputs, outputs = saved[: ctx.num_inputs], saved[ctx.num_inputs :]
        cotangents = [torch.zeros_like(o) if g is None else g for g, o in zip(grads, outputs)]
        result = self.vjp_op(list(inputs), cotangents)
        return ([g if x.is_floating_point() or x.is_complex() else None for g, x in zip(result, inputs)],)

    def __call__(self, *tensors: torch.Tensor):
        for t in tensors:
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"{self.__name__}: jax_op arguments must be tensors, got {type(t).__name__}")
        outputs = self.op(list(tensors))
        return tuple(outputs) if self.returns_tuple else outputs[0]


def jax_op(fn: Callable | None = None, *, name: str | None = None):
    """Decorator: `fn` (jax arrays in, a jax array or tuple of them out) as a torch op on tpu
    tensors, in eager mode and inside torch.compile(backend="tpu"). Differentiable through
    jax.vjp (for functions jax can differentiate)."""
    if fn is None:
        return lambda f: JaxOp(f, name)
    return JaxOp(fn, name)
