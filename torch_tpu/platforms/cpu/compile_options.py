"""The CPU client's XLA options for compiling one eager op (platforms.op_compile_options)."""

from __future__ import annotations

import os
from typing import Any


def op_compile_options() -> dict[str, Any] | None:
    """A tiny op's compile on the CPU client is mostly LLVM codegen: one module instead of parallel
    splits cuts it, and the classic elemental emitters compile a small fusion in about half the
    time of the MLIR fusion emitters. (LLVM -O0 would cut more, but changes bfloat16 rounding
    against CPU's.) TORCH_TPU_FAST_OP_COMPILE=0 keeps XLA's defaults (None)."""
    if os.environ.get("TORCH_TPU_FAST_OP_COMPILE") == "0":
        return None
    return {"xla_cpu_parallel_codegen_split_count": 1, "xla_cpu_use_fusion_emitters": False}
