"""libtpu's runtime metrics (libtpu.sdk.tpumonitoring): what torch.tpu.utilization() and
memory_usage() read (device/telemetry.py)."""

from __future__ import annotations

from torch_tpu import platforms


def metric(name: str, index: int) -> float | None:
    """libtpu's runtime metric `name` for chip `index` (a percentage), or None where it has none
    (another platform than TPU, or a libtpu without it)."""
    if platforms.name() != "tpu":
        return None
    try:
        from libtpu import sdk  # shipped with libtpu (jax[tpu]); absent on other platforms

        values = sdk.tpumonitoring.get_metric(name).data()
        return float(values[index]) if index < len(values) else None
    except Exception:
        return None
