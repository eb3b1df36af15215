"""`torch.tpu`: the device module, mirroring `torch.cuda`.

Devices take an int, a "tpu"/"tpu:N" string, a torch.device or None (the current device).
Execution is in order per device, so streams and events are ordering points: there is one
stream per device, and waits are no-ops. Timing events wait for queued work and take
wall-clock timestamps, so Event.elapsed_time() measures the work between two of them.
"""

from __future__ import annotations

import collections
import time
from typing import Any

import torch

from torch_tpu import _C, memory
from torch_tpu.runtime import client

DeviceLike = torch.device | int | str | None


def _index(device: DeviceLike, optional: bool = True) -> int:
    """torch.cuda's _get_device_index for tpu: None or an index-less device is the current one."""
    if isinstance(device, str):
        device = torch.device(device)
    if isinstance(device, torch.device):
        if device.type != "tpu":
            raise ValueError(f"Expected a tpu device, but got: {device}")
        device = device.index
    if device is None:
        if not optional:
            raise ValueError("Expected a torch.device with a specified index or an integer, but got:None")
        return _C._current_device()
    if not isinstance(device, int):
        raise TypeError(f"Expected a tpu device as an int, str or torch.device, but got: {type(device).__name__}")
    return device


def _valid(index: int) -> bool:
    return 0 <= index < device_count()


def _memory_index(device: DeviceLike) -> int:
    index = _index(device)
    if not _valid(index):
        raise RuntimeError(f"Invalid device argument {index}: there are {device_count()} tpu devices")
    return index


def _ordinal(index: int) -> int:
    if not _valid(index):
        raise torch.AcceleratorError(
            f"tpu error: invalid device ordinal {index} ({device_count()} tpu devices are visible)"
        )
    return index


# ---- devices -------------------------------------------------------------------


def is_available() -> bool:
    return device_count() > 0


def is_initialized() -> bool:
    """True: the PJRT client is created when torch_tpu is imported."""
    return True


def init() -> None:
    """Initializes the runtime; it already is once torch_tpu is imported."""
    client.devices()


def _lazy_init() -> None:
    init()


def device_count() -> int:
    return _C._device_count()


def current_device() -> int:
    return _C._current_device()


def set_device(device: DeviceLike) -> None:
    index = _index(device)
    if index >= 0:
        _C._set_current_device(_ordinal(index))


class device:
    """Context manager that changes the current tpu device (a negative index or None: no change)."""

    def __init__(self, device: DeviceLike):
        self.idx = -1 if device is None else _index(device)
        self.prev_idx = -1

    def __enter__(self) -> device:
        self.prev_idx = _C._current_device()
        if self.idx >= 0 and self.idx != self.prev_idx:
            _C._set_current_device(_ordinal(self.idx))
        return self

    def __exit__(self, *exc: Any) -> bool:
        if self.idx >= 0 and self.idx != self.prev_idx:
            _C._set_current_device(self.prev_idx)
        return False


class device_of(device):
    """Context manager that makes the device of tensor `obj` current (no change for a CPU tensor)."""

    def __init__(self, obj: torch.Tensor):
        super().__init__(obj.device if obj.device.type == "tpu" else -1)


def synchronize(device: DeviceLike = None) -> None:
    """Waits for all queued work on the device (the client waits for all of them)."""
    index = _index(device)
    if index >= 0:
        _ordinal(index)
    client.synchronize()


# ---- streams and events ---------------------------------------------------------


class Stream(torch.Stream):
    """A tpu stream. Each device has one in-order stream, so every Stream of a device is it."""

    def __new__(cls, device: DeviceLike = None, priority: int = 0, **kwargs: Any) -> Stream:
        if kwargs:  # stream_id=, device_index=, device_type=: rebuilding an existing stream
            return super().__new__(cls, priority=priority, **kwargs)
        return super().__new__(cls, device=torch.device("tpu", _ordinal(_index(device))), priority=priority)

    def wait_event(self, event: torch.Event) -> None:
        event.wait(self)

    def wait_stream(self, stream: torch.Stream) -> None:
        self.wait_event(stream.record_event())

    def record_event(self, event: torch.Event | None = None) -> torch.Event:
        if event is None:
            event = Event()
        event.record(self)
        return event

    def __repr__(self) -> str:
        return f"<torch.tpu.Stream device={self.device} stream_id={self.stream_id}>"


class Event(torch.Event):
    """A tpu event: an ordering point in its stream. With enable_timing=True, record() waits for
    queued work first, so elapsed_time() (milliseconds) is the wall time of the work between."""

    def __new__(cls, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False) -> Event:
        event = super().__new__(
            cls, device="tpu", enable_timing=enable_timing, blocking=blocking, interprocess=interprocess
        )
        event._timing = enable_timing
        event._recorded_at = None
        return event

    def record(self, stream: torch.Stream | None = None) -> None:
        super().record(current_stream() if stream is None else stream)  # a timing event synchronizes
        self._recorded_at = time.perf_counter()

    def wait(self, stream: torch.Stream | None = None) -> None:
        super().wait(current_stream() if stream is None else stream)

    def elapsed_time(self, end_event: torch.Event) -> float:
        """Milliseconds from this event to `end_event`."""
        if not isinstance(end_event, Event):  # a torch.Event(device="tpu"): timed in C++
            return super().elapsed_time(end_event)
        if not (self._timing and end_event._timing):
            raise RuntimeError("Both events must be created with argument 'enable_timing=True'.")
        if self._recorded_at is None or end_event._recorded_at is None:
            raise RuntimeError("Both events must be recorded before calculating elapsed time.")
        return (end_event._recorded_at - self._recorded_at) * 1000.0

    def __repr__(self) -> str:
        return f"<torch.tpu.Event {self.event_id:#x}>" if self.event_id else "<torch.tpu.Event uninitialized>"


