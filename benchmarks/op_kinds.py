"""Eager per-op cost of torch_tpu against jax.jit of the same work, in ONE process.

    python benchmarks/op_kinds.py [--rounds 5] [--calls 200] [--cases add,mul_scalar,...] [--json OUT]

For TPU, where one process holds the chip (so eager_dispatch.py's worker processes cannot all
run): every op kind (two tensors, a Python scalar that changes every call, in place, a strided
view, matmul, autocast linear, activations, reductions, gathers, cat) runs as torch_tpu eager ops
and as the same function under jax.jit, on arrays of the same shapes. A sample is `calls`
back-to-back calls then one wait for the last result; torch_tpu and jax samples alternate in a
shuffled order, round after round, and the table shows the median µs per call, the host's share
(time to issue the calls, before the wait), and torch_tpu / jax.jit. Target (issue 33): every
kind <= 1.2x.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp
import torch
import torch.nn.functional as F

import torch_tpu
from torch_tpu.runtime import compile_queue

BF16 = torch.bfloat16


def _cases() -> dict[str, tuple[Callable[[], Callable[[int], torch.Tensor]], Callable[[], Callable[[int], jax.Array]]]]:
    """name -> (torch builder, jax builder); a builder makes its inputs and returns `call(i)`."""

    def rand(*shape, dtype=torch.float32):
        g = torch.Generator().manual_seed(len(shape) * 31 + shape[0])
        return torch.randn(*shape, generator=g).to(dtype)

    def both(make_inputs, torch_fn, jax_fn, scalar=False, in_place=False):
        """`jax_fn` takes the inputs (then the call's Python scalar, if `scalar`); `in_place`: its
        result replaces the first input, which it donates (as add_ writes self)."""

        def torch_builder():
            xs = [x.to("tpu") for x in make_inputs()]
            return lambda i: torch_fn(i, *xs)

        def jax_builder():
            xs = [jnp.asarray(x.float().numpy()).astype(_jax_dtype(x.dtype)) for x in make_inputs()]
            f = jax.jit(jax_fn, donate_argnums=(0,) if in_place else ())

            def call(i):
                out = f(*xs, 1.0 + i * 1e-3) if scalar else f(*xs)
                if in_place:
                    xs[0] = out
                return out

            return call

        return torch_builder, jax_builder

    def ab(n=1024):
        return lambda: [rand(n, n), rand(n, n)]

    cases = {
        "add": both(ab(), lambda i, a, b: a + b, lambda a, b: a + b),
        "mul_scalar": both(
            lambda: [rand(1024, 1024)], lambda i, a: a * (1.0 + i * 1e-3), lambda a, s: a * s, scalar=True
        ),
        "add_inplace": both(ab(), lambda i, a, b: a.add_(b, alpha=1e-3), lambda a, b: a + 1e-3 * b, in_place=True),
        "view_add": both(lambda: [rand(1024, 1024)], lambda i, a: a[:, 1:] + 1.0, lambda a: a[:, 1:] + 1.0),
        "matmul_bf16": both(
            lambda: [rand(2048, 2048, dtype=BF16), rand(2048, 2048, dtype=BF16)],
            lambda i, a, b: a @ b,
            lambda a, b: a @ b,
        ),
        "linear_autocast": both(
            lambda: [rand(4, 1024, 768), rand(3072, 768), rand(3072)],
            _autocast_linear,
            lambda x, w, b: x.astype(jnp.bfloat16) @ w.astype(jnp.bfloat16).T + b.astype(jnp.bfloat16),
        ),
        "gelu_bf16": both(
            lambda: [rand(4, 1024, 3072, dtype=BF16)],
            lambda i, x: F.gelu(x),
            lambda x: jax.nn.gelu(x, approximate=False),
        ),
        "softmax": both(lambda: [rand(4096, 1024)], lambda i, x: x.softmax(-1), lambda x: jax.nn.softmax(x, -1)),
        "layer_norm": both(
            lambda: [rand(4, 1024, 768), rand(768), rand(768)],
            lambda i, x, w, b: F.layer_norm(x, (768,), w, b),
            _jax_layer_norm,
        ),
        # the same layer norm in jax returning its mean and rstd too, as aten's native_layer_norm
        # does: how much of layer_norm's gap is the two extra outputs
        "layer_norm_3_outputs": both(
            lambda: [rand(4, 1024, 768), rand(768), rand(768)],
            lambda i, x, w, b: F.layer_norm(x, (768,), w, b),
            _jax_layer_norm_3_outputs,
        ),
        "sum_dim": both(lambda: [rand(4096, 1024)], lambda i, x: x.sum(-1), lambda x: x.sum(-1)),
        "embedding": both(
            lambda: [torch.randint(0, 50304, (4, 1024)), rand(50304, 768)],
            lambda i, idx, w: F.embedding(idx, w),
            lambda idx, w: w[idx],
        ),
        "cat": both(ab(512), lambda i, a, b: torch.cat([a, b]), lambda a, b: jnp.concatenate([a, b])),
    }
    return cases


def _autocast_linear(i, x, w, b):
    with torch.autocast("tpu", dtype=torch.bfloat16):
        return F.linear(x, w, b)


def _jax_layer_norm(x, w, b):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) * jax.lax.rsqrt(var + 1e-5) * w + b


def _jax_layer_norm_3_outputs(x, w, b):
    mean = x.mean(-1, keepdims=True)
    rstd = jax.lax.rsqrt(((x - mean) ** 2).mean(-1, keepdims=True) + 1e-5)
    return (x - mean) * rstd * w + b, mean, rstd


def _jax_dtype(dtype: torch.dtype):
    return {torch.float32: jnp.float32, torch.bfloat16: jnp.bfloat16, torch.int64: jnp.int32}[dtype]


def _sample(
    call: Callable[[int], object], calls: int, wait: Callable[[object], None], start_i: int
) -> tuple[float, float]:
    """(µs per call, µs per call to issue them) for `calls` back-to-back calls and one wait."""
    start = time.perf_counter()
    out = None
    for i in range(calls):
        out = call(start_i + i)
    issued = time.perf_counter()
    wait(out)
    end = time.perf_counter()
    return (end - start) / calls * 1e6, (issued - start) / calls * 1e6


def _wait_torch(out) -> None:
    torch_tpu.sync()


def _wait_jax(out) -> None:
    jax.block_until_ready(out)


def measure(names: list[str], rounds: int, calls: int) -> dict[str, dict[str, float]]:
    cases = _cases()
    runners = {}
    for name in names:
        torch_builder, jax_builder = cases[name]
        runners[(name, "torch_tpu")] = (torch_builder(), _wait_torch)
        runners[(name, "jax.jit")] = (jax_builder(), _wait_jax)
    for call, wait in runners.values():  # warm up: compiles, caches
        _sample(call, 3, wait, 0)
    compile_queue.wait_idle()  # heavy ops run their default-effort executables (ops/op_tier_up.py)
    samples: dict = {key: [] for key in runners}
    counter = 10
    for _ in range(rounds):
        order = list(runners)
        random.shuffle(order)
        for key in order:
            call, wait = runners[key]
            samples[key].append(_sample(call, calls, wait, counter))
            counter += calls
    results = {}
    for name in names:
        tpu, jx = samples[(name, "torch_tpu")], samples[(name, "jax.jit")]
        results[name] = {
            "torch_tpu_us": statistics.median(s[0] for s in tpu),
            "torch_tpu_issue_us": statistics.median(s[1] for s in tpu),
            "jax_us": statistics.median(s[0] for s in jx),
            "jax_issue_us": statistics.median(s[1] for s in jx),
        }
        results[name]["ratio"] = results[name]["torch_tpu_us"] / results[name]["jax_us"]
    return results


def profile(names: list[str], calls: int, top: int) -> str:
    """cProfile's `top` functions by own time over `calls` torch_tpu calls of each case (after a
    warm-up), with executions per call: where the host's issue time goes beyond jax's."""
    import cProfile
    import io
    import pstats

    cases, report = _cases(), []
    for name in names:
        call = cases[name][0]()
        _sample(call, 3, _wait_torch, 0)
        torch_tpu.metrics.reset()
        profiler = cProfile.Profile()
        profiler.enable()
        for i in range(calls):
            call(i)
        profiler.disable()
        _wait_torch(None)
        counts = {k: v / calls for k, v in torch_tpu.metrics.counters().items() if isinstance(v, int) and v}
        text = io.StringIO()
        pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(top)
        report.append(f"## {name}: per call {counts}\n{text.getvalue()}")
    return "\n".join(report)


def table(results: dict) -> str:
    lines = [
        "| op kind | torch_tpu µs/call | issue µs | jax.jit µs/call | issue µs | torch_tpu / jax.jit |",
        "|---|---|---|---|---|---|",
    ]
    for name, r in results.items():
        lines.append(
            f"| {name} | {r['torch_tpu_us']:.1f} | {r['torch_tpu_issue_us']:.1f} | {r['jax_us']:.1f} | "
            f"{r['jax_issue_us']:.1f} | {r['ratio']:.2f}x |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--cases", default=",".join(_cases()))
    parser.add_argument("--json")
    parser.add_argument("--profile", type=int, default=0, metavar="N", help="then cProfile's top N per case")
    args = parser.parse_args(argv)
    names = [c for c in args.cases.split(",") if c]
    unknown = set(names) - set(_cases())
    if unknown:
        parser.error(f"unknown cases {sorted(unknown)}")
    device = jax.devices()[0].device_kind
    print(f"torch_tpu on {torch_tpu.platform()} ({device}), jax {jax.__version__}, torch {torch.__version__}")
    results = measure(names, args.rounds, args.calls)
    print(table(results))
    worst = max(r["ratio"] for r in results.values())
    print(f"worst torch_tpu / jax.jit: {worst:.2f}x (target <= 1.2x)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    if args.profile:
        print(profile(names, args.calls, args.profile))
    return 0


if __name__ == "__main__":
    sys.exit(main())
