"""Runs an ATen op on tpu tensors through its lowering.

Per call: read each tpu tensor as (flat buffer, geometry), look the call's
signature up in the op executable cache, run the jitted function, then wrap
fresh outputs in new storages and swap the buffers of mutated arguments.
On a cache miss the op first runs on meta tensors: that gives PyTorch's own
output shapes, dtypes and error checks.
"""

from __future__ import annotations

import functools
import math
import time
import warnings
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import torch
from torch._ops import OpOverload

from torch_tpu import _C, debug, metrics
from torch_tpu.device import memory
from torch_tpu.ops import geometry as geo
from torch_tpu.ops import precision
from torch_tpu.ops.dtypes import TORCH_TO_NUMPY, to_numpy_dtype
from torch_tpu.ops.registry import Lowering
from torch_tpu.runtime import client
from torch_tpu.runtime.executable_cache import ExecutableCache

_cache = ExecutableCache()

# Set by torch_tpu.distributed once a tensor is sharded (torch_tpu/distributed/sharding.py):
# place_inputs(inputs, bound) moves a call's single-device inputs onto the mesh of its sharded
# ones (jax.jit refuses mixed device sets); keep_layout(old, new) keeps a written tensor's sharding.
spmd = None
# Set by torch_tpu/compile/lazy.py in lazy mode: record(entry, inputs, rng_data, device) records
# the op and gives pending buffers; concrete(inputs) runs pending ones (for an op run eagerly).
lazy = None


class _TensorSlot:
    __slots__ = ("geom", "index")

    def __init__(self, index: int, geom):
        self.index = index
        self.geom = geom


class _WrappedNumber:
    """A Python number torch passed for a Tensor argument (`x + 2`): traced like a CPU 0-dim tensor."""

    __slots__ = ("value",)

    def __init__(self, value):
        self.value = value


def _wrap_numbers(bound: list, positions: tuple[int, ...]) -> None:
    for i in positions:
        v = bound[i]
        if isinstance(v, (bool, float)) or (isinstance(v, int) and -(2**63) <= v < 2**63):
            bound[i] = _WrappedNumber(v)


class _ScalarSlot:
    """A CPU 0-dim tensor: traced as a weakly typed scalar."""

    __slots__ = ("index", "tensor")

    def __init__(self, index: int, tensor: torch.Tensor):
        self.index = index
        self.tensor = tensor


# ---- reading arguments ------------------------------------------------------


def buffer_of(t: torch.Tensor) -> jax.Array:
    """The flat buffer behind a tpu tensor; unwritten storage becomes zeros."""
    buf = _C._get_buffer(t)
    if buf is None:
        storage = t.untyped_storage()
        itemsize = t.element_size()
        n = storage.nbytes() // itemsize
        buf = _zeros(n, TORCH_TO_NUMPY[t.dtype], t.device.index)
        _C._set_buffer(storage, buf, t.dtype, n)
    return buf


@functools.cache
def _zeros_fn(n: int, dtype: np.dtype, device: int) -> Callable:
    sharding = jax.sharding.SingleDeviceSharding(client.jax_device(device))
    return jax.jit(lambda: jnp.zeros(n, dtype), out_shardings=sharding)


def _zeros(n: int, dtype: np.dtype, device: int) -> jax.Array:
    """Zeros made on the device (no host buffer, no transfer)."""
    return _zeros_fn(n, dtype, device)()


def tensor_geometry(t: torch.Tensor, buf: jax.Array):
    dtype = TORCH_TO_NUMPY.get(t.dtype)
    if dtype is None:
        raise TypeError(f"tpu tensors do not support dtype {t.dtype}")
    return geo.Geometry(tuple(t.shape), tuple(t.stride()), t.storage_offset(), dtype, buf.dtype, buf.size)


