"""XLA:TPU's options for compiling one eager op (platforms.op_compile_options)."""

from __future__ import annotations

import os
from typing import Any

# jax's exec_time_optimization_effort in [-1, 1]: how hard XLA:TPU searches for a faster program.
OP_COMPILE_EFFORT = -1.0


def op_compile_options() -> dict[str, Any] | None:
    """An eager op's executable is one op: XLA:TPU's default effort spends its compile time on
    searching convolution and fusion strategies that one op barely has. On a v5e (jax 0.10.2,
    benchmarks/op_compile_effort.py), effort -1 compiled a 3x3 convolution in 0.19 s instead of
    2.39 s and its weight gradient in 0.25 s instead of 1.39 s; add, softmax and a 64x512 matmul
    kept their ~60-90 ms. Those ops ran in the dispatch's ~160 us at either effort; ops large
    enough for the device's time to show are not measured at effort -1 yet.
    TORCH_TPU_OP_COMPILE_EFFORT=<float in [-1, 1]> sets another effort; "default" keeps XLA's
    (None). Compiled graphs and lazy traces keep XLA's default effort."""
    setting = os.environ.get("TORCH_TPU_OP_COMPILE_EFFORT", "")
    if setting == "default":
        return None
    effort = float(setting) if setting else OP_COMPILE_EFFORT
    if not -1.0 <= effort <= 1.0:
        raise ValueError(f"TORCH_TPU_OP_COMPILE_EFFORT={setting!r}: an effort in [-1, 1], or 'default'")
    return {"exec_time_optimization_effort": effort}
