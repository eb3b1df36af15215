"""`torch.tpu`: the device module, mirroring `torch.cuda`."""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from torch_tpu import _C
from torch_tpu.runtime import client

DeviceLike = torch.device | int | str | None


def _index(device: DeviceLike) -> int:
    if device is None:
        return _C._current_device()
    if isinstance(device, int):
        return device
    device = torch.device(device)
    if device.type != "tpu":
        raise ValueError(f"Expected a tpu device, but got: {device}")
    return device.index if device.index is not None else _C._current_device()


def is_available() -> bool:
    return device_count() > 0


def is_initialized() -> bool:
    return True


def device_count() -> int:
    return _C._device_count()


def current_device() -> int:
    return _C._current_device()


def set_device(device: DeviceLike) -> None:
    index = _index(device)
    if index >= 0:
        _C._set_current_device(index)


class device(contextlib.ContextDecorator):
    """Context manager that changes the current tpu device."""

    def __init__(self, device: DeviceLike):
        self.index = _index(device)
        self.previous = -1

    def __enter__(self):
        self.previous = _C._current_device()
        _C._set_current_device(self.index)

    def __exit__(self, *exc: Any) -> bool:
        _C._set_current_device(self.previous)
        return False


def synchronize(device: DeviceLike = None) -> None:
    client.synchronize()


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


def memory_stats(device: DeviceLike = None) -> dict[str, int]:
    index = _index(device)
    stats = dict(_C._memory_stats(index))
    try:
        runtime = client.jax_device(index).memory_stats() or {}
    except Exception:
        runtime = {}
    for key, value in runtime.items():
        stats[f"device.{key}"] = value
    return stats


def memory_allocated(device: DeviceLike = None) -> int:
    return _C._memory_stats(_index(device))["allocated_bytes.all.current"]


def max_memory_allocated(device: DeviceLike = None) -> int:
    return _C._memory_stats(_index(device))["allocated_bytes.all.peak"]


def reset_peak_memory_stats(device: DeviceLike = None) -> None:
    _C._reset_peak_memory_stats(_index(device))


def empty_cache() -> None:
    """Buffers are freed when their tensors die; nothing is cached."""


# ---- properties ----------------------------------------------------------------


class _DeviceProperties:
    def __init__(self, index: int):
        _, kind, platform, coords = _C._device_info(index)
        self.index = index
        self.name = kind
        self.platform = platform
        self.coords = tuple(coords)
        stats = memory_stats(index)
        self.total_memory = int(stats.get("device.bytes_limit", 0))

    def __repr__(self) -> str:
        return (
            f"_TpuDeviceProperties(name={self.name!r}, platform={self.platform!r}, "
            f"total_memory={self.total_memory // (1024 * 1024)}MB)"
        )


def get_device_name(device: DeviceLike = None) -> str:
    return _C._device_info(_index(device))[1]


def get_device_properties(device: DeviceLike = None) -> _DeviceProperties:
    return _DeviceProperties(_index(device))


def _is_in_bad_fork() -> bool:
    return False


def get_amp_supported_dtype() -> list[torch.dtype]:
    return [torch.bfloat16, torch.float16]