class _Call:
    """One call's flattened arguments: the jit inputs, the device and the generator."""

    __slots__ = ("device", "generator", "inputs")

    def __init__(self):
        self.inputs: list[Any] = []
        self.device: int | None = None
        self.generator = None

    def walk(self, x):
        if isinstance(x, _WrappedNumber):
            self.inputs.append(x.value)
            return ("number", type(x.value))
        if isinstance(x, torch.Tensor):
            info = _C._arg_info(x)
            if info is not None:
                index, buf, key = info
                if self.device is None:
                    self.device = index
                elif index != self.device:
                    raise RuntimeError(
                        "Expected all tensors to be on the same device, but found at least two "
                        f"devices, tpu:{self.device} and tpu:{index}!"
                    )
                if buf is None:
                    buf = buffer_of(x)
                self.inputs.append(buf)
                # (sizes, dtype) for a tensor that is its whole buffer, else the full geometry.
                return key if key is not None else tensor_geometry(x, buf)
            if x.dim() == 0 and x.device.type == "cpu":
                self.inputs.append(x.item())
                return ("scalar", x.dtype)
            raise RuntimeError(
                f"Expected all tensors to be on the same device, but found at least two devices, {x.device} and tpu!"
            )
        if isinstance(x, (list, tuple)):
            return (type(x), tuple(self.walk(v) for v in x))
        if isinstance(x, float):
            return (float, x if x == x else "nan", math.copysign(1.0, x))
        if isinstance(x, torch.Generator):
            self.generator = x
            return (torch.Generator,)
        return (type(x), x)


def _template(x, call: _Call, counter: list[int]):
    """`x` with tensors replaced by slots, in the same order as _Call.walk."""
    if isinstance(x, _WrappedNumber):
        counter[0] += 1
        return _ScalarSlot(counter[0] - 1, x.value)
    if isinstance(x, torch.Tensor):
        i = counter[0]
        counter[0] += 1
        if x.device.type == "tpu":
            return _TensorSlot(i, tensor_geometry(x, call.inputs[i]))
        return _ScalarSlot(i, x)
    if isinstance(x, (list, tuple)):
        return type(x)(_template(v, call, counter) for v in x)
    if isinstance(x, torch.Generator):
        return None
    return x


def _substitute(x, fn: Callable):
    if isinstance(x, (_TensorSlot, _ScalarSlot)):
        return fn(x)
    if isinstance(x, (list, tuple)):
        return type(x)(_substitute(v, fn) for v in x)
    return x


def _meta_tensor(slot):
    if isinstance(slot, _ScalarSlot):
        # A CPU scalar meets tpu tensors as it meets cuda ones, which meta refs
        # only allow for same-device (here: meta) 0-dim tensors.
        return slot.tensor.to("meta") if isinstance(slot.tensor, torch.Tensor) else slot.tensor
    g = slot.geom
    dtype = _NUMPY_TO_TORCH[g.dtype]
    if g.offset == 0 and geo.is_contiguous(g.sizes, g.strides):
        return torch.empty_strided(g.sizes, g.strides, dtype=dtype, device="meta")
    base = torch.empty(geo.storage_elements(g), dtype=dtype, device="meta")
    return base.as_strided(g.sizes, g.strides, g.offset)


_NUMPY_TO_TORCH = {v: k for k, v in TORCH_TO_NUMPY.items()}


def _meta_device(x):
    """A factory's `device=tpu` argument runs on meta too (else the meta run recurses)."""
    if isinstance(x, torch.device) and x.type == "tpu":
        return torch.device("meta")
    return x


# ---- the op plan ------------------------------------------------------------


class _OpPlan:
    """What a schema says about mutation and returns, computed once per op."""

    def __init__(self, op: OpOverload, derived: bool):
        schema = op._schema
        self.op = op
        self.derived = derived  # lowering is the functional op; outputs go to mutable args
        self.arg_names = [a.name for a in schema.arguments]
        self.kwarg_only = {a.name for a in schema.arguments if a.kwarg_only}
        self.mutable = [i for i, a in enumerate(schema.arguments) if a.alias_info and a.alias_info.is_write]
        self.out_names = [a.name for a in schema.arguments if a.is_out]
        arg_sets = {
            frozenset(a.alias_info.before_set): i
            for i, a in enumerate(schema.arguments)
            if a.alias_info and a.alias_info.is_write
        }
        self.returns: list[tuple[str, int]] = []
        fresh = 0
        for r in schema.returns:
            if r.alias_info is not None:
                self.returns.append(("arg", arg_sets[frozenset(r.alias_info.before_set)]))
            else:
                self.returns.append(("fresh", fresh))
                fresh += 1
        self.num_fresh = fresh
        self.tensor_args = tuple(
            i for i, a in enumerate(schema.arguments) if str(a.type) in ("Tensor", "Optional[Tensor]")
        )
        self._defaults = [(a.name, _schema_default(a) if a.has_default_value() else None) for a in schema.arguments]
        self.generator_index = next((i for i, a in enumerate(schema.arguments) if "Generator" in str(a.type)), None)

    def bind(self, args: tuple, kwargs: dict) -> list:
        """All arguments in schema order; omitted ones take their schema defaults
        (torch drops trailing arguments equal to their defaults before calling us)."""
        bound = list(args)
        for name, default in self._defaults[len(args) :]:
            bound.append(kwargs.get(name, default))
        return bound


