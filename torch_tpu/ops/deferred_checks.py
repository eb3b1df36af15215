"""Index checks that do not stop the host: verdicts computed on the device, read at the next host read.

CPU raises IndexError for an index out of range before the op runs; reading the index values
to decide that is a host sync, and on TPU a host read waits for all the work queued before it:
every embedding, gather or nll_loss would stall the host until the chip drained (an eager
embedding cost 1.5 ms there against jax's 0.12 ms). Where checks are deferred, the op queues a
tiny computation of its check's verdict (is an index outside, and the first such) beside its
own, and the verdicts are read at the next host read (`.item()`, `.cpu()`, printing,
`torch.tpu.synchronize()`), before any value can reach the host: the first failed check raises
its op's CPU exception there, with a note naming the op. The op's own result is then
meaningless, as on CPU where it never ran, and no value of it was seen.

Deferred on every platform but the CPU client, where buffers are host memory and a host read
costs nothing (`platforms.host_memory_buffers()`: its checks stay synchronous, exactly CPU's
behaviour); TORCH_TPU_DEFERRED_CHECKS=1 or 0 decides elsewise. While ops are recorded lazily
(`torch_tpu.eager_mode(False)`) checks are always deferred and their verdicts recorded with the
ops: reading the indices would run the trace recorded so far, and split the step's fused
executable at every embedding or loss.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
import torch

from torch_tpu import metrics, platforms
from torch_tpu.ops import tensors
from torch_tpu.runtime import client, executable_cache, global_arrays

# Verdicts queued before a host read forces them (bounds the memory they hold).
MAX_PENDING = 256

_lock = threading.Lock()
_pending: list[tuple[object, list[Callable[[int], Exception]], str]] = []  # (verdicts, errors, what)


def enabled() -> bool:
    if tensors.lazy is not None:
        return True
    setting = os.environ.get("TORCH_TPU_DEFERRED_CHECKS", "").strip()
    if setting:
        return setting not in ("0", "false", "no", "off")
    return not platforms.host_memory_buffers()


def first_outside(flat, low: int, high: int):
    """(any element of the 1-D `flat` outside [low, high), the first such element), traced."""
    outside = (flat < low) | (flat >= high)
    return jnp.any(outside), flat[jnp.argmax(outside)]


def _range_rows(bounds, *arrays):
    """(outside?, first offending value) per (index array, (low, high)): int64 [n, 2]."""
    rows = []
    for a, (low, high) in zip(arrays, bounds):
        bad, value = first_outside(a.reshape(-1), low, high)
        rows.append(jnp.stack([bad.astype(jnp.int64), value.astype(jnp.int64)]))
    return jnp.stack(rows)


_range_verdicts = executable_cache.jit(_range_rows, static_argnums=0)


class Queued:
    """A check's verdict rows not computed yet: `rows(*static, *arrays)`, computed with every other
    queued one at the next host read (raise_pending), or alone when read first (`value`)."""

    __slots__ = ("arrays", "result", "rows", "stacked", "static")

    def __init__(self, rows: Callable, static: tuple, arrays: tuple):
        self.rows, self.static, self.arrays, self.result = rows, static, arrays, None
        self.stacked: tuple | None = None  # (the queue's rows in one array, this one's first row)

    def spec(self) -> tuple:
        return (self.rows, self.static, len(self.arrays))

    def value(self) -> jax.Array:
        if self.result is None:
            compute([self])
        return self.result


def _batched_rows(specs, *arrays):
    """The verdict rows of each (rows, static, number of arrays) in `specs`, over `arrays` in turn,
    and all of them in one array (a host read fetches that one, not one array per check)."""
    out, start = [], 0
    for rows, static, count in specs:
        out.append(rows(*static, *arrays[start : start + count]))
        start += count
    return out, jnp.concatenate(out)


_batched = executable_cache.jit(_batched_rows, static_argnums=0)


# A host read's queue of up to this many verdicts runs as one program, compiled once for a loop
# that repeats it (a training step's checks); a longer queue runs per kind of check in chunks of
# powers of two, so its programs stay few whatever the count.
WHOLE_QUEUE = 16


def compute(queued: list[Queued]) -> None:
    """Computes the verdicts of `queued`: one execution for a short queue, a few for a long one."""
    if len(queued) <= WHOLE_QUEUE:
        _compute_together(queued)
        return
    kinds: dict[tuple, list[Queued]] = {}
    for q in queued:
        kinds.setdefault((q.spec(), tuple((a.shape, a.dtype) for a in q.arrays)), []).append(q)
    for same in kinds.values():
        start = 0
        while start < len(same):
            size = 1 << ((len(same) - start).bit_length() - 1)
            _compute_together(same[start : start + size])
            start += size


def _compute_together(queued: list[Queued]) -> None:
    results, stacked = _batched(tuple(q.spec() for q in queued), *(a for q in queued for a in q.arrays))
    metrics.bump("executions")
    first = 0
    for q, result in zip(queued, results):
        q.result, q.arrays, q.stacked = result, (), (stacked, first)
        first += result.shape[0]


def verdicts(rows: Callable, jitted: Callable, static: tuple, args: tuple[torch.Tensor, ...], flat: bool = False):
    """`rows(*static, *values of args)`, the int64 [n, 2] verdict rows of a check: queued where
    checks are deferred (computed at the next host read), recorded with the ops while they are
    recorded lazily (the values do not exist yet), else computed on the device now (`jitted` is
    `rows` under executable_cache.jit with `static` static). `flat`: `rows` reads only the
    arrays' elements in order, whatever their shape (a queued check takes whole buffers as they are)."""
    if tensors.lazy is not None:
        return tensors.lazy.call(rows, static, *(tensors.lazy.read(t) for t in args))
    if enabled():
        read = tensors.elements if flat else tensors.to_jax
        return Queued(rows, static, tuple(read(t) for t in args))
    metrics.bump("executions")
    return jitted(*static, *(tensors.to_jax(t) for t in args))


