"""Lightning on tpu (torch_tpu/lightning.py): a LightningModule trained with
Trainer(accelerator="torch_tpu") in float32 and bf16-mixed matches CPU's run, on tpu, with
bfloat16 autocast on tpu (Lightning's own choice would autocast on "cuda", i.e. not at all)."""

from __future__ import annotations

import copy

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import torch_tpu

pl = pytest.importorskip("pytorch_lightning")


class _Regressor(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
        self.seen: set = set()  # (device, autocast on there, first layer's output dtype); the weights' place
        self.losses: list[float] = []
        self.net[0].register_forward_hook(self._note)

    def _note(self, module, inputs, out) -> None:
        self.seen.add((out.device.type, torch.is_autocast_enabled(out.device.type), out.dtype))

    def training_step(self, batch, batch_idx):
        x, y = batch
        self.seen.add(("weights", self.net[0].weight.device.type, self.net[0].weight.dtype))
        loss = torch.nn.functional.mse_loss(self.net(x).float(), y)
        self.losses.append(loss.item())
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _data() -> DataLoader:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(32, 8, generator=g)
    return DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=8)


def _fit(model: _Regressor, accelerator, precision: str) -> _Regressor:
    trainer = pl.Trainer(
        accelerator=accelerator,
        devices=1,
        precision=precision,
        max_epochs=2,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(model, _data())
    return model


@pytest.mark.parametrize("precision", ["32-true", "bf16-mixed"])
def test_trainer_on_tpu_matches_cpu(precision):
    torch.manual_seed(0)
    cpu_model = _Regressor()
    tpu_model = copy.deepcopy(cpu_model)
    _fit(cpu_model, "cpu", precision)
    _fit(tpu_model, "torch_tpu", precision)
    autocast = precision == "bf16-mixed"
    dtype = torch.bfloat16 if autocast else torch.float32
    # Weights stay float32 under mixed precision (Lightning moves them back to CPU after fit).
    assert cpu_model.seen == {("cpu", autocast, dtype), ("weights", "cpu", torch.float32)}
    assert tpu_model.seen == {("tpu", autocast, dtype), ("weights", "tpu", torch.float32)}
    assert len(tpu_model.losses) == 8
    tolerance = 2e-2 if autocast else 1e-5
    torch.testing.assert_close(tpu_model.losses, cpu_model.losses, rtol=tolerance, atol=tolerance)
    assert tpu_model.losses[-1] < tpu_model.losses[0]


def test_accelerator_instance_and_registry():
    from pytorch_lightning.accelerators import AcceleratorRegistry

    assert "torch_tpu" in AcceleratorRegistry.available_accelerators()
    accelerator = torch_tpu.lightning.TPUAccelerator()
    assert isinstance(accelerator, pl.accelerators.Accelerator)
    assert accelerator.is_available()
    assert accelerator.get_parallel_devices("auto") == [torch.device("tpu", 0)]
    if torch.tpu.device_count() > 1:  # (a TPU VM with one chip has tpu:0 only)
        assert accelerator.get_parallel_devices([1]) == [torch.device("tpu", 1)]
    with pytest.raises(ValueError, match="one tpu device per process"):
        accelerator.get_parallel_devices(2)
    torch.manual_seed(0)
    model = _fit(_Regressor(), accelerator, "bf16-mixed")
    assert model.seen == {("tpu", True, torch.bfloat16), ("weights", "tpu", torch.float32)}
