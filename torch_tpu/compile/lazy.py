"""Lazy execution: ops are recorded, then run as one fused XLA executable.

`torch_tpu.eager_mode(False)` switches the dispatcher from op by op to recording.
Each op still goes through its usual plan: the meta run gives PyTorch's shapes,
dtypes and errors, and the op's cached entry (op_entries.Entry) gives the jax
function over flat storage buffers. Instead of running that function, the
dispatcher records it and puts a `LazyArray` (shape and dtype only) where the
storage's buffer would go. Views are C++ metadata over the same storage and
in-place ops swap the storage's buffer, so both keep their eager semantics.

The recorded ops run when a value is needed: `torch_tpu.sync()`, or any read of a
pending buffer outside the recording dispatcher (`.item()`, `.cpu()`, printing, an
op with a host check or an eager lowering, a CPU fallback, a compiled graph).
The C++ buffer handle calls `_resolve` for that (csrc/device_buffer.cc). The
trace becomes one jax function that replays the ops' functions, with the
buffers still referenced (live LazyArrays) as its outputs: temporaries that died
are never materialized. That function is compiled as a graph-mode graph is
(compile/options.py's compile path, the persistent cache, `graph_compiles` /
`graph_cache_hits`) and cached in memory keyed by the recorded sequence: the
ops' cache entries, how their inputs are wired, which values are outputs, and
the shapes of the concrete inputs. The same training step at the same shapes
therefore runs one cached executable.

On TPU `eager_mode(False)` runs a trace every `platforms.lazy_segment_ops()` ops and records on
in a new one: executables run asynchronously, so the chip runs one segment while the host records
the next. The cuts fall at the same op counts at every step of a steady loop, so each segment's
executable is compiled once. An optimizer step's state creation runs apart from its update
(fused_optimizer.py), so step 2 records what step 1 did and compiles nothing.
"""

from __future__ import annotations

import collections
import concurrent.futures
import hashlib
import math
import sys
import threading
import time
import weakref

import jax
import jax.numpy as jnp
import numpy as np
import torch

from torch_tpu import _C, debug, metrics, platforms
from torch_tpu.compile import options as compile_options
from torch_tpu.device import memory
from torch_tpu.ops import geometry as geo
from torch_tpu.ops import scalars, tensors
from torch_tpu.ops.dtypes import TORCH_TO_NUMPY
from torch_tpu.ops.rng import key_from_data
from torch_tpu.runtime import client, executable_cache

# A trace longer than this runs at once (a loop that never syncs must not grow without end).
MAX_OPS = 50_000
# Fused executables kept in memory (least recently used dropped first).
MAX_EXECUTABLES = 256


class LazyArray:
    """A pending flat storage buffer: the `node`-th value of trace `trace_id`."""

    __slots__ = ("__weakref__", "device", "dtype", "ndim", "node", "shape", "size", "trace_id", "value")

    def __init__(self, trace_id: int, node: int, aval, device: int):
        self.device = device
        self.trace_id = trace_id
        self.node = node
        self.shape = tuple(aval.shape)
        self.dtype = np.dtype(aval.dtype)
        self.ndim = len(self.shape)
        self.size = math.prod(self.shape)  # (np.prod costs ~3 µs: an optimizer step makes thousands)
        self.value: jax.Array | None = None

    def reshape(self, *shape):
        shape = shape[0] if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else shape
        return _Recorder.call(_reshape, (tuple(shape),), self)

    def __repr__(self) -> str:
        state = "pending" if self.value is None else "resolved"
        return f"LazyArray({self.dtype.name}{list(self.shape)}, {state})"


class _Trace:
    """The ops recorded since the last run, on one device."""

    _ids = 0

    def __init__(self, device: int):
        _Trace._ids += 1
        self.id = _Trace._ids
        self.device = device
        self.leaves: list = []  # concrete inputs: jax arrays and Python numbers
        self.leaf_index: dict[int, int] = {}  # id(jax array) -> leaf position
        self.rngs: list[np.ndarray] = []  # generator data of random ops
        self.records: list[tuple] = []  # (entry, wiring, rng position or None, first value)
        self.values: list[weakref.ref] = []  # value number -> its LazyArray

    def leaf(self, x) -> tuple[int, int]:
        if isinstance(x, jax.Array):
            k = self.leaf_index.get(id(x))
            if k is None:
                k = self.leaf_index[id(x)] = len(self.leaves)
                self.leaves.append(x)
            return (0, k)
        self.leaves.append(x)  # a Python number: a traced scalar, as in eager
        return (0, len(self.leaves) - 1)


