"""SPMD in one process over 8 virtual devices: Mesh, mark_sharding, data and tensor parallel
training, each compared with the same run on one device."""

from __future__ import annotations

import copy
import functools
import os
import pathlib
import sys

import pytest
import torch
from torch import nn
from torch.nn import functional as F

import torch_tpu
import torch_tpu.distributed as td

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "examples" / "distributed"))
from llama import Llama, LlamaConfig, shard_llama

pytestmark = pytest.mark.skipif(torch.tpu.device_count() < 8, reason="needs 8 tpu devices")


def test_mesh_shape_must_equal_the_device_count():
    with pytest.raises(ValueError, match="does not divide"):
        td.Mesh((3,), ("data",))
    with pytest.raises(ValueError, match="does not use all"):
        td.Mesh((2, 2), ("data", "model"))
    with pytest.raises(ValueError, match="axis names"):
        td.Mesh((2, 4), ("data",))
    with pytest.raises(ValueError, match="distinct"):
        td.Mesh((2, 4), ("x", "x"))
    mesh = td.Mesh((2, 2), ("data", "model"), devices=[4, 5, 6, 7])
    assert mesh.size() == 4 and mesh.size("model") == 2 and mesh.device_ids == (4, 5, 6, 7)


def test_bad_specs_raise_value_error():
    mesh = td.Mesh((2, 4), ("data", "model"))
    t = torch.zeros(8, 6, device="tpu")
    with pytest.raises(ValueError, match="unknown mesh axis 'batch'"):
        td.mark_sharding(t, mesh, ("batch", None))
    with pytest.raises(ValueError, match="dim 1 of size 6 is not divisible by 4"):
        td.mark_sharding(t, mesh, (None, "model"))
    with pytest.raises(ValueError, match="not divisible by 8"):
        td.mark_sharding(torch.zeros(4, device="tpu"), mesh, (("data", "model"),))
    with pytest.raises(ValueError, match="2 entries"):
        td.mark_sharding(torch.zeros(8, device="tpu"), mesh, ("data", None))
    with pytest.raises(ValueError, match="twice"):
        td.mark_sharding(torch.zeros(8, 8, device="tpu"), mesh, ("data", "data"))
    with pytest.raises(ValueError, match="view"):
        td.mark_sharding(torch.zeros(8, 8, device="tpu")[:4], mesh, ("data", None))
    with pytest.raises(ValueError, match="tpu tensor"):
        td.mark_sharding(torch.zeros(8), mesh, ("data",))


def test_eager_ops_propagate_shardings_and_match_cpu(no_fallbacks):
    mesh = td.Mesh((2, 4), ("data", "model"))
    x, w, b = torch.randn(8, 16), torch.randn(32, 16), torch.randn(32)
    xt = td.mark_sharding(x.to("tpu"), mesh, ("data", None))
    wt = td.mark_sharding(w.to("tpu"), mesh, ("model", None))
    bt = td.mark_sharding(b.to("tpu"), mesh, ("model",))
    assert td.sharding_spec(xt) == ("data", None)
    assert len(td.sharding_of(xt).device_set) == 8
    y = F.linear(xt, wt, bt)  # column parallel: batch over data, features over model
    assert td.sharding_spec(y) == ("data", "model")
    torch.testing.assert_close(y.cpu(), F.linear(x, w, b))  # .cpu() gathers the shards
    z = torch.relu(y).sum(0)
    torch.testing.assert_close(z.cpu(), torch.relu(x @ w.T + b).sum(0))
    # In-place writes keep the tensor's sharding; a fresh single-device tensor joins the mesh.
    y[:, :3] = 1.0
    y.add_(torch.ones(8, 32, device="tpu"))
    assert td.sharding_spec(y) == ("data", "model")
    expected = F.linear(x, w, b)
    expected[:, :3] = 1.0
    expected += 1
    torch.testing.assert_close(y.cpu(), expected)
    # A view of a sharded tensor reads and writes through its base.
    y.t()[5].mul_(2)
    expected.t()[5].mul_(2)
    torch.testing.assert_close(y.cpu(), expected)
    torch.testing.assert_close(y[1:3].sum().cpu(), expected[1:3].sum())
    assert td.sharding_spec(y) == ("data", "model")


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 4))


