"""torch_tpu: a native PyTorch backend for XLA devices (TPU first).

`import torch_tpu` (or torch's backend autoload) renames PrivateUse1 to "tpu", loads the C++
extension built for the running torch (torch_tpu/_extension.py) and registers `torch.tpu`, the
op lowerings and the rest (torch_tpu/_register.py).

Loading never takes `import torch` down: without a usable extension (a source checkout that was
not built, or an unsupported torch), torch's autoload gets a warning naming the fix and the tpu
device stays unregistered; an explicit `import torch_tpu` raises that error as an ImportError.
"""

from __future__ import annotations

import os as _os
import sys as _sys
import warnings as _warnings

__version__ = "0.1.0"


def _autoload() -> None:
    """The `torch.backends` entry point. Importing this package registers the
    backend; defined before `import torch` because that import may autoload us."""


def _inside_import_of_torch() -> bool:
    """True while `import torch` itself runs (its backend autoload imports us)."""
    spec = getattr(_sys.modules.get("torch"), "__spec__", None)
    return bool(getattr(spec, "_initializing", False))


def _is_tpu_info_command() -> bool:
    """True in the `tpu-info` console script, which loads the backend only once its arguments
    are parsed (so `tpu-info --help` starts no backend)."""
    return _os.path.basename(_sys.argv[0] if _sys.argv else "") == "tpu-info" and "torch" not in _sys.modules


_loaded = False


def _load() -> None:
    """Imports torch, loads the extension and registers the backend (once)."""
    global _C, _loaded
    if _loaded:
        return
    autoloading = _inside_import_of_torch()
    import torch

    from torch_tpu import _extension

    try:
        _C = _extension.load(torch.__version__)
    except _extension.ExtensionError as error:
        if not autoloading:
            raise
        _warnings.warn(f"{error} The 'tpu' device is not available.", RuntimeWarning, stacklevel=2)
        _loaded = True
        return
    _loaded = True
    from torch_tpu import _jax_import

    _jax_import.import_jax()  # before anything else imports it
    from torch_tpu import _register

    _register.register()
    global distributed, metrics
    from torch_tpu import distributed, metrics


if not _is_tpu_info_command():
    _load()


def sync() -> None:
    """Runs ops recorded in lazy mode, then waits for all queued work on all tpu devices."""
    from torch_tpu.runtime import client

    lazy = _sys.modules.get("torch_tpu.compile.lazy")
    if lazy is not None:
        lazy.sync()
    client.synchronize()


def eager_mode(enabled: bool):
    """`eager_mode(True)` runs tpu ops one by one (the default); `eager_mode(False)` records
    them and runs them as one fused executable at `sync()` or when a value is read.
    Takes effect at once, and as a context manager restores the previous mode on exit."""
    from torch_tpu.compile import lazy

    return lazy.eager_mode(enabled)


def is_eager_mode() -> bool:
    """False while ops are recorded lazily (`eager_mode(False)`)."""
    lazy = _sys.modules.get("torch_tpu.compile.lazy")
    return lazy is None or lazy.is_eager_mode()


def platform() -> str:
    """ "tpu", "cuda" or "cpu": the PJRT client tpu tensors run on."""
    from torch_tpu.runtime import client

    return client.platform()


def export(model, example_args, weights: str = "arguments", example_kwargs: dict | None = None):
    """`model(*example_args)` as StableHLO text and portable bytecode that run under jax
    (torch_tpu/compile/export.py); weights="arguments" or "constants"."""
    from torch_tpu.compile import export as _export

    return _export.export(model, example_args, weights=weights, example_kwargs=example_kwargs)


__all__ = ["distributed", "export", "metrics", "platform", "sync"]