# Schema defaults of ScalarType arguments are c10::ScalarType enum values (`dtype=4`).
_SCALAR_TYPES = {
    0: torch.uint8,
    1: torch.int8,
    2: torch.int16,
    3: torch.int32,
    4: torch.int64,
    5: torch.float16,
    6: torch.float32,
    7: torch.float64,
    9: torch.complex64,
    10: torch.complex128,
    11: torch.bool,
    15: torch.bfloat16,
}


def _schema_default(arg):
    value = arg.default_value
    if isinstance(value, int) and "ScalarType" in str(arg.real_type):
        return _SCALAR_TYPES[value]
    return value


class _Entry:
    __slots__ = ("compiled", "fresh_meta", "lazy_avals", "mutable_shapes", "mutable_specs", "out_tree", "run")

    def __init__(self, run, fresh_meta, mutable_shapes):
        self.run = run
        self.compiled = False  # run has been called (jax compiled it); lazy mode only traces it
        self.lazy_avals = None  # the flat results' shapes, for lazy mode
        self.fresh_meta = fresh_meta
        self.mutable_shapes = mutable_shapes  # meta shapes of mutable args after the op
        self.out_tree = None
        self.mutable_specs = None  # (dtype, length) of each new mutable-arg buffer, set when traced


def _flatten_values(values) -> list:
    flat: list = []
    for v in values:
        if isinstance(v, (list, tuple)):
            flat.extend(v)
        else:
            flat.append(v)
    return flat


def _mutable_tensors(plan: _OpPlan, bound: list) -> list[torch.Tensor | None]:
    return _flatten_values([bound[i] for i in plan.mutable])


def _fresh_meta(plan: _OpPlan, meta_result) -> list:
    results = meta_result if isinstance(meta_result, tuple) else (meta_result,)
    if len(plan.returns) == 0:
        results = ()
    return [results[i] for i, (kind, _) in enumerate(plan.returns) if kind == "fresh"]


def _storage_aliases(plan: _OpPlan, bound: list) -> tuple[int, ...] | None:
    """For each mutable tensor, the first mutable tensor sharing its storage (e.g.
    _foreach_add_ on views of one base), or None when no two share one."""
    if len(plan.mutable) == 1 and not isinstance(bound[plan.mutable[0]], (list, tuple)):
        return None
    seen: dict[int, int] = {}
    groups = []
    for i, t in enumerate(_mutable_tensors(plan, bound)):
        groups.append(i if t is None else seen.setdefault(t.untyped_storage().data_ptr(), i))
    return tuple(groups) if any(g != i for i, g in enumerate(groups)) else None


