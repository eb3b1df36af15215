"""A whole training step under torch.compile, optimizer included. An optimizer whose state dynamo
creates keeps its step counters on tpu (compile/optimizer_capturable.py, as dynamo does for
CUDA): the update is one executable, with no host scalar per parameter. One stepped eagerly
first has AdamW's default CPU counters when dynamo first sees it. Either way a steady step makes
no host transfer, runs nothing eagerly on the device, and matches CPU."""

from __future__ import annotations

import copy

import torch

import torch_tpu
from tests.helpers import platform_tol
from torch_tpu import platforms


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4))


def _train(model, device: str, steps: int, compiled: bool, counters: list | None = None, eager_first: bool = False):
    model = model.to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    x = torch.randn(8, 16, generator=torch.Generator().manual_seed(1)).to(device)

    def step():
        loss = model(x).pow(2).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss

    losses = []
    if eager_first:
        losses.append(step().detach())
    if compiled:
        step = torch.compile(step, backend="tpu")
    for i in range(len(losses), steps):
        if counters is not None and i == steps - 1:
            torch_tpu.sync()
            torch_tpu.metrics.reset()
        losses.append(step().detach())
        if counters is not None and i == steps - 1:
            torch_tpu.sync()
            counters.append(torch_tpu.metrics.counters())
    return [loss.item() for loss in losses], model, optimizer


def _check_steady_step_and_cpu_match(eager_first: bool) -> tuple[dict, torch.optim.Optimizer]:
    counters: list = []
    base = _model()
    losses, model, optimizer = _train(copy.deepcopy(base), "tpu", 4, True, counters, eager_first)
    cpu_losses, cpu_model, cpu_optimizer = _train(copy.deepcopy(base), "cpu", 4, compiled=False)
    steady = counters[0]
    assert steady["host_transfers"] == 0, steady
    assert not steady.get("graph_eager_ops") and steady["cpu_fallbacks"] == 0, steady
    tol = platform_tol({"rtol": 1e-5, "atol": 1e-6})  # GELU's erf and AdamW's sqrt on a TPU
    torch.testing.assert_close(losses, cpu_losses, **tol)
    for p, p_cpu in zip(model.parameters(), cpu_model.parameters()):
        torch.testing.assert_close(p.detach().cpu(), p_cpu.detach(), **tol)
        step, cpu_step = optimizer.state[p]["step"], cpu_optimizer.state[p_cpu]["step"]
        assert step.item() == cpu_step.item() == 4
    return steady, optimizer


def test_a_compiled_step_keeps_the_optimizer_on_the_device(fresh_dynamo):
    steady, optimizer = _check_steady_step_and_cpu_match(eager_first=False)
    assert all(state["step"].device.type == "tpu" for state in optimizer.state.values())
    # forward, backward's seed gradient (autograd's ones_like), backward, the whole AdamW update
    assert steady["executions"] == 4, steady
    if platforms.donates_buffers():  # the update overwrites parameters, moments and step counts in place
        assert steady["donated_buffers"] == 4 * len(optimizer.state), steady


def test_an_optimizer_stepped_eagerly_first_still_matches_cpu(fresh_dynamo):
    _check_steady_step_and_cpu_match(eager_first=True)


def test_a_compiled_step_creates_the_optimizer_state_in_one_program(fresh_dynamo):
    """Dynamo runs `_init_group` eagerly: its zero fills (one op compile per parameter shape, ~1 s
    each on TPU) are recorded and run as one program."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.Tanh(), torch.nn.Linear(7, 3)).to("tpu")
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    x = torch.randn(4, 5).to("tpu")

    @torch.compile(backend="tpu")
    def step():
        loss = model(x).square().mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss

    torch_tpu.sync()
    torch_tpu.metrics.reset()
    step()
    torch_tpu.sync()
    counters = torch_tpu.metrics.counters()
    assert counters.get("lazy_runs", 0) == 1, counters
    assert len(optimizer.state) == 4
    assert all(s["exp_avg"].device.type == "tpu" and s["step"].item() == 1 for s in optimizer.state.values())
    assert torch_tpu.is_eager_mode()  # recording ended with the state creation


def test_dynamo_leaves_torch_tpus_machinery_untraced():
    """An eager op inside a compiled function (autograd's ones_like at `loss.backward()`) reaches
    torch_tpu's machinery, the CPU client's host tier included: dynamo skips those frames (it
    compiled host-tier functions into graphs of their own before)."""
    from torch._dynamo import trace_rules

    from torch_tpu.compile import lazy
    from torch_tpu.ops import dispatcher
    from torch_tpu.platforms.cpu import background_compile, host_tier

    for module in (dispatcher, lazy, host_tier, background_compile):
        assert trace_rules.check_file(module.__file__).skipped, module.__name__