_lock = threading.RLock()
_trace: _Trace | None = None
_executables: dict[tuple, tuple[object, int]] = {}  # key -> (executable, XLA temporary bytes)
_enabled = False
_installed = False
_segment_ops = MAX_OPS  # ops a trace records before it runs and recording goes on in a new one
_background: concurrent.futures.Future | None = None  # a trace running on _worker (run_in_background)
_worker = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="torch_tpu_lazy")


# ---- mode ------------------------------------------------------------------------


def _install() -> None:
    global _installed
    if not _installed:
        _C._set_lazy_hook(LazyArray, _resolve)
        _installed = True


def set_enabled(on: bool, segment_ops: int = 0, in_background: bool = False) -> None:
    """Lazy recording on or off; turning it off runs what was recorded (`in_background`: on a
    worker thread, see run_in_background). While on, a trace runs after every `segment_ops` ops
    (0: only at MAX_OPS) and recording goes on in a new one."""
    global _enabled, _segment_ops
    _install()
    with _lock:
        try:
            if _enabled and not on:
                run_in_background() if in_background else flush()
        finally:  # the mode changes even when the trace fails to run (out of memory)
            _enabled = on
            _segment_ops = segment_ops if on and 0 < segment_ops < MAX_OPS else MAX_OPS
            _C._set_lazy_recording(on)
            tensors.lazy = _Recorder if on else None


def enabled() -> bool:
    return _enabled


class eager_mode:
    """`torch_tpu.eager_mode(False)` records ops lazily, `eager_mode(True)` runs them one by one
    (the default). Takes effect at once; as a context manager it restores the previous mode on
    exit (like `torch.set_grad_enabled`)."""

    def __init__(self, enabled: bool):
        self.prev = not _enabled
        self.mode = bool(enabled)
        self._set(self.mode)

    def __enter__(self) -> None:
        self._set(self.mode)

    def __exit__(self, *exc) -> None:
        self._set(self.prev)

    @staticmethod
    def _set(eager: bool) -> None:
        set_enabled(not eager, 0 if eager else platforms.lazy_segment_ops())


def is_eager_mode() -> bool:
    """True when ops run one by one, False when they are recorded lazily."""
    return not _enabled


# ---- recording ----------------------------------------------------------------------


def _aval(x):
    if isinstance(x, LazyArray):
        return jax.ShapeDtypeStruct(x.shape, x.dtype)
    return x


class _FnOp:
    """A jax function recorded by an eager lowering (read, compute, write), like an op entry."""

    __slots__ = ("lazy_avals", "out_tree", "persist", "run", "traceable")

    def __init__(self, run, out, persist: str | None):
        self.run = self.traceable = run
        self.lazy_avals, self.out_tree = jax.tree_util.tree_flatten(out)
        self.persist = persist  # what it computes, as text that reads the same in every process


_fn_ops: dict[tuple, _FnOp] = {}


def _fn_op(fn, static: tuple, treedef, leaves: list) -> _FnOp:
    key = (fn, static, treedef, tuple(_leaf_key(_aval(x)) for x in leaves))
    op = _fn_ops.get(key)
    if op is None:

        def call(inputs):
            return fn(*static, *jax.tree_util.tree_unflatten(treedef, inputs))

        def run(inputs, _rng):
            return jax.tree_util.tree_leaves(call(inputs))

        out = jax.eval_shape(call, [_aval(x) for x in leaves])
        persist = executable_cache.stable_text((fn, static, str(treedef), key[3]))
        op = _fn_ops[key] = _FnOp(run, out, persist)
    return op


def _reshape(shape, x):
    return x.reshape(shape)


def _read(geom, buf):
    return geo.read(buf, geom)


def _write(geom, buf, value):
    return geo.write(buf, geom, jnp.broadcast_to(value, geom.sizes), platforms.shaped_buffers())


def _update(fn, static, geoms, bufs, *args):
    values = [[geo.read(b, g) for b, g in zip(bs, gs)] for bs, gs in zip(bufs, geoms)]
    new = fn(*static, values, *args)
    shaped = platforms.shaped_buffers()
    return [
        [None if v is old else geo.write(b, g, v, shaped) for v, old, b, g in zip(vs, olds, bs, gs)]
        for vs, olds, bs, gs in zip(new, values, bufs, geoms)
    ]


def _zeros(n, dtype):
    return jnp.zeros(n, dtype)


