"""ResNet with basic blocks (He et al. 2015), CIFAR-style stem for small images."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn
from torch.nn import functional as F


class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut = nn.Sequential()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(y)) + self.shortcut(x))


class ResNet(nn.Module):
    """Images (B, C, H, W) -> class logits (B, num_classes)."""

    def __init__(self, widths: Sequence[int], depths: Sequence[int], num_classes: int, in_channels: int = 3):
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(in_channels, widths[0], 3, padding=1, bias=False), nn.BatchNorm2d(widths[0]), nn.ReLU()
        )
        blocks, cin = [], widths[0]
        for stage, (width, depth) in enumerate(zip(widths, depths, strict=True)):
            for i in range(depth):
                blocks.append(BasicBlock(cin, width, stride=2 if stage > 0 and i == 0 else 1))
                cin = width
        self.blocks = nn.Sequential(*blocks)
        self.fc = nn.Linear(cin, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.blocks(self.stem(x))
        return self.fc(F.adaptive_avg_pool2d(x, 1).flatten(1))


def resnet18(num_classes: int = 10) -> ResNet:
    """ResNet-18's widths and depths (11M parameters)."""
    return ResNet(widths=(64, 128, 256, 512), depths=(2, 2, 2, 2), num_classes=num_classes)


def resnet_tiny(num_classes: int = 10) -> ResNet:
    return ResNet(widths=(8, 16), depths=(1, 1), num_classes=num_classes)
