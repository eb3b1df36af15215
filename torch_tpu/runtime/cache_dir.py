"""Where the persistent compile cache lives: TORCH_TPU_CACHE_DIR, default ~/.cache/torch_tpu."""

from __future__ import annotations

import os
import pathlib


def cache_dir() -> pathlib.Path:
    configured = os.environ.get("TORCH_TPU_CACHE_DIR")
    if configured:
        return pathlib.Path(configured).expanduser()
    return pathlib.Path("~/.cache/torch_tpu").expanduser()