def _flat(dtype, value):
    """A fresh value as its buffer: flat, or as it is where buffers are shaped."""
    value = value.astype(dtype)
    return value if platforms.shaped_buffers() else value.reshape(-1)


def _raw_buffer(t: torch.Tensor):
    info = _C._arg_info(t)  # does not run pending work while recording
    buf = info[1] if info is not None else None
    return tensors.buffer_of(t, recorded=True) if buf is None else buf


class _Recorder:
    """What the dispatcher calls in lazy mode (ops/tensors.py's `lazy`)."""

    @staticmethod
    def record(entry, inputs: list, rng_data, device: int) -> list[LazyArray]:
        """Records `entry.traceable(inputs, rng)`; its flat results, as pending buffers."""
        if entry.lazy_avals is None:
            entry.lazy_avals = jax.eval_shape(
                lambda xs, data: entry.traceable(xs, None if data is None else key_from_data(data)),
                [_aval(x) for x in inputs],
                rng_data,
            )
        return _append(entry, inputs, rng_data, device)

    @staticmethod
    def call(fn, static: tuple, *args, device: int | None = None):
        """`fn(*static, *args)` recorded: a pytree of pending arrays (for eager lowerings)."""
        leaves, treedef = jax.tree_util.tree_flatten(args)
        if device is None:
            device = next((x.device for x in leaves if isinstance(x, LazyArray)), None)
        if device is None:
            device = _trace.device if _trace is not None else _C._current_device()
        op = _fn_op(fn, static, treedef, leaves)
        return jax.tree_util.tree_unflatten(op.out_tree, _append(op, leaves, None, device))

    @staticmethod
    def read(t: torch.Tensor):
        """The value of tpu tensor `t` (shaped), pending."""
        buf = _raw_buffer(t)
        return _Recorder.call(_read, (tensors.tensor_geometry(t, buf),), buf, device=t.device.index)

    @staticmethod
    def write(t: torch.Tensor, value) -> None:
        """Writes `value` into `t` (a view writes into its base), pending."""
        buf = _raw_buffer(t)
        new = _Recorder.call(_write, (tensors.tensor_geometry(t, buf),), buf, value, device=t.device.index)
        _C._set_buffer(t, new, t.dtype, new.size)

    @staticmethod
    def update(fn, static: tuple, lists: list, *args, device: int) -> None:
        """Records `fn(*static, values, *args)`, where `values` are the values of the tpu tensor
        lists `lists`, and writes back the lists of new values it returns (one per tensor; the
        very value read leaves its tensor as it was): the reads, the computation and the writes
        are one recorded op, not one per tensor (an optimizer's fused step)."""
        bufs = [[_raw_buffer(t) for t in ts] for ts in lists]
        geoms = tuple(tuple(tensors.tensor_geometry(t, b) for t, b in zip(ts, bs)) for ts, bs in zip(lists, bufs))
        new = _Recorder.call(_update, (fn, static, geoms), bufs, *args, device=device)
        for ts, values in zip(lists, new):
            for t, value in zip(ts, values):
                if value is not None:
                    _C._set_buffer(t, value, t.dtype, value.size)

    @staticmethod
    def zeros(n: int, dtype: np.dtype, device: int) -> LazyArray:
        """A never-written storage's buffer, `n` zeros, pending: made inside the trace."""
        return _Recorder.call(_zeros, (n, np.dtype(dtype)), device=device)

    @staticmethod
    def wrap(value, device: int, dtype: torch.dtype) -> torch.Tensor:
        """A new tpu tensor holding `value`, pending."""
        flat = _Recorder.call(_flat, (np.dtype(TORCH_TO_NUMPY[dtype]),), value, device=device)
        return _C._wrap(flat, list(value.shape), dtype, device)

    @staticmethod
    def pending(x) -> bool:
        return isinstance(x, LazyArray)

    @staticmethod
    def flush() -> None:
        flush()

    @staticmethod
    def concrete(inputs: list) -> list:
        """`inputs` with pending buffers run (for an op that must run eagerly)."""
        if not any(isinstance(x, LazyArray) for x in inputs):
            return inputs
        return [_resolve(x, True) if isinstance(x, LazyArray) else x for x in inputs]