def current_stream(device: DeviceLike = None) -> Stream:
    s = torch.accelerator.current_stream(_ordinal(_index(device)))
    return Stream(stream_id=s.stream_id, device_index=s.device_index, device_type=s.device_type)


def default_stream(device: DeviceLike = None) -> Stream:
    return current_stream(device)


def set_stream(stream: torch.Stream | None) -> None:
    """Makes `stream` current; with one stream per device this only checks it is a tpu stream."""
    if stream is not None and stream.device.type != "tpu":
        raise ValueError(f"Expected a tpu stream, but got one on {stream.device}")


class StreamContext:
    """Context manager that selects a stream (a no-op for None): a tpu stream is always current."""

    def __init__(self, stream: torch.Stream | None):
        set_stream(stream)
        self.stream = stream
        self._device = device(None if stream is None else stream.device_index)

    def __enter__(self) -> StreamContext:
        self._device.__enter__()
        return self

    def __exit__(self, *exc: Any) -> bool:
        return self._device.__exit__(*exc)


def stream(stream: torch.Stream | None) -> StreamContext:
    return StreamContext(stream)


# ---- random ------------------------------------------------------------------


def _generator(device: DeviceLike = None) -> torch.Generator:
    return _C._default_generator(_index(device))


def manual_seed(seed: int) -> None:
    _generator().manual_seed(int(seed))


def manual_seed_all(seed: int) -> None:
    for i in range(device_count()):
        _generator(i).manual_seed(int(seed))


def seed() -> None:
    _generator().seed()


def seed_all() -> None:
    for i in range(device_count()):
        _generator(i).seed()


def initial_seed() -> int:
    return _generator().initial_seed()


def get_rng_state(device: DeviceLike = "tpu") -> torch.Tensor:
    return _generator(device).get_state()


def set_rng_state(new_state: torch.Tensor, device: DeviceLike = "tpu") -> None:
    _generator(device).set_state(new_state)


def get_rng_state_all() -> list[torch.Tensor]:
    return [get_rng_state(i) for i in range(device_count())]


def set_rng_state_all(new_states: list[torch.Tensor]) -> None:
    for i, state in enumerate(new_states):
        set_rng_state(state, i)


def default_generator(device: DeviceLike = None) -> torch.Generator:
    return _generator(device)


# ---- memory ------------------------------------------------------------------
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
    limit = memory.limit(index)
    stats["limit_bytes"] = -1 if limit is None else limit
    for key, value in memory.runtime_stats(index).items():
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
    _C._reset_peak_memory_stats(_memory_index(device))


def reset_max_memory_allocated(device: DeviceLike = None) -> None:
    reset_peak_memory_stats(device)


def empty_cache() -> None:
    """Buffers are freed when their tensors die; nothing is cached."""


def mem_get_info(device: DeviceLike = None) -> tuple[int, int]:
    """(free, total) bytes: from the client's stats where it has them; on the CPU client the
    total is the limit if one is set, else host memory."""
    index = _memory_index(device)
    runtime = memory.runtime_stats(index)
    if runtime.get("bytes_limit"):
        total = int(runtime["bytes_limit"])
        return max(total - int(runtime.get("bytes_in_use", 0)), 0), total
    limit = memory.limit(index)
    if limit is not None:
        return max(limit - memory_allocated(index), 0), limit
    total = memory.host_memory_bytes()
    free = memory.host_available_bytes()
    return min(free, total), total


def set_per_process_memory_fraction(fraction: float, device: DeviceLike = None) -> None:
    """Caps tpu storages on the device at fraction * total_memory; past it, allocations raise
    torch.OutOfMemoryError."""
    index = _memory_index(device)
    if not isinstance(fraction, float):
        raise TypeError("Invalid type for fraction argument, must be `float`")
    if fraction < 0 or fraction > 1:
        raise ValueError(f"Invalid fraction value: {fraction}. Allowed range: 0~1")
    memory.set_limit(index, int(fraction * memory.total_memory(index)))


def get_per_process_memory_fraction(device: DeviceLike = None) -> float:
    index = _memory_index(device)
    limit = memory.limit(index)
    return 1.0 if limit is None else limit / memory.total_memory(index)


# ---- properties ----------------------------------------------------------------


class _TpuDeviceProperties:
    def __init__(self, index: int):
        _, kind, platform, coords = _C._device_info(index)
        self.index = index
        self.name = kind
        self.platform = platform
        self.coords = tuple(coords)
        self.total_memory = memory.total_memory(index)

    def __repr__(self) -> str:
        return (
            f"_TpuDeviceProperties(name={self.name!r}, platform={self.platform!r}, "
            f"total_memory={self.total_memory // (1024 * 1024)}MB)"
        )


def get_device_properties(device: DeviceLike = None) -> _TpuDeviceProperties:
    index = _index(device)
    if not _valid(index):
        raise AssertionError("Invalid device id")
    return _TpuDeviceProperties(index)


def get_device_name(device: DeviceLike = None) -> str:
    return get_device_properties(device).name


def _is_in_bad_fork() -> bool:
    return False


def get_amp_supported_dtype() -> list[torch.dtype]:
    return [torch.bfloat16, torch.float16]
