"""The persistent compile cache: a second process loads every executable instead of compiling it."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

# Trains a small MLP for 3 steps, compiled and eager, and prints losses and counters as JSON.
_SCRIPT = r"""
import json, sys
import torch
import torch_tpu
from torch import nn
from torch.nn import functional as F

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 4)).to("tpu")
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

@torch.compile(backend="tpu")
def step(x, y):
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss

g = torch.Generator().manual_seed(1)
losses = []
for _ in range(3):
    x, y = torch.randn(4, 8, generator=g), torch.randint(0, 4, (4,), generator=g)
    losses.append(step(x.to("tpu"), y.to("tpu")).item())
eager = (torch.arange(6.0).to("tpu").reshape(2, 3).exp() * 3).sum(1).cpu().tolist()
counters = torch_tpu.metrics.counters()
print(json.dumps({"losses": losses, "eager": eager, "counters": counters}))
"""


def _env(cache: pathlib.Path) -> dict:
    env = dict(os.environ)
    env["TORCH_TPU_CACHE_DIR"] = str(cache)
    env["TORCH_TPU_PLATFORM"] = "cpu"
    env.pop("TORCH_TPU_DEBUG", None)
    return env


def _start(cache: pathlib.Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", _SCRIPT],
        env=_env(cache),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _result(proc: subprocess.Popen) -> dict:
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-4000:]
    return json.loads(out.strip().splitlines()[-1])


def _run(cache: pathlib.Path) -> dict:
    return _result(_start(cache))


@pytest.fixture(scope="module")
def warm_cache(tmp_path_factory):
    """A cache directory filled by one process, and that process's result."""
    cache = tmp_path_factory.mktemp("cache")
    return cache, _run(cache)


def test_first_process_compiles_and_fills_the_cache(warm_cache):
    cache, first = warm_cache
    assert first["counters"]["graph_compiles"] >= 3  # forward, backward, optimizer step
    assert first["counters"]["persistent_cache_hits"] == 0
    assert len(list(cache.glob("*.xla"))) >= first["counters"]["graph_compiles"]


def test_second_process_loads_graphs_and_ops_from_the_cache(warm_cache):
    cache, first = warm_cache
    second = _run(cache)
    assert second["counters"]["graph_compiles"] == 0
    assert second["counters"]["persistent_cache_hits"] >= first["counters"]["graph_compiles"] + 1
    assert second["losses"] == first["losses"]
    assert second["eager"] == first["eager"]


def test_two_processes_sharing_an_empty_cache_both_run_right(tmp_path, warm_cache):
    _, reference = warm_cache
    procs = [_start(tmp_path), _start(tmp_path)]
    results = [_result(p) for p in procs]
    for result in results:
        assert result["losses"] == reference["losses"]
        assert result["eager"] == reference["eager"]
    assert not list(tmp_path.glob("*.tmp.*"))  # no partial files left behind


def test_corrupt_and_truncated_entries_are_recompiled(tmp_path, warm_cache):
    cache, reference = warm_cache
    entries = sorted(cache.glob("*.xla"))
    for i, entry in enumerate(entries):
        data = entry.read_bytes()
        (tmp_path / entry.name).write_bytes(data[: len(data) // 3] if i % 2 else b"not an executable")
    result = _run(tmp_path)
    assert result["losses"] == reference["losses"]
    assert result["eager"] == reference["eager"]
    assert result["counters"]["graph_compiles"] >= 3
