"""aot_autograd's graph text, written only when a log reads it.

aot_autograd writes its joint, forward, backward and inference graphs out as annotated text
(`GraphModule.print_readable(print_output=False)`) for its logs and for its cache entries, even
with every log off: for a GPT-2-class step, at least 5 s of an 80 s cold first step on the TPU
host (benchmarks/results/tpu/first_step_phases_gpt_b4.md: fx's `_tensor_annotation`), 0.8 s of 19
on the CPU client. While the backend runs aot_autograd on a thread with torch's structured trace
and graph logs off, such a call returns a one-line note instead; with TORCH_TRACE or
TORCH_LOGS="aot_graphs" (or "aot_joint_graph") set, the text is written as before.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
from collections.abc import Iterator

from torch.fx import GraphModule

NOTE = "(graph text not written: torch_tpu skips it while torch's graph logs are off)"

_local = threading.local()
_original = GraphModule.print_readable  # what the class had when _print_readable took its place
_installed = False


@functools.wraps(GraphModule.print_readable)
def _print_readable(self, print_output: bool = True, *args, **kwargs):
    if getattr(_local, "skip", False) and not print_output:
        return NOTE
    return _original(self, print_output, *args, **kwargs)


def _logged() -> bool:
    """Whether torch's structured trace or an aot_autograd graph log is on."""
    try:
        from torch._functorch._aot_autograd import graph_compile
        from torch._logging._internal import LazyTraceHandler, trace_log
    except ImportError:  # a torch laid out otherwise: write the text as it would
        return True

    # torch's own trace handler without a folder (no TORCH_TRACE) drops itself at its first record
    if any(not isinstance(h, LazyTraceHandler) or h.root_dir is not None for h in trace_log.handlers):
        return True
    loggers = (getattr(graph_compile, name, None) for name in ("aot_graphs_log", "aot_joint_log"))
    return any(log is None or log.isEnabledFor(logging.INFO) for log in loggers)


def install() -> None:
    """Puts _print_readable in GraphModule's place, once: a wrapper another library puts over it
    later stays outermost."""
    global _installed, _original
    if not _installed:
        _original, GraphModule.print_readable = GraphModule.print_readable, _print_readable
        _installed = True


@contextlib.contextmanager
def skipped_while_unlogged() -> Iterator[None]:
    """Inside, this thread's print_readable(print_output=False) calls return NOTE unless logged."""
    install()
    before = getattr(_local, "skip", False)
    _local.skip = not _logged()
    try:
        yield
    finally:
        _local.skip = before
