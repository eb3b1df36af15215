"""Buffer donation in compiled graphs: overwritten inputs are donated, held data is never corrupted."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from torch import nn

import torch_tpu
from tests.helpers import platform_tol
from torch_tpu import _C
from torch_tpu.ops import tensors

# Each test starts with dynamo's caches and the counters cleared (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("fresh_dynamo")


def _model():
    torch.manual_seed(0)
    # No bias before the BatchNorm: its gradient is rounding noise, which AdamW would amplify.
    return nn.Sequential(nn.Linear(8, 16, bias=False), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 4))


def _train(model, device, options=None, steps=3, hold=None):
    model = copy.deepcopy(model).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)

    def step(x):
        loss = model(x).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss

    if options is not None:
        step = torch.compile(step, backend="tpu", options=options)
    held = hold(model) if hold else None
    g = torch.Generator().manual_seed(1)
    losses = [step(torch.randn(4, 8, generator=g).to(device)).item() for _ in range(steps)]
    return model, losses, held


def _held_views(model):
    weight = model[0].weight
    return {
        "view": weight.view(-1)[:6],
        "detached": weight.detach(),
        "transposed": weight.t(),
        "running_mean": model[1].running_mean.view(2, 8),
    }


def test_donating_training_step_matches_cpu_and_held_views_follow():
    model = _model()
    cpu, cpu_losses, cpu_held = _train(model, "cpu", hold=_held_views)
    tpu, tpu_losses, tpu_held = _train(model, "tpu", {"donate_buffers": True}, hold=_held_views)
    assert torch_tpu.metrics.counters()["donated_buffers"] > 0
    # A TPU's rsqrt (BatchNorm) and sqrt (AdamW) differ from CPU's, compounded over the steps.
    loss_tol, tol = platform_tol({"rtol": 1e-5, "atol": 1e-6}), platform_tol({})
    assert tpu_losses == pytest.approx(cpu_losses, rel=loss_tol["rtol"], abs=loss_tol["atol"])
    for name in ("view", "detached", "transposed"):
        torch.testing.assert_close(tpu_held[name].detach().cpu(), cpu_held[name].detach(), msg=name, **tol)
    for name, p_cpu in cpu.named_parameters():
        torch.testing.assert_close(tpu.get_parameter(name).detach().cpu(), p_cpu.detach(), msg=name, **tol)


def test_donation_off_gives_the_same_numbers_and_buffers():
    model = _model()
    donated, donated_losses, donated_held = _train(model, "tpu", {"donate_buffers": True}, hold=_held_views)
    torch._dynamo.reset()
    kept, kept_losses, kept_held = _train(model, "tpu", {"donate_buffers": False}, hold=_held_views)
    assert donated_losses == kept_losses
    for name in kept_held:
        torch.testing.assert_close(donated_held[name].detach().cpu(), kept_held[name].detach().cpu(), msg=name)
    for (name, a), b in zip(donated.state_dict().items(), kept.state_dict().values()):
        torch.testing.assert_close(a.cpu(), b.cpu(), msg=name)
    # The held view reads the model's own (updated) running statistics.
    torch.testing.assert_close(donated_held["running_mean"].cpu().view(-1), donated[1].running_mean.cpu())


def test_a_buffer_something_else_holds_is_copied_not_donated():
    weight = torch.randn(4, 4)
    x = weight.to("tpu")
    buffer = tensors.buffer_of(x)
    # A second storage holding the very same jax array (as a forwarded graph output would).
    other = _C._wrap(buffer, [4, 4], torch.float32, 0)
    del buffer

    @torch.compile(backend="tpu", options={"donate_buffers": True})
    def bump(t):
        t.add_(1)
        return t.sum()

    bump(x)
    assert torch_tpu.metrics.counters()["donation_copies"] == 1
    torch.testing.assert_close(other.cpu(), weight)  # the other holder still reads the old values
    torch.testing.assert_close(x.cpu(), weight + 1)
    bump(x)  # x's new buffer is its own: donated
    assert torch_tpu.metrics.counters()["donated_buffers"] >= 1
    torch.testing.assert_close(x.cpu(), weight + 2)


def test_a_view_and_its_base_as_inputs_never_lose_data():
    def update(b, v):
        v.mul_(2)
        return b.sum() + v.sum()

    base = torch.arange(12.0).to("tpu")
    view = base[2:8]
    got = torch.compile(update, backend="tpu", options={"donate_buffers": True})(base, view)
    expected_base = torch.arange(12.0)
    expected = update(expected_base, expected_base[2:8])
    torch.testing.assert_close(got.cpu(), expected)
    torch.testing.assert_close(base.cpu(), expected_base)
    torch.testing.assert_close(view.cpu(), expected_base[2:8])


def test_donated_executable_aliases_the_overwritten_input(tmp_path):
    x = torch.randn(8, 8).to("tpu")

    @torch.compile(backend="tpu", options={"donate_buffers": True, "dump_dir": str(tmp_path)})
    def scale(t):
        t.mul_(3)

    before = x.cpu()
    scale(x)
    torch.testing.assert_close(x.cpu(), before * 3)
    hlo = "".join(p.read_text() for p in tmp_path.glob("*.hlo.txt"))
    assert "input_output_alias" in hlo
    assert np.isfinite(x.cpu().numpy()).all()


@pytest.mark.parametrize("written", ["source", "clone"])
def test_a_lazy_clone_never_loses_its_value_to_a_donation(written):
    @torch.compile(backend="tpu", options={"donate_buffers": True})
    def bump(t):
        t.add_(1)
        return t.sum()

    for _ in range(3):  # the first calls compile; later ones run the donating executable
        source = torch.arange(4.0).to("tpu")
        clone = source._lazy_clone()
        target, other = (source, clone) if written == "source" else (clone, source)
        assert bump(target).item() == 10.0
        torch.testing.assert_close(other.cpu(), torch.arange(4.0))
        torch.testing.assert_close(target.cpu(), torch.arange(4.0) + 1)
    counters = torch_tpu.metrics.counters()
    assert counters.get("donated_buffers", 0) + counters.get("donation_copies", 0) >= 1
