"""DLRM (Naumov et al. 2019): a bottom MLP for dense features, one embedding bag per sparse
feature, pairwise dot-product interaction of all feature vectors, and a top MLP to a click logit.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import torch
from torch import nn


def mlp(sizes: Sequence[int]) -> nn.Sequential:
    layers: list[nn.Module] = []
    for cin, cout in itertools.pairwise(sizes):
        layers += [nn.Linear(cin, cout), nn.ReLU()]
    return nn.Sequential(*layers[:-1])  # no activation on the output


class DLRM(nn.Module):
    def __init__(self, num_dense: int, table_sizes: Sequence[int], dim: int, bottom: Sequence[int], top: Sequence[int]):
        super().__init__()
        self.bottom = nn.Sequential(mlp([num_dense, *bottom, dim]), nn.ReLU())
        self.tables = nn.ModuleList(nn.EmbeddingBag(n, dim, mode="sum") for n in table_sizes)
        num_features = 1 + len(table_sizes)
        rows, cols = torch.triu_indices(num_features, num_features, offset=1)
        self.register_buffer("pair_rows", rows, persistent=False)
        self.register_buffer("pair_cols", cols, persistent=False)
        self.top = mlp([dim + rows.numel(), *top, 1])

    def interact(self, features: torch.Tensor) -> torch.Tensor:
        """(B, F, D) feature vectors -> (B, F*(F-1)/2) dot products of each distinct pair."""
        dots = torch.bmm(features, features.transpose(1, 2))
        return dots[:, self.pair_rows, self.pair_cols]

    def forward(self, dense: torch.Tensor, indices: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        """dense (B, num_dense); indices[t] and offsets[t] are table t's flat bag indices and bag starts.

        Returns click logits (B,)."""
        x = self.bottom(dense)
        bags = [table(indices[t], offsets[t]) for t, table in enumerate(self.tables)]
        features = torch.stack([x, *bags], dim=1)
        return self.top(torch.cat([x, self.interact(features)], dim=1)).squeeze(1)
