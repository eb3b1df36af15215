"""Compiled graphs keep eager's data-dependent checks: a bad index or an integer zero divisor under
torch.compile(backend="tpu") raises CPU's exception (a checked error output of the executable, read
once after it runs), valid inputs give CPU's values, and graphs without checked ops return nothing
extra."""

from __future__ import annotations

import pytest
import torch
from torch.nn import functional as F

import torch_tpu
from tests.helpers import graph_runners
from torch_tpu.compile import graph
from torch_tpu.ops import deferred_checks

pytestmark = pytest.mark.usefixtures("fresh_dynamo")

_I = torch.tensor([[7, -3, 5], [2, 0, 1]])  # int64 dividends
_ZERO = torch.tensor([[2, 0, 3], [1, 5, 2]])  # a zero divisor
_NONZERO = torch.tensor([[2, 4, 3], [1, 5, 2]])
_X = torch.arange(12.0).reshape(3, 4)
_LOGITS = torch.linspace(-1, 1, 4 * 5).reshape(4, 5)


def _scatter_add(x, i):
    return x.scatter_add(0, i, torch.ones_like(i, dtype=x.dtype))


def _index_put(x, i):
    y = x.clone()
    y[i] = 1.0
    return y


# name: (function, valid arguments, bad arguments)
CASES = {
    "floor_divide": (lambda a, b: a // b, (_I, _NONZERO), (_I, _ZERO)),
    "remainder": (lambda a, b: a % b, (_I, _NONZERO), (_I, _ZERO)),
    "fmod": (torch.fmod, (_I, _NONZERO), (_I, _ZERO)),
    "div_trunc": (lambda a, b: torch.div(a, b, rounding_mode="trunc"), (_I, _NONZERO), (_I, _ZERO)),
    "cross_entropy": (F.cross_entropy, (_LOGITS, torch.tensor([0, 4, 2, 1])), (_LOGITS, torch.tensor([0, 5, 2, 1]))),
    "nll_loss": (
        lambda x, t: F.nll_loss(F.log_softmax(x, 1), t, reduction="sum"),
        (_LOGITS, torch.tensor([3, 4, 2, 1])),
        (_LOGITS, torch.tensor([3, -2, 2, 1])),
    ),
    "nll_loss2d": (
        lambda x, t: F.nll_loss(x, t),
        (torch.randn(2, 3, 2, 2, generator=torch.Generator().manual_seed(0)), torch.tensor([[[0, 1], [2, 0]]] * 2)),
        (torch.randn(2, 3, 2, 2, generator=torch.Generator().manual_seed(0)), torch.tensor([[[0, 1], [3, 0]]] * 2)),
    ),
    "index_select": (lambda x, i: x.index_select(0, i), (_X, torch.tensor([2, 0])), (_X, torch.tensor([2, 3]))),
    "gather": (lambda x, i: x.gather(1, i), (_X, torch.tensor([[0, 3], [1, 2]])), (_X, torch.tensor([[0, 4], [1, 2]]))),
    "scatter": (
        lambda x, i: x.scatter(1, i, -1.0),
        (_X, torch.tensor([[0, 3], [1, 2]])),
        (_X, torch.tensor([[0, 1], [-1, 2]])),
    ),
    "scatter_add": (_scatter_add, (_X, torch.tensor([[0, 2], [1, 2]])), (_X, torch.tensor([[0, 2], [1, 3]]))),
    "take": (torch.take, (_X, torch.tensor([0, 11, -12])), (_X, torch.tensor([0, 12]))),
    "index_add": (
        lambda x, i: x.index_add(1, i, torch.ones(3, 2, device=x.device)),
        (_X, torch.tensor([3, 0])),
        (_X, torch.tensor([3, 4])),
    ),
    "index_copy": (
        lambda x, i: x.index_copy(0, i, torch.zeros(2, 4, device=x.device)),
        (_X, torch.tensor([2, 0])),
        (_X, torch.tensor([2, 5])),
    ),
    "index_fill": (lambda x, i: x.index_fill(1, i, 0.5), (_X, torch.tensor([-4, 1])), (_X, torch.tensor([-5, 1]))),
    "embedding": (lambda w, i: F.embedding(i, w), (_X, torch.tensor([[0, 2], [1, 1]])), (_X, torch.tensor([[0, 3]]))),
    "index_tensor": (lambda x, i: x[i, 1:], (_X, torch.tensor([2, -3])), (_X, torch.tensor([1, 3]))),
    "index_put": (_index_put, (_X, torch.tensor([0, -1])), (_X, torch.tensor([0, -4]))),
}


def _cpu_error(fn, args) -> Exception:
    with pytest.raises(Exception) as info:
        fn(*args)
    return info.value


def _tpu(args):
    return [a.to("tpu") for a in args]


@pytest.mark.parametrize("name", sorted(CASES))
def test_bad_input_raises_cpu_error_when_compiled(name):
    fn, _, bad = CASES[name]
    expected = _cpu_error(fn, bad)
    compiled = torch.compile(fn, backend="tpu")
    with pytest.raises(type(expected)) as info:
        compiled(*_tpu(bad))
        torch_tpu.sync()
    assert type(info.value) is type(expected)
    if name not in ("cross_entropy", "nll_loss", "nll_loss2d", "embedding"):  # CPU words these per kernel
        assert str(info.value).split("\n")[0] == str(expected)  # a deferred check adds a note line
    assert torch_tpu.metrics.counters().get("graph_eager_ops", 0) == 0  # raised by the graph, not an eager split


@pytest.mark.parametrize("name", sorted(CASES))
def test_valid_input_matches_cpu_when_compiled(name):
    fn, valid, _ = CASES[name]
    compiled = torch.compile(fn, backend="tpu")
    torch.testing.assert_close(compiled(*_tpu(valid)).cpu(), fn(*valid))


def test_target_message_names_the_bad_target():
    compiled = torch.compile(F.cross_entropy, backend="tpu")
    with pytest.raises(IndexError, match=r"Target 5 is out of bounds\."):
        compiled(_LOGITS.to("tpu"), torch.tensor([0, 5, 2, 1], device="tpu"))
        torch_tpu.sync()  # where checks are deferred, they report here


def _executables(runners) -> list:
    return [exe for r in runners for s in r.steps if isinstance(s, graph.Segment) for exe in s.executables.values()]


def test_graph_without_checked_ops_has_no_extra_outputs(monkeypatch):
    runners = graph_runners(monkeypatch)
    compiled = torch.compile(lambda x, y: torch.relu(x @ y + 1).sum(0), backend="tpu")
    x = torch.randn(4, 4)
    args = _tpu((x, x))
    torch_tpu.metrics.reset()
    out = compiled(*args)
    assert torch_tpu.metrics.counters()["host_transfers"] == 0
    torch.testing.assert_close(out.cpu(), torch.relu(x @ x + 1).sum(0))
    (exe,) = _executables(runners)
    assert exe.checks == []
    assert len(exe.compiled(*[torch_tpu.ops.tensors.buffer_of(t) for t in args])) == 1


@pytest.mark.cpu_client
def test_checked_graph_reads_its_verdicts_at_once_on_the_cpu_client(monkeypatch):
    monkeypatch.delenv("TORCH_TPU_DEFERRED_CHECKS", raising=False)
    runners = graph_runners(monkeypatch)
    fn, valid, _ = CASES["gather"]
    compiled = torch.compile(fn, backend="tpu")
    args = _tpu(valid)
    compiled(*args)
    (exe,) = _executables(runners)
    assert [e for e, _ in exe.checks] == [RuntimeError]
    torch_tpu.metrics.reset()
    compiled(*args)
    assert torch_tpu.metrics.counters()["host_transfers"] == 1


@pytest.mark.parametrize("name", ["gather", "cross_entropy"])
def test_deferred_graph_checks_do_not_stop_the_host(monkeypatch, name):
    """Where checks are deferred (TPU), a checked graph queues its verdicts: no host read at the
    call, CPU's error at the next host read, naming the graph."""
    monkeypatch.setenv("TORCH_TPU_DEFERRED_CHECKS", "1")
    deferred_checks.raise_pending()
    fn, valid, bad = CASES[name]
    expected = _cpu_error(fn, bad)
    compiled = torch.compile(fn, backend="tpu")
    args = _tpu(valid)
    compiled(*args)
    torch_tpu.metrics.reset()
    out = compiled(*args)
    assert torch_tpu.metrics.counters().get("host_transfers", 0) == 0
    assert torch_tpu.metrics.counters()["deferred_checks"] == 1
    torch.testing.assert_close(out.cpu(), fn(*valid))
    compiled(*_tpu(bad))
    with pytest.raises(type(expected), match="the compiled graph"):
        torch.tpu.synchronize()
    deferred_checks.raise_pending()  # nothing left queued
