"""Train a small character-level GPT (minGPT) on tpu, then generate text.

python examples/mingpt/train.py --steps 20 [--compile] [--check] [--device cpu]
"""

from __future__ import annotations

import pathlib
import sys

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))  # examples/common
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))  # model.py
from common import harness
from common.lm import lm_example
from model import GPT, GPTConfig

CONFIG = GPTConfig()


def _logits(model: GPT, idx: torch.Tensor) -> torch.Tensor:
    return model(idx)[0]


EXAMPLE = lm_example("minGPT", lambda: GPT(CONFIG), CONFIG.block_size, logits_fn=_logits)


def train(device: str, steps: int, seed: int = 0, compile: bool = False) -> list[float]:
    """The losses of `steps` training steps on `device`."""
    return harness.train(EXAMPLE, device, steps, seed, compile=compile).losses


if __name__ == "__main__":
    sys.exit(harness.main(EXAMPLE))
