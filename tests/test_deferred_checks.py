"""Deferred index checks (ops/deferred_checks.py): where they are on (TPU; forced here), an op
with an out-of-range index queues its check's verdict on the device instead of reading the
indices (no host sync), and the next host read raises CPU's exception."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import torch_tpu
from torch_tpu.ops import deferred_checks, tensors


@pytest.fixture
def deferred(monkeypatch):
    monkeypatch.setenv("TORCH_TPU_DEFERRED_CHECKS", "1")
    deferred_checks.raise_pending()
    yield
    deferred_checks.raise_pending()


def _cpu_error(fn, *args):
    with pytest.raises(Exception) as info:
        fn(*args)
    return info.value


@pytest.mark.parametrize(
    "case",
    [
        (lambda w, i: F.embedding(i, w), lambda: (torch.randn(10, 4), torch.tensor([1, 2, 12]))),
        (lambda x, i: x[i], lambda: (torch.randn(3, 4), torch.tensor([0, 5]))),
        (lambda x, i: x.index_select(0, i), lambda: (torch.randn(3, 4), torch.tensor([3]))),
        (lambda x, i: x.gather(1, i), lambda: (torch.randn(3, 4), torch.tensor([[0, 4]]).expand(3, 2))),
        (lambda x, t: F.cross_entropy(x, t), lambda: (torch.randn(2, 5), torch.tensor([0, 7]))),
    ],
    ids=["embedding", "index", "index_select", "gather", "cross_entropy"],
)
def test_an_out_of_range_index_raises_at_the_next_host_read(deferred, case):
    fn, make = case
    x, index = make()
    expected = _cpu_error(fn, x, index)
    x_tpu, index_tpu = x.to("tpu"), index.to("tpu")
    torch_tpu.metrics.reset()
    out = fn(x_tpu, index_tpu)  # no host read, no error yet
    counters = torch_tpu.metrics.counters()
    assert counters["host_transfers"] == 0 and counters["deferred_checks"] >= 1
    assert deferred_checks.pending() == 1
    with pytest.raises(type(expected)) as info:
        out.sum().item()
    assert str(info.value).splitlines()[0] == str(expected).splitlines()[0]
    assert "reports at the next host read" in str(info.value)
    assert deferred_checks.pending() == 0
    out.cpu()  # reported once: later reads go on


def test_valid_indices_give_cpus_values_and_no_error(deferred):
    w, index = torch.randn(10, 4), torch.tensor([[1, 9], [0, 3]])
    torch.testing.assert_close(F.embedding(index.to("tpu"), w.to("tpu")).cpu(), F.embedding(index, w))
    assert deferred_checks.pending() == 0


def test_synchronize_reports_a_failed_check(deferred):
    F.embedding(torch.tensor([11]).to("tpu"), torch.randn(10, 4).to("tpu"))
    with pytest.raises(IndexError, match="index out of range in self"):
        torch.tpu.synchronize()


def test_pending_verdicts_are_bounded(deferred, monkeypatch):
    monkeypatch.setattr(deferred_checks, "MAX_PENDING", 3)
    w, index = torch.randn(10, 4).to("tpu"), torch.tensor([1]).to("tpu")
    for _ in range(4):
        F.embedding(index, w)
    assert deferred_checks.pending() == 0  # the fourth read the first three


@pytest.mark.parametrize("calls", [5, 40])
def test_queued_verdicts_run_at_the_read_in_few_executions(deferred, calls, monkeypatch):
    """An eager embedding is one execution: its verdict waits for the read, which computes every
    queued one together (a long queue in chunks of powers of two per kind: 32 + 8), from the
    index buffers as they are (no reshape of 2-D indices to the check's flat view runs)."""
    reshape, reshaped = tensors.reshape, []

    def counted(array, shape):
        reshaped.append(tuple(array.shape) != tuple(shape))
        return reshape(array, shape)

    monkeypatch.setattr(tensors, "reshape", counted)
    w = torch.randn(10, 4).to("tpu")
    indices = [torch.tensor([[i % 10], [9 - i % 10]]).to("tpu") for i in range(calls)]
    bad = torch.tensor([[3], [10]]).to("tpu")
    for _ in range(2):  # the second round runs compiled programs
        torch_tpu.sync()
        torch_tpu.metrics.reset()
        reshaped.clear()
        outs = [F.embedding(i, w) for i in indices]
        assert torch_tpu.metrics.counters()["executions"] == calls and not any(reshaped)
        torch_tpu.sync()
        expected_reads = 1 if calls <= deferred_checks.WHOLE_QUEUE else 2
        assert torch_tpu.metrics.counters()["executions"] == calls + expected_reads
    torch.testing.assert_close(outs[-1].cpu(), F.embedding(indices[-1].cpu(), w.cpu()))
    outs = [F.embedding(i, w) for i in (*indices[:-1], bad)]
    with pytest.raises(IndexError, match="index out of range in self"):
        outs[0].cpu()


@pytest.mark.cpu_client
def test_checks_stay_synchronous_on_the_cpu_client(monkeypatch):
    monkeypatch.delenv("TORCH_TPU_DEFERRED_CHECKS", raising=False)
    assert not deferred_checks.enabled()
    with pytest.raises(IndexError, match="index out of range in self"):
        F.embedding(torch.tensor([11]).to("tpu"), torch.randn(10, 4).to("tpu"))


def test_a_host_read_fetches_a_queue_of_verdicts_as_one_array(deferred, monkeypatch):
    """Queued checks computed together come back in one transfer (each is a device-to-host copy
    on TPU), and a failure among them still raises its own op's error."""
    fetched = []
    device_get = deferred_checks.jax.device_get
    monkeypatch.setattr(
        deferred_checks.jax, "device_get", lambda arrays: fetched.append(len(arrays)) or device_get(arrays)
    )
    w, good = torch.randn(10, 4).to("tpu"), torch.tensor([1, 2, 3]).to("tpu")
    for _ in range(5):
        F.embedding(good, w)
    torch.tpu.synchronize()
    assert fetched == [1]
    F.embedding(good, w)
    F.embedding(torch.tensor([1, 12]).to("tpu"), w)
    F.embedding(good, w)
    with pytest.raises(IndexError, match="index out of range"):
        torch.tpu.synchronize()
