"""Synthetic image data made from fixed seeds (nothing is downloaded)."""

from __future__ import annotations

import torch


def class_templates(num_classes: int, channels: int, size: int, seed: int = 1234) -> torch.Tensor:
    """One smooth random pattern per class, (num_classes, channels, size, size)."""
    g = torch.Generator().manual_seed(seed)
    coarse = torch.randn(num_classes, channels, 4, 4, generator=g)
    return torch.nn.functional.interpolate(coarse, size=(size, size), mode="bilinear", align_corners=False)


def labelled_images(
    templates: torch.Tensor, batch_size: int, g: torch.Generator, noise: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """A batch of (noisy class pattern, class) pairs."""
    labels = torch.randint(0, templates.shape[0], (batch_size,), generator=g)
    images = templates[labels] + noise * torch.randn(batch_size, *templates.shape[1:], generator=g)
    return images, labels


def smooth_images(batch_size: int, channels: int, size: int, g: torch.Generator) -> torch.Tensor:
    """Random smooth images in [-1, 1] (upsampled coarse noise), (batch_size, channels, size, size)."""
    coarse = torch.randn(batch_size, channels, size // 4, size // 4, generator=g)
    fine = torch.nn.functional.interpolate(coarse, size=(size, size), mode="bilinear", align_corners=False)
    return torch.tanh(fine)
