"""Lightning on tpu: `pl.Trainer(accelerator="torch_tpu", precision="bf16-mixed")`.

Lightning stays optional: nothing here imports it until Lightning itself is imported. Then the
accelerator "torch_tpu" is added to its AcceleratorRegistry (pytorch_lightning's and
lightning.pytorch's, whichever is imported), and `torch_tpu.lightning.TPUAccelerator()` is the
same accelerator as an instance. ("tpu" stays Lightning's name for torch_xla's accelerator.)

Lightning places only CUDA and MPS accelerators' devices itself: with another accelerator it
builds SingleDeviceStrategy("cpu"), and its "16-mixed"/"bf16-mixed" precision autocasts on
"cuda". TPUAccelerator.setup() (which Lightning calls before it moves the model) puts that
strategy on the tpu device and makes a MixedPrecision plugin autocast on tpu, so the model,
batches and autocast all run on tpu. One device per process.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from typing import Any

import torch

NAME = "torch_tpu"
_REGISTRIES = {
    "pytorch_lightning.accelerators": "pytorch_lightning",
    "lightning.pytorch.accelerators": "lightning.pytorch",
}
_classes: dict[str, type] = {}


def _parse_devices(devices: Any) -> list[int]:
    """Lightning's `devices` flag as tpu indices: "auto", 1, "1", [i] or "i,"; one device."""
    if devices in ("auto", -1, "-1"):
        return [torch.tpu.current_device()]
    if isinstance(devices, str):
        devices = [int(d) for d in devices.split(",") if d.strip()] if "," in devices else int(devices)
    if isinstance(devices, int):
        devices = list(range(devices))
    indices = [int(d) for d in devices]
    if len(indices) != 1:
        raise ValueError(
            f"torch_tpu's Lightning accelerator runs one tpu device per process, got devices={devices!r}; "
            "pass devices=1 (or [index])"
        )
    if not 0 <= indices[0] < torch.tpu.device_count():
        raise ValueError(f"tpu:{indices[0]} does not exist: there are {torch.tpu.device_count()} tpu devices")
    return indices


def _accelerator_class(package: str) -> type:
    """TPUAccelerator for one Lightning package ("pytorch_lightning" or "lightning.pytorch")."""
    if package in _classes:
        return _classes[package]
    accelerators = importlib.import_module(f"{package}.accelerators")  # loaded (or loading) already

    class TPUAccelerator(accelerators.Accelerator):
        """Lightning accelerator for torch_tpu's "tpu" device (see torch_tpu/lightning.py)."""

        def setup_device(self, device: torch.device) -> None:
            if device.type == "tpu":
                torch.tpu.set_device(device)

        def setup(self, trainer: Any) -> None:
            """Moves Lightning's default single-device strategy to tpu and autocasts on tpu."""
            strategies = importlib.import_module(f"{package}.strategies")
            precision = importlib.import_module(f"{package}.plugins.precision")
            strategy = trainer.strategy
            devices = getattr(trainer._accelerator_connector, "_parallel_devices", None) or ["tpu"]
            device = torch.device(devices[0])
            if isinstance(strategy, strategies.SingleDeviceStrategy) and strategy.root_device.type != "tpu":
                strategy._root_device = device
            self.setup_device(strategy.root_device)
            plugin = strategy.precision_plugin
            if isinstance(plugin, precision.MixedPrecision) and plugin.device != "tpu":
                plugin.device = "tpu"
                if plugin.scaler is not None:
                    plugin.scaler = torch.amp.GradScaler("tpu")

        def teardown(self) -> None:
            pass

        @staticmethod
        def parse_devices(devices: Any) -> list[int]:
            return _parse_devices(devices)

        @staticmethod
        def get_parallel_devices(devices: Any) -> list[torch.device]:
            return [torch.device("tpu", i) for i in _parse_devices(devices)]

        @staticmethod
        def auto_device_count() -> int:
            return 1

        @staticmethod
        def is_available() -> bool:
            return torch.tpu.is_available()

        @staticmethod
        def name() -> str:
            return NAME

        def get_device_stats(self, device: Any) -> dict[str, Any]:
            return dict(torch.tpu.memory_stats(device))

        @classmethod
        def register_accelerators(cls, accelerator_registry: Any) -> None:
            accelerator_registry.register(cls.name(), cls, description=cls.__name__, override=True)

    TPUAccelerator.__module__ = __name__
    _classes[package] = TPUAccelerator
    return TPUAccelerator


def _register(package: str) -> None:
    registry = sys.modules[f"{package}.accelerators"].AcceleratorRegistry  # Lightning may still be loading
    _accelerator_class(package).register_accelerators(registry)


class _RegisterOnImport(importlib.abc.MetaPathFinder):
    """Registers "torch_tpu" in a Lightning accelerator registry once that module has run."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname not in _REGISTRIES:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None and spec.loader is not None and hasattr(spec.loader, "exec_module"):
                run = spec.loader.exec_module

                def exec_module(module: Any, run: Any = run) -> None:
                    run(module)
                    _register(_REGISTRIES[fullname])

                spec.loader.exec_module = exec_module
                return spec
        return None


def install() -> None:
    """Registers "torch_tpu" with Lightning now if it is imported, else when it is (run once by
    `import torch_tpu`); imports nothing of Lightning."""
    for module, package in _REGISTRIES.items():
        if module in sys.modules:
            _register(package)
    if not any(isinstance(finder, _RegisterOnImport) for finder in sys.meta_path):
        sys.meta_path.insert(0, _RegisterOnImport())


def __getattr__(name: str) -> Any:
    if name == "TPUAccelerator":  # for the Lightning package in use: lightning.pytorch if imported alone
        lightning_only = "lightning.pytorch" in sys.modules and "pytorch_lightning" not in sys.modules
        return _accelerator_class("lightning.pytorch" if lightning_only else "pytorch_lightning")
    raise AttributeError(f"module 'torch_tpu.lightning' has no attribute {name!r}")


__all__ = ["NAME", "TPUAccelerator", "install"]  # noqa: F822 (TPUAccelerator comes from __getattr__)
