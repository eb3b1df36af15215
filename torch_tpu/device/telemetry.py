"""Device telemetry and capability queries for `torch.tpu`, as torch.cuda has them.

On TPU, utilization() and memory_usage() read libtpu's runtime metrics (platforms/tpu/monitoring.py:
duty_cycle_pct and runtime_hbm_utilization), where the platform reports them. Nothing reports
clock rate, power or temperature for tpu devices, and the XLA CPU client reports none of these,
so those calls raise NotImplementedError saying so.
"""

from __future__ import annotations

from torch_tpu.device.devices import DeviceLike, _index, _memory_index, _valid
from torch_tpu.platforms.tpu import monitoring
from torch_tpu.runtime import client


def _percent(what: str, metric: str, device: DeviceLike) -> int:
    index = _memory_index(device)
    value = monitoring.metric(metric, index)
    if value is None:
        platform = client.platform()
        where = (
            f"libtpu reports no {metric} for tpu:{index} on this host"
            if platform == "tpu"
            else f"the XLA {platform.upper()} client reports no {what}"
        )
        raise NotImplementedError(f"torch.tpu.{what}: {where}.")
    return round(value)


def utilization(device: DeviceLike = None) -> int:
    """Percent of the last sample period the TPU was executing (libtpu's duty_cycle_pct)."""
    return _percent("utilization", "duty_cycle_pct", device)


def memory_usage(device: DeviceLike = None) -> int:
    """Percent of the device's memory bandwidth in use over the last sample period (libtpu's
    runtime_hbm_utilization), CUDA's "global memory was being read or written"."""
    return _percent("memory_usage", "runtime_hbm_utilization", device)


def _unreported(what: str) -> NotImplementedError:
    return NotImplementedError(
        f"torch.tpu.{what}: neither PJRT nor libtpu reports a tpu device's {what.replace('_', ' ')}."
    )


def clock_rate(device: DeviceLike = None) -> int:
    _memory_index(device)
    raise _unreported("clock_rate")


def power_draw(device: DeviceLike = None) -> int:
    _memory_index(device)
    raise _unreported("power_draw")


def temperature(device: DeviceLike = None) -> int:
    _memory_index(device)
    raise _unreported("temperature")


def is_tf32_supported() -> bool:
    """False: TPUs have no TF32 format (float32 matmuls run in float32, or in bfloat16 passes
    where torch.set_float32_matmul_precision allows it)."""
    return False


def get_arch_list() -> list[str]:
    raise NotImplementedError(
        "torch.tpu.get_arch_list: torch_tpu ships no code built for device architectures; XLA "
        "compiles each op for the device present at run time (see torch.tpu.get_device_capability())."
    )


def can_device_access_peer(device: DeviceLike, peer_device: DeviceLike) -> bool:
    """Whether tensors move between the two devices directly: True for two distinct tpu devices
    of this process (a copy goes device to device, chip to chip on TPU); a device and itself
    are no peers, as in torch.cuda."""
    index, peer = _index(device, optional=False), _index(peer_device, optional=False)
    if not _valid(index):
        raise AssertionError("Invalid device id")
    if not _valid(peer):
        raise AssertionError("Invalid peer device id")
    return index != peer


def is_current_stream_capturing() -> bool:
    """False: tpu has no stream capture (CUDA graphs); torch.compile builds graphs instead."""
    return False


_SYNC_DEBUG_MODES = {"default": 0, "warn": 1, "error": 2}


def get_sync_debug_mode() -> int:
    """0: torch_tpu never flags ops that wait for the device."""
    return 0


def set_sync_debug_mode(debug_mode: int | str) -> None:
    """Only mode 0 ("default"): torch_tpu does not track which ops wait for the device, so it
    cannot warn or raise on them (modes 1 "warn" and 2 "error")."""
    if isinstance(debug_mode, str):
        if debug_mode not in _SYNC_DEBUG_MODES:
            raise RuntimeError("invalid value of debug_mode, expected one of `default`, `warn`, `error`")
        debug_mode = _SYNC_DEBUG_MODES[debug_mode]
    if debug_mode != 0:
        raise NotImplementedError(
            "torch.tpu.set_sync_debug_mode: torch_tpu does not track which ops wait for the device, "
            "so it cannot warn or raise on them; only mode 0 ('default') is available."
        )
