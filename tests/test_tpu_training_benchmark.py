"""benchmarks/tpu_training.py, which the TPU lane runs, works on the CPU client (--tiny): every
mode trains from the same weights to jax's losses, and a steady compiled step runs its four
executions with one host read (the loss; where checks are not deferred, the CPU client, the
graph's target check is read too) and no compile."""

from __future__ import annotations

import json
import os
import pathlib

from tests.helpers import run_python
from torch_tpu.ops import deferred_checks

BENCHMARKS = pathlib.Path(__file__).resolve().parents[1] / "benchmarks"


def test_tiny_gpt_modes_match_jax(tmp_path):
    out = tmp_path / "result.json"
    args = [str(BENCHMARKS / "tpu_training.py"), "--tiny", "--models", "gpt"]
    args += ["--modes", "jax,compiled-step,compiled-model,eager", "--steps", "2", "--warmup", "1", "--json", str(out)]
    env = dict(os.environ, TORCH_TPU_PLATFORM=os.environ.get("TORCH_TPU_PLATFORM", "cpu"))
    result = run_python(args, env, cwd=tmp_path, timeout=900)
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    rows = {row["mode"]: row for row in json.loads(out.read_text())["rows"]}
    assert all(row["status"] == "ok" for row in rows.values()), {m: r["status"] for m, r in rows.items()}
    for mode in ("compiled-step", "compiled-model", "eager"):
        assert rows[mode]["loss_match_jax"], (mode, rows[mode]["losses"], rows["jax"]["losses"])
    steady = rows["compiled-step"]["per_step"]
    # forward, backward's seed gradient, backward, the optimizer: one executable each
    reads = 1 if deferred_checks.enabled() else 2
    assert steady["executions"] == 4 and steady["host_transfers"] == reads and steady["xla_compiles"] == 0, steady
