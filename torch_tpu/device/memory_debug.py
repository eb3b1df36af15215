"""torch.cuda's memory-debugging calls for `torch.tpu`: summaries, snapshots, processes, aliases.

tpu memory is PJRT buffers, one per live storage, freed when the storage dies: there is no
caching allocator, so "reserved" equals "allocated", every buffer is its own segment, and the
calls that manage a cache or pools of one (MemPool, caching_allocator_alloc, ...) raise
NotImplementedError saying so. Pinned host memory is plain host memory (csrc/host_allocator.cc)
with no cache either, so the host_memory_* calls raise too.
"""

from __future__ import annotations

import collections
import contextlib
import os
import warnings
from typing import Any

import torch

from torch_tpu import _C
from torch_tpu.device import memory
from torch_tpu.device.devices import DeviceLike, _memory_index
from torch_tpu.runtime import client

OutOfMemoryError = torch.OutOfMemoryError  # what a tpu allocation past the limit raises

_NO_CACHING_ALLOCATOR = (
    "tpu memory is PJRT buffers, one per live storage and freed with it: there is no caching "
    "allocator {what}. Allocate with torch.empty(..., device='tpu')."
)
_NO_HOST_CACHE = (
    "pin_memory() on tpu is plain 64-byte aligned host memory (PJRT stages every transfer itself), "
    "and nothing is cached, so there are no pinned host memory stats"
)


def _full_stats(index: int) -> dict[str, int]:
    """torch.accelerator's stats for the device: every key of CUDA's memory_stats()."""
    return dict(torch.accelerator.memory_stats(index))


def memory_stats_as_nested_dict(device: DeviceLike = None) -> dict[str, Any]:
    """memory_stats() nested at each "." of its keys, as torch.cuda returns it."""
    nested: dict[str, Any] = {}
    for key, value in memory.memory_stats(device).items():
        node = nested
        *parents, leaf = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return nested


def reset_accumulated_memory_stats(device: DeviceLike = None) -> None:
    """Zeroes the cumulative counters: bytes and buffers ever allocated and freed, and OOMs."""
    torch.accelerator.reset_accumulated_memory_stats(_memory_index(device))


def device_memory_used(device: DeviceLike = None) -> int:
    """Bytes in use on the device: the PJRT client's bytes_in_use where it reports it (TPU),
    else (the CPU client) the bytes of live tpu storages."""
    index = _memory_index(device)
    in_use = memory.runtime_stats(index).get("bytes_in_use")
    return int(in_use) if in_use is not None else memory.memory_allocated(index)


def memory_cached(device: DeviceLike = None) -> int:
    """Deprecated alias of memory_reserved(), as in torch.cuda."""
    warnings.warn("torch.tpu.memory_cached has been renamed to torch.tpu.memory_reserved", FutureWarning, stacklevel=2)
    return memory.memory_reserved(device)


def max_memory_cached(device: DeviceLike = None) -> int:
    """Deprecated alias of max_memory_reserved(), as in torch.cuda."""
    warnings.warn(
        "torch.tpu.max_memory_cached has been renamed to torch.tpu.max_memory_reserved", FutureWarning, stacklevel=2
    )
    return memory.max_memory_reserved(device)


def reset_max_memory_cached(device: DeviceLike = None) -> None:
    """Deprecated alias of reset_peak_memory_stats(), as in torch.cuda."""
    warnings.warn(
        "torch.tpu.reset_max_memory_cached now calls torch.tpu.reset_peak_memory_stats, "
        "which resets /all/ peak memory stats.",
        FutureWarning,
        stacklevel=2,
    )
    memory.reset_peak_memory_stats(device)


def _format_size(size: int, scale: float) -> str:
    prefix = "B  "
    for next_prefix in ("KiB", "MiB", "GiB", "TiB", "PiB"):
        if scale < 768 * 1024:
            break
        prefix, size, scale = next_prefix, size // 1024, scale / 1024
    return f"{size:6d} {prefix}"


def _format_count(count: int, scale: float) -> str:
    prefix = " "
    for next_prefix in ("K", "M"):
        if scale < 750 * 1000:
            break
        prefix, count, scale = next_prefix, count // 1000, scale / 1000
    return f"{count:7d} {prefix} "


_SUMMARY_ROWS = (
    ("allocated_bytes", "Allocated memory", _format_size),
    ("active_bytes", "Active memory", _format_size),
    ("requested_bytes", "Requested memory", _format_size),
    ("reserved_bytes", "TPU reserved memory", _format_size),
    ("inactive_split_bytes", "Non-releasable memory", _format_size),
    ("allocation", "Allocations", _format_count),
    ("active", "Active allocs", _format_count),
    ("segment", "TPU reserved segments", _format_count),
    ("inactive_split", "Non-releasable allocs", _format_count),
)