def _build(plan: _OpPlan, lowering: Lowering, call: _Call, bound: list, aliases=None) -> _Entry:
    counter = [0]
    template = [_template(v, call, counter) for v in bound]
    meta_args = [_meta_device(_substitute(v, _meta_tensor)) for v in template]
    try:
        meta_result = _call_schema(plan.op, plan, meta_args)
    except Exception as meta_error:
        _raise_cpu_error(plan, lowering, template, meta_error)
    fresh_meta = _fresh_meta(plan, meta_result)
    mutable_slots = _flatten_values([template[i] for i in plan.mutable])
    for slot in mutable_slots:
        if isinstance(slot, _TensorSlot):
            _check_no_internal_overlap(slot.geom)
    fn = lowering.fn
    functional_names = [n for n in plan.arg_names if n not in plan.out_names]
    mutable_shapes = [
        None if m is None else tuple(m.shape) for m in _flatten_values([meta_args[i] for i in plan.mutable])
    ]
    entry = _Entry(None, fresh_meta, mutable_shapes)
    tensor_slots: list[_TensorSlot] = []
    _substitute(template, lambda s: tensor_slots.append(s) if isinstance(s, _TensorSlot) else None)

    def run(inputs, rng):
        def materialize(slot):
            value = inputs[slot.index]
            return geo.read(value, slot.geom) if isinstance(slot, _TensorSlot) else value

        values = [_substitute(v, materialize) for v in template]
        # Sharded (N-D) buffers in, N-D buffers out: a flat output would drop a per-dim sharding.
        keep_shape = any(inputs[slot.index].ndim != 1 for slot in tensor_slots)
        pos, kw = [], {}
        for name, value in zip(plan.arg_names, values):
            if name not in functional_names:
                continue
            if name in plan.kwarg_only:
                kw[name] = value
            elif kw:
                kw[name] = value
            else:
                pos.append(value)
        if rng is not None:
            kw["rng"] = rng
        if plan.generator_index is not None:
            kw.pop(plan.arg_names[plan.generator_index], None)
            if len(pos) > plan.generator_index:
                pos = pos[: plan.generator_index]
        result = fn(*pos, **kw)
        result = list(result) if isinstance(result, (tuple, list)) else [result]
        if plan.derived:
            # A list-returning functional op (_foreach_*) gives ([values],): flatten it.
            fresh, mutated = [], _flatten_values(result)
        else:
            fresh, mutated = result[: plan.num_fresh], result[plan.num_fresh :]
            mutated = _flatten_values(mutated)
        fresh_out = [_conform_tree(v, m, plan.op, keep_shape) for v, m in zip(fresh, fresh_meta)]
        new_buffers = []
        latest = {}  # storage group -> its buffer with the writes so far
        for k, (slot, value) in enumerate(zip(mutable_slots, mutated)):
            if slot is None:
                new_buffers.append(None)
                continue
            group = aliases[k] if aliases else k
            buf = geo.write(latest.get(group, inputs[slot.index]), slot.geom, jnp.broadcast_to(value, slot.geom.sizes))
            latest[group] = buf
            new_buffers.append(buf)
        entry.mutable_specs = [None if b is None else (_NUMPY_TO_TORCH[np.dtype(b.dtype)], b.size) for b in new_buffers]
        flat_out, entry.out_tree = jax.tree_util.tree_flatten((fresh_out, new_buffers))
        return flat_out

    if call.device is None:
        device = _factory_device(bound)
        sharding = jax.sharding.SingleDeviceSharding(client.jax_device(device))
        entry.run = jax.jit(run, out_shardings=sharding)
    else:
        entry.run = jax.jit(run)
    return entry


def _check_no_internal_overlap(geom) -> None:
    """CPU's assert_no_internal_overlap: an expanded (stride-0) tensor cannot be written."""
    if any(size > 1 and stride == 0 for size, stride in zip(geom.sizes, geom.strides)):
        raise RuntimeError(
            "unsupported operation: more than one element of the written-to tensor refers to a single "
            "memory location. Please clone() the tensor before performing the operation."
        )


def _conform_tree(value, meta, op, keep_shape: bool = False):
    if isinstance(meta, (list, tuple)):
        return [_conform_tree(v, m, op, keep_shape) for v, m in zip(value, meta)]
    if meta is None or value is None:
        return None
    value = jnp.asarray(value)
    dtype = TORCH_TO_NUMPY[meta.dtype]
    if value.dtype != dtype:
        value = value.astype(dtype)
    if tuple(value.shape) != tuple(meta.shape):
        raise AssertionError(
            f"torch_tpu lowering of {op} produced shape {tuple(value.shape)}, expected {tuple(meta.shape)}"
        )
    return value if keep_shape else value.reshape(-1)


def _factory_device(bound: list) -> int:
    for v in bound:
        if isinstance(v, torch.device):
            return v.index if v.index is not None else _C._current_device()
    return _C._current_device()


def _raise_cpu_error(plan: _OpPlan, lowering: Lowering, template: list, meta_error: Exception):
    """Meta kernels (often Python refs) word errors differently from CPU: raise CPU's
    own error for the same call on small CPU stand-ins, if it has one."""

    def stand_in(slot):
        if isinstance(slot, _ScalarSlot):
            return slot.tensor
        return torch.ones(slot.geom.sizes, dtype=_NUMPY_TO_TORCH[slot.geom.dtype])

    def on_cpu(x):
        return torch.device("cpu") if isinstance(x, torch.device) and x.type == "tpu" else x

    slots: list = []
    _substitute(template, lambda s: slots.append(s) or s)
    small = all(isinstance(s, _ScalarSlot) or s.geom.numel <= 1 << 16 for s in slots)
    if small:
        args = [on_cpu(_substitute(v, stand_in)) for v in template]
        try:
            with torch.random.fork_rng(devices=[]):  # a random op must not move CPU's generator
                _call_schema(plan.op, plan, args)
        except Exception as cpu_error:
            raise cpu_error from None
    raise meta_error


