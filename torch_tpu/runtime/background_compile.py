"""Compiles executables on one background thread, hottest first.

A first-seen eager op signature need not wait for XLA: its call runs on the host
(ops/host_tier.py) while its executable compiles here, and the calls after the compile
finished run the executable. Each `request` of a pending job counts as a call, and the
worker takes the pending job with the most calls next (ties: the oldest), so what a
program runs every step compiles before what it ran once.

`TORCH_TPU_ASYNC_COMPILE=0` turns this off: every first call compiles before it runs.
At interpreter exit, jobs not started are dropped; the one compiling finishes.
"""

from __future__ import annotations

import itertools
import os
import threading
from collections.abc import Callable
from typing import Any

from torch_tpu import metrics

_cond = threading.Condition()
_pending: list[Job] = []  # submitted, not started
_running: Job | None = None
_thread: threading.Thread | None = None
_stopping = False
_order = itertools.count()


def enabled() -> bool:
    """TORCH_TPU_ASYNC_COMPILE (default on): first-seen op signatures compile in the background."""
    return os.environ.get("TORCH_TPU_ASYNC_COMPILE", "1").strip().lower() not in ("0", "false", "off", "no")


class Job:
    """One executable being compiled: `compile()` runs on the worker; `result` or `error` is set
    once `done`."""

    __slots__ = ("calls", "compile", "done", "error", "order", "result")

    def __init__(self, compile: Callable[[], Any]):
        self.compile = compile
        self.calls = 1
        self.order = next(_order)
        self.done = False
        self.result: Any = None
        self.error: BaseException | None = None


def submit(compile: Callable[[], Any]) -> Job:
    """A new job compiling with `compile()` on the worker thread."""
    global _thread
    job = Job(compile)
    with _cond:
        if _stopping:
            job.error = RuntimeError("torch_tpu: the interpreter is exiting")
            job.done = True
            return job
        _pending.append(job)
        if _thread is None:
            _thread = threading.Thread(target=_work, name="torch_tpu_compile")
            _thread.start()
            threading._register_atexit(_stop)  # before threads are joined: drop what has not started
        _cond.notify()
    metrics.bump("async_compiles")
    return job


def called(job: Job) -> bool:
    """Counts a call waiting for `job` (it ranks pending jobs) and tells whether it is done."""
    if job.done:
        return True
    job.calls += 1
    return False


def drain(timeout: float | None = None) -> bool:
    """Waits until no job is pending or compiling (True), or `timeout` seconds passed (False)."""
    with _cond:
        return _cond.wait_for(lambda: not _pending and _running is None, timeout)


def pending_count() -> int:
    with _cond:
        return len(_pending) + (_running is not None)


def _next() -> Job | None:
    global _running
    with _cond:
        while not _pending and not _stopping:
            _cond.wait()
        if _stopping:
            return None
        job = max(_pending, key=lambda j: (j.calls, -j.order))
        _pending.remove(job)
        _running = job
        return job


def _work() -> None:
    global _running
    while (job := _next()) is not None:
        try:
            job.result = job.compile()
        except BaseException as e:  # the caller sees it when it collects the job
            job.error = e
        with _cond:
            job.compile = None  # drops what the compile closed over (abstract arguments, entries)
            job.done = True
            _running = None
            _cond.notify_all()


def _stop() -> None:
    global _stopping
    with _cond:
        _stopping = True
        for job in _pending:
            job.error = RuntimeError("torch_tpu: the interpreter is exiting")
            job.done = True
        _pending.clear()
        _cond.notify_all()
