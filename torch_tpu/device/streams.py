"""Streams and events for `torch.tpu`.

Execution is in order per device, so streams and events are ordering points: there is one
stream per device, and waits are no-ops. Timing events wait for queued work and take
wall-clock timestamps, so Event.elapsed_time() measures the work between two of them.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from torch_tpu.device.devices import DeviceLike, _index, _ordinal, device


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