def _call_schema(op: OpOverload, plan: _OpPlan, bound: list):
    pos, kw = [], {}
    for name, value in zip(plan.arg_names, bound):
        if name in plan.kwarg_only or kw:
            kw[name] = value
        else:
            pos.append(value)
    return op(*pos, **kw)


def _generator_key(plan: _OpPlan, call: _Call, device: int):
    seed, offset = _C._reserve_random(call.generator, device, 1)
    return np.array([seed & 0xFFFFFFFF, seed >> 32, offset & 0xFFFFFFFF, offset >> 32], dtype=np.uint32)


def _key_from_data(data):
    key = jax.random.wrap_key_data(data[:2], impl="threefry2x32")
    key = jax.random.fold_in(key, data[2])
    return jax.random.fold_in(key, data[3])


def _describe(sig: tuple) -> str:
    """A short readable form of a call signature, for debug output."""
    text = repr(sig)
    return text if len(text) <= 200 else text[:197] + "..."


def make_kernel(op: OpOverload, lowering: Lowering, derived: bool) -> Callable:
    """The PrivateUse1 kernel of `op`, registered with torch.library."""
    plan = _OpPlan(op, derived)
    if lowering.eager:
        return lowering.fn
    check = lowering.check

    def kernel(*args, **kwargs):
        if check is not None:
            check(*args, **kwargs)
        bound = plan.bind(args, kwargs)
        _wrap_numbers(bound, plan.tensor_args)
        call = _Call()
        sig = tuple(call.walk(v) for v in bound)
        if spmd is not None:
            spmd.place_inputs(call.inputs, bound)
        aliases = _storage_aliases(plan, bound) if plan.mutable else None
        # factories and wrapped floats depend on the default dtype, matmuls on the matmul precision
        key = (op, sig, torch.get_default_dtype(), aliases, precision.cache_key())
        entry = _cache.get(key)
        compile_start = None
        if entry is None:
            compile_start = time.perf_counter()
            entry = _build(plan, lowering, call, bound, aliases)
            if plan.out_names and _resize_out_args(plan, bound, entry):
                return kernel(*args, **kwargs)
            _cache.put(key, entry)
            if debug.enabled():
                debug.log("compile", f"{op} for {_describe(sig)}")
        device = call.device if call.device is not None else _factory_device(bound)
        if lazy is not None and spmd is None:
            rng_data = _generator_key(plan, call, device) if lowering.random else None
            flat = lazy.record(entry, call.inputs, rng_data, device)
        else:
            if lazy is not None:
                call.inputs = lazy.concrete(call.inputs)
            if entry.compiled:
                metrics.bump("op_cache_hits")
            else:
                entry.compiled = True
                metrics.bump("op_compiles")
                compile_start = compile_start or time.perf_counter()
            flat = _execute(entry, lowering, plan, call, device, compile_start, op)
        fresh_values, new_buffers = jax.tree_util.tree_unflatten(entry.out_tree, flat)
        fresh = [_wrap_tree(v, m, device) for v, m in zip(fresh_values, entry.fresh_meta)]
        for t, buf, spec in zip(_mutable_tensors(plan, bound), new_buffers, entry.mutable_specs):
            if t is not None and buf is not None:
                if spmd is not None:
                    buf = spmd.keep_layout(_C._get_buffer(t), buf)
                _C._set_buffer(t, buf, *spec)
        results = []
        for kind, i in plan.returns:
            results.append(fresh[i] if kind == "fresh" else bound[i])
        if not results:
            return None
        return results[0] if len(results) == 1 else tuple(results)

    kernel.__name__ = f"tpu_{op._schema.name.split('::')[1]}_{op._overloadname}"
    return kernel


def _execute(entry: _Entry, lowering: Lowering, plan: _OpPlan, call: _Call, device: int, compile_start, op) -> list:
    rng = None
    if lowering.random:
        rng = _key_from_data_jit(_generator_key(plan, call, device))
    try:
        flat = entry.run(call.inputs, rng)
    except jax.errors.JaxRuntimeError as error:
        memory.raise_if_out_of_memory(error, device, str(op))
        raise
    if compile_start is not None:  # jax.jit traces and compiles on the first call
        metrics.record_compile("op", time.perf_counter() - compile_start)
    metrics.bump("executions")
    return flat


