"""A small character-level corpus that ships with Python, and language-model batches from it."""

from __future__ import annotations

import codecs
import contextlib
import io
from collections.abc import Iterator

import torch

with contextlib.redirect_stdout(io.StringIO()):  # importing `this` prints it
    import this  # the Zen of Python

VOCAB_SIZE = 128  # ASCII


def zen_of_python() -> str:
    return codecs.decode(this.s, "rot13")


def encode(text: str) -> torch.Tensor:
    return torch.tensor([min(ord(ch), VOCAB_SIZE - 1) for ch in text], dtype=torch.long)


def decode(tokens: torch.Tensor) -> str:
    return "".join(chr(t) for t in tokens.tolist())


def corpus() -> torch.Tensor:
    return encode(zen_of_python())


def lm_batches(steps: int, seed: int, batch_size: int, block_size: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """(inputs, next-token targets) windows of the corpus, both (batch_size, block_size)."""
    data = corpus()
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        starts = torch.randint(0, data.numel() - block_size - 1, (batch_size,), generator=g)
        x = torch.stack([data[s : s + block_size] for s in starts])
        y = torch.stack([data[s + 1 : s + 1 + block_size] for s in starts])
        yield x, y
