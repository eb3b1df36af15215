"""Device indices, the current device and synchronization for `torch.tpu`."""

from __future__ import annotations

import sys
from typing import Any

import torch

from torch_tpu import _C
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
    lazy = sys.modules.get("torch_tpu.compile.lazy")  # ops recorded in lazy mode run first
    if lazy is not None:
        lazy.sync()
    client.synchronize()
