"""Device memory: byte limits, the PJRT client's own stats, and out-of-memory errors.

The C++ buffer registry counts the bytes of every live tpu storage and refuses an
allocation past a device's limit with torch.OutOfMemoryError. A limit comes from
torch.tpu.set_per_process_memory_fraction() or from TORCH_TPU_MEMORY_LIMIT (bytes, or with
a K/M/G/T suffix, for every device). XLA's own RESOURCE_EXHAUSTED errors become
torch.OutOfMemoryError too (raise_if_out_of_memory).
"""

from __future__ import annotations

import os
import re

import torch

from torch_tpu import _C
from torch_tpu.runtime import client

_SUFFIXES = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def parse_bytes(text: str) -> int:
    """ "1048576", "512M", "8G" or "1.5GiB" as a number of bytes."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(?:i?B)?\s*", text, re.IGNORECASE)
    if match is None:
        raise ValueError(f"TORCH_TPU_MEMORY_LIMIT={text!r} is not a byte count such as 1073741824, 512M or 8G")
    return int(float(match.group(1)) * _SUFFIXES[match.group(2).upper()])


def format_bytes(n: int) -> str:
    """Bytes for people: 512 B, 3.00 KiB, 1.50 GiB."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{int(value)} {unit}" if unit == "B" else f"{value:.2f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def runtime_stats(index: int) -> dict[str, int]:
    """The PJRT client's stats for device `index` (bytes_in_use, bytes_limit, ...); {} where
    the client has none (the CPU client)."""
    try:
        return dict(client.jax_device(index).memory_stats() or {})
    except Exception:
        return {}


def host_memory_bytes() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def host_available_bytes() -> int:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")


def total_memory(index: int) -> int:
    """The device's capacity: the client's bytes_limit, or host memory on the CPU client."""
    return int(runtime_stats(index).get("bytes_limit") or host_memory_bytes())


def limit(index: int) -> int | None:
    """The byte limit enforced for tpu storages on device `index`, or None."""
    value = _C._memory_limit(index)
    return None if value < 0 else value


def set_limit(index: int, nbytes: int | None) -> None:
    _C._set_memory_limit(index, -1 if nbytes is None else int(nbytes))


def apply_env_limit() -> None:
    """Applies TORCH_TPU_MEMORY_LIMIT to every device (run once at import)."""
    text = os.environ.get("TORCH_TPU_MEMORY_LIMIT", "").strip()
    if text:
        nbytes = parse_bytes(text)
        for index in range(_C._device_count()):
            set_limit(index, nbytes)


def raise_if_out_of_memory(error: Exception, device: int, what: str = "") -> None:
    """Raises torch.OutOfMemoryError (from `error`) if `error` is XLA's RESOURCE_EXHAUSTED."""
    text = str(error)
    if "RESOURCE_EXHAUSTED" not in text:
        return
    allocated = _C._memory_stats(device)["allocated_bytes.all.current"]
    cap = limit(device)
    capacity = runtime_stats(device).get("bytes_limit")
    message = (
        f"tpu:{device} out of memory{' running ' + what if what else ''}. XLA: {text.strip()} "
        f"{format_bytes(allocated)} ({allocated} bytes) already allocated by tpu tensors"
    )
    if cap is not None:
        message += f"; limit {format_bytes(cap)} ({cap} bytes)"
    if capacity:
        message += f"; device capacity {format_bytes(capacity)} ({capacity} bytes)"
    raise torch.OutOfMemoryError(message) from error
