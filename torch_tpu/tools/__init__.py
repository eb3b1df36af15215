"""Device tools: tpu-info, per-process stats files, profiling."""

from torch_tpu.tools.profiler import profile

__all__ = ["profile"]
