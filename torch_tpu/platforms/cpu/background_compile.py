"""Compiles executables in the background, hottest first.

A first-seen eager op signature need not wait for XLA: its call runs on the host
(host_tier.py) while its executable compiles here, and the calls after the compile
finished run the executable. Each call waiting for a pending job counts (`called`), and
the pending job with the most calls compiles next (ties: the oldest), so what a program
runs every step compiles before what it ran once.

One thread takes the jobs in turn. A job with a picklable `request` compiles in the compile
worker process (compile_worker.py), whose tracing does not contend for this process's GIL;
the thread only waits on its pipe. Others (and every job under TORCH_TPU_ASYNC_COMPILE=thread,
or when the worker cannot run) compile on the thread itself.

`TORCH_TPU_ASYNC_COMPILE=0` turns this off: every first call compiles before it runs.

Every compiled executable is written to the persistent cache as soon as it is ready (by the
worker, or by the thread), so the next run loads it. A short program ends before most of its
compiles are done (the worker alone takes seconds to start): at interpreter exit, while the
persistent cache is in use, the exit waits for the jobs still pending, up to
TORCH_TPU_EXIT_COMPILE_WAIT seconds (default 120; 0 drops them), so the next run of the same
program compiles nothing it compiled before. A worker still starting then is ended and the
thread compiles the rest itself; Ctrl-C skips the wait. Then jobs not started are dropped and
the worker is ended.
"""

from __future__ import annotations

import itertools
import os
import pickle
import sys
import threading
from collections.abc import Callable
from typing import Any

import jax

from torch_tpu import metrics
from torch_tpu.platforms.cpu import compile_worker
from torch_tpu.runtime import client, persistent_cache

_cond = threading.Condition()
_pending: list[Job] = []  # submitted, not started
_running: Job | None = None
_thread: threading.Thread | None = None
_stopping = False
_finishing = False  # the interpreter exits and waits for the pending jobs (see _finish)
_order = itertools.count()
_process: compile_worker.Worker | None = None
_process_failed = False
SWITCH_INTERVAL = 2e-4  # seconds: the interpreter's thread switch interval while a compile runs
DEFAULT_EXIT_WAIT = 120.0  # seconds the exit waits for pending compiles (TORCH_TPU_EXIT_COMPILE_WAIT)


def _mode() -> str:
    return os.environ.get("TORCH_TPU_ASYNC_COMPILE", "1").strip().lower()


def enabled() -> bool:
    """TORCH_TPU_ASYNC_COMPILE (default on; "thread" keeps compiles in this process): first-seen
    op signatures compile in the background."""
    return _mode() not in ("0", "false", "off", "no")


class Job:
    """One executable being compiled. Once `done`: `error`, or `result`: what `compile()` returned
    (compiled on the thread), or executable_cache.to_bytes's bytes when `remote` (compiled in the
    worker process from `request`)."""

    __slots__ = ("calls", "compile", "done", "error", "order", "remote", "request", "result")

    def __init__(self, compile: Callable[[], Any], request: tuple | None = None):
        self.compile = compile
        self.request = request
        self.calls = 1
        self.order = next(_order)
        self.done = False
        self.remote = False
        self.result: Any = None
        self.error: BaseException | None = None


def submit(compile: Callable[[], Any], request: tuple | None = None) -> Job:
    """A new job: compiled from `request` (kind, spec) by the worker process where it can, else
    by `compile()` on the thread."""
    global _thread
    job = Job(compile, request)
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
            worker = _worker() if job.request is not None else None
            try:
                job.result = worker.compile(job.request) if worker is not None else None
                job.remote = worker is not None
            except (pickle.PicklingError, TypeError, AttributeError):  # a request that cannot travel
                pass
            except compile_worker.WorkerError:
                if not _finishing:  # its caller compiles it at its next call
                    raise
            if not job.remote:
                if _stopping:  # the worker was ended for the exit: nothing more compiles
                    raise RuntimeError("torch_tpu: the interpreter is exiting")
                job.result = _compile_here(job)
        except BaseException as e:  # the caller sees it when it collects the job
            job.error = e
        with _cond:
            job.compile = job.request = None  # drops what they hold (abstract arguments, entries)
            job.done = True
            _running = None
            _cond.notify_all()


def _compile_here(job: Job) -> Any:
    # Tracing and lowering hold the GIL in long stretches; every op the program runs meanwhile
    # takes the GIL back (torch releases it around each op), so switch often while compiling.
    interval = sys.getswitchinterval()
    sys.setswitchinterval(min(interval, SWITCH_INTERVAL))
    try:
        return job.compile()
    finally:
        sys.setswitchinterval(interval)


def _worker() -> compile_worker.Worker | None:
    """The compile worker process (started on first use), or None: compile on this thread."""
    global _process, _process_failed
    if _process is not None and _process.alive():
        return _process
    if _stopping or _finishing or _process_failed or _mode() == "thread":
        return None
    if client.platform() != "cpu" or jax.process_count() > 1:
        return None
    try:
        _process = compile_worker.Worker()  # known before its start completes: _stop can end it
        _process.wait_ready()
    except (OSError, compile_worker.WorkerError):
        _process_failed = True  # compile on the thread from now on
        return None
    return _process


def exit_wait() -> float:
    """TORCH_TPU_EXIT_COMPILE_WAIT: how long the interpreter's exit waits for pending compiles
    (seconds; default DEFAULT_EXIT_WAIT, 0 drops them)."""
    text = os.environ.get("TORCH_TPU_EXIT_COMPILE_WAIT", "").strip()
    try:
        return max(0.0, float(text)) if text else DEFAULT_EXIT_WAIT
    except ValueError:
        return DEFAULT_EXIT_WAIT


def _finish(timeout: float) -> None:
    """At exit: waits up to `timeout` seconds for the pending jobs, whose executables go to the
    persistent cache (nothing else would use them). A worker still starting is ended: the
    thread compiles the rest (a start takes seconds, a small op's compile tens of ms)."""
    global _finishing
    store = persistent_cache.store()
    if timeout <= 0 or store is None or not store.writable or jax.process_count() > 1:
        return
    with _cond:
        count = len(_pending) + (_running is not None)
        if not count:
            return
        _finishing = True
    process = _process
    if process is not None and not process.ready:
        process.kill()  # its start fails, and the thread compiles instead
    print(
        f"torch_tpu: finishing {count} background compile(s) for the persistent cache (Ctrl-C skips)",
        file=sys.stderr,
        flush=True,
    )
    try:
        drain(timeout)
    except KeyboardInterrupt:
        pass


def _stop() -> None:
    global _stopping
    _finish(exit_wait())
    with _cond:
        _stopping = True
        for job in _pending:
            job.error = RuntimeError("torch_tpu: the interpreter is exiting")
            job.done = True
        _pending.clear()
        _cond.notify_all()
    if _process is not None:
        _process.close()  # the job it runs fails, and the thread ends
