"""Eager ops compiled twice: quickly first, at XLA's default effort in the background when it pays.

An eager op's first call compiles at platforms.op_compile_options' low effort (on TPU, a
convolution in 0.2 s instead of 2.4 s). For an op whose device work is large enough that the
low effort's program runs slower (platforms.op_tier_up asks XLA's cost analysis), the same
lowering is compiled again at XLA's default effort on the compile queue
(runtime/compile_queue.py) while the program runs on with the quick executable; the default
one then replaces it, in memory and in the persistent cache. Counted in metrics as
"op_tier_ups" (done) and "op_tier_ups_queued".

A quick executable is persisted marked as such (Entry.quick), so a process that exits before
its recompile finishes leaves one that the next process loads, runs, and recompiles again.
"""

from __future__ import annotations

from torch_tpu import _C, metrics, platforms
from torch_tpu.runtime import compile_queue, executable_cache


def after_first_compile(label: str, entry, lowered, compiled) -> None:
    """Called when the executable `compiled` of op `label`'s `entry` was compiled from `lowered`
    with the low-effort options: marks it quick and queues its recompile where
    platforms.op_tier_up says so."""
    if platforms.op_tier_up(compiled):
        entry.quick = True
        _queue(label, entry, lowered)


def _queue(label: str, entry, lowered) -> None:
    metrics.bump("op_tier_ups_queued")
    compile_queue.submit(_recompile, label, entry, lowered, priority=compile_queue.SPEED_UP)


def _recompile(label: str, entry, lowered) -> None:
    """On the compile thread: compiles at XLA's default effort and puts the result in place."""
    from torch_tpu.ops.op_entries import entry_state

    compiled = lowered.compile()
    entry.quick = False
    executable_cache.save(entry.persist, compiled, entry_state(entry))
    entry.run = compiled
    entry.fast = None  # the C++ path's direct call was the quick executable's
    _C._clear_eager_entries_of(label)  # the C++ path's entries of this op: its next call takes the new one
    metrics.bump("op_tier_ups")


class RecompileLoaded:
    """Stands in for a quick executable loaded from the persistent cache until its first call:
    runs it, lowers the op again for the call's arguments (`traceable`: the op's jitted lowering)
    and queues the recompile."""

    __slots__ = ("compiled", "entry", "label", "traceable")

    def __init__(self, label: str, entry, compiled, traceable):
        self.label, self.entry, self.compiled, self.traceable = label, entry, compiled, traceable

    def __call__(self, *args):
        result = self.compiled(*args)
        if self.entry.run is self:
            self.entry.run = self.compiled
        _queue(self.label, self.entry, self.traceable.lower(*args))
        return result
