"""Peak device memory of a compiled minGPT AdamW step, without and with buffer donation.

    python benchmarks/compile_memory.py [--layers 2] [--d 64] [--seq 64] [--batch 8] [--steps 3]

The ideal is what a step must hold at once: parameters, gradients, AdamW state
(measured after one CPU step) and the activations autograd saves (measured on CPU
with saved-tensor hooks, one count per storage). For each donation setting the
compiled step runs twice to compile, then `torch.tpu.max_memory_allocated` is taken
over the timed steps; where the PJRT client reports it (TPU, GPU) its own
`peak_bytes_in_use` is printed too, which is where donation shows: without it, XLA
holds the old and the new parameters and optimizer state during the call.
"""

from __future__ import annotations

import argparse
import copy
import pathlib
import sys

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "examples" / "mingpt"))
from model import GPT, GPTConfig


def _nbytes(tensors) -> int:
    seen, total = set(), 0
    for t in tensors:
        if not isinstance(t, torch.Tensor) or t.device.type == "meta":
            continue
        key = (t.untyped_storage().data_ptr(), t.device.type)
        if key not in seen:
            seen.add(key)
            total += t.untyped_storage().nbytes()
    return total


def _batch(args, device):
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 128, (args.batch, args.seq), generator=g)
    y = torch.randint(0, 128, (args.batch, args.seq), generator=g)
    return x.to(device), y.to(device)


def _ideal_bytes(model: GPT, args) -> dict[str, int]:
    model = copy.deepcopy(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    saved: list[torch.Tensor] = []
    x, y = _batch(args, "cpu")
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        _, loss = model(x, y)
    loss.backward()
    opt.step()
    params = list(model.parameters())
    param_ids = {p.untyped_storage().data_ptr() for p in params}
    activations = [t for t in saved if t.untyped_storage().data_ptr() not in param_ids]
    state = [v for s in opt.state.values() for v in s.values() if isinstance(v, torch.Tensor)]
    return {
        "params": _nbytes(params),
        "grads": _nbytes(p.grad for p in params),
        "optimizer state": _nbytes(state),
        "activations": _nbytes(activations),
    }


def _compiled_peak(model: GPT, args, donate: bool) -> tuple[int, int | None]:
    import torch_tpu

    torch._dynamo.reset()
    model = copy.deepcopy(model).to("tpu")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

    @torch.compile(backend="tpu", options={"donate_buffers": donate})
    def step(x, y):
        _, loss = model(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    x, y = _batch(args, "tpu")
    for _ in range(2):
        step(x, y).item()
    torch.tpu.reset_peak_memory_stats()
    for _ in range(args.steps):
        step(x, y).item()
    runtime = torch_tpu.memory.runtime_stats(0).get("peak_bytes_in_use")
    return torch.tpu.max_memory_allocated(), runtime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--d", type=int, default=64)
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()
    import torch_tpu

    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=128, block_size=args.seq, n_layer=args.layers, n_head=4, n_embd=args.d))
    ideal = _ideal_bytes(model, args)
    total = sum(ideal.values())
    fmt = torch_tpu.memory.format_bytes
    for name, n in ideal.items():
        print(f"{name:>22s}: {fmt(n)}")
    print(f"{'ideal':>22s}: {fmt(total)}")
    print(f"{'':22s}  {'max_memory_allocated':>22s} {'ratio':>6s} {'PJRT peak':>12s}")
    for label, donate in (("before (no donation)", False), ("after (donation)", True)):
        peak, runtime = _compiled_peak(model, args, donate)
        runtime_text = fmt(runtime) if runtime else "n/a"
        print(f"{label:>22s}: {fmt(peak):>22s} {peak / total:6.2f} {runtime_text:>12s}")
    print(f"donated buffers: {torch_tpu.metrics.counters()['donated_buffers']}")


if __name__ == "__main__":
    main()
