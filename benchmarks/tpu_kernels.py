"""The Pallas kernels against XLA's own way of doing the same work, on the chip, in one process.

    python benchmarks/tpu_kernels.py [--iters 20] [--json OUT]

- flash attention forward+backward (torch_tpu.kernels.flash) against XLA attention (the one-op
  einsum/softmax attention the CPU client uses, differentiated by jax) at a GPT-2 shape and a
  grouped-query Llama shape, bf16, causal;
- gmm and tgmm against jax.lax.ragged_dot (XLA's grouped matmul) and its gradient;
- paged attention against attention over the gathered pages.
Each row checks the kernel's result against XLA's (max abs difference) and times both (median
of `iters` calls after a warmup call). Runs anywhere; on the CPU client the kernels interpret.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

import torch_tpu  # noqa: F401  (jax_enable_x64, as torch_tpu runs the kernels)
from torch_tpu.kernels import attention_math, flash, grouped_matmul, paged


def _time(fn: Callable, args, iters: int) -> tuple[float, object]:
    out = jax.block_until_ready(fn(*args))
    times = []
    for _ in range(iters):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3, out


def _max_diff(a, b) -> float:
    leaves = zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b))
    return max(float(jnp.max(jnp.abs(x.astype(jnp.float32) - y.astype(jnp.float32)))) for x, y in leaves)


def _normal(key, shape, dtype):
    return jax.random.normal(key, shape, jnp.float32).astype(dtype)


def attention_rows(iters: int) -> list[dict]:
    rows = []
    for name, (b, h, hk, length, d) in {
        "GPT-2 (4x12 heads, 1024, d64)": (4, 12, 12, 1024, 64),
        "Llama GQA (2x32/8 heads, 2048, d128)": (2, 32, 8, 2048, 128),
    }.items():
        keys = jax.random.split(jax.random.key(0), 4)
        q = _normal(keys[0], (b, h, length, d), jnp.bfloat16)
        k = _normal(keys[1], (b, hk, length, d), jnp.bfloat16)
        v = _normal(keys[2], (b, hk, length, d), jnp.bfloat16)
        do = _normal(keys[3], (b, h, length, d), jnp.bfloat16)
        scale = float(1 / np.sqrt(d))

        def kernel(q, k, v, do, scale=scale):
            out, lse = flash.flash_attention_forward(q, k, v, True, scale)
            return out, flash.flash_attention_backward(do, q, k, v, out, lse, True, scale)

        def xla(q, k, v, do, scale=scale):
            out, lse = attention_math.attention_forward(q, k, v, True, scale)
            return out, attention_math.attention_backward(do, q, k, v, out, lse, True, scale)

        kernel_ms, kernel_out = _time(jax.jit(kernel), (q, k, v, do), iters)
        xla_ms, xla_out = _time(jax.jit(xla), (q, k, v, do), iters)
        flops = 4 * b * h * length * length * d * 0.5 * 3.5  # causal: half; fwd 2 matmuls, bwd 5
        rows.append(
            {
                "kernel": f"flash fwd+bwd, {name}, bf16 causal",
                "kernel_ms": kernel_ms,
                "xla_ms": xla_ms,
                "speedup": xla_ms / kernel_ms,
                "kernel_tflops": flops / kernel_ms / 1e9,
                "max_abs_diff": _max_diff(kernel_out, xla_out),
            }
        )
    return rows


def gmm_rows(iters: int) -> list[dict]:
    m, k, n, groups = 8192, 1024, 2048, 8
    keys = jax.random.split(jax.random.key(1), 3)
    lhs = _normal(keys[0], (m, k), jnp.bfloat16)
    rhs = _normal(keys[1], (groups, k, n), jnp.bfloat16)
    grad = _normal(keys[2], (m, n), jnp.bfloat16)
    sizes = jnp.asarray(np.random.RandomState(0).multinomial(m, [1 / groups] * groups), jnp.int32)

    def xla_gmm(lhs, rhs, sizes):
        return jax.lax.ragged_dot(lhs, rhs, sizes, preferred_element_type=jnp.float32).astype(lhs.dtype)

    def xla_tgmm(lhs, grad, sizes):
        _, vjp = jax.vjp(lambda r: xla_gmm(lhs, r, sizes), rhs)
        return vjp(grad)[0]

    rows = []
    for name, kernel, xla, args in [
        ("gmm", grouped_matmul.gmm_jax, xla_gmm, (lhs, rhs, sizes)),
        ("tgmm", grouped_matmul.tgmm_jax, xla_tgmm, (lhs, grad, sizes)),
    ]:
        kernel_ms, kernel_out = _time(jax.jit(kernel), args, iters)
        xla_ms, xla_out = _time(jax.jit(xla), args, iters)
        rows.append(
            {
                "kernel": f"{name} m={m} k={k} n={n} groups={groups}, bf16",
                "kernel_ms": kernel_ms,
                "xla_ms": xla_ms,
                "speedup": xla_ms / kernel_ms,
                "kernel_tflops": 2 * m * k * n / kernel_ms / 1e9,
                "max_abs_diff": _max_diff(kernel_out, xla_out),
            }
        )
    return rows


def paged_rows(iters: int) -> list[dict]:
    batch, heads, kv_heads, d, page_size, pages_per_seq, total = 8, 32, 8, 128, 64, 32, 512
    keys = jax.random.split(jax.random.key(2), 3)
    q = _normal(keys[0], (batch, heads, d), jnp.bfloat16)
    k_pages = _normal(keys[1], (kv_heads, total, page_size, d), jnp.bfloat16)
    v_pages = _normal(keys[2], (kv_heads, total, page_size, d), jnp.bfloat16)
    rng = np.random.RandomState(0)
    lengths = jnp.asarray(rng.randint(1, pages_per_seq * page_size, batch), jnp.int32)
    pages = jnp.asarray(rng.permutation(total)[: batch * pages_per_seq].reshape(batch, pages_per_seq), jnp.int32)
    scale = float(1 / np.sqrt(d))

    def gathered(q, k_pages, v_pages, lengths, pages):
        k = k_pages[:, pages].reshape(kv_heads, batch, -1, d).transpose(1, 0, 2, 3)
        v = v_pages[:, pages].reshape(kv_heads, batch, -1, d).transpose(1, 0, 2, 3)
        qg = q.reshape(batch, kv_heads, heads // kv_heads, d)
        s = jnp.einsum("bhgd,bhsd->bhgs", qg, k, preferred_element_type=jnp.float32) * scale
        s = jnp.where(jnp.arange(s.shape[-1]) < lengths[:, None, None, None], s, -jnp.inf)
        p = jax.nn.softmax(s, axis=-1)
        return jnp.einsum("bhgs,bhsd->bhgd", p.astype(v.dtype), v).reshape(batch, heads, d)

    args = (q, k_pages, v_pages, lengths, pages)
    kernel_ms, kernel_out = _time(jax.jit(lambda *a: paged.paged_attention_jax(*a, sm_scale=scale)), args, iters)
    xla_ms, xla_out = _time(jax.jit(gathered), args, iters)
    return [
        {
            "kernel": f"paged attention, {batch} seqs x {heads}/{kv_heads} heads, pages of {page_size}, bf16",
            "kernel_ms": kernel_ms,
            "xla_ms": xla_ms,
            "speedup": xla_ms / kernel_ms,
            "kernel_tflops": None,
            "max_abs_diff": _max_diff(kernel_out, xla_out),
        }
    ]


def table(rows: list[dict]) -> str:
    lines = [
        "| kernel | kernel ms | XLA ms | XLA / kernel | kernel TFLOP/s | max abs diff |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        tflops = f"{r['kernel_tflops']:.1f}" if r["kernel_tflops"] else "-"
        lines.append(
            f"| {r['kernel']} | {r['kernel_ms']:.3f} | {r['xla_ms']:.3f} | {r['speedup']:.2f}x | {tflops} | "
            f"{r['max_abs_diff']:.2e} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    print(f"jax {jax.__version__} on {jax.devices()[0].device_kind}")
    rows = []
    for part in (attention_rows, gmm_rows, paged_rows):
        try:
            rows += part(args.iters)
        except Exception as e:  # a kernel that fails is a finding: report it, go on
            rows.append(
                {
                    "kernel": f"{part.__name__}: FAILED {type(e).__name__}: {str(e).splitlines()[0][:200]}",
                    "kernel_ms": float("nan"),
                    "xla_ms": float("nan"),
                    "speedup": float("nan"),
                    "kernel_tflops": None,
                    "max_abs_diff": float("nan"),
                }
            )
    print(table(rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
