"""A warm persistent cache runs exactly as a cold one, and really is warm.

- Linear algebra, FFTs and the other ops whose executables hold custom calls (LAPACK kernels on
  the CPU client) load in a process that never traced them and give CPU's results: jax sets
  their kernels up while lowering, a loaded executable must have it done for it (it used to
  segfault). Both with every first call compiled before it runs, and with the default
  asynchronous compile (whose worker process sends executables back serialized).
- A short eager training script with the default asynchronous compile: its first process leaves
  every executable in the cache (the exit finishes the pending background compiles), so the
  second and third trace, compile and background-compile nothing.
- The key holds the build's identity: entries written by another build of torch_tpu (another
  lowering source, another extension) are never loaded.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys

import pytest

import torch_tpu
from torch_tpu.runtime import executable_cache

_TIMEOUT = 600
_PACKAGE_ROOT = pathlib.Path(torch_tpu.__file__).parent.parent  # the package under test

# Every OpInfo entry of linalg and fft, and the other ops that run LAPACK kernels: forward only,
# two float32 samples each, compared with CPU by the OpInfo harness. Prints each entry's forward
# result, the counters and the custom-call targets of the executables it compiled.
_OPINFO_SCRIPT = r"""
import json
import torch, torch_tpu
from torch_tpu.runtime import executable_cache
from torch_tpu.testing import opinfo

targets = set()
_custom_calls = executable_cache.custom_calls
def _recording(compiled):
    found = _custom_calls(compiled)
    targets.update(found or ())
    return found
executable_cache.custom_calls = _recording

OTHERS = {
    "cholesky", "cholesky_inverse", "cholesky_solve", "qr", "svd", "lu", "lu_solve", "lu_unpack",
    "triangular_solve", "geqrf", "ormqr", "pinverse", "det", "logdet", "inverse", "matrix_exp",
    "svd_lowrank", "pca_lowrank",
}
ops = [op for op in opinfo.op_db() if op.name.startswith(("linalg.", "fft.")) or op.name in OTHERS]
results = {}
for op in ops:
    r = opinfo.check_op(op, forward_samples=2, other_dtype_samples=0, grad_samples=0, error_samples=0)
    results[opinfo.entry_name(op)] = [r.results.get("forward"), r.reasons.get("forward", "")[:300]]
