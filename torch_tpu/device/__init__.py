"""`torch.tpu`: the device module, mirroring `torch.cuda`.

Devices take an int, a "tpu"/"tpu:N" string, a torch.device or None (the current device).
The functions live in devices.py, streams.py, random.py and memory.py; this module gathers
them under torch.tpu's names.
"""

from __future__ import annotations

import torch

from torch_tpu import _C, amp
from torch_tpu.device import memory
from torch_tpu.device.devices import (
    DeviceLike,
    _index,
    _lazy_init,
    _memory_index,
    _ordinal,
    _valid,
    current_device,
    device,
    device_count,
    device_of,
    init,
    is_available,
    is_initialized,
    set_device,
    synchronize,
)
from torch_tpu.device.memory import (
    empty_cache,
    get_per_process_memory_fraction,
    max_memory_allocated,
    max_memory_reserved,
    mem_get_info,
    memory_allocated,
    memory_reserved,
    memory_stats,
    reset_max_memory_allocated,
    reset_peak_memory_stats,
    set_per_process_memory_fraction,
)
from torch_tpu.device.properties import (
    _is_in_bad_fork,
    _TpuDeviceProperties,
    get_amp_supported_dtype,
    get_device_capability,
    get_device_name,
    get_device_properties,
    is_bf16_supported,
)
from torch_tpu.device.random import (
    default_generator,
    get_rng_state,
    get_rng_state_all,
    initial_seed,
    manual_seed,
    manual_seed_all,
    seed,
    seed_all,
    set_rng_state,
    set_rng_state_all,
)
from torch_tpu.device.streams import (
    Event,
    Stream,
    StreamContext,
    current_stream,
    default_stream,
    set_stream,
    stream,
)
from torch_tpu.ops import precision as _precision
from torch_tpu.runtime import client

__all__ = [
    "DeviceLike",
    "Event",
    "Stream",
    "StreamContext",
    "_TpuDeviceProperties",
    "_index",
    "_is_in_bad_fork",
    "_lazy_init",
    "_memory_index",
    "_ordinal",
    "_valid",
    "amp",
    "current_device",
    "current_stream",
    "default_generator",
    "default_stream",
    "device",
    "device_count",
    "device_of",
    "empty_cache",
    "get_amp_supported_dtype",
    "get_device_capability",
    "get_device_name",
    "get_device_properties",
    "get_per_process_memory_fraction",
    "get_rng_state",
    "get_rng_state_all",
    "init",
    "initial_seed",
    "is_available",
    "is_bf16_supported",
    "is_initialized",
    "manual_seed",
    "manual_seed_all",
    "max_memory_allocated",
    "max_memory_reserved",
    "mem_get_info",
    "memory",
    "memory_allocated",
    "memory_reserved",
    "memory_stats",
    "reset_max_memory_allocated",
    "reset_peak_memory_stats",
    "seed",
    "seed_all",
    "set_device",
    "set_per_process_memory_fraction",
    "set_rng_state",
    "set_rng_state_all",
    "set_stream",
    "stream",
    "synchronize",
]

_C._set_synchronize_hook(client.synchronize)
_C._set_memory_info_hook(mem_get_info)
memory.apply_env_limit()
torch.set_autocast_dtype("tpu", torch.bfloat16)  # CUDA's default is float16; TPUs train in bfloat16
_precision.apply_env()
