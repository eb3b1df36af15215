"""torch.tpu against torch.cuda's generic API: a count, and the names it gained for issue 31.

How the 76 generic names are chosen: torch.cuda's public names (its __all__, 125 in torch 2.13,
plus OutOfMemoryError, which torch.cuda exports outside __all__) less two groups:
  - LEGACY: the 22 typed tensor and storage classes (torch.cuda.FloatTensor, ...);
  - CUDA_ONLY: 28 names that are CUDA or NVIDIA machinery: its libraries and toolkit (cudart,
    nccl, nvtx, jiterator, cuBLAS/cuSOLVER handles, MAGMA, gencode flags, CUDA error types),
    CUDA graphs, raw CUDA stream and context handles, the pluggable-allocator hooks and the caching
    allocator's on/off switch.
What is left, GENERIC, is what any accelerator's module can have: devices, streams, random,
memory stats and debugging, telemetry and capability queries. Each name torch.tpu has is real
or raises NotImplementedError saying why (NOT_IMPLEMENTED below).
"""

from __future__ import annotations

import os
import re
import warnings

import pytest
import torch

import torch_tpu
from torch_tpu.device.memory_debug import _format_size
from torch_tpu.device.properties import tpu_generation

LEGACY = {
    f"{kind}{suffix}"
    for kind in ("BFloat16", "Bool", "Byte", "Char", "Double", "Float", "Half", "Int", "Long", "Short")
    for suffix in ("Tensor", "Storage")
} | {"ComplexDoubleStorage", "ComplexFloatStorage"}

CUDA_ONLY = {
    # libraries and toolkit
    "cudart", "nccl", "nvtx", "jiterator", "sparse", "tunable", "profiler", "current_blas_handle",
    "current_solver_handle", "has_magma", "has_half", "get_gencode_flags", "check_error", "cudaStatus",
    "CudaError", "DeferredCudaCallError",
    # CUDA graphs
    "CUDAGraph", "graph", "graphs", "graph_pool_handle", "make_graphed_callables",
    # raw CUDA stream and context handles
    "ExternalStream", "get_stream_from_external", "GreenContext",
    # pluggable-allocator hooks and the caching allocator's on/off switch
    "CUDAPluggableAllocator", "change_current_allocator", "caching_allocator_enable", "caching_allocator_disabled",
}  # fmt: skip

GENERIC = sorted(set(torch.cuda.__all__) - LEGACY - CUDA_ONLY | {"OutOfMemoryError"})

# Names torch.tpu has that raise NotImplementedError (what they would report does not exist on
# tpu), with a call that shows it.
NOT_IMPLEMENTED = {
    "caching_allocator_alloc": lambda f: f(16),
    "caching_allocator_delete": lambda f: f(0),
    "MemPool": lambda f: f(),
    "use_mem_pool": lambda f: f(None).__enter__(),
    "host_memory_stats": lambda f: f(),
    "host_memory_stats_as_nested_dict": lambda f: f(),
    "reset_accumulated_host_memory_stats": lambda f: f(),
    "reset_peak_host_memory_stats": lambda f: f(),
    "clock_rate": lambda f: f(),
    "power_draw": lambda f: f(),
    "temperature": lambda f: f(),
    "get_arch_list": lambda f: f(),
}
if torch_tpu.platform() != "tpu":  # libtpu's runtime metrics exist only on TPU
    NOT_IMPLEMENTED |= {"utilization": lambda f: f(), "memory_usage": lambda f: f()}


def test_generic_names_are_all_of_torch_cuda_classified():
    everything = set(torch.cuda.__all__) | {"OutOfMemoryError"}
    assert LEGACY | CUDA_ONLY <= everything
    assert len(LEGACY) == 22 and len(CUDA_ONLY) == 28
    assert len(GENERIC) == 76
    assert all(hasattr(torch.cuda, name) for name in GENERIC)


def test_torch_tpu_has_most_of_torch_cuda_generic_api():
    have = [name for name in GENERIC if hasattr(torch.tpu, name)]
    missing = sorted(set(GENERIC) - set(have))
    print(f"\ntorch.tpu has {len(have)}/{len(GENERIC)} of torch.cuda's generic names; missing: {missing}")
    assert len(have) >= 70


@pytest.mark.parametrize("name", sorted(NOT_IMPLEMENTED))
def test_unsupported_names_raise_saying_why(name):
    with pytest.raises(NotImplementedError, match=rf"torch\.tpu\.{name}: .{{40,}}"):
        NOT_IMPLEMENTED[name](getattr(torch.tpu, name))


def _table(text: str) -> list[str]:
    return text.rstrip("\n").split("\n")


def test_memory_summary_is_cudas_table(monkeypatch):
    """The same table torch.cuda.memory_summary() prints from the same stats, CUDA's words aside."""
    keep = torch.ones(1000, device="tpu")  # noqa: F841
    stats = torch.accelerator.memory_stats(0)
    for abbreviated in (False, True):
        ours = _table(torch.tpu.memory_summary(0, abbreviated=abbreviated))
        monkeypatch.setattr(torch.cuda.memory, "memory_stats", lambda device=None: stats)
        cudas = _table(torch.cuda.memory_summary(0, abbreviated=abbreviated))
        assert len(ours) == len(cudas) and all(len(line) == 77 for line in ours)
        assert "PyTorch TPU memory summary, device ID 0" in ours[1]
        assert re.search(r"TPU OOMs: 0 +\| +allocation retries: 0", ours[3])
        renamed = [line.replace("GPU", "TPU") for line in cudas[5:]]
        assert ours[5:] == renamed
    allocated = torch.tpu.memory_allocated(0)
    assert f"Allocated memory      | {_format_size(allocated, allocated)} |" in torch.tpu.memory_summary(0)
    assert _format_size(4000, 4000) == "  4000 B  " and _format_size(3 << 20, 3 << 20) == "  3072 KiB"


