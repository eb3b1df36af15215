"""`torch.compile(model, backend="tpu")`: whole ATen graphs as single XLA executables.

Importing torch._dynamo costs seconds, so `import torch_tpu` does not: the
backend registers itself right after torch._dynamo is first imported (which
`torch.compile` does), or at once if it already was.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys

_DYNAMO = "torch._dynamo"


def register() -> None:
    """Registers the "tpu" backend now, or as soon as torch._dynamo is imported."""
    if _DYNAMO in sys.modules:
        _register_now()
    elif not any(isinstance(f, _RegisterAfterDynamo) for f in sys.meta_path):
        sys.meta_path.insert(0, _RegisterAfterDynamo())


def _register_now() -> None:
    # Importing the backend module registers it (it may be the module whose
    # `import torch._dynamo` brought us here; it then registers when it finishes).
    importlib.import_module("torch_tpu.compile.backend")


class _RegisterAfterDynamo(importlib.abc.MetaPathFinder):
    """Finds nothing itself; wraps torch._dynamo's loader to register the backend once it has run."""

    def find_spec(self, fullname, path, target=None):
        if fullname != _DYNAMO:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        exec_module = loader.exec_module

        def exec_then_register(module):
            exec_module(module)
            _register_now()

        loader.exec_module = exec_then_register
        return spec


__all__ = ["register"]
