"""torch.set_float32_matmul_precision as XLA's per-op precision config.

"highest" (torch's default) is Precision.HIGHEST: float32 products as on CPU. "high" is
Precision.HIGH (bfloat16_3x passes on TPU, TF32 on GPU) and "medium" is Precision.DEFAULT
(one bfloat16 pass on TPU). Only float32 matrix products follow it, as in torch; other dtypes
and convolutions stay HIGHEST. The setting is read when an op or graph is traced, so it is part
of the op cache key and of the graph signature (cache_key()). TORCH_TPU_MATMUL_PRECISION
sets the default at import (apply_env()).
"""

from __future__ import annotations

import contextlib
import os
import threading

import jax.numpy as jnp
import torch
from jax import lax

from torch_tpu import _C

_LEVELS = {"highest": lax.Precision.HIGHEST, "high": lax.Precision.HIGH, "medium": lax.Precision.DEFAULT}


# at::Float32MatmulPrecision's values
_ENUM = {"highest": 0, "high": 1, "medium": 2}

_override = threading.local()
_reads = threading.local()


def reads() -> int:
    """How many times this thread's traces have read the precision (`matmul()`): an op whose
    trace did not read it runs the same program at every precision."""
    return getattr(_reads, "count", 0)


def level() -> str:
    """The float32 matmul precision in force: a graph's own option, else torch's setting."""
    return getattr(_override, "level", None) or torch.get_float32_matmul_precision()


@contextlib.contextmanager
def overridden(value: str):
    """Traces under precision `value` ("highest", "high" or "medium"), whatever torch's setting."""
    if value not in _LEVELS:
        raise ValueError(f"matmul precision {value!r} is not one of {', '.join(_LEVELS)}")
    previous = getattr(_override, "level", None)
    _override.level = value
    _C._set_matmul_precision_override(_ENUM[value])  # the C++ eager path's key holds it too
    try:
        yield
    finally:
        _override.level = previous
        _C._set_matmul_precision_override(None if previous is None else _ENUM[previous])


def cache_key() -> str:
    return level()


def matmul(*operands) -> lax.Precision:
    """The precision of a matrix product of `operands`: the level in force if all are float32.
    Lowerings read the setting through this (counted: `reads()`)."""
    _reads.count = getattr(_reads, "count", 0) + 1
    if operands and all(jnp.dtype(x.dtype) == jnp.float32 for x in operands):
        return _LEVELS[level()]
    return lax.Precision.HIGHEST


def apply_env() -> None:
    """TORCH_TPU_MATMUL_PRECISION=highest|high|medium: torch.set_float32_matmul_precision at import."""
    value = os.environ.get("TORCH_TPU_MATMUL_PRECISION", "").strip().lower()
    if value:
        if value not in _LEVELS:
            raise ValueError(f"TORCH_TPU_MATMUL_PRECISION={value!r} is not one of {', '.join(_LEVELS)}")
        torch.set_float32_matmul_precision(value)
