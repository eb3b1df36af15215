// Mirrors torch RecordFunction regions (torch.profiler.record_function, and
// optionally every ATen op) into the jax/XLA profiler trace.
#pragma once

#include <Python.h>

namespace torch_tpu {

// Starts mirroring: `enter(name)` is called when a region opens and must
// return an object whose __exit__(None, None, None) closes it (a jax
// TraceAnnotation). `ops` adds ATen ops and autograd nodes to user regions.
// Caller holds the GIL.
void start_trace_annotations(PyObject* enter, bool ops);

// Stops mirroring; regions still open are closed when they end. Idempotent.
void stop_trace_annotations();

}  // namespace torch_tpu
