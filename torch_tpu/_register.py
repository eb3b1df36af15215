"""The one composition step: registers torch_tpu with torch (run once by `import torch_tpu`).

Every import-time side effect of torch_tpu is a call from `register()`, in order: the
persistent compile cache, jax's TPU lowering rules for 64-bit types (platforms/tpu/x64_types.py),
the PrivateUse1 rename and the C++ device surface, the device list,
`torch.tpu` (and its hooks), the op lowerings (the Pallas SDPA routing among them),
torch.compile's "tpu" backend, the optimizer step pre-hook that fuses a tpu optimizer's step
(fused_optimizer.py), the c10d backend "tpu", Lightning's "torch_tpu" accelerator (registered
when Lightning is imported), and this process's stats file for tpu-info.

A client that cannot be created (e.g. an invalid TORCH_TPU_PLATFORM) does not fail the import:
the backend registers with no devices, and the first tpu use (`torch.tpu.init()`, which torch
calls before creating a tpu tensor) raises the client's error.
"""

from __future__ import annotations

import torch

from torch_tpu import _C
from torch_tpu.runtime import client

# Why the PJRT client could not be created at import, or None.
client_error: Exception | None = None
_done = False


def _device_list() -> list[tuple[int, str, str, list[int]]]:
    global client_error
    try:
        devices = client.devices()
        platform = client.platform()
    except RuntimeError as e:  # raised again, uncached, at the first tpu use
        client_error = e
        return []
    return [
        (i, getattr(d, "device_kind", d.platform), platform, list(getattr(d, "coords", []) or []))
        for i, d in enumerate(devices)
    ]


def register() -> None:
    """Registers the "tpu" device, its ops, compile backend, kernels and c10d backend (once)."""
    global _done
    if _done:
        return
    _done = True
    from torch_tpu.runtime import persistent_cache

    persistent_cache.install()
    from torch_tpu.platforms.tpu import x64_types

    x64_types.install()  # what XLA:TPU's 64-bit rewriting cannot compile, from what it can
    torch.utils.rename_privateuse1_backend("tpu")
    _C._register_device()
    _C._set_devices(_device_list())

    from torch_tpu import device as device_module
    from torch_tpu.device import memory, storages

    torch._register_device_module("tpu", device_module)
    storages.register()
    _C._set_synchronize_hook(client.synchronize)
    _C._set_memory_info_hook(device_module.mem_get_info)
    memory.apply_limits()
    torch.set_autocast_dtype("tpu", torch.bfloat16)  # CUDA's default is float16; TPUs train in bfloat16
    torch.utils.generate_methods_for_privateuse1_backend(for_storage=True)

    from torch_tpu import ops
    from torch_tpu.ops import precision

    precision.apply_env()
    ops.install()

    from torch_tpu import compile as graph_compile

    graph_compile.register()

    from torch_tpu import fused_optimizer

    fused_optimizer.install()  # eager optimizer steps on tpu as one executable

    from torch_tpu.distributed import c10d

    c10d.register()

    from torch_tpu import lightning

    lightning.install()  # the "torch_tpu" accelerator, once Lightning is imported

    if client_error is None:
        from torch_tpu.tools import stats_file

        stats_file.start()  # lets tpu-info see this process's memory
