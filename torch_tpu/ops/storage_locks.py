"""Per-storage locks for buffer swaps.

An in-place op reads its storage's flat buffer, runs an executable that scatters into it and
swaps the storage's buffer for the result. Two threads doing that on one storage (each on its own
row of one tensor) would lose one thread's write, so the read-run-swap holds the storage's lock.
jax dispatch is async: the lock covers the dispatch, not the device work.

The locks are re-entrant (a kernel may re-enter the dispatcher) and keyed by the storage's
buffer (its data pointer less its offset into the buffer: a storage slice shares its parent's
lock, as the dispatcher's alias grouping keys them); several storages are locked in address
order, so two threads never wait on each other in a cycle. Locks no thread holds are pruned as the table grows.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable

from torch_tpu import _C

_locks: dict[int, threading.RLock] = {}  # buffer's base address -> its lock
_making = threading.Lock()  # held while adding or pruning entries
_prune_at = 4096


def _lock(key: int):
    lock = _locks.get(key)
    if lock is None:
        with _making:
            lock = _locks.get(key)
            if lock is None:
                if len(_locks) >= _prune_at:
                    _prune()
                lock = _locks[key] = threading.RLock()
    return lock


def _prune() -> None:
    """Drops the locks no thread holds (storages come and go; their addresses are reused)."""
    global _prune_at
    for key, lock in list(_locks.items()):
        if not lock._is_owned() and lock.acquire(blocking=False):
            del _locks[key]
            lock.release()
    _prune_at = max(4096, 2 * len(_locks))


def _acquire(key: int) -> threading.RLock:
    while True:
        lock = _lock(key)
        lock.acquire()
        if _locks.get(key) is lock:  # not pruned between the look-up and the acquire
            return lock
        lock.release()


def _keys(tensors: Iterable) -> list[int]:
    keys = []
    for t in tensors:  # a plain loop: generators cost microseconds here
        if t is not None:
            ptr = t.untyped_storage().data_ptr()
            if ptr:  # an empty storage has nothing to lose
                # a tpu storage slice takes its parent buffer's key; a graph may also mutate CPU inputs
                keys.append(ptr if t.is_cpu else ptr - _C._buffer_offset(t))
    return sorted(set(keys)) if len(keys) > 1 else keys


class held:
    """`with held(tensors):` holds the locks of the tensors' storages (None entries skipped)."""

    __slots__ = ("_keys", "_taken")

    def __init__(self, tensors: Iterable):
        self._keys = _keys(tensors)
        self._taken: list[threading.RLock] = []

    def __enter__(self) -> None:
        taken = self._taken
        try:
            for key in self._keys:
                lock = _locks.get(key)  # the common case inline: the lock exists and stays
                if lock is not None and lock.acquire() and _locks.get(key) is lock:
                    taken.append(lock)
                    continue
                if lock is not None:
                    lock.release()
                taken.append(_acquire(key))
        except BaseException:
            self.__exit__()
            raise

    def __exit__(self, *exc) -> None:
        while self._taken:
            self._taken.pop().release()


def table() -> dict[int, threading.RLock]:
    """The lock table itself, for the C++ eager path (csrc/eager_kernel.cc takes existing locks)."""
    return _locks


def held_count() -> int:
    """How many storage locks some thread holds now (tests check none leak)."""
    with _making:
        _prune()
        return len(_locks)
