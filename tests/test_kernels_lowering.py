"""Every Pallas kernel lowers for TPU (Mosaic) on this machine, and the check catches the two
failures the first TPU run found: a block shape Mosaic refuses and 64-bit integers in a kernel."""

from __future__ import annotations

import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import pytest
from jax.experimental import pallas as pl

from torch_tpu.kernels import check_lowering


def _copy_kernel(x_ref, o_ref):
    o_ref[...] = x_ref[...] * 2


def _lse_like_kernel(x):
    # The old flash kernel's logsumexp block: (squeezed, squeezed, 64) of a (2, 4, 64) array.
    spec = pl.BlockSpec((None, None, 64), lambda i, j: (i, j, 0))
    out = jax.ShapeDtypeStruct((2, 4, 64), jnp.float32)
    return pl.pallas_call(_copy_kernel, grid=(2, 4), in_specs=[spec], out_specs=spec, out_shape=out, debug=True)(x)


def _int64_index_map_kernel(x):
    # Under jax_enable_x64 a Python 0 in an index map is an int64 constant (gmm's failure).
    spec = pl.BlockSpec((8, 128), lambda i: (i, 0))
    out = jax.ShapeDtypeStruct((16, 128), jnp.float32)
    return pl.pallas_call(_copy_kernel, grid=(2,), in_specs=[spec], out_specs=spec, out_shape=out, debug=True)(x)


def test_the_cli_lowers_every_kernel_for_tpu():
    # The CPU client only: on a TPU host this process already holds the chip.
    env = {**os.environ, "TORCH_TPU_PLATFORM": "cpu", "JAX_PLATFORMS": "cpu"}
    done = subprocess.run(
        [sys.executable, "-m", "torch_tpu.kernels.check_lowering", "--chip", "v5e", "--chip", "v6e"],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    count = len(check_lowering.all_cases())
    assert f"v5e: {count} of {count}" in done.stdout and f"v6e: {count} of {count}" in done.stdout


def test_a_block_shape_mosaic_refuses_fails_the_check(capsys):
    bad = check_lowering.Case("lse block", _lse_like_kernel, (jax.ShapeDtypeStruct((2, 4, 64), jnp.float32),))
    found = check_lowering.problems(bad)
    assert found and "divisible by 8 and 128" in found[0]
    assert check_lowering.check([bad]) == {"lse block": found}
    assert "FAIL lse block" in capsys.readouterr().out


def test_int64_in_a_kernel_fails_the_check():
    assert jax.config.jax_enable_x64  # torch_tpu's setting: the case the check exists for
    case = check_lowering.Case("i64", _int64_index_map_kernel, (jax.ShapeDtypeStruct((16, 128), jnp.float32),))
    found = check_lowering.problems(case)
    assert len(found) == 1 and "64-bit integers" in found[0]


def test_the_cli_exits_nonzero_when_a_kernel_fails(monkeypatch):
    bad = check_lowering.Case("lse block", _lse_like_kernel, (jax.ShapeDtypeStruct((2, 4, 64), jnp.float32),))
    monkeypatch.setattr(check_lowering, "all_cases", lambda: [bad])
    assert check_lowering.main(["--chip", "v5e"]) == 1


@pytest.mark.parametrize("kernel", ["flash", "paged", "gmm"])
def test_each_kernel_family_has_cases_for_every_dtype(kernel):
    names = [c.name for c in check_lowering.all_cases() if c.name.startswith(kernel)]
    for dtype in ("float32", "bfloat16", "float16"):
        assert any(dtype in n for n in names), (kernel, dtype)
