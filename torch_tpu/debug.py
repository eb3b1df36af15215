"""Debug output: with TORCH_TPU_DEBUG=1, one line on stderr per compile,
recompile and CPU fallback, as it happens."""

from __future__ import annotations

import logging
import os
import sys
import warnings

logger = logging.getLogger("torch_tpu")
_warned: set[str] = set()


def enabled() -> bool:
    return os.environ.get("TORCH_TPU_DEBUG", "") not in ("", "0")


def log(event: str, message: str) -> None:
    """Reports one event ("compile", "recompile", "fallback", ...) when debugging is on."""
    if enabled():
        print(f"[torch_tpu] {event}: {message}", file=sys.stderr, flush=True)
    logger.debug("%s: %s", event, message)


def warn_once(key: str, message: str, stacklevel: int = 1) -> None:
    """`warnings.warn(message)` the first time `key` is seen in this process (a fallback op, a
    graph split, an unpaddable node). `stacklevel` counts from the caller, as warnings.warn's."""
    if key not in _warned:
        _warned.add(key)
        warnings.warn(message, stacklevel=stacklevel + 1)
