"""Finds and loads torch_tpu's C++ extension as `torch_tpu._C`, for the running torch.

A wheel carries one build of the torch-dependent glue per supported torch version,
`torch_tpu/_C/torch_<major>_<minor>.so`; the one matching `torch.__version__` is loaded. A
development build (`bash ci/dev_build.sh`) is `torch_tpu/_C.so`, built for the local torch.
Nothing here imports more of torch_tpu, so failures can be reported before anything registers.
"""

from __future__ import annotations

import glob
import importlib.machinery
import importlib.util
import os
import re
import sys
import types

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
_GLUE_DIR = os.path.join(_PACKAGE_DIR, "_C")
_MODULE = "torch_tpu._C"

BUILD_HINT = (
    "build it with `bash ci/dev_build.sh` (PYTHON=<your python>), or install the wheel "
    "(`bazel build --config=wheel_common --config=no_rbe //ci/wheel:torch_tpu_wheel`, then "
    "`pip install bazel-bin/ci/wheel/torch_tpu-*.whl`) and run Python outside the checkout"
)


class ExtensionError(ImportError):
    """torch_tpu._C is missing, or there is none for this torch."""


def glue_name(torch_version: str) -> str:
    """The glue file for a torch version, without ".so": "2.14.1+cpu" -> "torch_2_14"."""
    m = re.match(r"(\d+)\.(\d+)", torch_version)
    if not m:
        raise ExtensionError(f"torch_tpu: cannot read torch version {torch_version!r}")
    return f"torch_{m.group(1)}_{m.group(2)}"


def supported_torch_versions(glue_dir: str = _GLUE_DIR) -> list[str]:
    """The torch versions ("2.13", ...) this installation has glue for."""
    found = []
    for path in glob.glob(os.path.join(glue_dir, "torch_*_*.so")):
        m = re.fullmatch(r"torch_(\d+)_(\d+)\.so", os.path.basename(path))
        if m:
            found.append((int(m.group(1)), int(m.group(2))))
    return [f"{a}.{b}" for a, b in sorted(found)]


def find(torch_version: str, package_dir: str = _PACKAGE_DIR) -> str:
    """The extension file to load for `torch_version`; ExtensionError (naming the fix) if none."""
    glue_dir = os.path.join(package_dir, "_C")
    glue = os.path.join(glue_dir, glue_name(torch_version) + ".so")
    if os.path.isfile(glue):
        return glue
    supported = supported_torch_versions(glue_dir)
    if supported:
        raise ExtensionError(
            f"torch_tpu has no extension for torch {torch_version}: this installation supports torch "
            f"{', '.join(supported)}. Install one of those, e.g. pip install 'torch=={supported[-1]}.*'"
        )
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        dev = os.path.join(package_dir, "_C" + suffix)
        if os.path.isfile(dev):
            return dev
    raise ExtensionError(
        f"torch_tpu: {package_dir} has no built extension (torch_tpu/_C); it looks like a source "
        f"checkout. To use it, {BUILD_HINT}."
    )


def load(torch_version: str) -> types.ModuleType:
    """Loads the extension for `torch_version` as torch_tpu._C (once)."""
    if _MODULE in sys.modules:
        return sys.modules[_MODULE]
    path = find(torch_version)
    spec = importlib.util.spec_from_file_location(
        _MODULE, path, loader=importlib.machinery.ExtensionFileLoader(_MODULE, path)
    )
    try:
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    except ImportError as e:
        raise ExtensionError(
            f"torch_tpu: {path} does not load with torch {torch_version} ({e}). It was built for "
            f"another torch: rebuild it ({BUILD_HINT})."
        ) from e
    sys.modules[_MODULE] = module
    return module
