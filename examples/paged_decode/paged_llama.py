"""A tiny Llama (RMSNorm, rotary embeddings, grouped-query attention, SwiGLU) whose attention
is a callback, so one model serves a paged-cache decode loop and a plain reference."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch
from torch import nn
from torch.nn import functional as F

# attend(layer, q, k, v) -> attention output; q [B, heads, T, hd], k/v [B, kv_heads, T, hd].
Attend = Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


@dataclasses.dataclass
class LlamaConfig:
    vocab_size: int = 64
    dim: int = 32
    layers: int = 2
    heads: int = 4
    kv_heads: int = 2
    hidden: int = 64
    max_positions: int = 64
    rope_theta: float = 10000.0

    @property
    def head_dim(self) -> int:
        return self.dim // self.heads


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding (half-split form); cos/sin broadcast over x's leading dims."""
    first, second = x.chunk(2, dim=-1)
    return torch.cat([first * cos - second * sin, first * sin + second * cos], dim=-1)


class Block(nn.Module):
    def __init__(self, cfg: LlamaConfig, index: int):
        super().__init__()
        self.cfg, self.index = cfg, index
        hd = cfg.head_dim
        self.attn_norm, self.mlp_norm = RMSNorm(cfg.dim), RMSNorm(cfg.dim)
        self.wq = nn.Linear(cfg.dim, cfg.heads * hd, bias=False)
        self.wk = nn.Linear(cfg.dim, cfg.kv_heads * hd, bias=False)
        self.wv = nn.Linear(cfg.dim, cfg.kv_heads * hd, bias=False)
        self.wo = nn.Linear(cfg.heads * hd, cfg.dim, bias=False)
        self.w_gate = nn.Linear(cfg.dim, cfg.hidden, bias=False)
        self.w_up = nn.Linear(cfg.dim, cfg.hidden, bias=False)
        self.w_down = nn.Linear(cfg.hidden, cfg.dim, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, attend: Attend) -> torch.Tensor:
        batch, steps, _ = x.shape
        cfg = self.cfg
        h = self.attn_norm(x)
        q = self.wq(h).view(batch, steps, cfg.heads, cfg.head_dim).transpose(1, 2)
        k = self.wk(h).view(batch, steps, cfg.kv_heads, cfg.head_dim).transpose(1, 2)
        v = self.wv(h).view(batch, steps, cfg.kv_heads, cfg.head_dim).transpose(1, 2)
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        out = attend(self.index, q, k, v).transpose(1, 2).reshape(batch, steps, -1)
        x = x + self.wo(out)
        h = self.mlp_norm(x)
        return x + self.w_down(F.silu(self.w_gate(h)) * self.w_up(h))


class Llama(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.dim)
        self.blocks = nn.ModuleList(Block(cfg, i) for i in range(cfg.layers))
        self.norm = RMSNorm(cfg.dim)
        self.head = nn.Linear(cfg.dim, cfg.vocab_size, bias=False)
        inv_freq = 1.0 / cfg.rope_theta ** (torch.arange(0, cfg.head_dim, 2).float() / cfg.head_dim)
        angles = torch.outer(torch.arange(cfg.max_positions).float(), inv_freq)
        self.register_buffer("cos", angles.cos(), persistent=False)
        self.register_buffer("sin", angles.sin(), persistent=False)

    def forward(self, tokens: torch.Tensor, positions: torch.Tensor, attend: Attend) -> torch.Tensor:
        """Logits [B, T, vocab] for tokens [B, T] at positions [B, T]."""
        cos, sin = self.cos[positions].unsqueeze(1), self.sin[positions].unsqueeze(1)  # [B, 1, T, hd/2]
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x, cos, sin, attend)
        return self.head(self.norm(x))
