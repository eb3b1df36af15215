"""End-to-end training on tpu equals the same training on CPU."""

from __future__ import annotations

import copy

import torch
from torch import nn
from torch.nn import functional as F

from tests.helpers import platform_tol


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.GELU(), nn.Linear(32, 4))


def _train(model: nn.Module, device: str, steps: int, opt_name: str) -> list[float]:
    model = model.to(device)
    if opt_name == "sgd":
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-4)
    else:
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(1)
    losses = []
    for _ in range(steps):
        x = torch.randn(8, 16, generator=g)
        y = torch.randint(0, 4, (8,), generator=g)
        loss = F.cross_entropy(model(x.to(device)), y.to(device))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def test_mlp_sgd_matches_cpu(no_fallbacks):
    model = _mlp()
    cpu = _train(copy.deepcopy(model), "cpu", 20, "sgd")
    tpu = _train(model, "tpu", 20, "sgd")
    torch.testing.assert_close(tpu, cpu, **platform_tol({"rtol": 0, "atol": 1e-5}))  # GELU, cross entropy


def test_mlp_adamw_matches_cpu(no_fallbacks):
    model = _mlp()
    cpu = _train(copy.deepcopy(model), "cpu", 20, "adamw")
    tpu = _train(model, "tpu", 20, "adamw")
    torch.testing.assert_close(tpu, cpu, **platform_tol({"rtol": 0, "atol": 1e-5}))  # GELU, cross entropy, sqrt


class _SmallCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 8, 3, stride=2)
        self.fc = nn.Linear(8 * 3 * 3, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.bn(self.conv1(x))), 2)
        x = F.relu(self.conv2(x))
        return F.log_softmax(self.fc(x.flatten(1)), dim=1)


def test_cnn_forward_backward_matches_cpu(no_fallbacks):
    torch.manual_seed(0)
    cpu_model = _SmallCNN()
    tpu_model = copy.deepcopy(cpu_model).to("tpu")
    x = torch.randn(4, 3, 16, 16)
    y = torch.tensor([1, 0, 3, 9])
    losses = []
    for model, device in ((cpu_model, "cpu"), (tpu_model, "tpu")):
        loss = F.nll_loss(model(x.to(device)), y.to(device))
        loss.backward()
        losses.append(loss)
    # batch norm's rsqrt and log_softmax; the running statistics are a mean and a variance
    torch.testing.assert_close(losses[1].cpu(), losses[0], **platform_tol({"rtol": 1e-5, "atol": 1e-5}))
    for (name, p_cpu), p_tpu in zip(cpu_model.named_parameters(), tpu_model.parameters()):
        torch.testing.assert_close(p_tpu.grad.cpu(), p_cpu.grad, **platform_tol({"rtol": 1e-4, "atol": 1e-4}), msg=name)
    torch.testing.assert_close(tpu_model.bn.running_mean.cpu(), cpu_model.bn.running_mean)
    torch.testing.assert_close(tpu_model.bn.running_var.cpu(), cpu_model.bn.running_var)


def test_mingpt_example_trains_like_cpu():
    import pathlib
    import sys

    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "examples" / "mingpt"))
    from train import train

    tpu = train("tpu", 3)
    cpu = train("cpu", 3)
    torch.testing.assert_close(tpu, cpu, **platform_tol({"rtol": 0, "atol": 1e-4}))  # softmax, GELU, layer norm
