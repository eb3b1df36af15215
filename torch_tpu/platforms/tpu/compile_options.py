"""XLA:TPU's options for compiling one eager op (platforms.op_compile_options)."""

from __future__ import annotations

import os
from typing import Any

# jax's exec_time_optimization_effort in [-1, 1]: how hard XLA:TPU searches for a faster program.
OP_COMPILE_EFFORT = -1.0


# An eager op whose work would take at least this long at the chip's peak is recompiled at XLA's
# default effort (op_tier_up); v5e's peaks: 197 TFLOP/s in bfloat16, 819 GB/s of HBM.
TIER_UP_DEVICE_SECONDS = 20e-6
PEAK_FLOPS = 197e12
PEAK_BYTES_PER_SECOND = 819e9


def _effort_setting() -> str:
    return os.environ.get("TORCH_TPU_OP_COMPILE_EFFORT", "")


def op_compile_options() -> dict[str, Any] | None:
    """An eager op's executable is one op: XLA:TPU's default effort spends its compile time on
    searching convolution and fusion strategies. On a v5e (jax 0.10.2, benchmarks/op_compile_effort.py,
    2026-12-07), effort -1 compiled a 3x3 convolution in 0.21 s instead of 2.39 s and its weight
    gradient in 0.25 s instead of 1.42 s; add, softmax and a 64x512 matmul kept their ~60-90 ms and
    the dispatch's ~150 us run time. Ops with enough device work run slower at -1 (a 4096x4096
    bfloat16 matmul 1.87 ms instead of 0.75 ms, a batch-128 convolution 0.92 ms instead of 0.53 ms):
    op_tier_up recompiles those at XLA's default effort in the background.
    TORCH_TPU_OP_COMPILE_EFFORT=<float in [-1, 1]> sets another effort for every op, without
    the recompile; "default" keeps XLA's (None). Compiled graphs and lazy traces keep XLA's
    default effort."""
    setting = _effort_setting()
    if setting == "default":
        return None
    effort = float(setting) if setting else OP_COMPILE_EFFORT
    if not -1.0 <= effort <= 1.0:
        raise ValueError(f"TORCH_TPU_OP_COMPILE_EFFORT={setting!r}: an effort in [-1, 1], or 'default'")
    return {"exec_time_optimization_effort": effort}


def op_tier_up(compiled) -> bool:
    """Whether an op's executable compiled at op_compile_options' low effort should be compiled
    again at XLA's default: when XLA's cost analysis puts its work at TIER_UP_DEVICE_SECONDS or
    more at the chip's peak (flops or bytes), and no effort was set."""
    if _effort_setting():
        return False
    try:
        cost = compiled.cost_analysis()
    except Exception:  # no analysis for this executable: keep it
        return False
    if isinstance(cost, (list, tuple)):
        cost = cost[0] if cost else {}
    flops, moved = float(cost.get("flops", 0.0)), float(cost.get("bytes accessed", 0.0))
    return max(flops / PEAK_FLOPS, moved / PEAK_BYTES_PER_SECOND) >= TIER_UP_DEVICE_SECONDS
