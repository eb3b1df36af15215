"""Train a small character-level GPT on tpu and print the losses.

python examples/mingpt/train.py --steps 20 [--check] [--device cpu]
"""

from __future__ import annotations

import argparse
import codecs
import contextlib
import io
import pathlib
import sys

import torch

with contextlib.redirect_stdout(io.StringIO()):  # importing `this` prints it
    import this  # the Zen of Python: a small corpus that ships with Python

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from model import GPT, GPTConfig


def corpus() -> torch.Tensor:
    text = codecs.decode(this.s, "rot13")
    return torch.tensor([min(ord(ch), 127) for ch in text], dtype=torch.long)


def batches(data: torch.Tensor, steps: int, batch_size: int, block_size: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        starts = torch.randint(0, data.numel() - block_size - 1, (batch_size,), generator=g)
        x = torch.stack([data[s : s + block_size] for s in starts])
        y = torch.stack([data[s + 1 : s + 1 + block_size] for s in starts])
        yield x, y


def train(device: str, steps: int, seed: int = 0, compile: bool = False) -> list[float]:
    torch.manual_seed(seed)
    cfg = GPTConfig()
    model = GPT(cfg).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.1)
    step_fn = model
    if compile:
        step_fn = torch.compile(model, backend="tpu" if device.startswith("tpu") else "inductor")
    losses = []
    for x, y in batches(corpus(), steps, batch_size=8, block_size=cfg.block_size, seed=seed):
        x, y = x.to(device), y.to(device)
        _, loss = step_fn(x, y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--device", default="tpu")
    parser.add_argument("--compile", action="store_true", help="use torch.compile(backend='tpu')")
    parser.add_argument("--check", action="store_true", help="compare the losses with the same run on CPU")
    args = parser.parse_args(argv)

    if args.device.startswith("tpu"):
        import torch_tpu

        print(f"torch_tpu platform: {torch_tpu.platform()}")
    losses = train(args.device, args.steps, compile=args.compile)
    for i, loss in enumerate(losses):
        print(f"step {i:3d}  loss {loss:.4f}")
    if args.check:
        reference = train("cpu", args.steps)
        worst = max(abs(a - b) for a, b in zip(losses, reference))
        print(f"max |loss - cpu loss| = {worst:.2e}")
        if worst > 1e-4:
            print("CHECK FAILED")
            return 1
        print("check passed")
    if args.device.startswith("tpu"):
        import torch_tpu

        print(torch_tpu.metrics.report())
    return 0


if __name__ == "__main__":
    sys.exit(main())
