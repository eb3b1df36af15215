"""Hugging Face Trainer(bf16=True) through accelerate on tpu: 5 steps of a tiny Llama match CPU's bf16
run. accelerate knows no PrivateUse1 device: ACCELERATE_TORCH_DEVICE=tpu picks it (docs/autocast.md)."""

from __future__ import annotations

import copy
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


def _train(model, device: str, monkeypatch) -> tuple[list[float], set]:
    monkeypatch.setenv("ACCELERATE_TORCH_DEVICE", device)
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
