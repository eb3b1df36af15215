"""Hugging Face Trainer(bf16=True) and accelerate on tpu: 5 steps of a tiny Llama match CPU's bf16
run. accelerate 1.16 finds the tpu through torch.accelerator (no ACCELERATE_TORCH_DEVICE): the
model trains on tpu, never silently on CPU (accelerate 1.15 left it there)."""

from __future__ import annotations

import copy
import importlib.metadata
import os
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # no hub access: models come from configs

import pytest
import torch
from torch.utils.data import Dataset

import torch_tpu
from tests.helpers import assert_no_fallbacks
from torch_tpu.testing.models import TINY_LLAMA

transformers = pytest.importorskip("transformers")
accelerate_state = pytest.importorskip("accelerate.state")


class _Tokens(Dataset):
    def __len__(self) -> int:
        return 10

    def __getitem__(self, i: int) -> dict:
        ids = torch.randint(0, 128, (16,), generator=torch.Generator().manual_seed(i))
        return {"input_ids": ids, "labels": ids}


ACCELERATE_FLOOR = (1, 16)  # the first accelerate that finds PrivateUse1 devices (torch_tpu[hf])


def _version(package: str) -> tuple[int, ...]:
    return tuple(int(part) for part in importlib.metadata.version(package).split(".")[:2])


def test_accelerate_is_new_enough_to_find_tpu():
    assert _version("accelerate") >= ACCELERATE_FLOOR
    from accelerate import PartialState

    accelerate_state.AcceleratorState._reset_state(True)
    assert PartialState().device.type == "tpu"


def _train(model, device: str, monkeypatch) -> tuple[list[float], set]:
    monkeypatch.delenv("ACCELERATE_TORCH_DEVICE", raising=False)  # found, not told
    accelerate_state.AcceleratorState._reset_state(True)
    args = transformers.TrainingArguments(
        output_dir=tempfile.mkdtemp(),
        max_steps=5,
        per_device_train_batch_size=2,
        bf16=True,
        logging_steps=1,
        report_to=[],
        use_cpu=device == "cpu",
        save_strategy="no",
        learning_rate=1e-3,
        seed=0,
        data_seed=0,
        disable_tqdm=True,
    )
    trainer = transformers.Trainer(model=model, args=args, train_dataset=_Tokens())
    assert trainer.args.device.type == device
    seen = set()  # (device, autocast on, dtype) of the first linear's output
    hook = trainer.model.model.layers[0].self_attn.q_proj.register_forward_hook(
        lambda m, i, out: seen.add((out.device.type, torch.is_autocast_enabled(device), out.dtype))
    )
    torch_tpu.metrics.reset()
    trainer.train()
    hook.remove()
    accelerate_state.AcceleratorState._reset_state(True)
    return [h["loss"] for h in trainer.state.log_history if "loss" in h], seen


def test_trainer_bf16_llama_matches_cpu(monkeypatch):
    config = transformers.LlamaConfig(**TINY_LLAMA)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config)
    cpu_losses, cpu_seen = _train(copy.deepcopy(model), "cpu", monkeypatch)
    tpu_losses, tpu_seen = _train(copy.deepcopy(model), "tpu", monkeypatch)
    assert_no_fallbacks()
    assert cpu_seen == {("cpu", True, torch.bfloat16)}
    assert tpu_seen == {("tpu", True, torch.bfloat16)}
    assert len(tpu_losses) == 5
    torch.testing.assert_close(tpu_losses, cpu_losses, rtol=2e-2, atol=2e-2)


def test_accelerate_bf16_loop_trains_on_tpu(monkeypatch):
    """A plain accelerate loop, Accelerator(mixed_precision="bf16"): model, batches and autocast on
    tpu, and the losses of CPU's bf16 run."""
    monkeypatch.delenv("ACCELERATE_TORCH_DEVICE", raising=False)
    accelerate = pytest.importorskip("accelerate")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.GELU(), torch.nn.Linear(32, 1))
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 8, generator=g)
    data = torch.utils.data.TensorDataset(x, x.pow(2).sum(1, keepdim=True))
    runs = {}
    for cpu in (True, False):
        accelerate_state.AcceleratorState._reset_state(True)
        accelerator = accelerate.Accelerator(mixed_precision="bf16", cpu=cpu)
        net = copy.deepcopy(model)
        optimizer = torch.optim.AdamW(net.parameters(), lr=1e-2)
        loader = torch.utils.data.DataLoader(data, batch_size=16)
        net, optimizer, loader = accelerator.prepare(net, optimizer, loader)
        losses, seen = [], set()
        first = accelerator.unwrap_model(net)[0]
        first.register_forward_hook(
            lambda m, i, out, seen=seen: seen.add((i[0].device.type, m.weight.device.type, out.dtype))
        )
        for xb, yb in loader:
            loss = torch.nn.functional.mse_loss(net(xb).float(), yb)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            losses.append(loss.item())
        runs[accelerator.device.type] = losses, seen
    accelerate_state.AcceleratorState._reset_state(True)
    assert set(runs) == {"cpu", "tpu"}
    assert runs["tpu"][1] == {("tpu", "tpu", torch.bfloat16)}
    assert runs["cpu"][1] == {("cpu", "cpu", torch.bfloat16)}
    torch.testing.assert_close(runs["tpu"][0], runs["cpu"][0], rtol=2e-2, atol=2e-2)