def _append(op, inputs: list, rng_data, device: int) -> list[LazyArray]:
    global _trace
    if _background is not None:  # its values may be inputs here
        _join_background()
    with _lock:
        trace = _trace
        if trace is not None and (trace.device != device or len(trace.records) >= _segment_ops):
            flush()
            trace = None
        if trace is None:
            trace = _trace = _Trace(device)
        wiring = []
        for x in inputs:
            if isinstance(x, LazyArray):
                if x.value is not None:
                    x = x.value
                elif x.trace_id == trace.id:
                    wiring.append((1, x.node))
                    continue
                else:
                    raise RuntimeError(f"torch_tpu lazy mode: {x} belongs to a trace that failed to run")
            wiring.append(trace.leaf(x))
        rng = None
        if rng_data is not None:
            rng = len(trace.rngs)
            trace.rngs.append(rng_data)
        first = len(trace.values)
        avals = jax.tree_util.tree_leaves(op.lazy_avals)
        out = [LazyArray(trace.id, first + j, a, device) for j, a in enumerate(avals)]
        trace.values.extend(weakref.ref(o) for o in out)
        trace.records.append((op, tuple(wiring), rng, first))
        metrics.bump("lazy_ops")
        return out


# ---- running ------------------------------------------------------------------------


def _resolve(x: LazyArray, force: bool):
    """The C++ buffer handle's hook: the concrete buffer, running the trace if `force`."""
    if x.value is None and force:
        _join_background()
        if x.value is None:
            flush()
        if x.value is None:
            raise RuntimeError(f"torch_tpu lazy mode: {x} belongs to a trace that failed to run")
    return x if x.value is None else x.value


def _replay(records: list, outputs: list[int]):
    def fn(leaves, rngs):
        values: dict = {}
        for entry, wiring, rng, first in records:
            inputs = [leaves[k] if kind == 0 else values[k] for kind, k in wiring]
            key = None if rng is None else key_from_data(rngs[rng])
            for j, v in enumerate(entry.traceable(inputs, key)):
                values[first + j] = v
        return [values[v] for v in outputs]

    return fn


def _leaf_key(x):
    if isinstance(x, (jax.Array, jax.ShapeDtypeStruct)):  # (a pending input's shape too)
        return (tuple(x.shape), np.dtype(x.dtype), x.weak_type)
    return type(x)


def flush() -> None:
    """Runs the recorded ops as one executable and resolves every live pending buffer."""
    _join_background()
    with _lock:
        ended = _end_trace()
        if ended is not None:
            _run(*ended)


def run_in_background() -> None:
    """Ends the trace and runs it on a worker thread, as `flush` would: its compile overlaps what
    the host does next (dynamo tracing an optimizer step after creating its state). A read of one
    of its values, a new recording, `flush` and `sync` wait for it first, and raise its error."""
    global _background
    _join_background()
    with _lock:
        ended = _end_trace()  # (its outputs chosen here: the host may drop references meanwhile)
        if ended is not None:
            _background = _worker.submit(_run, *ended)


def _end_trace() -> tuple[_Trace, list[int], tuple[int, ...]] | None:
    """Under _lock: the current trace taken out of recording, with the values still referenced
    (its outputs) and the inputs it may donate; None where nothing recorded is referenced."""
    global _trace
    trace, _trace = _trace, None
    if trace is None:
        return None
    outputs = [v for v, ref in enumerate(trace.values) if ref() is not None]
    return (trace, outputs, _donatable(trace, outputs)) if outputs else None


def _join_background() -> None:
    """Waits for the trace run_in_background started; raises its error (to the first caller)."""
    global _background
    job = _background
    if job is None:
        return
    try:
        job.result()
    finally:
        if _background is job:
            _background = None


def _run(trace: _Trace, outputs: list[int], donated: tuple[int, ...]) -> None:
    """Compiles (or finds) and runs the executable of `trace`, giving its `outputs` their values."""
    key = (
        trace.device,
        tuple((entry, wiring, rng is not None) for entry, wiring, rng, _ in trace.records),
        tuple(outputs),
        tuple(_leaf_key(x) for x in trace.leaves),
        len(trace.rngs),
        donated,
    )
    what = f"the lazy graph of {len(trace.records)} ops"
    compiled, temp_bytes = _executables.pop(key, (None, 0))
    if compiled is None:
        persist = _persist_key(trace, key)
        found = executable_cache.load(persist)
        if found is not None:  # XLA's temporaries as measured at compile time (a loaded one need not say)
            compiled, temp_bytes = found[0], found[1] if isinstance(found[1], int) else memory.temp_bytes_of(found[0])
        else:
            with memory.out_of_memory_as_torch(trace.device, "compiling " + what):
                compiled = _compile(trace, outputs, donated)
            temp_bytes = memory.temp_bytes_of(compiled)
            executable_cache.save(persist, compiled, temp_bytes)
    else:
        metrics.bump("graph_cache_hits")
    _executables[key] = (compiled, temp_bytes)
    if len(_executables) > MAX_EXECUTABLES:
        del _executables[next(iter(_executables))]
    given, kept = _split(_device_numbers(trace), donated)
    with memory.out_of_memory_as_torch(trace.device, "running " + what):
        flat = compiled(given, kept, trace.rngs)
    memory.note_temp_bytes(trace.device, temp_bytes)
    metrics.bump("executions")
    metrics.bump("donated_buffers", len(donated))
    metrics.bump("lazy_runs")
    for v, value in zip(outputs, flat):
        lazy = trace.values[v]()
        if lazy is not None:
            lazy.value = value


