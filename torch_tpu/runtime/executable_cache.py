"""Executables keyed by torch_tpu's own signatures, in memory and in the persistent cache.

jax's persistent cache is keyed by a hash of the lowered module, so a warm
process still traces and lowers every function before it can load anything.
Here the key is what torch_tpu knows before tracing: a name for the function,
its static arguments and the shapes, dtypes and placements of its array
arguments (for an eager op: the op, the input geometry and static args; for a
graph: the FX graph's own text and the input signature), plus `fingerprint()`
(platform, devices, XLA flags, torch/jax/torch_tpu versions and torch_tpu's
build identity). A hit deserializes the executable (jax.experimental.serialize_executable)
with the caller's metadata: nothing is traced, lowered or compiled.

`jit` is a drop-in for `jax.jit` over positional and keyword arguments;
`save` and `load` (and `FirstCall`) serve callers that keep their own
in-memory tables: the eager dispatcher and compiled graphs.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import inspect
import os
import pickle
import re
import sys
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np
from jax._src.array import ArrayImpl
from jax._src.interpreters import pxla
from jax.experimental import serialize_executable

from torch_tpu import debug, metrics, platforms
from torch_tpu.platforms.cpu import background_compile, compile_worker
from torch_tpu.runtime import client, global_arrays, persistent_cache

_ArrayImpl = ArrayImpl  # a concrete array (not a tracer)

_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+|<function |<lambda>")


def op_cache_size() -> int:
    """TORCH_TPU_OP_CACHE_SIZE: how many op executables stay in memory (least recently used go)."""
    return max(1, int(os.environ.get("TORCH_TPU_OP_CACHE_SIZE", "4096")))


class ExecutableCache:
    """The in-memory op executable table (the eager dispatcher's): an LRU of `size` entries
    (default `op_cache_size()`); each eviction counts in metrics' op_cache_evictions."""

    def __init__(self, size: int | None = None) -> None:
        self._entries: OrderedDict[Any, Any] = OrderedDict()
        self.size = size

    def get(self, key: Any) -> Any:
        entry = self._entries.get(key)
        if entry is not None:
            self._entries.move_to_end(key)
        return entry

    def put(self, key: Any, entry: Any) -> None:
        self._entries[key] = entry
        self._entries.move_to_end(key)
        limit = self.size if self.size is not None else op_cache_size()
        while len(self._entries) > limit:
            self._entries.popitem(last=False)
            metrics.bump("op_cache_evictions")

    def __len__(self) -> int:
        return len(self._entries)


# ---- keys -----------------------------------------------------------------------


@functools.cache
def fingerprint() -> str:
    """What every key holds besides the call itself: a change in any of these is a miss."""
    import jaxlib
    import torch

    import torch_tpu

    devices = client.devices()
    parts = [
        f"torch {torch.__version__}",
        f"jax {jax.__version__} jaxlib {jaxlib.__version__}",
        f"torch_tpu {torch_tpu.__version__} build {build_identity()}",
        f"platform {client.platform()} {devices[0].client.platform_version}",
        f"devices {len(devices)} {getattr(devices[0], 'device_kind', '')}",
        f"XLA_FLAGS {os.environ.get('XLA_FLAGS', '')}",
        f"LIBTPU_INIT_ARGS {os.environ.get('LIBTPU_INIT_ARGS', '')}",
        f"x64 {jax.config.jax_enable_x64}",
        f"op compile options {platforms.op_compile_options()}",
    ]
    return "\n".join(parts)


@functools.cache
def build_identity() -> str:
    """A hash of this build of torch_tpu: its Python sources (relative paths and contents) and the
    bytes of the C++ extension this process loaded. The version string is the same for every
    build, so an executable lowered by another build (another lowering, another extension) must
    not load."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    h = hashlib.sha256()
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted(filenames):
            if name.endswith(".py"):
                path = os.path.join(dirpath, name)
                h.update(os.path.relpath(path, root).encode() + b"\0")
                h.update(_file_digest(path))
    extension = getattr(sys.modules.get("torch_tpu._C"), "__file__", None)
    h.update(b"extension\0" + (_file_digest(extension) if extension else b"none"))
    return h.hexdigest()[:16]


def _file_digest(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return hashlib.sha256(f.read()).digest()
    except OSError:
        return b"?"


def named(value: Any) -> Any:
    """`value` with its functions as their import names (module.qualname), inside tuples and
    lists too; a nested function, a lambda or a bound method (whose object may hold state)
    stays itself: its repr holds an address."""
    if type(value) in (tuple, list):
        return type(value)(named(v) for v in value)
    if callable(value) and not isinstance(value, type) and not inspect.ismethod(value):
        name = getattr(value, "__qualname__", "<")
        return value if "<" in name else f"{value.__module__}.{name}"
    return value


def stable_text(value: Any) -> str | None:
    """`repr(value)`, functions named by their import names, if it reads the same in every
    process (no addresses, no lambdas), else None."""
    text = repr(named(value))
    return None if _ADDRESS.search(text) else text


def key_text(kind: str, parts: Any) -> str | None:
    """The persistent key of a call, or None if part of it is not stable across processes."""
    if persistent_cache.store() is None:
        return None
    body = stable_text(parts)
    return None if body is None else f"{kind}\n{fingerprint()}\n{body}"


def sharding_text(sharding) -> str | None:
    if isinstance(sharding, jax.sharding.SingleDeviceSharding):
        return f"device {next(iter(sharding.device_set)).id}"
    if isinstance(sharding, jax.sharding.NamedSharding):
        mesh = sharding.mesh
        return f"mesh {mesh.axis_names} {mesh.device_ids.tolist()} {sharding.spec} {sharding.memory_kind}"
    return None


# ---- compile and load -------------------------------------------------------------


def _device_ids(compiled) -> list[int] | None:
    try:
        return [d.id for d in compiled._executable.xla_executable.local_devices()]
    except Exception:  # an executable kind we do not know: not persisted
        return None


def to_bytes(compiled, meta: Any = None) -> bytes | None:
    """`compiled` and `meta` (picklable) as bytes `from_bytes` loads, or None if not serializable."""
    ids = _device_ids(compiled)
    if ids is None:
        return None
    try:
        payload, in_tree, out_tree = serialize_executable.serialize(compiled)
        needs = custom_calls(compiled)
        return pickle.dumps((ids, needs, payload, in_tree, out_tree, meta), protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as error:  # not serializable: keep it in memory only
        debug.log("cache", f"not serialized ({type(error).__name__}: {error})")
        return None


def from_bytes(body: bytes) -> tuple[Any, Any]:
    """(compiled, meta) of `to_bytes`'s bytes, loaded on this process's devices, with what its
    custom calls need set up (`prepare_custom_calls`). Raises if not loadable here."""
    ids, needs, payload, in_tree, out_tree, meta = pickle.loads(body)
    prepare_custom_calls(needs)
    by_id = {d.id: d for d in client.devices()}
    devices = [by_id[i] for i in ids]
    compiled = serialize_executable.deserialize_and_load(
        payload, in_tree, out_tree, backend=devices[0].client, execution_devices=devices
    )
    return compiled, meta


_CUSTOM_CALL = re.compile(r'custom_call_target="([^"]+)"')


def custom_calls(compiled) -> tuple[str, ...] | None:
    """The custom-call targets of a compiled executable (its optimized HLO's), or None if unknown."""
    try:
        text = compiled.as_text()
    except Exception:  # an executable kind without its HLO text
        return None
    return tuple(sorted(set(_CUSTOM_CALL.findall(text)))) if isinstance(text, str) else None


class NotLoadable(RuntimeError):
    """An executable that cannot run in a process that did not trace it (a host callback)."""


def prepare_custom_calls(targets: tuple[str, ...] | None) -> None:
    """Sets up what custom-call `targets` (None: unknown) need before an executable that was not
    traced in this process runs them, as jax does while lowering (the platform's own kernels:
    platforms.prepare_custom_calls). A host callback is this process's own Python function:
    NotLoadable."""
    if targets is not None and any("callback" in t for t in targets):
        raise NotLoadable(f"the executable calls back into the process that compiled it ({targets})")
    if targets is not None and not targets:
        return
    platforms.prepare_custom_calls(targets)


def save(key: str | None, compiled, meta: Any = None) -> None:
    """Stores `compiled` and `meta` (picklable) under `key`; a failure only skips persistence."""
    store = persistent_cache.store()
    if key is None or store is None or jax.process_count() > 1:
        return
    body = to_bytes(compiled, meta)
    if body is not None:
        store.put(key, body)


def load(key: str | None) -> tuple[Any, Any] | None:
    """(compiled, meta) stored under `key`, or None. Traces, lowers and compiles nothing."""
    store = persistent_cache.store()
    if key is None or store is None:
        return None
    start = time.perf_counter()
    body = store.get(key)
    if body is None:
        return None
    try:
        found = from_bytes(body)
    except NotLoadable as error:
        debug.log("cache", f"not loaded: {error}")
        return None
    except Exception as error:  # checked, yet not loadable here: compile again
        kind = key.splitlines()[0]
        persistent_cache._warn(f"entry for {kind} not loadable ({type(error).__name__}); compiling again")
        return None
    metrics.bump("persistent_cache_hits")
    metrics.record_load(time.perf_counter() - start)
    return found


def direct_call(compiled) -> tuple[Callable, list] | None:
    """(execute, handlers) running `compiled` (a jax Compiled) without jax's call layer:
    `execute(arrays)` runs it on arrays already on its device, `.consume_with_handlers(handlers)`
    gives its flat outputs. None where jax's call does more (effects, host callbacks, mutable
    arrays, constants passed as arguments, inputs it pruned) or for an executable of another kind.
    """
    try:
        params = compiled._params
        call = compiled._executable.unsafe_call
        if not isinstance(call, pxla.ExecuteReplicated) or params.is_high or params.const_args:
            return None
        if call.ordered_effects or call.has_unordered_effects or call.has_host_callbacks or call.mut:
            return None
        if call.pgle_profiler is not None or call.kept_var_idx != set(range(params.in_tree.num_leaves)):
            return None
        return call.xla_executable.execute_sharded, list(call.out_handler.handlers)
    except AttributeError:  # another jax's internals: its own call only
        return None


class LazyJit:
    """`jax.jit(fn, **kwargs)`, made at its first use: making one costs about 100 µs, and an eager
    op's entry whose executable compiles in the worker process never uses it."""

    __slots__ = ("_fn", "_jitted", "_kwargs")

    def __init__(self, fn: Callable, **kwargs):
        self._fn, self._kwargs, self._jitted = fn, kwargs, None

    @property
    def jitted(self):
        if self._jitted is None:
            self._jitted = jax.jit(self._fn, **self._kwargs)
        return self._jitted

    def __call__(self, *args, **kwargs):
        return self.jitted(*args, **kwargs)

    def lower(self, *args, **kwargs):
        return self.jitted.lower(*args, **kwargs)


class FirstCall:
    """Stands in for an executable until its first call: lowers and compiles `jitted` for the
    call's arguments (with `options`, XLA compiler options), persists it with `meta()` (read
    after tracing), and puts the compiled executable at `owner.<attr>`, so later calls skip
    this wrapper. `after(lowered, compiled)`, if given, runs after each compile, before the
    executable is persisted (ops/op_tier_up.py)."""

    __slots__ = ("after", "attr", "jitted", "key", "meta", "options", "owner")

    def __init__(
        self,
        jitted,
        key: str | None,
        meta: Callable[[], Any],
        owner: Any,
        attr: str,
        options: dict | None = None,
        after: Callable[[Any, Any], None] | None = None,
    ):
        self.jitted = jitted
        self.key = key
        self.meta = meta
        self.owner = owner
        self.attr = attr
        self.options = options
        self.after = after

    def __call__(self, *args):
        compiled = self.compile(*args)
        if getattr(self.owner, self.attr) is self:  # not yet replaced by a recompile (op_tier_up)
            setattr(self.owner, self.attr, compiled)
        return compiled(*args)

    def compile(self, *args):
        """Lowers and compiles for `args` (arrays, or their jax.ShapeDtypeStruct), persists and
        returns the executable; the owner keeps this stand-in (background compiles use this)."""
        lowered = self.jitted.lower(*args)
        compiled = lowered.compile(compiler_options=self.options)
        if self.after is not None:
            self.after(lowered, compiled)
        save(self.key, compiled, self.meta())
        return compiled


# ---- a persistent jax.jit ------------------------------------------------------------


def _leaf_signature(x):
    if type(x) is _ArrayImpl:  # committed or not: a Compiled's outputs keep what it was compiled with
        return (x.shape, x.dtype, x.weak_type, x.sharding, x._committed)
    if type(x) is jax.ShapeDtypeStruct:  # what an array will be (Jit.ready): a committed one
        return (x.shape, x.dtype, x.weak_type, x.sharding, True)
    if isinstance(x, (np.ndarray, np.generic)):
        return ("np", x.shape, x.dtype)
    if isinstance(x, (bool, int, float, complex)):
        return type(x)
    raise TypeError(type(x))


def _leaf_text(sig) -> str | None:
    if isinstance(sig, tuple) and len(sig) == 5:
        shape, dtype, weak, sharding, committed = sig
        place = sharding_text(sharding)
        return None if place is None else f"{dtype}{list(shape)}{'w' if weak else ''} {place} {committed}"
    return repr(sig)


class Jit:
    """`jax.jit(fn, ...)` whose executables are also kept in the persistent cache. The key is
    `name`, `key`, the static arguments and each array argument's shape, dtype and placement."""

    def __init__(
        self,
        fn: Callable,
        name: str | None = None,
        key: Any = (),
        static_argnums: int | Sequence[int] = (),
        static_argnames: str | Sequence[str] = (),
        **jit_kwargs,
    ):
        self.fn = fn
        self.name = name or f"{fn.__module__}.{fn.__qualname__}"
        self.key = key
        nums = {static_argnums} if isinstance(static_argnums, int) else set(static_argnums)
        names = {static_argnames} if isinstance(static_argnames, str) else set(static_argnames)
        try:  # as jax.jit does: a static argument is static whether passed by position or by name
            params = list(inspect.signature(fn).parameters)
        except (TypeError, ValueError):
            params = []
        nums |= {params.index(n) for n in names if n in params}
        names |= {params[i] for i in nums if i < len(params)}
        self._static_argnums = tuple(sorted(nums))
        self._static_argnames = tuple(sorted(names))
        self._jitted = jax.jit(
            fn, static_argnums=self._static_argnums, static_argnames=self._static_argnames, **jit_kwargs
        )
        self._compiled: dict = {}
        self._pending: dict = {}  # signature -> its background compile (see ready)
        self._key_signatures: dict = {}  # see ready_by
        functools.update_wrapper(self, fn)

    def __call__(self, *args, **kwargs):
        global_arrays.before_program()  # the small programs eager lowerings run count too
        sig, dyn_args, dyn_kwargs = self._signature(args, kwargs)
        if sig is None:  # an argument kind we do not key on (or an unhashable static): plain jit
            return self._jitted(*args, **kwargs)
        compiled = self._compiled.get(sig)
        if compiled is None:
            compiled = self._compiled[sig] = self._compile(sig, args, kwargs)
        return compiled(*dyn_args, **dyn_kwargs)

    def ready(self, *args, **kwargs) -> bool:
        """Whether the executable for these arguments (arrays or jax.ShapeDtypeStruct) is at hand:
        in memory, or loaded now from the persistent cache. If not, it starts compiling in the
        background (platforms/cpu/background_compile.py), and a later call says True once it is done
        (or failed: the call then compiles it and raises what it raises)."""
        return self._ready(self._signature(args, kwargs)[0], args, kwargs)

    def ready_by(self, key, make_args: Callable[[], tuple]) -> bool:
        """`ready(*make_args())`, where hashable `key` decides the executable's signature and is
        cheaper to build than the arguments: later calls with that key skip building them."""
        sig = self._key_signatures.get(key)
        if sig is None:
            args = make_args()
            sig = self._key_signatures[key] = self._signature(args, {})[0]
            return self._ready(sig, args, {})
        return self._ready(sig, None, None)

    def _ready(self, sig, args, kwargs) -> bool:
        """`ready` for a call of signature `sig` (`args`, `kwargs`: its arguments, needed only the
        first time a signature is asked about)."""
        if sig is None or sig in self._compiled:
            return True
        job = self._pending.get(sig)
        if job is None:
            found = load(self._persist_key(sig))
            if found is not None:
                self._compiled[sig] = found[0]
                return True
            if args is None:  # asked by key after its background compile failed: the call compiles it
                return True
            request = ("jit", (self.fn.__module__, self.fn.__qualname__, args, kwargs)) if self._importable() else None
            self._pending[sig] = background_compile.submit(
                lambda: self._compile(sig, args, kwargs, loaded=False), request
            )
            return False
        if not background_compile.called(job):
            return False
        del self._pending[sig]
        if job.error is None:
            try:
                self._compiled[sig] = from_bytes(job.result)[0] if job.remote else job.result
            except Exception:  # not loadable here (a host callback): the call compiles it
                pass
        return True

    def _importable(self) -> bool:
        """Whether the compile worker finds this Jit as its function's module attribute."""
        module = sys.modules.get(self.fn.__module__)
        return getattr(module, self.fn.__qualname__, None) is self

    def _signature(self, args, kwargs) -> tuple:
        """(key of the call's executable or None, dynamic args, dynamic kwargs)."""
        statics = self._static_argnums
        if statics:
            dyn_args = tuple(a for i, a in enumerate(args) if i not in statics)
            static = tuple(args[i] for i in statics if i < len(args))
        else:
            dyn_args, static = args, ()
        if self._static_argnames and kwargs:
            static = (*static, *((n, kwargs[n]) for n in self._static_argnames if n in kwargs))
            dyn_kwargs = {k: v for k, v in kwargs.items() if k not in self._static_argnames}
        else:
            dyn_kwargs = kwargs
        leaves, tree = jax.tree_util.tree_flatten((dyn_args, dyn_kwargs))
        try:
            sig = (static, tree, tuple(_leaf_signature(x) for x in leaves))
            hash(sig)
        except TypeError:
            sig = None
        return sig, dyn_args, dyn_kwargs

    def _persist_key(self, sig) -> str | None:
        static, tree, leaf_sigs = sig
        texts = [_leaf_text(s) for s in leaf_sigs]
        return None if None in texts else key_text("jit", (self.name, self.key, static, str(tree), texts))

    def _compile(self, sig, args, kwargs, loaded: bool = True):
        key = self._persist_key(sig)
        found = load(key) if loaded else None
        if found is not None:
            return found[0]
        compiled = self._jitted.lower(*args, **kwargs).compile(compiler_options=platforms.op_compile_options())
        save(key, compiled)
        return compiled

    def lower(self, *args, **kwargs):
        return self._jitted.lower(*args, **kwargs)


@compile_worker.handler("jit")
def _compile_jit_request(spec: tuple) -> bytes:
    """In the compile worker: the executable `Jit.ready` asked for."""
    module, qualname, args, kwargs = spec
    jitted = getattr(importlib.import_module(module), qualname)
    sig = jitted._signature(args, kwargs)[0]
    body = to_bytes(jitted._compile(sig, args, kwargs, loaded=False))
    if body is None:
        raise RuntimeError(f"the executable of {qualname} cannot be serialized")
    return body


def jit(fn: Callable | None = None, **kwargs):
    """`Jit(fn, **kwargs)`; usable as `@jit` or `@functools.partial(jit, static_argnums=...)`."""
    if fn is None:
        return functools.partial(jit, **kwargs)
    return Jit(fn, **kwargs)
