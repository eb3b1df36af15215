"""Train a small ResNet on synthetic 3x16x16 images of 10 classes on tpu, then classify held-out
images.

python examples/resnet/train.py --steps 20 [--compile] [--check] [--device cpu]
"""

from __future__ import annotations

import pathlib
import sys

import torch
from torch import nn
from torch.nn import functional as F

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))  # examples/common
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))  # model.py
from common import harness
from common.images import class_templates, labelled_images
from model import resnet_tiny

NUM_CLASSES, SIZE, BATCH = 10, 16, 16
TEMPLATES = class_templates(NUM_CLASSES, 3, SIZE)


def batches(steps: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        yield labelled_images(TEMPLATES, BATCH, g)


def loss(model: nn.Module, batch: harness.Batch) -> torch.Tensor:
    images, labels = batch
    return F.cross_entropy(model(images), labels)


@torch.no_grad()
def classify(model: nn.Module, device: str) -> tuple[str, torch.Tensor]:
    images, labels = labelled_images(TEMPLATES, 64, torch.Generator().manual_seed(99))
    logits = model(images.to(device)).cpu()
    accuracy = (logits.argmax(1) == labels).float().mean().item()
    return f"accuracy {accuracy:.1%} on 64 held-out images", logits


EXAMPLE = harness.Example(
    name="ResNet",
    make_model=lambda: resnet_tiny(NUM_CLASSES),
    batches=batches,
    loss=loss,
    infer=classify,
    make_optimizer=lambda m: torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-4),
)

if __name__ == "__main__":
    sys.exit(harness.main(EXAMPLE))
