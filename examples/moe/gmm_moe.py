"""A tiny mixture-of-experts layer on the grouped matmul, trained for a few steps on tpu.

Tokens are routed to their top-k experts, sorted by expert, and each SwiGLU expert runs as
one gmm over its contiguous rows (group_sizes = tokens per expert): no padding to a fixed
expert capacity, no per-expert loop.

python examples/moe/gmm_moe.py --steps 5 [--check]

--check also trains the same model on CPU with a per-expert loop and asserts equal losses.
"""

from __future__ import annotations

import argparse

import torch
from torch import nn
from torch.nn import functional as F

import torch_tpu
from torch_tpu.kernels import gmm


class MoE(nn.Module):
    def __init__(self, dim: int = 16, hidden: int = 32, experts: int = 4, top_k: int = 2):
        super().__init__()
        self.experts, self.top_k = experts, top_k
        self.router = nn.Linear(dim, experts, bias=False)
        self.w_gate = nn.Parameter(torch.randn(experts, dim, hidden) / dim**0.5)
        self.w_up = nn.Parameter(torch.randn(experts, dim, hidden) / dim**0.5)
        self.w_down = nn.Parameter(torch.randn(experts, hidden, dim) / hidden**0.5)

    def route(self, x: torch.Tensor):
        """(expert, weight) per token and choice [tokens, top_k], the weights softmaxed over the chosen."""
        weights, chosen = self.router(x).topk(self.top_k, dim=-1)
        return chosen, weights.softmax(dim=-1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        chosen, weights = self.route(x)
        flat = chosen.reshape(-1)
        order = flat.argsort(stable=True)  # (token, choice) pairs sorted by expert
        tokens = order // self.top_k
        group_sizes = (flat[:, None] == torch.arange(self.experts, device=x.device)).sum(0).to(torch.int32)
        rows = x[tokens]
        hidden = F.silu(gmm(rows, self.w_gate, group_sizes)) * gmm(rows, self.w_up, group_sizes)
        y = gmm(hidden, self.w_down, group_sizes) * weights.reshape(-1)[order][:, None]
        return torch.zeros_like(x).index_add(0, tokens, y)

    def forward_reference(self, x: torch.Tensor) -> torch.Tensor:
        """The same layer with a loop over experts (plain matmuls)."""
        chosen, weights = self.route(x)
        out = torch.zeros_like(x)
        for e in range(self.experts):
            token, slot = (chosen == e).nonzero(as_tuple=True)
            h = F.silu(x[token] @ self.w_gate[e]) * (x[token] @ self.w_up[e])
            out = out.index_add(0, token, (h @ self.w_down[e]) * weights[token, slot][:, None])
        return out


def train(device: str, steps: int, reference: bool = False, seed: int = 0, optimizer: str = "adamw") -> list[float]:
    torch.manual_seed(seed)
    model = nn.ModuleDict({"moe": MoE(), "out": nn.Linear(16, 4)}).to(device)
    if optimizer == "adamw":
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    else:
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(seed + 1)
    losses = []
    for _ in range(steps):
        x = torch.randn(24, 16, generator=g)
        y = torch.randint(0, 4, (24,), generator=g)
        x, y = x.to(device), y.to(device)
        h = model["moe"].forward_reference(x) if reference else model["moe"](x)
        loss = F.cross_entropy(model["out"](x + h), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args()
    losses = train("tpu", args.steps)
    print("tpu losses:", [round(v, 5) for v in losses])
    if args.check:
        expected = train("cpu", args.steps, reference=True)
        print("cpu losses:", [round(v, 5) for v in expected])
        torch.testing.assert_close(losses, expected, rtol=1e-4, atol=1e-4)
        print("matches the CPU reference")
    print(torch_tpu.metrics.report())


if __name__ == "__main__":
    main()
