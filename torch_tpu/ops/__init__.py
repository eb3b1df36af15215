"""ATen lowerings to jax/lax and their registration on the tpu dispatch key."""

from __future__ import annotations

import dataclasses
import importlib
import pkgutil

import torch
from torch._ops import OpOverload

from torch_tpu import _C
from torch_tpu.ops import checks, deferred_checks, dispatcher, fallback, lowerings, registry, scalars
from torch_tpu.ops.registry import aten, lower
from torch_tpu.platforms.cpu import host_tier

_libraries: list[torch.library.Library] = []


def install() -> None:
    """Imports every module of ops/lowerings/ (and kernels/sdpa.py, aten's SDPA entry points,
    ops/autocast_linear.py, autocast's fused linear, and ops/max_pool_graph.py, graphs' max pool
    backward), then registers each table's kernels on its dispatch key, the derived variants and
    the fallback."""
    if _libraries:
        return
    for module in pkgutil.iter_modules(lowerings.__path__):
        importlib.import_module(f"{lowerings.__name__}.{module.name}")
    importlib.import_module("torch_tpu.kernels.sdpa")
    importlib.import_module("torch_tpu.ops.autocast_linear")
    importlib.import_module("torch_tpu.ops.max_pool_graph")
    host_tier.install()
    deferred_checks.install()
    _C._set_scalar_hook(scalars.device_scalar)
    lib = torch.library.Library("aten", "IMPL")
    registry.check_platform_rules()
    for key in registry.dispatch_keys():
        for op, lowering in registry.table(key).items():
            if lowering.graph_only or op.namespace != "aten":  # kernels/_custom_ops.py registers its own
                continue
            if registry.is_composite_implicit(op):
                raise RuntimeError(f"{op} is CompositeImplicitAutograd: lower what it decomposes into")
            dispatcher.register_kernel(lib, op, lowering, False, key, registry.platform_rules(op, key))
    table = registry.table()
    for op, lowering in table.items():
        if lowering.eager or lowering.graph_only or op.namespace != "aten":
            continue
        if any(a.alias_info is not None for a in op._schema.arguments):
            continue
        rules = registry.platform_rules(op)  # the variants follow the op's rule on each platform
        inplace = registry.inplace_variant(op)
        if inplace is not None and inplace not in table:
            variants = {platform: _cast_checked(inplace, rule) for platform, rule in rules.items()}
            dispatcher.register_kernel(lib, inplace, _cast_checked(inplace, lowering), True, "PrivateUse1", variants)
        out = registry.out_variant(op)
        if out is not None and out not in table:
            dispatcher.register_kernel(lib, out, lowering, True, "PrivateUse1", rules)
    _math_bit_fallthroughs(lib)
    fallback_lib = torch.library.Library("_", "IMPL")
    fallback_lib.fallback(_boxed_fallback, dispatch_key="PrivateUse1")
    _libraries.extend([lib, fallback_lib])


def _cast_checked(inplace: OpOverload, rule: registry.Lowering) -> registry.Lowering:
    """`rule` as the derived in-place variant `inplace` runs it: behind CPU's in-place cast check."""
    return dataclasses.replace(rule, check=checks.inplace_cast_check(inplace, rule.check))


def _math_bit_fallthroughs(lib: torch.library.Library) -> None:
    """copy_ into a conj or neg view reaches _copy_from, whose `dst` has no alias annotation:
    the Conjugate and Negative fallbacks would write into a resolved clone of it and drop the
    write. The tpu _copy_from honours both bits itself (tensors.write_jax), so let it see them."""
    for name in ("_copy_from", "_copy_from_and_resize"):
        for key in ("Conjugate", "Negative"):
            lib.impl(name, torch.library.fallthrough_kernel, key)


def _boxed_fallback(op, *args, **kwargs):
    return fallback.cpu_fallback(op, args, kwargs)


__all__ = ["aten", "install", "lower"]
