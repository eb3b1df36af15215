"""jax imported by torch_tpu (torch_tpu/_jax_import.py): jax's ROCm plugin probe parses the
metadata of no distribution that cannot be one, still finds one that is, and every other caller
of `importlib.metadata.distributions()` sees them all."""

from __future__ import annotations

import json

from tests.helpers import run_python

_SCRIPT = r"""
import importlib.metadata as md, json
parsed = []
original = md.PathDistribution.read_text
def read_text(self, filename):
    if filename in ("METADATA", "PKG-INFO"):
        parsed.append(self._path.name)
    return original(self, filename)
md.PathDistribution.read_text = read_text
import torch_tpu
import jax._src.numpy.array_constructors as constructors
probe = list(parsed)  # parsed while torch_tpu imported (jax's probe, and packages asked for by name)
names = {d.metadata["Name"] for d in md.distributions()}
print(json.dumps({
    "probe_parsed": probe,
    "found": getattr(constructors.rocm_plugin_extension, "__name__", None),
    "others_see": sorted(n for n in names if n.startswith("zz-") or n.startswith("jax-rocm")),
}))
"""


def _distribution(site, folder: str, name: str) -> None:
    info = site / folder
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.0.1\n")


def test_the_rocm_probe_parses_only_what_could_be_a_plugin(tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    _distribution(site, "zz_other-0.0.1.dist-info", "zz-other")
    _distribution(site, "jax_rocm9_plugin-0.0.1.dist-info", "jax-rocm9-plugin")
    plugin = site / "jax_rocm9_plugin"
    plugin.mkdir()
    (plugin / "__init__.py").write_text("")
    (plugin / "rocm_plugin_extension.py").write_text("")
    done = run_python(["-c", _SCRIPT], {"PYTHONPATH": str(site), "TORCH_TPU_PLATFORM": "cpu"}, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert "jax_rocm9_plugin-0.0.1.dist-info" in result["probe_parsed"]
    assert "zz_other-0.0.1.dist-info" not in result["probe_parsed"]  # only named packages' (e.g. tqdm's, by torch)
    assert result["found"] == "jax_rocm9_plugin.rocm_plugin_extension"
    assert result["others_see"] == ["jax-rocm9-plugin", "zz-other"]
