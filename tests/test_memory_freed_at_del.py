"""`del` frees device memory at once, as on CPU and CUDA: no reference cycle in the op paths keeps
a tensor alive until the garbage collector runs. Python's collector is off in these tests, so a
cycle holding a tensor shows as memory_allocated() staying up after `del`."""

from __future__ import annotations

import gc

import pytest
import torch
from torch import nn
from torch.nn import functional as F

import torch_tpu
from torch_tpu.platforms.cpu import background_compile

_SIZES = iter(range(211, 400))  # sizes no other test uses: first calls of these signatures miss


@pytest.fixture(params=["0", pytest.param("thread", marks=pytest.mark.cpu_client)], ids=["compile_first", "host_tier"])
def compile_mode(request, monkeypatch):
    """TORCH_TPU_ASYNC_COMPILE "0": every first call compiles before it runs; "thread": first calls
    run on the host tier while they compile in the background (on a thread: no worker process to
    start)."""
    monkeypatch.setenv("TORCH_TPU_ASYNC_COMPILE", request.param)
    assert background_compile.drain(timeout=300)
    yield request.param
    assert background_compile.drain(timeout=300)


@pytest.fixture
def no_gc():
    gc.collect()
    gc.disable()
    yield
    gc.enable()


def _allocated() -> int:
    return torch.tpu.memory_allocated()


def _host_runs() -> int:
    return torch_tpu.metrics.counters()["host_tier_runs"]


def test_factories_free_at_del(compile_mode, no_gc):
    n = next(_SIZES)
    torch.randn(n, device="tpu")  # warm: the first random fill imports parts of torch
    start = _allocated()
    a, b, c = torch.ones(n, device="tpu"), torch.zeros(n, 3, device="tpu"), torch.arange(n, device="tpu")
    d, e, f = torch.randn(n, device="tpu"), torch.full((n,), 2.0, device="tpu"), torch.empty(n, device="tpu")
    assert _allocated() > start
    del a, b, c, d, e, f
    assert _allocated() == start


def test_inplace_ops_and_host_tier_runs_free_at_del(compile_mode, no_gc):
    n = next(_SIZES)
    start, runs = _allocated(), _host_runs()
    a = torch.arange(float(n * 4)).to("tpu").view(n, 4)
    a.add_(1)
    a.mul_(a)
    a[1:].sub_(a[:1])
    a.clamp_(0, 1e6)
    b = (a * 2).softmax(-1).sum(0)
    c, d = a.t() @ a, a.max(1)
    assert (_host_runs() > runs) == (compile_mode == "thread")
    del a, b, c, d
    assert _allocated() == start


def test_a_50_step_mlp_training_loop_frees_at_del(compile_mode, no_gc):
    torch.manual_seed(0)
    width = next(_SIZES)  # its ops' first calls miss: on the host tier in that mode
    start, runs = _allocated(), _host_runs()
    model = nn.Sequential(nn.Linear(8, width), nn.GELU(), nn.Linear(width, 4)).to("tpu")
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    for _ in range(50):
        x, y = torch.randn(4, 8, device="tpu"), torch.randint(0, 4, (4,), device="tpu")
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    assert loss.item() == loss.item()  # a number, not nan
    assert (_host_runs() > runs) == (compile_mode == "thread")
    del model, opt, x, y, loss
    assert _allocated() == start
