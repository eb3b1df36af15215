"""The `tpu_kernels` torch.library namespace: each kernel is a custom op whose tpu
(PrivateUse1) kernel runs a jax function through the op dispatcher (behind the C++ steady-state
path where the op can take it, as aten's ops), and whose jax function is also in the lowering
table, so compiled graphs lower it the same way."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch._ops import OpOverload

from torch_tpu.ops import dispatcher, registry

NAMESPACE = "tpu_kernels"

_lib = torch.library.Library(NAMESPACE, "DEF")


def define(schema: str, lowering: Callable, fake: Callable, cpu: Callable | None = None) -> OpOverload:
    """Defines `tpu_kernels::<schema>` with `fake` as its meta/fake kernel and `lowering`
    (jax arrays in, jax arrays out; see docs/lowerings.md) as its tpu kernel and lowering.
    `cpu`, if given, is its kernel on CPU tensors (the host tier runs it, platforms/cpu/host_tier.py)."""
    name = _lib.define(schema)
    op: OpOverload = getattr(getattr(torch.ops, NAMESPACE), name).default
    torch.library.register_fake(op, fake, lib=_lib)
    registry.lower(op)(lowering)
    dispatcher.register_kernel(_lib, op, registry.table()[op], False, "PrivateUse1")  # C++ fast path where it can
    if cpu is not None:
        _lib.impl(name, cpu, "CPU")
    return op