def _persist_key(trace: _Trace, key: tuple) -> str | None:
    """The trace's persistent key: its in-memory key with each recorded op as its own persistent
    text (an op entry's key, a recorded function's name and arguments), hashed; None if an op
    has none (not persisted)."""
    texts = []
    for op, wiring, rng, _ in trace.records:
        if op.persist is None:
            return None
        texts.append((op.persist, wiring, rng is not None))
    body = repr((texts, *key[2:]))
    return executable_cache.key_text("lazy", (trace.device, hashlib.sha256(body.encode()).hexdigest()))


def _device_numbers(trace: _Trace) -> list:
    """The trace's inputs with its Python numbers as cached weakly typed device scalars (what
    jax makes of a number, without putting it on the device at every run: an optimizer step's
    lr and bias corrections are a few values repeated in a list per parameter)."""
    return [scalars.device_scalar(x, trace.device) if type(x) in _NUMBERS else x for x in trace.leaves]


_NUMBERS = (bool, int, float)


def _donatable(trace: _Trace, outputs: list[int]) -> tuple[int, ...]:
    """Positions of the leaves the trace may hand to XLA: arrays nothing else holds any more
    (their storages were overwritten while recording: an optimizer step's parameters and state),
    each matched to an output of its shape and dtype that can take its memory over. Without
    it the old and the new values of every parameter and state tensor are live at once."""
    if not platforms.donates_buffers():
        return ()
    free: collections.Counter = collections.Counter()
    for v in outputs:
        value = trace.values[v]()
        if value is not None:
            free[(value.shape, np.dtype(value.dtype))] += 1
    donated = []
    leaves = trace.leaves
    for k in range(len(leaves)):
        x = leaves[k]
        # held by trace.leaves, `x` and getrefcount's argument only: no storage reads it again
        if isinstance(x, jax.Array) and sys.getrefcount(x) <= 3:
            aval = (tuple(x.shape), np.dtype(x.dtype))
            if free[aval] > 0:
                free[aval] -= 1
                donated.append(k)
    return tuple(donated)


def _split(leaves: list, donated: tuple[int, ...]) -> tuple[list, list]:
    """(the donated leaves, the others), each in order."""
    given = set(donated)
    return [leaves[k] for k in donated], [x for k, x in enumerate(leaves) if k not in given]


def _compile(trace: _Trace, outputs: list[int], donated: tuple[int, ...]):
    sharding = jax.sharding.SingleDeviceSharding(client.jax_device(trace.device))
    replay = _replay(trace.records, outputs)
    n, given = len(trace.leaves), set(donated)
    kept = [k for k in range(n) if k not in given]

    def fn(donated_leaves, kept_leaves, rngs):
        leaves: list = [None] * n
        for k, x in zip(donated, donated_leaves):
            leaves[k] = x
        for k, x in zip(kept, kept_leaves):
            leaves[k] = x
        return replay(leaves, rngs)

    jitted = jax.jit(fn, out_shardings=sharding, donate_argnums=(0,) if donated else ())
    start = time.perf_counter()
    loaded_before = metrics.counters()["persistent_cache_hits"]
    lowered = jitted.lower(*_split(trace.leaves, donated), trace.rngs)
    compiled = compile_options.compile_lowered(lowered, compile_options.DEFAULT)
    seconds = time.perf_counter() - start
    metrics.record_compile("graph", seconds)
    if metrics.counters()["persistent_cache_hits"] == loaded_before:
        metrics.bump("graph_compiles")
    debug.log("compile", f"lazy trace: {len(trace.records)} ops, {len(outputs)} outputs in {seconds:.3f} s")
    return compiled


def sync() -> None:
    """Runs pending lazy work (a no-op in eager mode)."""
    if _trace is not None or _background is not None:
        flush()
