"""PJRT client selection and the executable caches."""

from torch_tpu.runtime.client import devices, jax_device, platform, synchronize

__all__ = ["devices", "jax_device", "platform", "synchronize"]
