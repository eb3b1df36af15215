"""Device tools: tpu-info, per-process stats files, profiling."""

from __future__ import annotations

from typing import Any


def __getattr__(name: str) -> Any:
    # Imported on first use: `tpu-info --help` imports this package before any backend exists.
    if name == "profile":
        from torch_tpu.tools.profiler import profile

        return profile
    raise AttributeError(f"module 'torch_tpu.tools' has no attribute {name!r}")


__all__ = ["profile"]
