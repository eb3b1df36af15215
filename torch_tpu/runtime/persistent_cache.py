"""The persistent compile cache: XLA executables on disk, shared by processes.

Every XLA compile torch_tpu starts (eager op executables and compiled graphs
alike) goes through jax's compile path, which looks the executable up in its
persistent-cache hook before compiling and stores it after. We plug our own
store into that hook: `_C.CacheIndex`, whose writes are atomic (tmp file,
fsync, rename), so a process killed mid-write leaves a readable cache and two
processes can share one directory. jax's key is a hash of the lowered module,
the devices, the compile options, the platform and the jax/jaxlib versions.
A corrupt or truncated entry fails to deserialize; jax then warns and
recompiles.

The directory is TORCH_TPU_CACHE_DIR (default ~/.cache/torch_tpu);
TORCH_TPU_PERSISTENT_CACHE=0 turns the cache off.
"""

from __future__ import annotations

import hashlib
import os
import pathlib
import re

import jax
from jax._src import compilation_cache
from jax._src.compilation_cache_interface import CacheInterface

from torch_tpu import _C, metrics
from torch_tpu.runtime.cache_dir import cache_dir

_SAFE_KEY = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,199}")
_HIT_EVENT = "/jax/compilation_cache/cache_hits"
_installed: pathlib.Path | None = None


class IndexCache(CacheInterface):
    """jax's persistent-cache interface over the C++ cache index."""

    def __init__(self, directory: pathlib.Path):
        self._path = directory
        self._index = _C.CacheIndex(str(directory))

    @staticmethod
    def _file_key(key: str) -> str:
        if _SAFE_KEY.fullmatch(key):
            return key
        return "h-" + hashlib.sha256(key.encode()).hexdigest()

    def get(self, key: str) -> bytes | None:
        return self._index.get(self._file_key(key))

    def put(self, key: str, value: bytes) -> None:
        self._index.put(self._file_key(key), value)

    def summary(self) -> tuple[int, int]:
        """(entries, bytes) on disk."""
        return self._index.summary()

    def clear(self) -> None:
        self._index.clear()


def _count_hit(event: str, **kwargs) -> None:
    if event == _HIT_EVENT:
        metrics.bump("persistent_cache_hits")


def enabled() -> bool:
    return os.environ.get("TORCH_TPU_PERSISTENT_CACHE", "1") not in ("0", "")


def install() -> pathlib.Path | None:
    """Routes jax's persistent compilation cache to our index; idempotent.
    Returns the cache directory, or None when the cache is off."""
    global _installed
    if _installed is not None or not enabled():
        return _installed
    directory = cache_dir()
    cache = IndexCache(directory)
    # Every executable is worth keeping: an op compile costs ~10-50 ms, a load ~1 ms.
    jax.config.update("jax_compilation_cache_dir", str(directory))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)
    with compilation_cache._cache_initialized_mutex:
        compilation_cache._cache = cache
        compilation_cache._cache_initialized = True
    jax.monitoring.register_event_listener(_count_hit)
    _installed = directory
    return directory


def directory() -> pathlib.Path | None:
    """The cache directory in use, or None when the cache is off."""
    return _installed
