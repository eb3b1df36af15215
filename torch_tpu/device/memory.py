"""Device memory: byte limits, the PJRT client's own stats, and out-of-memory errors.

The C++ buffer registry counts the bytes of every live tpu storage and refuses an
allocation past a device's capacity or limit with torch.OutOfMemoryError, as CUDA's allocator
does. The capacity is PJRT's bytes_limit where the platform reports it (TPU, GPU; the CPU
client reports none). A limit comes from torch.tpu.set_per_process_memory_fraction() or from
TORCH_TPU_MEMORY_LIMIT (bytes, or with a K/M/G/T suffix, for every device). XLA's own
RESOURCE_EXHAUSTED errors (an executable's outputs or temporaries, a transfer, a compile)
become torch.OutOfMemoryError too (out_of_memory_as_torch). Buffers are freed when their last
tensor dies (no caching allocator), so "reserved" equals "allocated".

An executable's XLA temporaries (a compiled step's activations and gradients live there) are
no tpu storage, and TPU's PJRT stats do not count them either: memory_stats() reports the
largest of a compiled graph or lazy trace run since the last reset as "xla_temp_bytes.all.peak"
(note_temp_bytes), so a peak can be told in full: storages' peak plus that.
"""

from __future__ import annotations

import collections
import os

import jax
import torch

from torch_tpu import _C
from torch_tpu._units import format_bytes, parse_bytes
from torch_tpu.device.devices import DeviceLike, _memory_index
from torch_tpu.runtime import client

# Device index -> the largest XLA temporary allocation of an executable run since the last reset.
_peak_temp_bytes: dict[int, int] = {}


def temp_bytes_of(compiled) -> int:
    """XLA's temporary allocation of a compiled executable (0 where it does not say)."""
    try:
        return int(compiled.memory_analysis().temp_size_in_bytes)
    except Exception:  # an executable without a memory analysis
        return 0


def note_temp_bytes(index: int, nbytes: int) -> None:
    """Records that an executable with `nbytes` of temporaries ran on device `index`."""
    if nbytes > _peak_temp_bytes.get(index, 0):
        _peak_temp_bytes[index] = nbytes


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


def capacity(index: int) -> int | None:
    """The device's capacity as the buffer registry enforces it (PJRT's bytes_limit), or None."""
    value = _C._memory_capacity(index)
    return None if value < 0 else value


def apply_limits() -> None:
    """Run once at import: each device's capacity where the platform reports one, so that an
    allocation that can never fit raises torch.OutOfMemoryError at once; and
    TORCH_TPU_MEMORY_LIMIT, if set, as every device's limit."""
    text = os.environ.get("TORCH_TPU_MEMORY_LIMIT", "").strip()
    nbytes = parse_bytes(text) if text else None
    for index in range(_C._device_count()):
        reported = runtime_stats(index).get("bytes_limit")
        if reported:
            _C._set_memory_capacity(index, int(reported))
        if nbytes is not None:
            set_limit(index, nbytes)


def _amount(nbytes: int) -> str:
    return f"{format_bytes(nbytes)} ({nbytes} bytes)"


def out_of_memory_message(device: int, what: str = "", nbytes: int | None = None, detail: str = "") -> str:
    """torch.OutOfMemoryError's text, in the spirit of CUDA's: the bytes asked for (when
    known), the bytes tpu tensors hold, the limit, and the device's capacity and use."""
    name = f"tpu:{device}"
    text = f"{name} out of memory{' ' + what if what else ''}."
    if nbytes is not None:
        text += f" Tried to allocate {_amount(nbytes)}."
    facts = [f"{_amount(_C._memory_stats(device)['allocated_bytes.all.current'])} already allocated by tpu tensors"]
    cap = limit(device)
    if cap is not None:
        facts.append(f"limit {_amount(cap)}")
    stats = runtime_stats(device)
    if stats.get("bytes_limit"):
        total, used = int(stats["bytes_limit"]), int(stats.get("bytes_in_use", 0))
        facts.append(f"{name} has a total capacity of {_amount(total)}, of which {_amount(used)} is in use")
    text += " " + "; ".join(facts) + "."
    return f"{text} XLA: {detail}" if detail else text


def is_out_of_memory(error: Exception) -> bool:
    """Whether `error` is XLA's out of memory: RESOURCE_EXHAUSTED on TPU and GPU clients; on the CPU
    client a failed allocation of an output, reported when the value is awaited ("INTERNAL: Error
    dispatching computation: Out of memory allocating N bytes")."""
    text = str(error)
    return "RESOURCE_EXHAUSTED" in text or "Out of memory allocating" in text


