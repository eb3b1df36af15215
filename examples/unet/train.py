"""Train a small U-Net to denoise synthetic 1x16x16 images on tpu, then denoise held-out images.

The network predicts the noise added to a clean image (as a diffusion model's denoiser does);
clean = noisy - predicted noise.

python examples/unet/train.py --steps 20 [--compile] [--check] [--device cpu]
"""

from __future__ import annotations

import math
import pathlib
import sys

import torch
from torch import nn
from torch.nn import functional as F

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))  # examples/common
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))  # model.py
from common import harness
from common.images import smooth_images
from model import UNet

SIZE, BATCH, NOISE = 16, 8, 0.3


def noisy_pairs(batch_size: int, g: torch.Generator) -> harness.Batch:
    clean = smooth_images(batch_size, 1, SIZE, g)
    noise = NOISE * torch.randn(clean.shape, generator=g)
    return clean + noise, noise


def batches(steps: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        yield noisy_pairs(BATCH, g)


def loss(model: nn.Module, batch: harness.Batch) -> torch.Tensor:
    noisy, noise = batch
    return F.mse_loss(model(noisy), noise)


def psnr(image: torch.Tensor, reference: torch.Tensor) -> float:
    mse = F.mse_loss(image, reference).item()
    return 10 * math.log10(4.0 / mse)  # images span [-1, 1]: peak-to-peak 2


@torch.no_grad()
def denoise(model: nn.Module, device: str) -> tuple[str, torch.Tensor]:
    noisy, noise = noisy_pairs(16, torch.Generator().manual_seed(99))
    clean = noisy - noise
    denoised = noisy - model(noisy.to(device)).cpu()
    return f"PSNR noisy {psnr(noisy, clean):.2f} dB -> denoised {psnr(denoised, clean):.2f} dB", denoised


EXAMPLE = harness.Example(
    name="UNet",
    make_model=UNet,
    batches=batches,
    loss=loss,
    infer=denoise,
    make_optimizer=lambda m: torch.optim.Adam(m.parameters(), lr=2e-3),
)

if __name__ == "__main__":
    sys.exit(harness.main(EXAMPLE))
