"""Lowers every Pallas kernel for TPU (Mosaic), on any machine, over a grid of shapes and dtypes.

    python -m torch_tpu.kernels.check_lowering [--verbose] [--chip v5e --chip v6e ...]

exits 0 only when every case lowers and no kernel's Mosaic module holds a 64-bit integer.
jax lowers for a platform it does not run on (`lowering_platforms=("tpu",)`), so Mosaic's block
rules (the last two block dims divide by (8, 128) or equal the array's) are checked without a
chip. What only libtpu checks (layouts Mosaic cannot vectorize, VMEM size) needs the TPU lane.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import re
import sys
import time
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp

from torch_tpu.kernels import _pallas, flash, grouped_matmul, paged

_MODULE_MARK = "The Mosaic module for pallas_call"
_I64 = re.compile(r"\bi64\b")
# 64-bit integers that are attributes (grid bounds, block shapes, counts), not kernel values.
_I64_ATTRIBUTES = re.compile(r"array<i64:[^>]*>|\b[a-z_]+ = -?\d+ : i64\b")


@dataclasses.dataclass(frozen=True)
class Case:
    """One kernel call to lower: `fn(*args)` with args given as shapes and dtypes."""

    name: str
    fn: Callable
    args: tuple[jax.ShapeDtypeStruct, ...]


def _s(shape, dtype) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(tuple(shape), jnp.dtype(dtype))


_DTYPES = (jnp.float32, jnp.bfloat16, jnp.float16)


def flash_cases() -> list[Case]:
    cases = []
    # (batch, heads, kv_heads, q_len, kv_len, head_dim, causal): block multiples and not, GQA,
    # decoding (one query row), and head dims that are padded (192) or below a lane row (80).
    shapes = [
        (2, 8, 8, 1024, 1024, 64, True),
        (1, 8, 2, 1000, 1000, 64, True),
        (2, 4, 4, 512, 2048, 128, False),
        (1, 8, 2, 300, 700, 128, True),
        (1, 4, 4, 1, 333, 128, False),
        (1, 4, 1, 640, 640, 256, True),
        (1, 2, 2, 129, 257, 256, False),
        (1, 4, 2, 200, 200, 80, True),
        (1, 2, 2, 256, 256, 192, False),
    ]
    for dtype in _DTYPES:
        for b, h, hk, lq, lk, d, causal in shapes:
            q, k = _s((b, h, lq, d), dtype), _s((b, hk, lk, d), dtype)
            out, lse = _s((b, h, lq, d), dtype), _s((b, h, lq), jnp.float32)
            tag = f"{jnp.dtype(dtype).name} q{(b, h, lq, d)} kv{(b, hk, lk, d)} causal={causal}"

            def fwd(q, k, v, causal=causal):
                return flash.flash_attention_forward(q, k, v, causal, 0.125)

            def bwd(do, q, k, v, o, lse, causal=causal):
                return flash.flash_attention_backward(do, q, k, v, o, lse, causal, 0.125)

            cases.append(Case(f"flash forward {tag}", fwd, (q, k, k)))
            cases.append(Case(f"flash backward {tag}", bwd, (out, q, k, k, out, lse)))
    # Keys padded past a traced length (a bucketed graph's, compile/buckets.py): scalar prefetch.
    for dtype in _DTYPES:
        for b, h, hk, lq, lk, d, causal in [(2, 4, 4, 256, 256, 64, False), (1, 8, 2, 300, 512, 128, True)]:
            q, k, n = _s((b, h, lq, d), dtype), _s((b, hk, lk, d), dtype), _s((), jnp.int32)
            out, lse = _s((b, h, lq, d), dtype), _s((b, h, lq), jnp.float32)
            tag = f"{jnp.dtype(dtype).name} q{(b, h, lq, d)} kv{(b, hk, lk, d)} causal={causal} traced key length"

            def fwd_to(q, k, v, n, causal=causal):
                return flash.flash_attention_forward(q, k, v, causal, 0.125, kv_len=n)

            def bwd_to(do, q, k, v, o, lse, n, causal=causal):
                return flash.flash_attention_backward(do, q, k, v, o, lse, causal, 0.125, kv_len=n)

            cases.append(Case(f"flash forward {tag}", fwd_to, (q, k, k, n)))
            cases.append(Case(f"flash backward {tag}", bwd_to, (out, q, k, k, out, lse, n)))
    return cases


def paged_cases() -> list[Case]:
    cases = []
    # (batch, heads, kv_heads, head_dim, total_pages, page_size, pages_per_sequence)
    shapes = [
        (4, 8, 8, 128, 64, 16, 8),
        (2, 32, 4, 128, 128, 128, 4),
        (3, 8, 2, 64, 32, 32, 6),
        (1, 4, 4, 256, 16, 64, 2),
    ]
    for dtype in _DTYPES:
        for b, h, hk, d, total, size, per in shapes:
            args = (
                _s((b, h, d), dtype),
                _s((hk, total, size, d), dtype),
                _s((hk, total, size, d), dtype),
                _s((b,), jnp.int32),
                _s((b, per), jnp.int32),
            )
            cases.append(
                Case(
                    f"paged {jnp.dtype(dtype).name} q{(b, h, d)} pages{(hk, total, size, d)}",
                    lambda *a: paged.paged_attention_jax(*a, sm_scale=0.1),
                    args,
                )
            )
    return cases


def gmm_cases() -> list[Case]:
    cases = []
    for dtype in _DTYPES:
        for m, k, n, groups in [(2048, 1024, 2048, 8), (300, 100, 200, 3), (4096, 768, 3072, 16)]:
            sizes = _s((groups,), jnp.int32)
            tag = f"{jnp.dtype(dtype).name} m={m} k={k} n={n} groups={groups}"
            cases.append(
                Case(f"gmm {tag}", grouped_matmul.gmm_jax, (_s((m, k), dtype), _s((groups, k, n), dtype), sizes))
            )
            cases.append(Case(f"tgmm {tag}", grouped_matmul.tgmm_jax, (_s((m, k), dtype), _s((m, n), dtype), sizes)))
    return cases


def all_cases() -> list[Case]:
    return flash_cases() + paged_cases() + gmm_cases()


# Chips by jax's device kind; Mosaic's lowering asks the chip for a few rules (its generation).
CHIPS = {"v5e": "TPU v5 lite", "v6e": "TPU v6 lite", "v5p": "TPU v5", "v4": "TPU v4"}


def _on_chip(chip: str) -> jax.sharding.use_abstract_mesh:
    device = jax.sharding.AbstractDevice(device_kind=CHIPS[chip], num_cores=1, platform="tpu")
    mesh = jax.sharding.AbstractMesh((1,), ("x",), (jax.sharding.AxisType.Explicit,), abstract_device=device)
    return jax.sharding.use_abstract_mesh(mesh)


def mosaic_modules(case: Case, chip: str = "v5e") -> list[str]:
    """Lowers `case` for a TPU `chip` (a CHIPS key) and returns the Mosaic modules of its kernels
    (raises what the lowering raises)."""
    printed = io.StringIO()
    with _on_chip(chip), _pallas.lowering_for_tpu(print_modules=True), contextlib.redirect_stdout(printed):
        jax.jit(case.fn).trace(*case.args).lower(lowering_platforms=("tpu",))
    return [part.split("The kernel jaxpr")[0] for part in printed.getvalue().split(_MODULE_MARK)[1:]]


def problems(case: Case, chip: str = "v5e") -> list[str]:
    """What keeps `case` from compiling on TPU: a lowering error, a 64-bit integer in a kernel,
    or no kernel at all; empty when it lowers."""
    try:
        modules = mosaic_modules(case, chip)
    except Exception as e:  # any lowering error is the finding
        return [f"{type(e).__name__}: {str(e).strip().splitlines()[0]}"]
    if not modules:
        return ["no Pallas kernel was lowered"]
    found = []
    for module in modules:
        lines = [line.strip() for line in module.splitlines() if _I64.search(_I64_ATTRIBUTES.sub("", line))]
        if lines:
            found.append(f"64-bit integers in the kernel: {lines[0][:160]}")
    return found


def check(cases: Sequence[Case], chip: str = "v5e", verbose: bool = False, out=None) -> dict[str, list[str]]:
    """Lowers every case for `chip`; returns {case name: problems} for the ones that fail (printed
    to `out`, default stdout, with every case if `verbose`)."""
    out = out or sys.stdout
    failures = {}
    for case in cases:
        found = problems(case, chip)
        if found:
            failures[case.name] = found
        if verbose or found:
            print(f"{'FAIL' if found else 'ok  '} {case.name}" + "".join(f"\n     {p}" for p in found), file=out)
    return failures


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--verbose", action="store_true", help="print every case, not only failures")
    parser.add_argument("--chip", action="append", choices=sorted(CHIPS), help="TPU generation(s) (default: v5e, v6e)")
    args = parser.parse_args(argv)
    cases = all_cases()
    failed = 0
    for chip in args.chip or ["v5e", "v6e"]:
        start = time.perf_counter()
        failures = check(cases, chip, verbose=args.verbose)
        seconds = time.perf_counter() - start
        print(f"{chip}: {len(cases) - len(failures)} of {len(cases)} kernel calls lower for TPU ({seconds:.0f} s)")
        failed += len(failures)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
