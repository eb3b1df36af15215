"""The kernel examples: paged-attention decoding and a gmm mixture-of-experts layer, each
against a CPU reference without the kernels."""

from __future__ import annotations

import pathlib
import sys

import torch_tpu

EXAMPLES = pathlib.Path(__file__).resolve().parents[1] / "examples"


def _import(folder: str, module: str):
    sys.path.insert(0, str(EXAMPLES / folder))
    try:
        return __import__(module)
    finally:
        sys.path.pop(0)


def test_paged_decode_matches_full_recompute_on_cpu():
    decode = _import("paged_decode", "paged_decode")
    model = decode.build_model()
    # Prompts of different lengths; 3 new tokens cross page boundaries (page_size 4).
    prompts = decode.PROMPTS
    torch_tpu.metrics.reset()
    tokens = decode.generate_paged(model.to("tpu"), prompts, steps=3)
    assert torch_tpu.metrics.counters()["cpu_fallback_ops"] == {}
    assert tokens == decode.generate_reference(model.cpu(), prompts, steps=3)


def test_moe_trains_like_the_per_expert_loop_on_cpu():
    moe = _import("moe", "gmm_moe")
    torch_tpu.metrics.reset()
    losses = moe.train("tpu", steps=2, optimizer="sgd")
    assert torch_tpu.metrics.counters()["cpu_fallback_ops"] == {}
    expected = moe.train("cpu", steps=2, reference=True, optimizer="sgd")
    assert abs(losses[0] - expected[0]) < 1e-4 and abs(losses[1] - expected[1]) < 1e-4
