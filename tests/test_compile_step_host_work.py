"""A whole training step under torch.compile, optimizer included, with AdamW's default
capturable=False (its step counters are CPU tensors): the counters and bias corrections run on
the host with PyTorch, so a steady step makes no host transfer (no step count sent over and read
back, a sync each, per parameter), runs nothing eagerly on the device, and matches CPU."""

from __future__ import annotations

import copy

import torch

import torch_tpu


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4))


def _train(model, device: str, steps: int, compiled: bool, counters: list | None = None):
    model = model.to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    x = torch.randn(8, 16, generator=torch.Generator().manual_seed(1)).to(device)

    def step():
        loss = model(x).pow(2).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss

    if compiled:
        step = torch.compile(step, backend="tpu")
    losses = []
    for i in range(steps):
        if counters is not None and i == steps - 1:
            torch_tpu.sync()
            torch_tpu.metrics.reset()
        losses.append(step().detach())
        if counters is not None and i == steps - 1:
            torch_tpu.sync()
            counters.append(torch_tpu.metrics.counters())
    return [loss.item() for loss in losses], model, optimizer


def test_a_compiled_step_keeps_cpu_optimizer_counters_on_the_host(fresh_dynamo):
    counters: list = []
    base = _model()
    losses, model, optimizer = _train(copy.deepcopy(base), "tpu", 4, compiled=True, counters=counters)
    cpu_losses, cpu_model, cpu_optimizer = _train(copy.deepcopy(base), "cpu", 4, compiled=False)
    steady = counters[0]
    assert steady["host_transfers"] == 0, steady
    assert not steady.get("graph_eager_ops") and steady["cpu_fallbacks"] == 0, steady
    torch.testing.assert_close(losses, cpu_losses, rtol=1e-5, atol=1e-6)
    for p, p_cpu in zip(model.parameters(), cpu_model.parameters()):
        torch.testing.assert_close(p.detach().cpu(), p_cpu.detach(), rtol=1e-5, atol=1e-6)
        step, cpu_step = optimizer.state[p]["step"], cpu_optimizer.state[p_cpu]["step"]
        assert step.device.type == "cpu" and step.item() == cpu_step.item() == 4
