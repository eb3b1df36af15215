"""torch.compile(backend="tpu"): graphs lowered to single XLA executables match eager tpu and CPU."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn
from torch.nn import functional as F

import torch_tpu
from tests.helpers import platform_tol

# Each test starts with dynamo's caches and the counters cleared (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("fresh_dynamo")


def _counters():
    return torch_tpu.metrics.counters()


class _TinyGPT(nn.Module):
    """A one-block causal transformer: embeddings, attention, LayerNorm, GELU MLP, cross entropy."""

    def __init__(self, vocab=32, block=16, d=32, heads=2):
        super().__init__()
        self.heads = heads
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(block, d)
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))
        self.head = nn.Linear(d, vocab, bias=False)

    def forward(self, idx, targets):
        b, t = idx.shape
        x = self.tok(idx) + self.pos(torch.arange(t, device=idx.device))
        q, k, v = self.qkv(self.ln1(x)).split(x.size(-1), dim=2)
        q, k, v = (z.view(b, t, self.heads, -1).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, -1))
        x = x + self.mlp(self.ln2(x))
        logits = self.head(x)
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def _train(model: nn.Module, device: str, steps: int, compiled: bool) -> list[float]:
    model = model.to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)

    def step(x, y):
        loss = model(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    if compiled:
        step = torch.compile(step, backend="tpu")
    g = torch.Generator().manual_seed(1)
    losses = []
    for _ in range(steps):
        x = torch.randint(0, 32, (4, 16), generator=g)
        y = torch.randint(0, 32, (4, 16), generator=g)
        losses.append(step(x.to(device), y.to(device)).item())
    return losses


def test_compiled_training_step_matches_eager_and_cpu(no_fallbacks):
    torch.manual_seed(0)
    model = _TinyGPT()
    cpu = _train(copy.deepcopy(model), "cpu", 10, compiled=False)
    eager = _train(copy.deepcopy(model), "tpu", 10, compiled=False)
    torch_tpu.metrics.reset()
    compiled = _train(model, "tpu", 10, compiled=True)
    counts = _counters()
    torch.testing.assert_close(compiled, eager, rtol=0, atol=1e-4)
    torch.testing.assert_close(compiled, cpu, rtol=0, atol=1e-4)
    # forward, backward and the optimizer step each became one executable, compiled once
    assert 3 <= counts["graph_compiles"] + counts["persistent_cache_hits"]
    assert counts["graph_compiles"] <= 4
    assert counts["graph_cache_hits"] >= 27
    assert counts.get("graph_eager_ops", 0) == 0


def test_registering_tpu_keeps_cpu_compile_working():
    def f(x):
        return torch.sin(x) * 2 + x.cos()

    x = torch.randn(5)
    torch.testing.assert_close(torch.compile(f)(x), f(x))  # inductor, the default
    torch.testing.assert_close(torch.compile(f, backend="tpu")(x), f(x))  # no tpu tensor: runs as is
    assert _counters()["graph_compiles"] == 0


def test_inference_graph_is_one_executable():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
    x = torch.randn(4, 8)
    expected = model(x)
    tpu_model = copy.deepcopy(model).to("tpu")
    compiled = torch.compile(tpu_model, backend="tpu")
    with torch.no_grad():
        for _ in range(3):
            out = compiled(x.to("tpu"))
    assert out.device.type == "tpu"
    torch.testing.assert_close(out.cpu(), expected.detach(), rtol=1e-5, atol=1e-5)
    counts = _counters()
    assert counts["graph_compiles"] + counts["persistent_cache_hits"] >= 1
    assert counts["graph_compiles"] <= 1
    assert counts["graph_cache_hits"] == 2
    assert counts["op_compiles"] <= 2  # only the host copies around the graph


def test_batchnorm_running_stats_land_in_tpu_buffers(no_fallbacks):
    torch.manual_seed(0)
    cpu_model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU())
    tpu_model = copy.deepcopy(cpu_model).to("tpu")
    compiled = torch.compile(tpu_model, backend="tpu")
    for _ in range(3):
        x = torch.randn(2, 3, 8, 8)
        with torch.no_grad():  # an inference graph: the stats are copy_ into placeholders
            out = compiled(x.to("tpu"))
            expected = cpu_model(x)
        torch.testing.assert_close(out.cpu(), expected, rtol=1e-4, atol=1e-4)
    bn_cpu, bn_tpu = cpu_model[1], tpu_model[1]
    torch.testing.assert_close(bn_tpu.running_mean.cpu(), bn_cpu.running_mean, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(bn_tpu.running_var.cpu(), bn_cpu.running_var, rtol=1e-5, atol=1e-5)
    assert bn_tpu.num_batches_tracked.item() == 3


def test_mutating_a_view_writes_through_to_its_base():
    def f(x, y):
        x[:, 1:3].mul_(2).add_(y)
        return x.sum()

    base = torch.randn(4, 5)
    y = torch.randn(4, 2)
    expected_base = base.clone()
    expected = f(expected_base, y)
    tpu_base = base.to("tpu")
    alias = tpu_base[1]  # a view that must see the write
    out = torch.compile(f, backend="tpu")(tpu_base, y.to("tpu"))
    torch.testing.assert_close(out.cpu(), expected)
    torch.testing.assert_close(tpu_base.cpu(), expected_base)
    torch.testing.assert_close(alias.cpu(), expected_base[1])


def test_graph_break_runs_eager_tpu_and_stays_correct():
    def f(x):
        y = x * 2
        if y.sum().item() > 0:  # a data-dependent branch: dynamo breaks the graph here
            y = y + 1
        return y.relu()

    x = torch.randn(6)
    torch.testing.assert_close(torch.compile(f, backend="tpu")(x.to("tpu")).cpu(), f(x))


def test_op_without_jax_lowering_splits_the_graph_visibly():
    def f(x):
        return torch.linalg.det(x * 2) + x.sum()  # det's tpu kernel is eager Python

    x = torch.randn(3, 3, dtype=torch.float64)
    with pytest.warns(UserWarning, match="graph is split"):
        out = torch.compile(f, backend="tpu")(x.to("tpu"))
    torch.testing.assert_close(out.cpu(), f(x))
    assert _counters()["graph_eager_ops"] >= 1


def test_sequence_length_sweep_compiles_at_most_one_graph_per_length():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(16, 8), nn.Linear(8, 8), nn.Tanh())
    tpu_model = copy.deepcopy(model).to("tpu")
    compiled = torch.compile(tpu_model, backend="tpu", dynamic=True)
    with torch.no_grad():
        for length in (5, 9, 12, 16):
            idx = torch.randint(0, 16, (2, length))
            torch.testing.assert_close(compiled(idx.to("tpu")).cpu(), model(idx), **platform_tol({}))  # tanh
    counts = _counters()
    assert 1 <= counts["graph_compiles"] + counts["persistent_cache_hits"] <= 4
    assert counts["graph_compiles"] <= 4


def test_recompile_is_logged_with_its_reason(monkeypatch, capfd):
    monkeypatch.setenv("TORCH_TPU_DEBUG", "1")

    def f(x):
        return (x * 3).sum(0)

    compiled = torch.compile(f, backend="tpu", dynamic=False)
    compiled(torch.randn(4, 3).to("tpu"))
    compiled(torch.randn(6, 3).to("tpu"))
    err = capfd.readouterr().err
    assert "[torch_tpu] recompile:" in err
    assert "[4, 3] -> " in err and "[6, 3]" in err


def test_dropout_in_a_compiled_training_graph():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 64), nn.Dropout(0.5)).to("tpu")
    compiled = torch.compile(model, backend="tpu")
    out = compiled(torch.ones(32, 64).to("tpu"))
    out.sum().backward()
    zeros = (out == 0).float().mean().item()
    assert 0.4 < zeros < 0.6
    grad = model[0].weight.grad
    assert grad is not None and torch.isfinite(grad.cpu()).all()
    second = compiled(torch.ones(32, 64).to("tpu"))
    assert not torch.equal(out.cpu() == 0, second.cpu() == 0)  # a fresh mask per call


def test_outputs_keep_eager_values_and_strides():
    def f(a):
        b = a @ a.T + 1
        return b.t(), b[1:], a.view(-1), a.transpose(0, 1).contiguous() * 2

    a = torch.randn(3, 4)
    expected = f(a)
    results = torch.compile(f, backend="tpu")(a.to("tpu"))
    for got, want in zip(results, expected):
        assert got.device.type == "tpu"
        assert got.stride() == want.stride()
        torch.testing.assert_close(got.cpu(), want)
