"""A small U-Net (Ronneberger et al. 2015): two resolution levels with skip connections,
GroupNorm + SiLU conv blocks, and a transposed convolution to upsample."""

from __future__ import annotations

import torch
from torch import nn


class ConvBlock(nn.Sequential):
    def __init__(self, cin: int, cout: int, groups: int = 4):
        super().__init__(
            nn.Conv2d(cin, cout, 3, padding=1),
            nn.GroupNorm(groups, cout),
            nn.SiLU(),
            nn.Conv2d(cout, cout, 3, padding=1),
            nn.GroupNorm(groups, cout),
            nn.SiLU(),
        )


class UNet(nn.Module):
    """Images (B, C, H, W), H and W divisible by 4 -> images of the same shape."""

    def __init__(self, channels: int = 1, width: int = 16):
        super().__init__()
        self.enc1 = ConvBlock(channels, width)
        self.enc2 = ConvBlock(width, 2 * width)
        self.middle = ConvBlock(2 * width, 2 * width)
        self.up2 = nn.ConvTranspose2d(2 * width, 2 * width, 2, stride=2)
        self.dec2 = ConvBlock(4 * width, width)
        self.up1 = nn.Upsample(scale_factor=2, mode="nearest")
        self.dec1 = ConvBlock(2 * width, width)
        self.out = nn.Conv2d(width, channels, 1)
        self.pool = nn.MaxPool2d(2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        e1 = self.enc1(x)
        e2 = self.enc2(self.pool(e1))
        m = self.middle(self.pool(e2))
        d2 = self.dec2(torch.cat([self.up2(m), e2], dim=1))
        d1 = self.dec1(torch.cat([self.up1(d2), e1], dim=1))
        return self.out(d1)