c = torch_tpu.metrics.counters()
counters = {k: c[k] for k in ("traces", "xla_compiles", "async_compiles", "persistent_cache_hits", "host_tier_runs")}
print(json.dumps({"results": results, "counters": counters, "targets": sorted(targets)}))
"""

# A 3-step eager MLP training script with an optimizer (random fills, cross entropy, Adam).
_TRAIN_SCRIPT = r"""
import json
import torch, torch_tpu
from torch import nn
from torch.nn import functional as F

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 4)).to("tpu")
opt = torch.optim.Adam(model.parameters(), lr=0.01)
losses = []
for _ in range(3):
    x, y = torch.randn(4, 8, device="tpu"), torch.randint(0, 4, (4,), device="tpu")
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    losses.append(loss.item())
c = torch_tpu.metrics.counters()
keys = ("traces", "xla_compiles", "async_compiles", "op_compiles", "persistent_cache_hits", "host_tier_runs")
print(json.dumps({"losses": losses, "counters": {k: c[k] for k in keys}}))
"""


def _run(script: str, cache: pathlib.Path, package_root: pathlib.Path = _PACKAGE_ROOT, **extra: str) -> dict:
    unset = ("TORCH_TPU_ASYNC_COMPILE", "TORCH_TPU_DEBUG", "TORCH_TPU_EXIT_COMPILE_WAIT")
    env = {k: v for k, v in os.environ.items() if k not in unset}
    env.update(TORCH_TPU_CACHE_DIR=str(cache), TORCH_TPU_PLATFORM="cpu", **extra)
    env["PYTHONPATH"] = str(package_root) + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.Popen(
        [sys.executable, "-c", script],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=str(cache.parent),
        start_new_session=True,  # its own process group, killed whole on a timeout
    )
    try:
        out, err = proc.communicate(timeout=_TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise
    assert proc.returncode == 0, f"exit {proc.returncode} (a signal if negative)\n{err[-4000:]}"
    result = json.loads(out.strip().splitlines()[-1])
    result["stderr"] = err
    return result


@pytest.mark.cpu_client  # LAPACK's custom calls
@pytest.mark.parametrize("async_compile", ["0", None], ids=["compile_first", "default_async"])
def test_linalg_and_fft_from_a_warm_cache_run_as_cold_ones(tmp_path, async_compile):
    mode = {} if async_compile is None else {"TORCH_TPU_ASYNC_COMPILE": async_compile}
    cache = tmp_path / "cache"
    cold = _run(_OPINFO_SCRIPT, cache, **mode)
    assert any(t.startswith("lapack_") for t in cold["targets"]), cold["targets"]
    assert len(cold["results"]) >= 70
    failed = {name: why for name, (result, why) in cold["results"].items() if result == "fail"}
    assert not failed, failed
    warm = _run(_OPINFO_SCRIPT, cache, **mode)  # a process that loads what the first compiled
    assert warm["results"] == cold["results"]
    counters = warm["counters"]
    assert counters["traces"] == 0 and counters["xla_compiles"] == 0, counters
    assert counters["async_compiles"] == 0, counters  # (views at new offsets still run on the host tier)
    assert counters["persistent_cache_hits"] >= 100, counters
    assert "CacheWarning" not in warm["stderr"]


@pytest.mark.cpu_client  # the host tier runs its first calls
def test_a_short_training_script_compiles_nothing_after_its_first_run(tmp_path):
    cache = tmp_path / "cache"
    first = _run(_TRAIN_SCRIPT, cache)  # the default asynchronous compile
    assert first["counters"]["async_compiles"] >= 10 and first["counters"]["host_tier_runs"] > 0
    for _ in range(2):
        again = _run(_TRAIN_SCRIPT, cache)
        counters = again["counters"]
        assert counters["traces"] == 0 and counters["xla_compiles"] == 0, counters
        assert counters["async_compiles"] == 0 and counters["op_compiles"] == 0, counters
        assert counters["persistent_cache_hits"] >= first["counters"]["async_compiles"], counters
        # the host tier ran the first process's first calls with CPU's kernels: rounding may differ
        assert again["losses"] == pytest.approx(first["losses"], rel=1e-5)


def test_entries_of_another_build_are_never_loaded(tmp_path):
    """A copy of the package that differs only in one lowering's source text, or only in its
    extension's bytes, is another build: it loads none of this build's entries (and warns about
    none: they are not corrupt, only another build's), and compiles its own."""
    cache = tmp_path / "cache"
    first = _run(_TRAIN_SCRIPT, cache, TORCH_TPU_ASYNC_COMPILE="0")
    assert first["counters"]["xla_compiles"] > 0
    entries = len(list(cache.glob("*.xla")))
    same = _run(_TRAIN_SCRIPT, cache, TORCH_TPU_ASYNC_COMPILE="0")
    assert same["counters"]["xla_compiles"] == 0  # this build: all loaded

    def copy_package(name: str) -> pathlib.Path:
        root = tmp_path / name
        shutil.copytree(_PACKAGE_ROOT / "torch_tpu", root / "torch_tpu", ignore=shutil.ignore_patterns("__pycache__"))
        return root

    lowering = copy_package("lowering_changed")
    with open(lowering / "torch_tpu" / "ops" / "lowerings" / "elementwise.py", "a") as f:
        f.write("\n# another build\n")
    extension = copy_package("extension_changed")
    loaded = extension / pathlib.Path(torch_tpu._C.__file__).resolve().relative_to(_PACKAGE_ROOT.resolve())
    data = bytearray(loaded.read_bytes())
    # The compiler's note (.comment, never loaded): the same code and size, other bytes; else
    # trailing bytes.
    at = max(data.find(b"GCC: ("), data.find(b"clang version"))
    if at >= 0:
        data[at + 2] ^= 0x20
    else:
        data += b"\0another build"
    loaded.write_bytes(bytes(data))
    for root in (lowering, extension):
        other = _run(_TRAIN_SCRIPT, cache, package_root=root, TORCH_TPU_ASYNC_COMPILE="0")
        counters = other["counters"]
        assert counters["persistent_cache_hits"] == 0, (root.name, counters)
        assert counters["xla_compiles"] == first["counters"]["xla_compiles"], (root.name, counters)
        assert other["losses"] == pytest.approx(first["losses"], rel=1e-6)
        assert "CacheWarning" not in other["stderr"]
    assert len(list(cache.glob("*.xla"))) == 3 * entries  # each build its own entries


def test_build_identity_covers_sources_and_extension():
    identity = executable_cache.build_identity()
    assert len(identity) == 16 and identity in executable_cache.fingerprint()
