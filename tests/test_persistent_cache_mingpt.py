"""A second process of minGPT training (examples/mingpt, eager) with a warm persistent cache
traces, lowers and compiles nothing: every executable is loaded by torch_tpu's own key."""

from __future__ import annotations

import json
import os
import pathlib

from tests.helpers import run_python

EXAMPLES = pathlib.Path(__file__).resolve().parents[1] / "examples"

_SCRIPT = r"""
import json, sys
sys.path[:0] = [sys.argv[1], sys.argv[1] + "/mingpt"]
import torch_tpu
import train as mingpt
from common import harness

losses = harness.train(mingpt.EXAMPLE, "tpu", 2, 0).losses
counters = {k: v for k, v in torch_tpu.metrics.counters().items() if isinstance(v, int)}
print(json.dumps({"losses": losses, "counters": counters}))
"""


def _run(cache: pathlib.Path) -> dict:
    env = dict(os.environ, TORCH_TPU_CACHE_DIR=str(cache), TORCH_TPU_PLATFORM="cpu")
    env.pop("TORCH_TPU_DEBUG", None)
    proc = run_python(["-c", _SCRIPT, str(EXAMPLES)], env, cwd=None, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    result["stderr"] = proc.stderr
    return result


def test_warm_mingpt_training_traces_and_compiles_nothing(tmp_path):
    cold = _run(tmp_path)
    assert cold["counters"]["traces"] > 0
    assert cold["counters"]["xla_compiles"] > 0
    warm = _run(tmp_path)
    counters = warm["counters"]
    assert counters["traces"] == 0, counters
    assert counters["xla_compiles"] == 0, counters
    assert counters["op_compiles"] == 0
    assert counters["persistent_cache_hits"] >= cold["counters"]["xla_compiles"] * 0.9
    assert warm["losses"] == cold["losses"]
    assert "CacheWarning" not in warm["stderr"]
