"""Device properties for `torch.tpu` (get_device_properties, get_device_name, ...)."""

from __future__ import annotations

import torch

from torch_tpu import _C
from torch_tpu.device import memory
from torch_tpu.device.devices import DeviceLike, _index, _valid


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
