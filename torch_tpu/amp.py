"""`torch.tpu.amp`, mirroring `torch.cuda.amp`: autocast, GradScaler, custom_fwd/custom_bwd.

These are torch.amp's with device_type "tpu"; autocast's default dtype is bfloat16
(torch.get_autocast_dtype("tpu")), and float16 works too. torch.tpu.amp is this module; it lives
outside torch_tpu/device/ because dynamo skips that package and must trace autocast().
"""

from __future__ import annotations

import functools
from typing import Any

import torch

__all__ = ["GradScaler", "amp_definitely_not_available", "autocast", "custom_bwd", "custom_fwd"]


def autocast(enabled: bool = True, dtype: torch.dtype | None = None, cache_enabled: bool = True) -> torch.autocast:
    """torch.autocast("tpu", ...); dtype None is torch.get_autocast_dtype("tpu") (bfloat16).
    A function, not a subclass, so dynamo sees torch.autocast itself (this module is traced)."""
    return torch.autocast("tpu", enabled=enabled, dtype=dtype, cache_enabled=cache_enabled)


class GradScaler(torch.amp.GradScaler):
    """torch.amp.GradScaler("tpu", ...)."""

    def __init__(
        self,
        init_scale: float = 2.0**16,
        growth_factor: float = 2.0,
        backoff_factor: float = 0.5,
        growth_interval: int = 2000,
        enabled: bool = True,
    ) -> None:
        super().__init__("tpu", init_scale, growth_factor, backoff_factor, growth_interval, enabled)


def custom_fwd(fwd: Any = None, *, cast_inputs: torch.dtype | None = None) -> Any:
    """torch.amp.custom_fwd(device_type="tpu")."""
    if fwd is None:
        return functools.partial(custom_fwd, cast_inputs=cast_inputs)
    return torch.amp.custom_fwd(fwd, device_type="tpu", cast_inputs=cast_inputs)


def custom_bwd(bwd: Any) -> Any:
    """torch.amp.custom_bwd(device_type="tpu")."""
    return torch.amp.custom_bwd(bwd, device_type="tpu")


def amp_definitely_not_available() -> bool:
    return not torch.tpu.is_available()
