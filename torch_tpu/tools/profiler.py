"""`torch_tpu.tools.profile(path)`: records a jax/XLA profiler trace of the tpu work in a block.

The trace (`<path>/plugins/profile/<run>/*.xplane.pb`, and `perfetto_trace.json.gz` unless
turned off) opens in TensorBoard's profile plugin or in Perfetto (ui.perfetto.dev). While it
records, torch's RecordFunction regions are mirrored into it as trace annotations:
`torch.profiler.record_function("name")` blocks always, and every ATen op and autograd node
when `annotate_ops` is True, so XLA executions appear under the op that launched them.
It nests inside (or around) `torch.profiler.profile()`; each profiler writes its own trace.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
from collections.abc import Iterator

import jax

from torch_tpu import _C
from torch_tpu.runtime import client


def _enter_annotation(name: str) -> jax.profiler.TraceAnnotation:
    annotation = jax.profiler.TraceAnnotation(name)
    annotation.__enter__()
    return annotation


@contextlib.contextmanager
def profile(
    path: str | os.PathLike,
    *,
    annotate_ops: bool = True,
    create_perfetto_trace: bool = True,
) -> Iterator[pathlib.Path]:
    """Records a jax/XLA trace of the block into directory `path` (created if needed).

    Work queued before the block is waited for first, and work queued inside it is waited
    for before the trace stops, so the trace holds exactly the block's device work.
    Yields the trace directory. Only one trace can record at a time (a jax limit).
    """
    directory = pathlib.Path(path)
    directory.mkdir(parents=True, exist_ok=True)
    client.synchronize()
    jax.profiler.start_trace(directory, create_perfetto_trace=create_perfetto_trace)
    _C._start_trace_annotations(_enter_annotation, annotate_ops)
    try:
        yield directory
    finally:
        try:
            client.synchronize()
        finally:
            _C._stop_trace_annotations()
            jax.profiler.stop_trace()


def trace_files(path: str | os.PathLike) -> list[pathlib.Path]:
    """The trace files recorded under `path`: *.xplane.pb and *.trace.json.gz/perfetto files."""
    root = pathlib.Path(path)
    patterns = ("*.xplane.pb", "*.trace.json.gz", "perfetto_trace.json.gz")
    return sorted({p for pattern in patterns for p in root.rglob(pattern)})
