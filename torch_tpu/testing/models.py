"""Tiny model configs shared by the tests and the benchmarks."""

from __future__ import annotations

# A Hugging Face Llama-family decoder: 2 layers, hidden 64, 4 query heads over 2 K/V heads
# (grouped-query attention). transformers.LlamaConfig(**TINY_LLAMA), or Qwen2Config(**TINY_LLAMA).
TINY_LLAMA: dict = dict(
    vocab_size=128,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=64,
)