def _train_mlp(model: nn.Module, opt_name: str, mesh: td.Mesh | None, tensor_parallel: bool = False):
    model = copy.deepcopy(model).to("tpu")
    if tensor_parallel:
        td.column_parallel(model[0], mesh)
        td.row_parallel(model[2], mesh)
    if mesh is not None:
        td.replicate(model, mesh)
    if opt_name == "sgd":
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    else:
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(1)
    losses = []
    for _ in range(10):
        x, y = torch.randn(16, 16, generator=g).to("tpu"), torch.randint(0, 4, (16,), generator=g).to("tpu")
        if mesh is not None and not tensor_parallel:
            td.shard_batch(x, mesh)
            td.shard_batch(y, mesh)
        hidden = model[0](x)
        if mesh is not None:
            assert td.sharding_spec(hidden) == ((None, "model") if tensor_parallel else ("data", None))
        loss = F.cross_entropy(model[2](model[1](hidden)), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, model


@pytest.mark.parametrize("opt_name", ["sgd", "adamw"])
def test_data_parallel_training_matches_one_device(opt_name, no_fallbacks):
    model = _mlp()
    single, ref = _train_mlp(model, opt_name, None)
    sharded, dp = _train_mlp(model, opt_name, td.Mesh((8,), ("data",)))
    torch.testing.assert_close(sharded, single, rtol=0, atol=1e-5)
    for p, q in zip(dp.parameters(), ref.parameters()):
        # Gradients were all-reduced over "data" by GSPMD: parameters stay replicated and equal.
        assert td.sharding_spec(p) == (None,) * p.dim()
        assert td.sharding_spec(p.grad) == (None,) * p.dim()
        torch.testing.assert_close(p.cpu(), q.cpu(), rtol=0, atol=1e-5)


def test_tensor_parallel_mlp_matches_one_device(no_fallbacks):
    model = _mlp()
    single, ref = _train_mlp(model, "sgd", None)
    sharded, tp = _train_mlp(model, "sgd", td.Mesh((8,), ("model",)), tensor_parallel=True)
    torch.testing.assert_close(sharded, single, rtol=0, atol=1e-5)
    assert td.sharding_spec(tp[0].weight) == ("model", None)
    assert td.sharding_spec(tp[2].weight) == (None, "model")
    for p, q in zip(tp.parameters(), ref.parameters()):
        torch.testing.assert_close(p.cpu(), q.cpu(), rtol=0, atol=1e-5)


def _train_llama(model: Llama, mesh: td.Mesh | None, steps: int = 10) -> list[float]:
    model = copy.deepcopy(model).to("tpu")
    if mesh is not None:
        shard_llama(model, mesh, "model" if "model" in mesh.axis_names else None)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(2)
    losses = []
    for _ in range(steps):
        tokens = torch.randint(0, model.cfg.vocab_size, (4, model.cfg.max_seq_len + 1), generator=g).to("tpu")
        inputs, targets = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()
        if mesh is not None and "data" in mesh.axis_names:
            td.shard_batch(inputs, mesh)
            td.shard_batch(targets, mesh)
        logits = model(inputs)
        if mesh is not None and "model" in mesh.axis_names:
            assert td.sharding_spec(logits)[-1] == "model"  # column-parallel LM head
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    if mesh is not None and "model" in mesh.axis_names:
        assert td.sharding_spec(model.blocks[0].mlp.gate.weight) == ("model", None)
        assert td.sharding_spec(model.blocks[0].attn.o.weight) == (None, "model")
    return losses


def _tiny_llama() -> Llama:
    torch.manual_seed(0)
    return Llama(LlamaConfig(n_layers=1))


@functools.cache
def _llama_on_one_device() -> list[float]:
    return _train_llama(_tiny_llama(), None)


@pytest.mark.parametrize("shape,axes", [((8,), ("model",)), ((2, 4), ("data", "model"))], ids=["tp8", "dp2xtp4"])
def test_llama_tensor_parallel_matches_one_device(shape, axes, no_fallbacks):
    single = _llama_on_one_device()
    sharded = _train_llama(_tiny_llama(), td.Mesh(shape, axes))
    torch.testing.assert_close(sharded, single, rtol=0, atol=1e-5)
    assert torch_tpu.metrics.counters()["cpu_fallbacks"] == 0


def test_compiled_training_step_on_sharded_tensors_matches_one_device(no_fallbacks):
    """torch.compile(backend="tpu") graphs take sharded buffers; XLA partitions the whole graph."""
    mesh = td.Mesh((2, 4), ("data", "model"))
    model = _mlp()
    reference = copy.deepcopy(model).to("tpu")
    sharded = model.to("tpu")
    td.column_parallel(sharded[0], mesh)
    td.row_parallel(sharded[2], mesh)
    td.replicate(sharded, mesh)
    opt = torch.optim.SGD(sharded.parameters(), lr=0.1)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)

    def step(model, opt, x, y):
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss

    compiled = torch.compile(step, backend="tpu")
    g = torch.Generator().manual_seed(1)
    for _ in range(3):
        x, y = torch.randn(16, 16, generator=g), torch.randint(0, 4, (16,), generator=g)
        loss = compiled(sharded, opt, td.shard_batch(x.to("tpu"), mesh), td.shard_batch(y.to("tpu"), mesh))
        ref_loss = step(reference, ref_opt, x.to("tpu"), y.to("tpu"))
        torch.testing.assert_close(loss.cpu(), ref_loss.cpu(), rtol=0, atol=1e-5)
    assert torch_tpu.metrics.counters()["graph_compiles"] > 0
    assert td.sharding_spec(sharded[0].weight) == ("model", None)
    assert td.sharding_spec(sharded[2].weight) == (None, "model")
    for p, q in zip(sharded.parameters(), reference.parameters()):
        torch.testing.assert_close(p.cpu(), q.cpu(), rtol=0, atol=1e-5)


def test_cpu_collectives_wait_long_for_a_late_device():
    """Virtual CPU devices are threads; on a loaded machine XLA's short rendezvous timeout would
    abort the process, so the client is created with a long one (a user's own value is kept)."""
    from torch_tpu.runtime import client

    assert "--xla_cpu_collective_call_terminate_timeout_seconds=1800" in os.environ["XLA_FLAGS"]
    saved = os.environ["XLA_FLAGS"]
    try:
        os.environ["XLA_FLAGS"] = "--xla_cpu_collective_call_terminate_timeout_seconds=7"
        client._add_xla_flag("xla_cpu_collective_call_terminate_timeout_seconds", "1800", keep_user_value=True)
        assert os.environ["XLA_FLAGS"] == "--xla_cpu_collective_call_terminate_timeout_seconds=7"
    finally:
        os.environ["XLA_FLAGS"] = saved
