"""torch_tpu.export: StableHLO text and portable bytecode that run under jax and match the torch model."""

from __future__ import annotations

import dataclasses
import importlib.util
import pathlib
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from torch import nn

import torch_tpu


def _mingpt():
    path = pathlib.Path(__file__).resolve().parents[1] / "examples" / "mingpt" / "model.py"
    spec = importlib.util.spec_from_file_location("mingpt_model_for_export_tests", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def gpt():
    mingpt = _mingpt()
    torch.manual_seed(0)
    model = mingpt.GPT(mingpt.GPTConfig(vocab_size=32, block_size=8, n_layer=2, n_head=2, n_embd=16)).eval()
    idx = torch.randint(0, 32, (2, 8))
    with torch.no_grad():
        expected = model(idx)[0].numpy()
    return model, idx, expected


@pytest.mark.parametrize("weights", ["arguments", "constants"])
def test_mingpt_export_runs_under_jax_and_matches(gpt, weights):
    model, idx, expected = gpt
    exported = torch_tpu.export(model, (idx,), weights=weights)
    assert "stablehlo" in exported.stablehlo and "func.func public @main" in exported.stablehlo
    logits, loss = exported(idx)
    assert loss is None
    np.testing.assert_allclose(np.asarray(logits), expected, atol=1e-5, rtol=1e-5)
    if weights == "arguments":
        assert exported.weight_names[0] == "tok_emb.weight" and len(exported.weights) == len(exported.weight_names)
        # Other weights give other results: they really are arguments.
        zeroed = [np.zeros_like(w) for w in exported.weights]
        out = exported.exported.call(zeroed, [jnp.asarray(idx.numpy())])
        assert not np.allclose(np.asarray(out[0]), expected)
    else:
        assert exported.weights == []


def test_bytecode_alone_carries_the_computation(gpt, tmp_path):
    model, idx, expected = gpt
    exported = torch_tpu.export(model, (idx,), weights="constants")
    path = tmp_path / "mingpt.mlirbc"
    path.write_bytes(exported.bytecode)
    assert path.read_bytes()[:4] == b"ML\xefR"  # MLIR bytecode magic
    # A jax Exported whose module is only the bytes read back.
    reloaded = dataclasses.replace(exported.exported, mlir_module_serialized=path.read_bytes())
    out = reloaded.call([jnp.asarray(idx.numpy())])
    np.testing.assert_allclose(np.asarray(out[0]), expected, atol=1e-5, rtol=1e-5)


def test_serialized_export_round_trips_through_jax_deserialize(gpt):
    pytest.importorskip("flatbuffers")
    model, idx, expected = gpt
    exported = torch_tpu.export(model, (idx,))
    restored = jax.export.deserialize(bytearray(exported.serialize()))
    out = restored.call(exported.weights, [jnp.asarray(idx.numpy())])
    np.testing.assert_allclose(np.asarray(out[0]), expected, atol=1e-5, rtol=1e-5)


def test_export_of_a_tpu_model_leaves_it_on_tpu():
    model = nn.Sequential(nn.Linear(4, 3), nn.ReLU()).to("tpu")
    x = torch.randn(2, 4)
    exported = torch_tpu.export(model, (x,))
    assert next(model.parameters()).device.type == "tpu"
    np.testing.assert_allclose(np.asarray(exported(x)), model(x.to("tpu")).detach().cpu().numpy(), atol=1e-6)


def test_bad_weights_choice_raises():
    with pytest.raises(ValueError, match="arguments"):
        torch_tpu.export(nn.Linear(2, 2), (torch.randn(1, 2),), weights="inline")
