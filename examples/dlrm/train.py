"""Train a small DLRM click-through-rate model on synthetic click logs on tpu, then predict CTRs
for held-out impressions.

python examples/dlrm/train.py --steps 20 [--compile] [--check] [--device cpu]
"""

from __future__ import annotations

import pathlib
import sys

import torch
from torch import nn
from torch.nn import functional as F

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))  # examples/common
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))  # model.py
from common import harness
from model import DLRM

NUM_DENSE, TABLE_SIZES, DIM = 4, (50, 40, 30), 8
BATCH, HOT = 32, 3  # each table gets BATCH * HOT indices per batch, in bags of 1 to 5
_truth = torch.Generator().manual_seed(4321)
# The hidden click model: a linear score of the dense features plus one weight per sparse id.
DENSE_WEIGHTS = torch.randn(NUM_DENSE, generator=_truth)
ID_WEIGHTS = [torch.randn(n, generator=_truth) for n in TABLE_SIZES]


def impressions(batch_size: int, g: torch.Generator) -> harness.Batch:
    """(dense, indices, offsets, clicked): bags of varying length, with a fixed total per table so
    that every batch has the same shapes."""
    dense = torch.randn(batch_size, NUM_DENSE, generator=g)
    total = batch_size * HOT
    indices, offsets = [], []
    score = dense @ DENSE_WEIGHTS
    for n, weights in zip(TABLE_SIZES, ID_WEIGHTS):
        cuts = torch.randperm(total - 1, generator=g)[: batch_size - 1].sort().values + 1
        starts = torch.cat([torch.zeros(1, dtype=torch.long), cuts])
        idx = torch.randint(0, n, (total,), generator=g)
        lengths = torch.diff(starts, append=torch.tensor([total]))
        bag_of = torch.repeat_interleave(torch.arange(batch_size), lengths)
        score = score + torch.zeros(batch_size).index_add_(0, bag_of, weights[idx]) / lengths
        indices.append(idx)
        offsets.append(starts)
    clicked = torch.bernoulli(torch.sigmoid(score), generator=g)
    return dense, torch.stack(indices), torch.stack(offsets), clicked


def batches(steps: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        yield impressions(BATCH, g)


def loss(model: nn.Module, batch: harness.Batch) -> torch.Tensor:
    dense, indices, offsets, clicked = batch
    return F.binary_cross_entropy_with_logits(model(dense, indices, offsets), clicked)


@torch.no_grad()
def predict_ctr(model: nn.Module, device: str) -> tuple[str, torch.Tensor]:
    dense, indices, offsets, clicked = impressions(256, torch.Generator().manual_seed(99))
    ctr = torch.sigmoid(model(dense.to(device), indices.to(device), offsets.to(device))).cpu()
    accuracy = ((ctr > 0.5).float() == clicked).float().mean().item()
    return (
        f"mean predicted CTR {ctr.mean().item():.3f} vs observed {clicked.mean().item():.3f}, "
        f"click accuracy {accuracy:.1%} on 256 held-out impressions"
    ), ctr


EXAMPLE = harness.Example(
    name="DLRM",
    make_model=lambda: DLRM(NUM_DENSE, TABLE_SIZES, DIM, bottom=(16,), top=(16,)),
    batches=batches,
    loss=loss,
    infer=predict_ctr,
    make_optimizer=lambda m: torch.optim.Adagrad(m.parameters(), lr=0.05),
)

if __name__ == "__main__":
    sys.exit(harness.main(EXAMPLE))