_key_from_data_jit = jax.jit(_key_from_data)


def _resize_out_args(plan: _OpPlan, bound: list, entry: _Entry) -> bool:
    """Resizes out= tensors to the result shapes, as CPU does. True if any changed."""
    changed = False
    for t, shape in zip(_mutable_tensors(plan, bound), entry.mutable_shapes):
        if t is not None and shape is not None and tuple(t.shape) != shape:
            if t.numel() != 0:
                warnings.warn(
                    f"An output with one or more elements was resized since it had shape {list(t.shape)}, "
                    f"which does not match the required output shape {list(shape)}. This behavior is "
                    "deprecated, and in a future PyTorch release outputs will not be resized unless they "
                    "have zero elements. You can explicitly reuse an out tensor t by resizing it, inplace, "
                    "to zero elements with t.resize_(0).",
                    UserWarning,
                    stacklevel=3,
                )
            t.resize_(shape)
            changed = True
    return changed


def _wrap_tree(value, meta, device: int):
    if isinstance(meta, (list, tuple)):
        return [_wrap_tree(v, m, device) for v, m in zip(value, meta)]
    if meta is None or value is None:
        return None
    return _C._wrap(value, list(meta.shape), meta.dtype, device)


def from_jax(array: jax.Array, device: int, dtype: torch.dtype | None = None) -> torch.Tensor:
    """A new tpu tensor holding `array` (used by eager lowerings)."""
    if dtype is None:
        dtype = _NUMPY_TO_TORCH[np.dtype(array.dtype)]
    if lazy is not None and lazy.pending(array):
        return lazy.wrap(array, device, dtype)
    if array.dtype != to_numpy_dtype(dtype):
        array = array.astype(to_numpy_dtype(dtype))
    sharded = spmd is not None and len(array.sharding.device_set) > 1
    buf = array if sharded else reshape(array, (-1,))  # a sharded array keeps its shape
    return _C._wrap(buf, list(array.shape), dtype, device)


_read_jit_cache: dict = {}


@functools.cache
def _reshaper(shape: tuple[int, ...]) -> Callable:
    return jax.jit(lambda a: a.reshape(shape))


def reshape(array: jax.Array, shape: tuple[int, ...]) -> jax.Array:
    """`array.reshape(shape)` through a cached executable: eager jnp reshapes cost ~5x more."""
    if tuple(array.shape) == tuple(shape):
        return array
    return _reshaper(tuple(shape))(array)


def to_jax(t: torch.Tensor) -> jax.Array:
    """The value of a tpu tensor as a jax array of its shape (eager lowerings)."""
    buf = buffer_of(t)
    g = tensor_geometry(t, buf)
    if g.is_whole:
        return reshape(buf, g.sizes)
    fn = _read_jit_cache.get(g)
    if fn is None:
        fn = _read_jit_cache[g] = jax.jit(lambda b, g=g: geo.read(b, g))
    metrics.bump("executions")
    return fn(buf)


def write_jax(t: torch.Tensor, value: jax.Array) -> None:
    """Writes `value` into the tpu tensor `t` (a view writes through to its base)."""
    if lazy is not None and lazy.pending(value):
        return lazy.write(t, value)
    buf = buffer_of(t)
    g = tensor_geometry(t, buf)
    if g.is_whole and value.dtype == g.dtype and tuple(value.shape) == g.sizes:
        value = reshape(value, buf.shape)
        _C._set_buffer(t, value if spmd is None else spmd.keep_layout(buf, value), t.dtype, g.numel)
        return
    _check_no_internal_overlap(g)
    if spmd is not None:
        pair = [buf, value]
        spmd.place_inputs(pair, [])
        buf, value = pair
    key = ("write", g, value.shape, value.dtype)
    fn = _read_jit_cache.get(key)
    if fn is None:
        fn = _read_jit_cache[key] = jax.jit(lambda b, v, g=g: geo.write(b, g, jnp.broadcast_to(v, g.sizes)))
    metrics.bump("executions")
    new = fn(buf, value)
    if spmd is not None:
        new = spmd.keep_layout(buf, new)
    _C._set_buffer(t, new, t.dtype, new.size)
