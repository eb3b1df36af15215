"""No full garbage collections while a graph compiles.

Tracing a step (dynamo, aot_autograd's joint graph, torch_tpu's lowering) makes hundreds of
thousands of long-lived objects, and each full (generation 2) collection Python starts
meanwhile scans every tracked object of the process (~0.2 s each at 740,000 objects on the CPU
client). While a compile runs (`window()`: dynamo's compile callbacks, the "tpu" backend's
work, and a compiled graph's executable built at its first call), full collections wait:
generation 2's threshold is set out of reach, and put back when the last window closes. Young
objects are still collected (generations 0 and 1); the rest waits for the next full collection
after the compile. A GPT-2 first step (batch 1, CPU client, `benchmarks/first_step_phases.py`)
took 17.6-18.6 s before and 16.7-17.0 s with it.
"""

from __future__ import annotations

import contextlib
import gc
import threading
from collections.abc import Iterator

_DEFERRED = 1 << 30  # generation 2's threshold while a window is open
_lock = threading.Lock()
_open = 0
_saved: tuple[int, int, int] | None = None


def _enter() -> None:
    global _open, _saved
    with _lock:
        _open += 1
        if _open == 1:
            _saved = gc.get_threshold()
            gc.set_threshold(_saved[0], _saved[1], _DEFERRED)


def _exit() -> None:
    global _open, _saved
    with _lock:
        if _open == 0:
            return
        _open -= 1
        if _open == 0 and _saved is not None:
            if gc.get_threshold()[2] == _DEFERRED:  # unless someone set thresholds meanwhile
                gc.set_threshold(*_saved)
            _saved = None


@contextlib.contextmanager
def window() -> Iterator[None]:
    """Full collections wait while this (and every other open window) lasts."""
    _enter()
    try:
        yield
    finally:
        _exit()


_dynamo_open = threading.local()  # dynamo's compile opened a window (it may end one it did not start)


def _on_start(args) -> None:
    _dynamo_open.value = True
    _enter()


def _on_end(args) -> None:
    if getattr(_dynamo_open, "value", False):
        _dynamo_open.value = False
        _exit()


def install() -> None:
    """Opens a window for each of dynamo's compiles (its start and end callbacks), once;
    `torch._dynamo.reset()` drops the callbacks, so the backend calls this at each compile."""
    from torch._dynamo.callback import callback_handler

    if _on_start not in callback_handler.start_callbacks:
        callback_handler.register_start_callback(_on_start)
        callback_handler.register_end_callback(_on_end)
