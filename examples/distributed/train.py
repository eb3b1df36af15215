"""Trains the tiny Llama with data x tensor parallelism over all tpu devices, in one process or many.

    TORCH_TPU_NUM_CPU_DEVICES=8 python examples/distributed/train.py --data 2 --model 4
    TORCH_TPU_NUM_CPU_DEVICES=4 torchrun --nproc-per-node 2 examples/distributed/train.py --data 2 --model 4

Under torchrun (or any launcher that sets WORLD_SIZE > 1), each process joins the others with
torch_tpu.distributed.initialize(), and the mesh spans every process's devices (2 x 4 above):
one SPMD program runs across the processes, each driving its own devices.

Parameters are sharded Megatron-style over the "model" axis and replicated over "data"; each
batch is split over "data". XLA's SPMD partitioner inserts the collectives. With --check, the
same training runs on one device too and the losses must agree.
"""

from __future__ import annotations

import argparse
import copy
import os
import pathlib
import sys

import torch
from torch.nn import functional as F

import torch_tpu
import torch_tpu.distributed as td

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from llama import Llama, LlamaConfig, shard_llama


def batches(cfg: LlamaConfig, steps: int, batch: int, seed: int = 0):
    """`steps` batches cycling over two fixed ones of random tokens (so the loss falls)."""
    g = torch.Generator().manual_seed(seed)
    data = [torch.randint(0, cfg.vocab_size, (batch, cfg.max_seq_len + 1), generator=g) for _ in range(2)]
    for step in range(steps):
        tokens = data[step % 2]
        yield tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()


def train(model: Llama, steps: int, batch: int, mesh: td.Mesh | None) -> list[float]:
    model = model.to("tpu")
    if mesh is not None:
        shard_llama(model, mesh, "model" if mesh.size("model") > 1 else None)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for inputs, targets in batches(model.cfg, steps, batch):
        inputs, targets = inputs.to("tpu"), targets.to("tpu")
        if mesh is not None:
            td.shard_batch(inputs, mesh)
            td.shard_batch(targets, mesh)
        logits = model(inputs)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=int, default=2, help="data-parallel ways")
    parser.add_argument("--model", type=int, default=4, help="tensor-parallel ways")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--check", action="store_true", help="also train on one device and compare")
    args = parser.parse_args()
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        td.initialize()  # before any tpu tensor: the client is recreated over all processes' devices
    torch.manual_seed(0)
    model = Llama(LlamaConfig())
    mesh = td.Mesh((args.data, args.model), ("data", "model"))
    print(f"process {td.process_index()} of {td.process_count()}: {mesh} on {torch_tpu.platform()}")
    losses = train(copy.deepcopy(model) if args.check else model, args.steps, args.batch, mesh)
    for step, loss in enumerate(losses):
        print(f"step {step}: loss {loss:.5f}")
    if args.check:
        single = train(model, args.steps, args.batch, None)
        worst = max(abs(a - b) for a, b in zip(losses, single))
        print(f"largest loss difference from one device: {worst:.2e}")
        if worst > 1e-5:
            sys.exit("sharded training does not match one device")


if __name__ == "__main__":
    main()