def range_verdicts(checks: list[tuple[torch.Tensor, int, int, Callable[[int], Exception]]]):
    """The verdict rows of range checks of tpu index tensors (tensor, low, high, error)."""
    bounds = tuple((int(c[1]), int(c[2])) for c in checks)
    return verdicts(_range_rows, _range_verdicts, (bounds,), tuple(c[0] for c in checks), flat=True)


def read(verdicts) -> np.ndarray:
    """Verdict rows on the host (a host read, counted)."""
    metrics.bump("host_transfers")
    if isinstance(verdicts, Queued):
        verdicts = verdicts.value()
    return np.asarray(global_arrays.fetchable(verdicts))


def check(verdicts, errors: list[Callable[[int], Exception]], what: str) -> None:
    """Raises errors[i](value) for the first failed row (failed?, value) of `verdicts`: now (a host
    read), or where checks are deferred at the next host read; `what` says where it comes from."""
    if enabled():
        defer_verdicts(verdicts, errors, what)
    else:
        _raise_first(read(verdicts), errors)


def defer_verdicts(verdicts: jax.Array | Queued, errors: list[Callable[[int], Exception]], what: str) -> None:
    """Queues computed verdicts: int64 [n, 2] rows (failed?, value), row i raising errors[i](value)."""
    metrics.bump("deferred_checks")
    with _lock:
        _pending.append((verdicts, errors, what))
        full = len(_pending) > MAX_PENDING
    if full:
        raise_pending()


def _raise_first(rows, errors: list[Callable[[int], Exception]], note: str | None = None) -> None:
    for (failed, value), error in zip(rows, errors):
        if failed:
            failure = error(int(value))
            if note is not None:
                failure.args = (f"{failure.args[0]}\n{note}", *failure.args[1:]) if failure.args else (note,)
            raise failure


def raise_pending() -> None:
    """Reads every queued verdict (one host read: it waits for them) and raises the first failure."""
    if not _pending:
        return
    with _lock:
        taken = list(_pending)
        _pending.clear()
    queued = [v for v, _, _ in taken if isinstance(v, Queued) and v.result is None]
    if queued:
        compute(queued)
    # What to fetch: each queue's stacked rows once (id -> array), and each other verdict itself.
    fetch: dict[int, jax.Array] = {}
    where = []  # per taken verdict: (fetched array's id, first row, rows) or (id, None, None)
    for verdict, _, _ in taken:
        if isinstance(verdict, Queued) and verdict.stacked is not None:
            stacked, first = verdict.stacked
            fetch.setdefault(id(stacked), stacked)
            where.append((id(stacked), first, verdict.result.shape[0]))
            continue
        if isinstance(verdict, Queued):
            verdict = verdict.result
        if not isinstance(verdict, jax.Array):  # recorded lazily: run the trace it belongs to
            verdict = tensors.lazy.concrete([verdict])[0] if tensors.lazy is not None else verdict.value
        fetch.setdefault(id(verdict), verdict)
        where.append((id(verdict), None, None))
    keys = list(fetch)
    fetched = dict(zip(keys, jax.device_get([global_arrays.fetchable(fetch[k]) for k in keys])))
    for (key, first, count), (_, errors, what) in zip(where, taken):
        rows = fetched[key] if first is None else fetched[key][first : first + count]
        note = f"({what}: torch_tpu checks values on the device and reports at the next host read)"
        _raise_first(rows, errors, note)


def install() -> None:
    """Makes every host read and synchronize raise a failed check first."""
    if raise_pending not in client.before_host_read:
        client.before_host_read.append(raise_pending)


def pending() -> int:
    return len(_pending)
