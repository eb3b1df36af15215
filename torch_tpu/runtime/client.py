"""Chooses the PJRT client: TPU (libtpu), then CUDA (jax plugin), then CPU."""

from __future__ import annotations

import functools
import logging
import os

import jax

# jax imports this inside device_put on first use; threads making their first transfers at once
# then race on a half-initialized module (ImportError). Importing it here, once, avoids that.
from jax.experimental import multihost_utils  # noqa: F401

_PLATFORMS = ("tpu", "cuda", "cpu")

# Called before every host read of a tpu value and at the end of synchronize()
# (ops/deferred_checks.py raises a failed index check there).
before_host_read: list = []
_log = logging.getLogger("torch_tpu")


def _configure_jax() -> None:
    # PyTorch semantics need 64-bit integers and doubles.
    jax.config.update("jax_enable_x64", True)
    count = os.environ.get("TORCH_TPU_NUM_CPU_DEVICES")
    if count:
        jax.config.update("jax_num_cpu_devices", int(count))
    excess = os.environ.get("TORCH_TPU_ALLOW_EXCESS_PRECISION", "").strip().lower()
    if excess:  # XLA's flag, read when the client is created: "0" rounds half floats as CPU does
        _add_xla_flag("xla_allow_excess_precision", "false" if excess in ("0", "false", "no", "off") else "true")
    # The CPU client's virtual devices are threads: on a loaded machine one can reach a collective
    # long after the others, and XLA's short default timeout then aborts the whole process.
    _add_xla_flag("xla_cpu_collective_call_warn_stuck_timeout_seconds", "120", keep_user_value=True)
    _add_xla_flag("xla_cpu_collective_call_terminate_timeout_seconds", "1800", keep_user_value=True)


def _add_xla_flag(name: str, value: str, keep_user_value: bool = False) -> None:
    """Appends --name=value to XLA_FLAGS (read when the client is created)."""
    flags = os.environ.get("XLA_FLAGS", "")
    if keep_user_value and f"--{name}=" in flags:
        return
    os.environ["XLA_FLAGS"] = f"{flags} --{name}={value}".strip()


def _probe(name: str) -> list[jax.Device]:
    try:
        return list(jax.local_devices(backend=name))  # this process's own; all of them in one process
    except RuntimeError:
        return []


@functools.cache
def _selected() -> tuple[str, tuple[jax.Device, ...]]:
    _configure_jax()
    forced = os.environ.get("TORCH_TPU_PLATFORM", "").strip().lower()
    if forced:
        if forced not in _PLATFORMS:
            raise RuntimeError(f"TORCH_TPU_PLATFORM={forced!r} is not one of {', '.join(_PLATFORMS)}")
        found = _probe(forced)
        if not found:
            raise RuntimeError(f"TORCH_TPU_PLATFORM={forced!r} but no {forced} devices were found")
        return forced, tuple(found)
    for name in _PLATFORMS:
        found = _probe(name)
        if found:
            if name == "cpu":
                _log.warning(
                    "torch_tpu: no TPU or GPU found; tpu tensors run on the XLA CPU client "
                    "(%d device%s). Set TORCH_TPU_PLATFORM=cpu to silence this.",
                    len(found),
                    "" if len(found) == 1 else "s",
                )
            return name, tuple(found)
    raise RuntimeError("torch_tpu: no PJRT client could be created")


def platform() -> str:
    """The platform tpu tensors run on: "tpu", "cuda" or "cpu"."""
    return _selected()[0]


def devices() -> tuple[jax.Device, ...]:
    """The jax devices behind tpu:0, tpu:1, ..."""
    return _selected()[1]


def global_devices() -> tuple[jax.Device, ...]:
    """Every process's devices of the selected platform (after jax.distributed.initialize;
    the same as devices() in one process), ordered by device id."""
    return tuple(sorted(jax.devices(platform()), key=lambda d: d.id))


def reset() -> None:
    """Forgets the selected client (torch_tpu.distributed.initialize recreates it multi-process)."""
    _selected.cache_clear()
    _fence_inputs.cache_clear()


def jax_device(index: int) -> jax.Device:
    all_devices = devices()
    if not 0 <= index < len(all_devices):
        raise RuntimeError(f"tpu device index {index} is out of range: {len(all_devices)} tpu devices are visible")
    return all_devices[index]


@functools.cache
def _fence_inputs() -> tuple[jax.Array, ...]:
    """One tiny array per device: what each fence computation reads."""
    return tuple(jax.device_put(jax.numpy.zeros((), jax.numpy.int32), d) for d in devices())


@jax.jit
def _fence(x: jax.Array) -> jax.Array:
    return x + 1


def fences() -> list[jax.Array]:
    """Enqueues one tiny computation on each device and returns its results: a device runs its
    computations in the order they were queued, so a fence is ready once everything queued
    before it on its device has run, including work whose outputs were already freed."""
    return [_fence(x) for x in _fence_inputs()]


def host_read() -> None:
    """Runs the `before_host_read` hooks: called where a tpu value is about to reach the host."""
    for hook in before_host_read:
        hook()


def synchronize() -> None:
    """Waits for every computation queued on the selected client's devices: their fences, and
    the arrays still alive (transfers into them, and the CPU client, which may run independent
    computations side by side)."""
    jax.block_until_ready(fences())
    jax.block_until_ready(jax.live_arrays(platform()))
    host_read()
