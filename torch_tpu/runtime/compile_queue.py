"""One background thread for compiles that run beside the program, as futures.

A job a running program waits for (a compiled graph's segment, compile/async_compile.py) goes
before one that only makes a running program faster (an eager op recompiled at XLA's default
effort, ops/op_tier_up.py); within a priority, first come first served. XLA releases the GIL
while it compiles, so the program runs on meanwhile.

At interpreter exit the jobs not yet started are cancelled and the one running is waited for:
nothing delays the exit by more than one compile.
"""

from __future__ import annotations

import atexit
import concurrent.futures
import itertools
import queue
import threading
from collections.abc import Callable
from typing import Any

# Priorities, lowest first.
WAITED_FOR = 0  # the program runs another way until the job is done
SPEED_UP = 1  # the program already has an executable; the job's is faster

_jobs: queue.PriorityQueue = queue.PriorityQueue()
_order = itertools.count()
_lock = threading.Lock()
_worker: threading.Thread | None = None
_closing = False


def submit(fn: Callable[..., Any], *args, priority: int = WAITED_FOR) -> concurrent.futures.Future:
    """Runs `fn(*args)` on the compile thread; its future has the result or the exception."""
    future: concurrent.futures.Future = concurrent.futures.Future()
    if _closing:
        future.cancel()
        return future
    _jobs.put((priority, next(_order), future, fn, args))
    _start()
    return future


def wait_idle() -> None:
    """Blocks until every job submitted so far has finished."""
    _jobs.join()


def _start() -> None:
    global _worker
    with _lock:
        if _worker is None:
            _worker = threading.Thread(target=_run, name="torch_tpu_compile", daemon=True)
            _worker.start()


def _run() -> None:
    while True:
        _, _, future, fn, args = _jobs.get()
        if future is None:
            return
        if future.set_running_or_notify_cancel():
            try:
                future.set_result(fn(*args))
            except BaseException as error:  # the waiter raises it
                future.set_exception(error)
        _jobs.task_done()


@atexit.register
def _close() -> None:
    """Cancels the jobs not started and waits for the running one."""
    global _closing
    _closing = True
    while True:
        try:
            _, _, future, _, _ = _jobs.get_nowait()
        except queue.Empty:
            break
        future.cancel()
        _jobs.task_done()
    if _worker is not None and _worker.is_alive():
        _jobs.put((-1, -1, None, None, None))
        _worker.join()
