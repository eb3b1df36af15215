"""Device properties for `torch.tpu` (get_device_properties, get_device_name, ...)."""

from __future__ import annotations

import re

import torch

from torch_tpu import _C
from torch_tpu.device import memory
from torch_tpu.device.devices import DeviceLike, _index, _valid
from torch_tpu.runtime import client


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


def tpu_generation(device_kind: str) -> int | None:
    """The TPU generation in a jax device_kind: 4 for "TPU v4", 5 for "TPU v5 lite" (v5e) and
    "TPU v5p", 6 for "TPU v6 lite", 7 for "TPU7x"; None if it names none."""
    match = re.search(r"TPU\s*v?(\d+)|\bv(\d+)", device_kind)
    return int(match.group(1) or match.group(2)) if match else None


def get_device_capability(device: DeviceLike = None) -> tuple[int, int]:
    """(major, minor): the TPU generation as (N, 0) (a v5e, "TPU v5 lite", is (5, 0)), a GPU's
    compute capability, and (0, 0) on the XLA CPU client, which is no TPU generation."""
    props = get_device_properties(device)
    if props.platform == "tpu":
        return (tpu_generation(props.name) or 0, 0)
    capability = getattr(client.jax_device(props.index), "compute_capability", None)
    if capability:
        major, _, minor = str(capability).partition(".")
        return int(major), int(minor or 0)
    return 0, 0


def is_bf16_supported(including_emulation: bool = True) -> bool:
    """bfloat16 is native on every TPU and on GPUs of compute capability 8.0 and up; elsewhere
    (older GPUs, the CPU client) XLA emulates it in float32, which counts with
    including_emulation=True."""
    if not _C._device_count():
        return False
    props = get_device_properties(None)
    if props.platform == "tpu" or including_emulation:
        return True
    return props.platform in ("gpu", "cuda") and get_device_capability(None) >= (8, 0)