def test_memory_stats_nested_and_accumulated_reset():
    torch.tpu.reset_accumulated_memory_stats()
    before = torch.tpu.memory_allocated()
    x = torch.ones(256, device="tpu")
    del x
    nested = torch.tpu.memory_stats_as_nested_dict()
    assert nested["allocated_bytes"]["all"]["current"] == torch.tpu.memory_allocated() == before
    assert nested["allocated_bytes"]["all"]["allocated"] >= 1024
    torch.tpu.reset_accumulated_memory_stats()
    stats = torch.tpu.memory_stats()
    assert stats["allocated_bytes.all.allocated"] == stats["allocated_bytes.all.freed"] == 0
    assert stats["allocated_bytes.all.current"] == before


def test_memory_snapshot_lists_live_buffers():
    x = torch.ones(1000, device="tpu")
    y = torch.ones(10, device="tpu:1" if torch.tpu.device_count() > 1 else "tpu:0")
    segments = {s["address"]: s for s in torch.tpu.memory_snapshot()}
    segment = segments[x.data_ptr()]
    assert segment["device"] == 0 and segment["total_size"] == 4000
    assert segment["blocks"] == [
        {"address": x.data_ptr(), "size": 4000, "requested_size": 4000, "state": "active_allocated", "frames": []}
    ]
    assert segments[y.data_ptr()]["device"] == y.device.index
    assert sum(s["total_size"] for s in segments.values() if s["device"] == 0) == torch.tpu.memory_allocated(0)
    address = x.data_ptr()
    del x, segment, segments
    assert all(s["address"] != address for s in torch.tpu.memory_snapshot())


def test_list_gpu_processes_shows_this_process():
    keep = torch.ones(1 << 18, device="tpu")  # noqa: F841
    text = torch.tpu.list_gpu_processes(0)
    lines = text.split("\n")
    assert lines[0] == "TPU:0"
    assert any(re.fullmatch(rf"process {os.getpid():>10d} uses +\d+\.\d{{3}} MB TPU memory", line) for line in lines)


def test_cached_aliases_warn_and_match():
    keep = torch.ones(100, device="tpu")  # noqa: F841
    with pytest.warns(FutureWarning, match="renamed to torch.tpu.memory_reserved"):
        assert torch.tpu.memory_cached() == torch.tpu.memory_reserved()
    with pytest.warns(FutureWarning, match="renamed to torch.tpu.max_memory_reserved"):
        assert torch.tpu.max_memory_cached() == torch.tpu.max_memory_reserved()
    with pytest.warns(FutureWarning, match="reset_peak_memory_stats"):
        torch.tpu.reset_max_memory_cached()
    assert torch.tpu.max_memory_reserved() == torch.tpu.memory_reserved()


def test_device_memory_used_and_out_of_memory_error():
    keep = torch.ones(100, device="tpu")  # noqa: F841
    if torch_tpu.platform() == "cpu":
        assert torch.tpu.device_memory_used() == torch.tpu.memory_allocated()
    assert torch.tpu.device_memory_used() > 0
    assert torch.tpu.OutOfMemoryError is torch.OutOfMemoryError is torch.cuda.OutOfMemoryError


def test_default_generators():
    gens = torch.tpu.default_generators
    assert isinstance(gens, tuple) and len(gens) == torch.tpu.device_count()
    torch.tpu.manual_seed_all(123)
    assert all(g.initial_seed() == 123 for g in gens)
    assert gens[0].device == torch.device("tpu", 0)


def test_device_capability():
    assert tpu_generation("TPU v4") == 4
    assert tpu_generation("TPU v5 lite") == 5
    assert tpu_generation("TPU v5p") == 5
    assert tpu_generation("TPU v6 lite") == 6
    assert tpu_generation("TPU7x") == 7
    assert tpu_generation("cpu") is None
    expected = (tpu_generation(torch.tpu.get_device_name()), 0) if torch_tpu.platform() == "tpu" else (0, 0)
    assert torch.tpu.get_device_capability() == expected


def test_small_queries():
    count = torch.tpu.device_count()
    assert torch.tpu.can_device_access_peer(0, 0) is False
    if count > 1:
        assert torch.tpu.can_device_access_peer(0, 1) is True
    with pytest.raises(AssertionError, match="Invalid peer device id"):
        torch.tpu.can_device_access_peer(0, count)
    assert torch.tpu.get_allocator_backend() == "pjrt"
    assert torch.tpu.is_current_stream_capturing() is False
    assert torch.tpu.is_tf32_supported() is False
    assert torch.tpu.ipc_collect() is None
    assert torch.tpu.get_sync_debug_mode() == 0
    torch.tpu.set_sync_debug_mode("default")
    with pytest.raises(NotImplementedError, match="only mode 0"):
        torch.tpu.set_sync_debug_mode("warn")
    with pytest.raises(RuntimeError, match="invalid value of debug_mode"):
        torch.tpu.set_sync_debug_mode("loud")


@pytest.mark.cpu_client  # its message
def test_utilization_on_the_cpu_client_says_why():
    with pytest.raises(NotImplementedError, match="XLA CPU client reports no utilization"):
        torch.tpu.utilization()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(NotImplementedError, match="no memory_usage"):
            torch.tpu.memory_usage(0)
