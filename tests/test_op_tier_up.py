"""Eager ops compiled twice (ops/op_tier_up.py): the quick executable runs at once, the one
compiled at XLA's default effort on the compile queue replaces it, in memory, on the C++ fast
path and in the persistent cache; a quick executable a process left in the cache is recompiled
by the next. Which ops qualify is TPU's decision (platforms.op_tier_up); here every op does."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading

import pytest
import torch

from torch_tpu import _C, metrics, platforms
from torch_tpu.runtime import compile_queue

_TIMEOUT = 300


@pytest.fixture(autouse=True)
def _counters():
    compile_queue.wait_idle()
    metrics.reset()


@pytest.fixture
def every_op_tiers_up(monkeypatch):
    monkeypatch.setattr(platforms, "op_tier_up", lambda compiled: True)


@contextlib.contextmanager
def monkeypatch_declining():
    """The tier-up policy declines inside (an op compiled here compiles once)."""
    with pytest.MonkeyPatch.context() as m:
        m.setattr(platforms, "op_tier_up", lambda compiled: False)
        yield


def test_the_recompiled_executable_replaces_the_quick_one(every_op_tiers_up):
    a, b = torch.randn(67, 33), torch.randn(33, 29)  # shapes no other test compiles
    x, y = a.to("tpu"), b.to("tpu")
    with monkeypatch_declining():
        z = x + 1  # another op's entry on the C++ path, which stays
    gate = threading.Event()
    compile_queue.submit(gate.wait, _TIMEOUT)  # the recompile waits behind it
    try:
        first = (x @ y).cpu()
        assert metrics.counters()["op_tier_ups_queued"] == 1
        assert torch.equal((x @ y).cpu(), first)  # the quick executable, now on the C++ path
        entries, matmuls = _C._eager_entry_count(), _C._eager_entry_count("aten.mm.default")
        assert matmuls >= 1  # this one; a process running other tests may hold more
    finally:
        gate.set()
    compile_queue.wait_idle()
    assert metrics.counters()["op_tier_ups"] == 1
    assert _C._eager_entry_count("aten.mm.default") == 0  # the C++ path dropped the matmul's entries
    assert _C._eager_entry_count() == entries - matmuls  # and only those
    torch.testing.assert_close((x + 1).cpu(), z.cpu())
    runs = [(x @ y).cpu() for _ in range(3)]  # the Python path, then the C++ path, with the new one
    torch.testing.assert_close(first, a @ b)
    for again in runs:
        assert torch.equal(again, first)
    assert metrics.counters()["op_tier_ups_queued"] == 1  # compiled twice, not three times


def test_an_op_the_policy_declines_compiles_once(monkeypatch):
    monkeypatch.setattr(platforms, "op_tier_up", lambda compiled: False)
    x = torch.randn(71, 5, device="tpu")
    torch.testing.assert_close((x * 3).cpu(), x.cpu() * 3)
    compile_queue.wait_idle()
    assert metrics.counters()["op_tier_ups_queued"] == 0


def test_the_compile_queue_runs_waited_for_jobs_first_and_passes_errors_on():
    order = []
    gate = compile_queue.submit(order.append, "first")  # the thread starts on it
    gate.result(timeout=_TIMEOUT)
    blocker = compile_queue.submit(lambda: __import__("time").sleep(0.2))
    late = compile_queue.submit(order.append, "speed up", priority=compile_queue.SPEED_UP)
    early = compile_queue.submit(order.append, "waited for", priority=compile_queue.WAITED_FOR)
    failing = compile_queue.submit(lambda: 1 / 0)
    for f in (blocker, late, early):
        f.result(timeout=_TIMEOUT)
    assert order == ["first", "waited for", "speed up"]
    with pytest.raises(ZeroDivisionError):
        failing.result(timeout=_TIMEOUT)


# A process that runs one matmul with every op tiering up. BLOCK: the compile queue waits on an
# event nobody sets and the process ends without its exit handlers, so the recompile never runs.
_SCRIPT = r"""
import json, os, threading
import torch, torch_tpu
from torch_tpu import metrics, platforms
from torch_tpu.runtime import compile_queue
platforms.op_tier_up = lambda compiled: True
block = os.environ.get("BLOCK") == "1"
if block:
    compile_queue.submit(threading.Event().wait)
a = torch.arange(6 * 7, dtype=torch.float32).reshape(6, 7)
y = (a.to("tpu") @ a.T.contiguous().to("tpu")).cpu()
assert torch.equal(y, a @ a.T)
if not block:
    compile_queue.wait_idle()
c = metrics.counters()
print(json.dumps({k: c.get(k, 0) for k in ("op_tier_ups_queued", "op_tier_ups", "persistent_cache_hits")}), flush=True)
if block:
    os._exit(0)
"""


def _run(cache, block: bool) -> dict:
    env = dict(os.environ, TORCH_TPU_CACHE_DIR=str(cache), TORCH_TPU_PLATFORM="cpu", BLOCK="1" if block else "0")
    env["TORCH_TPU_ASYNC_COMPILE"] = "0"  # every first call compiles before it runs
    proc = subprocess.run([sys.executable, "-c", _SCRIPT], env=env, capture_output=True, text=True, timeout=_TIMEOUT)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_a_quick_executable_left_in_the_cache_is_recompiled_by_the_next_process(tmp_path):
    left = _run(tmp_path, block=True)  # exits with its recompile never run
    assert left == {"op_tier_ups_queued": 1, "op_tier_ups": 0, "persistent_cache_hits": 0}
    loaded = _run(tmp_path, block=False)  # loads the quick one, runs it, recompiles it
    assert loaded["persistent_cache_hits"] >= 1
    assert loaded["op_tier_ups_queued"] == 1 and loaded["op_tier_ups"] == 1
    warm = _run(tmp_path, block=False)  # loads the recompiled one: nothing to do
    assert warm["persistent_cache_hits"] >= 1
    assert warm["op_tier_ups_queued"] == 0 and warm["op_tier_ups"] == 0


def test_tpu_recompiles_ops_whose_work_would_show_and_only_without_a_set_effort(monkeypatch):
    """TPU's policy reads XLA's cost analysis (the CPU client's here: flops and bytes are the
    program's, not the chip's): a 2048x2048 matmul qualifies, a small add does not."""
    import jax
    import jax.numpy as jnp

    from torch_tpu.platforms.tpu import compile_options

    monkeypatch.delenv("TORCH_TPU_OP_COMPILE_EFFORT", raising=False)
    big = jax.ShapeDtypeStruct((2048, 2048), jnp.float32)  # 17 GFLOP: ~87 us at v5e's peak
    small = jax.ShapeDtypeStruct((64, 64), jnp.float32)
    matmul = jax.jit(lambda a: a @ a).lower(big).compile()
    add = jax.jit(lambda a: a + 1).lower(small).compile()
    assert compile_options.op_tier_up(matmul)
    assert not compile_options.op_tier_up(add)
    monkeypatch.setenv("TORCH_TPU_OP_COMPILE_EFFORT", "-1")  # an effort the user chose: kept
    assert not compile_options.op_tier_up(matmul)
