"""Moving small views (the last token of a growing sequence) do not compile an op per step, and
eager ops compile with the CPU client's cheaper options; results equal CPU's."""

from __future__ import annotations

import pytest
import torch

import torch_tpu
from torch_tpu import platforms


def _grow(device: str, steps: int) -> tuple[torch.Tensor, list[torch.Tensor]]:
    seq = torch.arange(6, dtype=torch.int64).reshape(1, 6).to(device)
    seen = []
    for _ in range(steps):
        last = seq[:, -1:]
        seen.append(torch.isin(last, torch.tensor([3, 40], device=device)))
        seq = torch.cat([seq, last * 2 + 1], dim=-1)
    return seq, seen


def test_a_moving_view_compiles_its_readers_once():
    expected, expected_seen = _grow("cpu", 12)
    _grow("tpu", 2)  # the ops' first placements
    torch_tpu.metrics.reset()
    got, got_seen = _grow("tpu", 12)
    counters = torch_tpu.metrics.counters()
    torch.testing.assert_close(got.cpu(), expected)
    for g, e in zip(got_seen, expected_seen):
        torch.testing.assert_close(g.cpu(), e)
    assert counters.get("view_host_gathers", 0) >= 12
    # Only cat (a new length each step) compiles per step; isin, mul and add on the last token do not.
    assert counters["op_compiles"] <= 12 + 2


def test_a_transposed_view_keeps_its_layout_through_ops():
    """A permuted view is not gathered into a contiguous copy: clone and elementwise ops keep its
    layout, as on CPU, whatever views of its shape ran before."""
    for device in ("cpu", "tpu"):
        a = torch.arange(12.0).reshape(3, 4).to(device)
        assert a[:, 1::2].clone().stride() == (2, 1)  # a (3, 2) view at one placement
        x = torch.arange(6.0).view(2, 3).to(device)
        assert x.t().clone().stride() == (1, 3)  # the same shape at another: still transposed
        assert (x.t() + 1).stride() == (1, 3)


def test_writes_through_a_moving_view_still_land():
    expected = torch.zeros(1, 16)
    got = torch.zeros(1, 16).to("tpu")
    for i in range(8):
        for t in (expected, got):
            t[:, i : i + 1].add_(i + 1)  # in place: never gathered
            t[:, i + 1 : i + 2] += t[:, i : i + 1] * 2
    torch.testing.assert_close(got.cpu(), expected)


@pytest.mark.cpu_client
def test_eager_ops_compile_cheaper_on_the_cpu_client(monkeypatch):
    assert platforms.op_compile_options() == {
        "xla_cpu_parallel_codegen_split_count": 1,
        "xla_cpu_use_fusion_emitters": False,
    }
    monkeypatch.setenv("TORCH_TPU_FAST_OP_COMPILE", "0")
    assert platforms.op_compile_options() is None
    x = torch.randn(300, 300)
    torch.testing.assert_close((x.to("tpu").tanh() * 3).sum(0).cpu(), (x.tanh() * 3).sum(0))
