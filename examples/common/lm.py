"""The `Example` of a character-level language model: Zen-of-Python batches, next-token loss and
greedy generation from a prompt."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from common.generation import generate_greedy
from common.harness import Batch, Example
from common.text import decode, encode, lm_batches
from common.transformer import lm_loss

PROMPT = "Beautiful is "
NEW_TOKENS = 16

LogitsFn = Callable[[nn.Module, torch.Tensor], torch.Tensor]


def _call(model: nn.Module, idx: torch.Tensor) -> torch.Tensor:
    return model(idx)


def lm_example(
    name: str,
    make_model: Callable[[], nn.Module],
    block_size: int,
    logits_fn: LogitsFn = _call,
    batch_size: int = 8,
    lr: float = 3e-3,
) -> Example:
    """An Example training `make_model()` to predict the next character; logits_fn(model, ids) -> logits."""

    def loss(model: nn.Module, batch: Batch) -> torch.Tensor:
        x, y = batch
        return lm_loss(logits_fn(model, x), y)

    def infer(model: nn.Module, device: str) -> tuple[str, torch.Tensor]:
        prompt = encode(PROMPT).unsqueeze(0).to(device)
        tokens = generate_greedy(lambda ids: logits_fn(model, ids), prompt, NEW_TOKENS, block_size).cpu()
        return f"generated {decode(tokens[0])!r}", tokens

    return Example(
        name=name,
        make_model=make_model,
        batches=lambda steps, seed: lm_batches(steps, seed, batch_size, block_size),
        loss=loss,
        infer=infer,
        make_optimizer=lambda model: torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.1),
    )
