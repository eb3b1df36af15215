"""A tiny Llama (examples/common/transformer.py's decoder: RMSNorm, rotary attention, SwiGLU MLP)
and its DP x TP sharding over a Mesh."""

from __future__ import annotations

import dataclasses
import pathlib
import sys

import torch_tpu.distributed as td

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))  # examples/common
from common.transformer import DecoderConfig, DecoderLM


@dataclasses.dataclass
class LlamaConfig:
    vocab_size: int = 64
    dim: int = 32
    n_layers: int = 2
    n_heads: int = 8
    hidden_dim: int = 64
    max_seq_len: int = 16
    eps: float = 1e-5

    def decoder(self) -> DecoderConfig:
        """The common decoder's configuration: multi-head attention (as many K/V heads as query
        heads), no biases, a separate LM head."""
        return DecoderConfig(
            vocab_size=self.vocab_size,
            block_size=self.max_seq_len,
            n_layer=self.n_layers,
            dim=self.dim,
            n_head=self.n_heads,
            n_kv_head=self.n_heads,
            hidden_dim=self.hidden_dim,
            norm_eps=self.eps,
        )


class Llama(DecoderLM):
    """Token ids (B, T) -> logits (B, T, vocab_size); `cfg` is the LlamaConfig it was built from."""

    def __init__(self, cfg: LlamaConfig):
        super().__init__(cfg.decoder())
        self.cfg = cfg


def shard_llama(model: Llama, mesh: td.Mesh, model_axis: str | None = "model") -> Llama:
    """Megatron tensor parallelism over `model_axis` (None: none, pure data parallel): q/k/v, the
    MLP's gate/up and the LM head are column-parallel, the attention output and MLP down
    projections row-parallel; everything else is replicated."""
    if model_axis is not None:
        for block in model.blocks:
            for linear in (block.attn.q, block.attn.k, block.attn.v, block.mlp.gate, block.mlp.up):
                td.column_parallel(linear, mesh, model_axis)
            td.row_parallel(block.attn.o, mesh, model_axis)
            td.row_parallel(block.mlp.down, mesh, model_axis)
        td.column_parallel(model.lm_head, mesh, model_axis)
    return td.replicate(model, mesh)