def memory_summary(device: DeviceLike = None, abbreviated: bool = False) -> str:
    """torch.cuda.memory_summary()'s table for a tpu device. Buffers are not pooled, so the
    large and small pool rows (left out when `abbreviated`) are 0 and reserved equals allocated."""
    index = _memory_index(device)
    stats = _full_stats(index)
    lines = [
        "=" * 75,
        f" {'':16} PyTorch TPU memory summary, device ID {index:<18d} ",
        "-" * 75,
        f"  {'':9} TPU OOMs: {stats['num_ooms']:<13d} | {'':6} allocation retries: {stats['num_alloc_retries']:<8d}  ",
        "=" * 75,
        "        Metric         | Cur Usage  | Peak Usage | Tot Alloc  | Tot Freed  ",
    ]
    pools = [("all", None)] if abbreviated else [("all", None), ("large_pool", "large"), ("small_pool", "small")]
    for key, name, fmt in _SUMMARY_ROWS:
        lines.append("-" * 75)
        scale = None
        for pool, pool_name in pools:
            values = [stats[f"{key}.{pool}.{field}"] for field in ("current", "peak", "allocated", "freed")]
            scale = scale or values
            label = name if pool_name is None else f"      from {pool_name} pool"
            cells = " | ".join(fmt(v, s) for v, s in zip(values, scale))
            lines.append(f" {label:<21} | {cells} ")
    for key, name in (("oversize_allocations", "Oversize allocations"), ("oversize_segments", "Oversize TPU segments")):
        lines.append("-" * 75)
        values = [stats[f"{key}.{field}"] for field in ("current", "peak", "allocated", "freed")]
        lines.append(f" {name:<21} | {' | '.join(_format_count(v, v) for v in values)} ")
    lines.append("=" * 75)
    return "|" + "|\n|".join(lines) + "|\n"


def memory_snapshot() -> list[dict[str, Any]]:
    """torch.cuda.memory_snapshot()'s segment list: one segment per live tpu buffer (no
    caching allocator splits them), each holding one active block. Addresses are the buffers'
    data_ptr() values; no stack frames are recorded."""
    segments = []
    for index, address, size in _C._live_buffers():
        block = {"address": address, "size": size, "requested_size": size, "state": "active_allocated", "frames": []}
        segments.append(
            {
                "device": index,
                "address": address,
                "total_size": size,
                "allocated_size": size,
                "active_size": size,
                "requested_size": size,
                "stream": 0,
                "segment_type": "large" if size > 1 << 20 else "small",
                "segment_pool_id": (0, 0),
                "is_expandable": False,
                "frames": [],
                "blocks": [block],
            }
        )
    return segments


def list_gpu_processes(device: DeviceLike = None) -> str:
    """The torch_tpu processes holding memory on the device and how much, as torch.cuda's
    list_gpu_processes prints them. Other processes are seen through their stats files (the
    ones tpu-info reads, torch_tpu/tools/stats_file.py)."""
    from torch_tpu.tools import stats_file

    index = _memory_index(device)
    platform = client.platform()
    own = stats_file.snapshot()
    records = [own, *stats_file.read_all(skip_pid=os.getpid())]
    lines = [f"TPU:{index}"]
    for record in records:
        for d in record.get("devices", []):
            if d["index"] == index and d["platform"] == platform and d["memory_in_use_bytes"]:
                mb = d["memory_in_use_bytes"] / (1024 * 1024)
                lines.append(f"process {record['pid']:>10d} uses {mb:>12.3f} MB TPU memory")
    if len(lines) == 1:
        lines.append("no processes are running")
    return "\n".join(lines)


def host_memory_stats() -> collections.OrderedDict[str, Any]:
    raise NotImplementedError(f"torch.tpu.host_memory_stats: {_NO_HOST_CACHE}.")


def host_memory_stats_as_nested_dict() -> dict[str, Any]:
    raise NotImplementedError(f"torch.tpu.host_memory_stats_as_nested_dict: {_NO_HOST_CACHE}.")


def reset_accumulated_host_memory_stats() -> None:
    raise NotImplementedError(f"torch.tpu.reset_accumulated_host_memory_stats: {_NO_HOST_CACHE}.")


def reset_peak_host_memory_stats() -> None:
    raise NotImplementedError(f"torch.tpu.reset_peak_host_memory_stats: {_NO_HOST_CACHE}.")


def caching_allocator_alloc(size: int, device: DeviceLike = None, stream: Any = None) -> int:
    raise NotImplementedError(
        "torch.tpu.caching_allocator_alloc: " + _NO_CACHING_ALLOCATOR.format(what="to take raw memory from")
    )


def caching_allocator_delete(mem_ptr: int) -> None:
    raise NotImplementedError(
        "torch.tpu.caching_allocator_delete: " + _NO_CACHING_ALLOCATOR.format(what="to give raw memory back to")
    )


class MemPool:
    """CUDA's private allocator pools: tpu has no caching allocator to pool."""

    def __init__(self, *args: Any, **kwargs: Any):
        raise NotImplementedError("torch.tpu.MemPool: " + _NO_CACHING_ALLOCATOR.format(what="whose pools to split"))


@contextlib.contextmanager
def use_mem_pool(pool: Any, device: DeviceLike = None):
    raise NotImplementedError("torch.tpu.use_mem_pool: " + _NO_CACHING_ALLOCATOR.format(what="whose pools to select"))
    yield  # pragma: no cover


def get_allocator_backend() -> str:
    """ "pjrt": tpu storages are PJRT buffers (XLA's device allocator), not CUDA's "native"
    caching allocator nor "cudaMallocAsync"."""
    return "pjrt"


def ipc_collect() -> None:
    """Nothing to collect: tpu tensors are never shared with other processes through IPC
    handles (CUDA frees the memory of such handles whose users died)."""
