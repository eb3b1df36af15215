"""`import jax` without parsing every installed distribution's metadata.

When imported, `jax._src.numpy.array_constructors` looks for a ROCm plugin by parsing the METADATA
of every installed distribution for its name. On the v5e test host (162 distributions) that was
7.3 s of a profiled 8.5 s `import jax`, which `import torch` pays through the backend's autoload
(benchmarks/results/tpu/examples_cold_start.md). While torch_tpu imports jax, that module's
`distributions()` call yields only the distributions whose folder could hold such a plugin
("jax_rocm*", named by the folder, which needs no METADATA) and any it cannot name that way; every
other caller gets all of them.
"""

from __future__ import annotations

import importlib.metadata
import sys
from collections.abc import Iterator

_PROBING_MODULE = "jax._src.numpy.array_constructors"
_FOLDER_SUFFIXES = (".dist-info", ".egg-info")


def _may_be_rocm_plugin(dist: importlib.metadata.Distribution) -> bool:
    folder = getattr(getattr(dist, "_path", None), "name", "")
    if not folder.endswith(_FOLDER_SUFFIXES):
        return True  # not named by its folder: jax reads its metadata as before
    return folder.replace("-", "_").lower().startswith("jax_rocm")


def _for_jax_probe(original):
    def distributions(**kwargs) -> Iterator[importlib.metadata.Distribution]:
        everything = original(**kwargs)
        if sys._getframe(1).f_globals.get("__name__") != _PROBING_MODULE:
            return everything
        return (dist for dist in everything if _may_be_rocm_plugin(dist))

    return distributions


def import_jax() -> None:
    """Imports jax (once), its ROCm probe reading only the distributions it could find."""
    if "jax" in sys.modules:
        return
    original = importlib.metadata.distributions
    importlib.metadata.distributions = _for_jax_probe(original)
    try:
        import jax  # noqa: F401
    finally:
        importlib.metadata.distributions = original
