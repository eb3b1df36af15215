"""The loop every example runs: train on a device with a progress bar, run inference, and with
--check repeat the run on CPU and compare.

An example describes itself as an `Example` (how to build the model, its batches, its loss and its
inference) and calls `main(example)`. Batches and the initial weights are made on CPU from fixed
seeds, so the tpu run and the CPU reference see exactly the same numbers.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
from collections.abc import Callable, Iterator, Sequence

import torch
from torch import nn
from tqdm import tqdm

Batch = tuple[torch.Tensor, ...]


@dataclasses.dataclass
class Example:
    """What `train` and `main` need to know about one example."""

    name: str
    # A freshly initialised model on CPU (called right after torch.manual_seed(seed)).
    make_model: Callable[[], nn.Module]
    # `steps` training batches on CPU, the same ones for the same seed.
    batches: Callable[[int, int], Iterator[Batch]]
    # The scalar training loss of `model` on a batch already on the model's device.
    loss: Callable[[nn.Module, Batch], torch.Tensor]
    # Runs inference with the trained model on `device`: (a line to print, a tensor to compare with CPU).
    infer: Callable[[nn.Module, str], tuple[str, torch.Tensor]]
    make_optimizer: Callable[[nn.Module], torch.optim.Optimizer] = lambda m: torch.optim.AdamW(m.parameters(), lr=3e-3)
    default_steps: int = 20


@dataclasses.dataclass
class Run:
    model: nn.Module
    losses: list[float]


def compile_backend(device: str) -> str:
    return "tpu" if device.startswith("tpu") else "inductor"


def to_device(batch: Batch, device: str) -> Batch:
    return tuple(x.to(device) for x in batch)


def train(
    example: Example, device: str, steps: int, seed: int = 0, compile: bool = False, progress: bool = False
) -> Run:
    """Trains a fresh model for `steps` steps on `device`; returns it with the loss of every step."""
    torch.manual_seed(seed)
    model = example.make_model().to(device)
    model.train()
    optimizer = example.make_optimizer(model)

    def step_loss(*batch: torch.Tensor) -> torch.Tensor:
        return example.loss(model, batch)

    if compile:
        step_loss = torch.compile(step_loss, backend=compile_backend(device))
    losses: list[float] = []
    bar = tqdm(total=steps, desc=f"{example.name} on {device}", disable=not progress, file=sys.stdout)
    if progress and device != "cpu":
        bar.set_postfix_str("compiling…")  # the first step traces and compiles every op: not a hang
    for i, batch in enumerate(example.batches(steps, seed)):
        loss = step_loss(*to_device(batch, device))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        if progress:
            tqdm.write(f"step {i:3d}  loss {losses[-1]:.5f}", file=sys.stdout)
            bar.set_postfix(loss=f"{losses[-1]:.4f}")
            bar.update()
    bar.close()
    model.eval()
    return Run(model, losses)


def worst_relative_error(values: Sequence[float], reference: Sequence[float]) -> float:
    """max |a - b| / max(|b|, 1e-3) over the pairs: losses near zero compare absolutely."""
    return max((abs(a - b) / max(abs(b), 1e-3) for a, b in zip(values, reference, strict=True)), default=0.0)


def outputs_match(output: torch.Tensor, reference: torch.Tensor, rtol: float) -> bool:
    output = output.cpu()
    if output.shape != reference.shape or output.dtype != reference.dtype:
        return False
    if not output.is_floating_point():
        return torch.equal(output, reference)
    return torch.allclose(output, reference, rtol=rtol, atol=rtol)


def parse_args(example: Example, argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=f"Train the {example.name} example and run inference.")
    parser.add_argument("--steps", type=int, default=example.default_steps)
    parser.add_argument("--device", default="tpu")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--compile", action="store_true", help="torch.compile the training step (backend 'tpu')")
    parser.add_argument("--check", action="store_true", help="compare the losses with the same run on CPU")
    parser.add_argument("--rtol", type=float, default=1e-4, help="relative tolerance of --check")
    parser.add_argument("--no-fallbacks", action="store_true", help="fail if any op ran through the CPU fallback")
    parser.add_argument("--quiet", action="store_true", help="no progress bar or per-step losses")
    return parser.parse_args(argv)


def main(example: Example, argv: list[str] | None = None) -> int:
    """Command line entry point of an example; returns the exit status."""
    args = parse_args(example, argv)
    on_tpu = args.device.startswith("tpu")
    if on_tpu:
        import torch_tpu

        print(f"torch_tpu platform: {torch_tpu.platform()}")
        torch_tpu.metrics.reset()
    run = train(example, args.device, args.steps, args.seed, compile=args.compile, progress=not args.quiet)
    summary, output = example.infer(run.model, args.device)
    print(f"losses: first {run.losses[0]:.5f}  last {run.losses[-1]:.5f}")
    print(f"inference: {summary}")
    status = 0
    if on_tpu:
        print(torch_tpu.metrics.report())
        fallbacks = torch_tpu.metrics.counters()["cpu_fallback_ops"]
        if fallbacks and args.no_fallbacks:
            print(f"FAILED: ops ran through the CPU fallback: {fallbacks}")
            status = 1
    if args.check:
        reference = train(example, "cpu", args.steps, args.seed, progress=False)
        _, reference_output = example.infer(reference.model, "cpu")
        worst = worst_relative_error(run.losses, reference.losses)
        print(f"max relative |loss - cpu loss| = {worst:.2e} over {len(run.losses)} steps (rtol {args.rtol:g})")
        if not math.isfinite(worst) or worst > args.rtol:
            print("CHECK FAILED: losses differ from CPU")
            status = 1
        elif not outputs_match(output, reference_output, args.rtol):
            print("CHECK FAILED: inference differs from CPU")
            status = 1
        else:
            print("check passed: losses and inference match CPU")
    return status
