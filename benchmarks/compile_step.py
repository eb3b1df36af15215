"""Training-step speed of a minGPT-sized model: tpu eager, tpu compiled, torch CPU eager and
inductor, and the same model written in jax under one jax.jit (the XLA limit).

    python benchmarks/compile_step.py [--steps 5] [--warmup 2] [--modes tpu-eager,tpu-compiled,...]

Each mode trains its own copy of one model (6 layers, d=256, seq 128, batch 8, AdamW). After
the warmup steps (compiles), the timed steps run round-robin across modes, so a change in the
machine's load hits every mode alike. Prints one table of median step times and ratios.
"""

from __future__ import annotations

import argparse
import copy
import math
import pathlib
import statistics
import sys
import time
from collections.abc import Callable

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "examples" / "mingpt"))
from model import GPT, GPTConfig

MODES = ("tpu-eager", "tpu-compiled", "cpu-eager", "cpu-inductor", "jax-jit")
LR, BETAS, EPS, WEIGHT_DECAY = 3e-4, (0.9, 0.999), 1e-8, 0.1


def _config(args) -> GPTConfig:
    return GPTConfig(vocab_size=128, block_size=args.seq, n_layer=args.layers, n_head=8, n_embd=args.d)


def _batches(args, n: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    return [
        (
            torch.randint(0, 128, (args.batch, args.seq), generator=g),
            torch.randint(0, 128, (args.batch, args.seq), generator=g),
        )
        for _ in range(n)
    ]


def torch_step(model: GPT, device: str, compile_backend: str | None) -> Callable:
    model = model.to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=LR, betas=BETAS, eps=EPS, weight_decay=WEIGHT_DECAY)

    def step(x, y):
        _, loss = model(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    if compile_backend is not None:
        step = torch.compile(step, backend=compile_backend)

    def run(x, y) -> float:
        return step(x.to(device), y.to(device)).item()  # .item() waits for the step

    return run


# ---- the same model in jax ------------------------------------------------------


def jax_step(model: GPT, cfg: GPTConfig) -> Callable:
    import jax
    import jax.numpy as jnp

    params = {k: jnp.asarray(v.detach().numpy()) for k, v in model.state_dict().items() if not k.endswith("mask")}
    mask = jnp.tril(jnp.ones((cfg.block_size, cfg.block_size), bool))
    n_head = cfg.n_head

    def layer_norm(x, p):
        mean = x.mean(-1, keepdims=True)
        var = ((x - mean) ** 2).mean(-1, keepdims=True)
        return (x - mean) * jax.lax.rsqrt(var + 1e-5) * p["weight"] + p["bias"]

    def linear(x, p, bias=True):
        y = x @ p["weight"].T
        return y + p["bias"] if bias else y

    def sub(p, prefix):
        return {k[len(prefix) + 1 :]: v for k, v in p.items() if k.startswith(prefix + ".")}

    def loss_fn(p, idx, targets):
        b, t = idx.shape
        x = p["tok_emb.weight"][idx] + p["pos_emb.weight"][:t]
        for i in range(cfg.n_layer):
            blk = sub(p, f"blocks.{i}")
            h = layer_norm(x, sub(blk, "ln1"))
            q, k, v = jnp.split(linear(h, sub(blk, "attn.qkv")), 3, axis=2)
            q, k, v = (z.reshape(b, t, n_head, -1).transpose(0, 2, 1, 3) for z in (q, k, v))
            att = (q @ k.transpose(0, 1, 3, 2)) * (1.0 / math.sqrt(k.shape[-1]))
            att = jnp.where(mask[:t, :t], att, -jnp.inf)
            y = jax.nn.softmax(att, axis=-1) @ v
            x = x + linear(y.transpose(0, 2, 1, 3).reshape(b, t, -1), sub(blk, "attn.proj"))
            h = layer_norm(x, sub(blk, "ln2"))
            h = jax.nn.gelu(linear(h, sub(blk, "mlp.0")), approximate=False)
            x = x + linear(h, sub(blk, "mlp.2"))
        logits = linear(layer_norm(x, sub(p, "ln_f")), sub(p, "head"), bias=False)
        logp = jax.nn.log_softmax(logits.reshape(-1, logits.shape[-1]), axis=-1)
        return -jnp.take_along_axis(logp, targets.reshape(-1, 1), axis=1).mean()

    def train_step(p, m, v, count, idx, targets):
        loss, grads = jax.value_and_grad(loss_fn)(p, idx, targets)
        count = count + 1
        b1, b2 = BETAS
        c1, c2 = 1 - b1**count, 1 - b2**count
        new_p, new_m, new_v = {}, {}, {}
        for k in p:
            g = grads[k]
            new_m[k] = b1 * m[k] + (1 - b1) * g
            new_v[k] = b2 * v[k] + (1 - b2) * g * g
            decayed = p[k] * (1 - LR * WEIGHT_DECAY)
            new_p[k] = decayed - LR * (new_m[k] / c1) / (jnp.sqrt(new_v[k] / c2) + EPS)
        return new_p, new_m, new_v, count, loss

    step = jax.jit(train_step, donate_argnums=(0, 1, 2))
    state = [
        params,
        {k: jnp.zeros_like(a) for k, a in params.items()},
        {k: jnp.zeros_like(a) for k, a in params.items()},
    ]
    state.append(jnp.zeros((), jnp.float32))

    def run(x, y) -> float:
        p, m, v, count, loss = step(*state, jnp.asarray(x.numpy()), jnp.asarray(y.numpy()))
        state[:] = [p, m, v, count]
        return float(loss)

    return run


# ---- measuring --------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=5, help="timed steps per mode")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps per mode (compiles)")
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--d", type=int, default=256)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--batch", type=int, default=8)
    args = parser.parse_args(argv)
    modes = [m for m in args.modes.split(",") if m]
    unknown = set(modes) - set(MODES)
    if unknown:
        parser.error(f"unknown modes {sorted(unknown)}; choose from {', '.join(MODES)}")

    if any(m.startswith("tpu") for m in modes) or "jax-jit" in modes:
        import torch_tpu

        print(f"torch_tpu platform: {torch_tpu.platform()}")
    cfg = _config(args)
    torch.manual_seed(0)
    base = GPT(cfg)
    builders = {
        "tpu-eager": lambda: torch_step(copy.deepcopy(base), "tpu", None),
        "tpu-compiled": lambda: torch_step(copy.deepcopy(base), "tpu", "tpu"),
        "cpu-eager": lambda: torch_step(copy.deepcopy(base), "cpu", None),
        "cpu-inductor": lambda: torch_step(copy.deepcopy(base), "cpu", "inductor"),
        "jax-jit": lambda: jax_step(copy.deepcopy(base), cfg),
    }
    batches = _batches(args, args.warmup + args.steps)
    runners, losses, times = {}, {m: [] for m in modes}, {m: [] for m in modes}
    for mode in modes:
        start = time.perf_counter()
        runners[mode] = builders[mode]()
        for x, y in batches[: args.warmup]:
            losses[mode].append(runners[mode](x, y))
        print(f"{mode:13s} warmup {time.perf_counter() - start:7.1f} s", flush=True)
    for x, y in batches[args.warmup :]:
        for mode in modes:
            start = time.perf_counter()
            losses[mode].append(runners[mode](x, y))
            times[mode].append(time.perf_counter() - start)

    medians = {m: statistics.median(times[m]) for m in modes}
    ref = medians.get("jax-jit")
    eager = medians.get("tpu-eager")
    print()
    print(f"minGPT {args.layers} layers, d={args.d}, seq {args.seq}, batch {args.batch}; median of {args.steps} steps")
    header = f"{'mode':14s} {'step ms':>10s} {'vs jax.jit':>11s} {'vs tpu eager':>13s} {'final loss':>11s}"
    print(header)
    print("-" * len(header))
    for mode in modes:
        ms = medians[mode] * 1e3
        vs_jax = f"{ref / medians[mode]:.2f}x" if ref else "-"
        vs_eager = f"{eager / medians[mode]:.2f}x" if eager else "-"
        print(f"{mode:14s} {ms:10.1f} {vs_jax:>11s} {vs_eager:>13s} {losses[mode][-1]:11.4f}")
    if "tpu-compiled" in modes and ref and eager:
        compiled = medians["tpu-compiled"]
        print()
        print(
            f"tpu compiled: {ref / compiled:.2f}x jax.jit speed (target >= 0.95), "
            f"{eager / compiled:.2f}x tpu eager (target >= 3)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
