"""torch_tpu: a native PyTorch backend for XLA devices (TPU first).

`import torch_tpu` (or torch's backend autoload) renames PrivateUse1 to "tpu",
loads the C++ device surface, registers `torch.tpu` and the op lowerings.
"""

from __future__ import annotations


def _autoload() -> None:
    """The `torch.backends` entry point. Importing this package registers the
    backend; defined before `import torch` because that import may autoload us."""


import torch  # noqa: E402

from torch_tpu import _C  # noqa: E402
from torch_tpu.runtime import client as _client  # noqa: E402

__version__ = "0.1.0"


def _register() -> None:
    from torch_tpu.runtime import persistent_cache

    persistent_cache.install()
    torch.utils.rename_privateuse1_backend("tpu")
    _C._register_device()
    devices = _client.devices()
    _C._set_devices(
        [
            (i, getattr(d, "device_kind", d.platform), _client.platform(), list(getattr(d, "coords", []) or []))
            for i, d in enumerate(devices)
        ]
    )
    from torch_tpu import device_module

    torch._register_device_module("tpu", device_module)
    torch.utils.generate_methods_for_privateuse1_backend(for_storage=True)
    from torch_tpu import ops

    ops.install()
    from torch_tpu import compile as graph_compile
    from torch_tpu import kernels  # noqa: F401  (Pallas kernels and the SDPA routing)

    graph_compile.register()


_register()

from torch_tpu import distributed, metrics  # noqa: E402  (distributed registers the c10d backend "tpu")
from torch_tpu.tools import stats_file as _stats_file  # noqa: E402

_stats_file.start()  # lets tpu-info see this process's memory


def sync() -> None:
    """Waits for all queued work on all tpu devices."""
    _client.synchronize()


def platform() -> str:
    """ "tpu", "cuda" or "cpu": the PJRT client tpu tensors run on."""
    return _client.platform()


def export(model, example_args, weights: str = "arguments", example_kwargs: dict | None = None):
    """`model(*example_args)` as StableHLO text and portable bytecode that run under jax
    (torch_tpu/compile/export.py); weights="arguments" or "constants"."""
    from torch_tpu.compile import export as _export

    return _export.export(model, example_args, weights=weights, example_kwargs=example_kwargs)


__all__ = ["distributed", "export", "metrics", "platform", "sync"]
