"""Debug output: with TORCH_TPU_DEBUG=1, one line on stderr per compile,
recompile and CPU fallback, as it happens."""

from __future__ import annotations

import logging
import os
import sys

logger = logging.getLogger("torch_tpu")


def enabled() -> bool:
    return os.environ.get("TORCH_TPU_DEBUG", "") not in ("", "0")


def log(event: str, message: str) -> None:
    """Reports one event ("compile", "recompile", "fallback", ...) when debugging is on."""
    if enabled():
        print(f"[torch_tpu] {event}: {message}", file=sys.stderr, flush=True)
    logger.debug("%s: %s", event, message)
