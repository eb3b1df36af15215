"""How long XLA compiles one-op executables (eager ops' kind) at an optimization effort, and how
fast they run (jax only; torch_tpu is not imported).

    python benchmarks/op_compile_effort.py [--effort -1] [--memory-effort -1] [--flags "--xla_..."]

Run once per setting, each in its own process (jax reads XLA_FLAGS at its first compile). torch_tpu
compiles eager ops on TPU at effort -1 (platforms/tpu/compile_options.py); this measures why."""

from __future__ import annotations

import argparse
import os
import statistics
import time


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--effort", type=float, default=None, help="exec_time_optimization_effort in [-1, 1]")
    parser.add_argument("--memory-effort", type=float, default=None, help="memory_fitting_effort in [-1, 1]")
    parser.add_argument("--flags", default="", help="appended to XLA_FLAGS")
    parser.add_argument("--repeats", type=int, default=3, help="distinct executables compiled per op kind")
    parser.add_argument("--x64", action="store_true", help="jax_enable_x64, as torch_tpu runs (int64 indices)")
    args = parser.parse_args()
    if args.flags:
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + args.flags).strip()
    import jax
    import jax.numpy as jnp

    options = {}
    if args.effort is not None:
        options["exec_time_optimization_effort"] = args.effort
    if args.memory_effort is not None:
        options["memory_fitting_effort"] = args.memory_effort
    jax.config.update("jax_compilation_cache_dir", None)
    jax.config.update("jax_enable_x64", args.x64)
    key = jax.random.key(0)
    x = jax.random.normal(key, (64, 512))
    image = jax.random.normal(key, (8, 64, 56, 56), jnp.bfloat16)
    big_image = jax.random.normal(key, (128, 64, 56, 56), jnp.bfloat16)  # ~30 GFLOP per conv
    big = jax.random.normal(key, (4096, 4096), jnp.bfloat16)  # ~137 GFLOP per matmul
    kernel = jax.random.normal(key, (64, 64, 3, 3), jnp.bfloat16)

    def conv(a, k):
        return jax.lax.conv_general_dilated(a, k, (1, 1), "SAME")

    def layer_norm(a):
        return (a - a.mean(-1, keepdims=True)) * jax.lax.rsqrt(a.var(-1, keepdims=True) + 1e-5)

    cases = {
        "add": (lambda a: a + 1.5, (x,)),
        "mul_sum": (lambda a: (a * a).sum(-1), (x,)),
        "softmax": (lambda a: jax.nn.softmax(a, -1), (x,)),
        "layer_norm": (layer_norm, (x,)),
        "matmul": (lambda a: a @ a.T, (x,)),
        "conv": (conv, (image, kernel)),
        "conv_weight_grad": (jax.grad(lambda a, k: conv(a, k).astype(jnp.float32).sum(), 1), (image, kernel)),
        # device-bound sizes: the small ones above run in the dispatch's time on a TPU
        "conv_b128": (conv, (big_image, kernel)),
        "conv_b128_weight_grad": (jax.grad(lambda a, k: conv(a, k).astype(jnp.float32).sum(), 1), (big_image, kernel)),
        "matmul_4096_bf16": (lambda a: a @ a, (big,)),
        # data-dependent shapes: torch's nonzero and masked_select compile per result length
        "nonzero_3x4": (lambda a: jnp.stack(jnp.nonzero(a > 0, size=6), 1), (x[:3, :4],)),
        "masked_select_3x4": (lambda a: a.reshape(-1)[jnp.nonzero(a.reshape(-1) > 0, size=6)[0]], (x[:3, :4],)),
    }
    print(f"options {options or 'XLA defaults'}, XLA_FLAGS {args.flags!r}, {jax.devices()[0].device_kind}")
    total = 0.0
    for name, (fn, operands) in cases.items():
        seconds = []
        for salt in range(args.repeats):  # distinct executables of the same kind: no cache hit
            lowered = jax.jit(lambda *v, s=salt, fn=fn: fn(*v) + s * 0).trace(*operands).lower()
            start = time.perf_counter()
            compiled = lowered.compile(compiler_options=options or None)
            seconds.append(time.perf_counter() - start)
        jax.block_until_ready(compiled(*operands))
        start = time.perf_counter()
        for _ in range(20):
            out = compiled(*operands)
        jax.block_until_ready(out)
        run_us = (time.perf_counter() - start) / 20 * 1e6
        total += statistics.median(seconds)
        print(f"{name:22s} compile {statistics.median(seconds) * 1e3:8.1f} ms   run {run_us:8.1f} us", flush=True)
    print(f"sum of median compiles {total:.2f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
