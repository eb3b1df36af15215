"""Greedy decoding at a fixed shape.

The sequence lives in a (batch, block_size) buffer and every step runs the model on the whole
buffer: causal attention keeps position t-1 blind to the padding after it. The step counter is a
device tensor, so every step has the same shapes and arguments and reuses the same executables
(a growing sequence would compile each op once per length).
"""

from __future__ import annotations

from collections.abc import Callable

import torch


@torch.no_grad()
def generate_greedy(
    logits_fn: Callable[[torch.Tensor], torch.Tensor], prompt: torch.Tensor, max_new_tokens: int, block_size: int
) -> torch.Tensor:
    """prompt (B, P) followed by `max_new_tokens` greedy tokens; logits_fn maps (B, T) ids to (B, T, V)."""
    batch, length = prompt.shape
    if length + max_new_tokens > block_size:
        raise ValueError(f"{length} + {max_new_tokens} tokens do not fit in a block of {block_size}")
    device = prompt.device
    tokens = torch.zeros(batch, block_size, dtype=prompt.dtype, device=device)
    tokens[:, :length] = prompt
    positions = torch.arange(block_size, device=device)
    step = torch.tensor(length, device=device)  # where the next token goes
    for _ in range(max_new_tokens):
        logits = logits_fn(tokens)
        last = logits.index_select(1, (step - 1).view(1)).squeeze(1)
        next_token = last.argmax(dim=-1, keepdim=True)
        tokens = torch.where(positions == step, next_token, tokens)
        step = step + 1
    return tokens[:, : length + max_new_tokens]
