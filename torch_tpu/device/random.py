"""The per-device default generators for `torch.tpu` (manual_seed, get_rng_state, ...)."""

from __future__ import annotations

import torch

from torch_tpu import _C
from torch_tpu.device.devices import DeviceLike, _index, device_count

# One default generator per tpu device, as torch.cuda.default_generators (set at import: the
# device list is known then).
default_generators: tuple[torch.Generator, ...] = tuple(_C._default_generator(i) for i in range(_C._device_count()))


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
