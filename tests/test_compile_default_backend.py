"""torch.compile(model) with no backend: graphs on tpu tensors compile through XLA, CPU keeps inductor."""

from __future__ import annotations

import copy
import importlib.util
import pathlib
import sys

import pytest
import torch
from torch import nn

import torch_tpu


def _mingpt():
    path = pathlib.Path(__file__).resolve().parents[1] / "examples" / "mingpt" / "model.py"
    spec = importlib.util.spec_from_file_location("mingpt_model_for_compile_tests", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


# Each test starts with dynamo's caches and the counters cleared (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("fresh_dynamo")


def _compare_on_tpu(model: nn.Module, *inputs, atol=1e-5):
    reference = model(*inputs)
    compiled = torch.compile(copy.deepcopy(model).to("tpu"))
    got = compiled(*(x.to("tpu") for x in inputs))
    reference, got = (r[0] if isinstance(r, tuple) else r for r in (reference, got))
    assert got.device.type == "tpu"
    torch.testing.assert_close(got.cpu(), reference, atol=atol, rtol=1e-5)
    assert torch_tpu.metrics.counters()["graph_compiles"] >= 1


def test_mlp_matches_cpu():
    model = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 4))
    _compare_on_tpu(model, torch.randn(3, 8))


def test_conv_net_matches_cpu():
    model = nn.Sequential(
        nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(64, 5)
    ).eval()
    _compare_on_tpu(model, torch.randn(2, 3, 8, 8))


def test_mingpt_matches_cpu():
    mingpt = _mingpt()
    model = mingpt.GPT(mingpt.GPTConfig(vocab_size=32, block_size=8, n_layer=1, n_head=2, n_embd=16)).eval()
    idx = torch.randint(0, 32, (2, 8))
    _compare_on_tpu(model, idx, torch.randint(0, 32, (2, 8)))


def test_training_step_with_default_backend_matches_cpu():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 1))
    losses = {}
    for device in ("cpu", "tpu"):
        m = copy.deepcopy(model).to(device)
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        step_fn = m if device == "cpu" else torch.compile(m)
        g = torch.Generator().manual_seed(2)
        out = []
        for _ in range(3):
            x = torch.randn(4, 6, generator=g).to(device)
            loss = step_fn(x).pow(2).mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            out.append(loss.item())
        losses[device] = out
    assert losses["tpu"] == pytest.approx(losses["cpu"], rel=1e-5, abs=1e-6)


def test_cpu_inductor_in_the_same_process_still_works():
    tpu_model = nn.Linear(4, 2).to("tpu")
    torch.compile(tpu_model)(torch.randn(2, 4, device="tpu"))
    compiles = torch_tpu.metrics.counters()["graph_compiles"]

    def f(x):
        return torch.sin(x) * 2 + 1

    x = torch.randn(5)
    compiled = torch.compile(f)
    torch.testing.assert_close(compiled(x), f(x))
    # The CPU graph was compiled by inductor, not by the tpu backend.
    assert torch_tpu.metrics.counters()["graph_compiles"] == compiles
    from torch._dynamo.utils import counters

    assert counters["inductor"]["fxgraph_cache_miss"] + counters["inductor"]["fxgraph_cache_hit"] >= 1


def test_default_backend_modes_map_to_tpu_modes():
    model = nn.Linear(4, 3)
    x = torch.randn(2, 4)
    got = torch.compile(copy.deepcopy(model).to("tpu"), mode="max-autotune")(x.to("tpu"))
    torch.testing.assert_close(got.cpu(), model(x))


def test_inductor_options_on_tpu_name_the_tpu_backend():
    model = torch.compile(nn.Linear(4, 3).to("tpu"), options={"epilogue_fusion": False})
    with pytest.raises(Exception, match='backend="tpu"'):
        model(torch.randn(2, 4, device="tpu"))
