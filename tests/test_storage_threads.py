"""Threads writing one storage: an in-place op on a view reads the base's buffer and swaps in a
new one, so two threads must not interleave there (no lost writes; results match CPU's)."""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable

import pytest
import torch

import torch_tpu
from torch_tpu.ops import storage_locks

THREADS = 4
STEPS = 50
ROUNDS = 100


@pytest.fixture(autouse=True)
def _often_switching():
    """Threads switch every 10 microseconds (not 5 ms), so a race shows in a few rounds."""
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    yield
    sys.setswitchinterval(interval)
    torch_tpu.eager_mode(True)
    assert storage_locks.held_count() == 0


def _in_threads(work: Callable[[int], None], count: int = THREADS) -> None:
    """`work(k)` in `count` threads started together; re-raises a thread's error."""
    start = threading.Barrier(count)
    errors: list[BaseException] = []

    def body(k: int) -> None:
        try:
            start.wait(timeout=30)
            work(k)
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=body, args=(k,), daemon=True) for k in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
        assert not t.is_alive(), "a thread hung (deadlock?)"
    if errors:
        raise errors[0]


def _rows(step: Callable[[torch.Tensor, int], None], device: str, rounds: int = ROUNDS) -> list[torch.Tensor]:
    """Each round: THREADS threads each run `step(base, k)` STEPS times on one (THREADS, 3) base."""
    results = []
    for _ in range(rounds):
        base = torch.zeros(THREADS, 3, device=device)
        _in_threads(lambda k, base=base: [step(base, k) for _ in range(STEPS)])
        results.append(base.cpu())
    return results


def _add_(base, k):
    base[k].add_(1.0)


def _copy_(base, k):
    base[k].copy_(base[k] + 1.0)


def _setitem(base, k):
    base[k] = base[k] + 1.0


def _setitem_index(base, k):
    index = torch.tensor([k], device=base.device)  # index_put_
    base[index] = base[index] + 1.0


# fewer rounds for the slower multi-op steps: the race shows in the first round without the locks
@pytest.mark.parametrize(
    ("step", "rounds"),
    [(_add_, ROUNDS), (_copy_, ROUNDS // 2), (_setitem, 30), (_setitem_index, 20)],
    ids=["add_", "copy_", "setitem", "index_put_"],
)
def test_disjoint_rows_lose_no_writes(step, rounds):
    expected = _rows(step, "cpu", rounds=1)[0]
    assert torch.equal(expected, torch.full((THREADS, 3), float(STEPS)))
    for i, got in enumerate(_rows(step, "tpu", rounds)):
        assert torch.equal(got, expected), f"round {i}: {got.tolist()}"


def test_overlapping_views_add_():
    """Two threads add into overlapping slices of one storage: the sums commute, as on CPU."""

    def run(device):
        base = torch.zeros(16, device=device)
        views = (base[0:10], base[6:16])
        _in_threads(lambda k: [views[k].add_(k + 1.0) for _ in range(STEPS)], count=2)
        return base.cpu()

    expected = run("cpu")
    for _ in range(20):
        assert torch.equal(run("tpu"), expected)


def test_foreach_rows():
    """_foreach_add_ (an eager lowering) on rows of two shared bases."""

    def run(device):
        a, b = torch.zeros(THREADS, 3, device=device), torch.zeros(THREADS, 2, device=device)
        _in_threads(lambda k: [torch._foreach_add_([a[k], b[k]], 1.0) for _ in range(STEPS)])
        return a.cpu(), b.cpu()

    expected = run("cpu")
    for _ in range(20):
        got = run("tpu")
        assert torch.equal(got[0], expected[0]) and torch.equal(got[1], expected[1])


def test_lazy_mode_rows():
    """Lazy mode records in-place ops into pending buffers: the same read and swap per storage."""
    expected = _rows(_add_, "cpu", rounds=1)[0]
    for _ in range(10):
        with torch_tpu.eager_mode(False):
            base = torch.zeros(THREADS, 3, device="tpu")
            _in_threads(lambda k, base=base: [_add_(base, k) for _ in range(STEPS)])
        assert torch.equal(base.cpu(), expected)


def test_unwritten_storage_first_writes():
    """torch.empty's storage gets its zeros on first use: a racing first write is kept."""
    for _ in range(20):
        base = torch.empty(THREADS, 3, device="tpu")
        _in_threads(lambda k, base=base: base[k].fill_(k + 1.0))
        assert torch.equal(base.cpu(), torch.arange(1.0, THREADS + 1).repeat_interleave(3).reshape(THREADS, 3))


def test_storage_slice_and_parent_rows():
    """One thread adds through a tensor on a storage slice, another through the parent tensor:
    both swap the one parent buffer, so they share a lock (no lost writes, CPU's result)."""

    def run(device):
        base = torch.zeros(2, 4, device=device)
        on_slice = torch.tensor((), device=device).set_(base.untyped_storage()[16:32], 0, (4,), (1,))
        targets = (base[0], on_slice)  # row 0 via the parent, row 1 via the slice
        _in_threads(lambda k: [targets[k].add_(k + 1.0) for _ in range(STEPS)], count=2)
        return base.cpu()

    expected = run("cpu")
    assert torch.equal(expected, torch.tensor([[1.0] * 4, [2.0] * 4]) * STEPS)
    for i in range(30):
        got = run("tpu")
        assert torch.equal(got, expected), f"round {i}: {got.tolist()}"