def raise_if_out_of_memory(error: Exception, device: int, what: str = "", nbytes: int | None = None) -> None:
    """Raises torch.OutOfMemoryError (from `error`) if `error` is XLA's out of memory; its first
    line is quoted (the whole of it stays as __cause__)."""
    text = str(error).strip()
    if not is_out_of_memory(error):
        return
    raise torch.OutOfMemoryError(out_of_memory_message(device, what, nbytes, text.splitlines()[0])) from error


class _OutOfMemoryAsTorch:
    __slots__ = ("device", "nbytes", "what")

    def __init__(self, device: int, what: str, nbytes: int | None):
        self.device, self.what, self.nbytes = device, what, nbytes

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind, error, traceback) -> bool:
        if kind is not None and issubclass(kind, jax.errors.JaxRuntimeError):
            raise_if_out_of_memory(error, self.device, self.what, self.nbytes)
        return False


def out_of_memory_as_torch(device: int, what: str = "", nbytes: int | None = None) -> _OutOfMemoryAsTorch:
    """A context in which XLA's RESOURCE_EXHAUSTED (jax's JaxRuntimeError) becomes
    torch.OutOfMemoryError on tpu device `device`: around every compile, execution and transfer.
    `what` says what ran ("running the compiled graph g0"); `nbytes`, what it asked for if known."""
    return _OutOfMemoryAsTorch(device, what, nbytes)


# ---- torch.tpu's memory functions ----------------------------------------------
# Bytes of live tpu storages, counted by the C++ buffer registry. Buffers are freed when their
# last tensor dies (no caching allocator), so "reserved" equals "allocated".


def memory_stats(device: DeviceLike = None) -> collections.OrderedDict[str, int]:
    """torch.cuda-style keys ("allocated_bytes.all.current", ...), plus the PJRT client's own
    stats as "device.<name>" where it has them (TPU and GPU clients; not the CPU client)."""
    index = _memory_index(device)
    stats = dict(_C._memory_stats(index))
    for kind in ("reserved_bytes", "active_bytes"):
        for field in ("current", "peak", "allocated", "freed"):
            stats[f"{kind}.all.{field}"] = stats[f"allocated_bytes.all.{field}"]
    stats["allocation.all.current"] = stats["active.all.current"]
    stats["num_alloc_retries"] = 0
    cap = limit(index)
    stats["limit_bytes"] = -1 if cap is None else cap
    stats["xla_temp_bytes.all.peak"] = _peak_temp_bytes.get(index, 0)
    for key, value in runtime_stats(index).items():
        stats[f"device.{key}"] = value
    return collections.OrderedDict(sorted(stats.items()))


def memory_allocated(device: DeviceLike = None) -> int:
    return _C._memory_stats(_memory_index(device))["allocated_bytes.all.current"]


def max_memory_allocated(device: DeviceLike = None) -> int:
    return _C._memory_stats(_memory_index(device))["allocated_bytes.all.peak"]


def memory_reserved(device: DeviceLike = None) -> int:
    return memory_allocated(device)


def max_memory_reserved(device: DeviceLike = None) -> int:
    return max_memory_allocated(device)


def reset_peak_memory_stats(device: DeviceLike = None) -> None:
    index = _memory_index(device)
    _C._reset_peak_memory_stats(index)
    _peak_temp_bytes.pop(index, None)


def reset_max_memory_allocated(device: DeviceLike = None) -> None:
    reset_peak_memory_stats(device)


def empty_cache() -> None:
    """Buffers are freed when their tensors die; nothing is cached."""


def mem_get_info(device: DeviceLike = None) -> tuple[int, int]:
    """(free, total) bytes: from the client's stats where it has them; on the CPU client the
    total is the limit if one is set, else host memory."""
    index = _memory_index(device)
    runtime = runtime_stats(index)
    if runtime.get("bytes_limit"):
        total = int(runtime["bytes_limit"])
        return max(total - int(runtime.get("bytes_in_use", 0)), 0), total
    cap = limit(index)
    if cap is not None:
        return max(cap - memory_allocated(index), 0), cap
    total = host_memory_bytes()
    free = host_available_bytes()
    return min(free, total), total


def set_per_process_memory_fraction(fraction: float, device: DeviceLike = None) -> None:
    """Caps tpu storages on the device at fraction * total_memory; past it, allocations raise
    torch.OutOfMemoryError."""
    index = _memory_index(device)
    if not isinstance(fraction, float):
        raise TypeError("Invalid type for fraction argument, must be `float`")
    if fraction < 0 or fraction > 1:
        raise ValueError(f"Invalid fraction value: {fraction}. Allowed range: 0~1")
    set_limit(index, int(fraction * total_memory(index)))


def get_per_process_memory_fraction(device: DeviceLike = None) -> float:
    index = _memory_index(device)
    cap = limit(index)
    return 1.0 if cap is None else cap / total_memory(index)
