"""Runs an ATen op on tpu tensors through its lowering.

Per call: read each tpu tensor as (flat buffer, geometry), look the call's
signature up in the op executable cache, run the jitted function, then wrap
fresh outputs in new storages and swap the buffers of mutated arguments.
On a cache miss the op first runs on meta tensors: that gives PyTorch's own
output shapes, dtypes and error checks.
"""

from __future__ import annotations

import contextlib
import inspect
import math
import time
import warnings
from collections.abc import Callable, Iterable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import torch
from torch._ops import OpOverload

from torch_tpu import _C, debug, metrics, platforms
from torch_tpu.device import memory
from torch_tpu.ops import geometry as geo
from torch_tpu.ops import growing, precision, spmd, storage_locks, tensors, view_gathers
from torch_tpu.ops.checks import check_no_overlap
from torch_tpu.ops.dtypes import NUMPY_TO_TORCH, to_numpy_dtype
from torch_tpu.ops.geometry import check_no_internal_overlap
from torch_tpu.ops.registry import Lowering, SignatureCheck
from torch_tpu.ops.rng import key_data, key_from_data_jit
from torch_tpu.ops.schema import OpPlan, call_lowering, call_schema, conform_tree, flatten_values
from torch_tpu.ops.tensors import apply_bits, buffer_of, math_bits, tensor_geometry
from torch_tpu.platforms.cpu import background_compile, compile_worker, host_tier
from torch_tpu.runtime import client, executable_cache

_cache = executable_cache.ExecutableCache()
_kernels: dict[tuple[str, bool], tuple[OpPlan, Lowering]] = {}  # (op name, derived) -> what its kernel runs


class _TensorSlot:
    __slots__ = ("bits", "geom", "index")

    def __init__(self, index: int, geom, bits: tuple[bool, bool] = (False, False)):
        self.index = index
        self.geom = geom
        self.bits = bits  # (conj, neg): the value is the buffer's read through them


class WrappedNumber:
    """A Python number torch passed for a Tensor argument (`x + 2`): traced like a CPU 0-dim tensor."""

    __slots__ = ("value",)

    def __init__(self, value):
        self.value = value


def _wrap_numbers(bound: list, positions: Iterable[int]) -> None:
    for i in positions:
        v = bound[i]
        if isinstance(v, (bool, float)) or (isinstance(v, int) and -(2**63) <= v < 2**63):
            bound[i] = WrappedNumber(v)


def _wrap_scalars(bound: list, traced: tuple[tuple[int, object], ...]) -> None:
    """Traced Scalar arguments (`Lowering.traced`) go in as wrapped numbers: the key holds their
    type, not their value. A value equal to the schema default stays static (`alpha=1` keeps its
    multiply-free executable), so an op compiles at most twice over all values. A Scalar[] list
    (`_foreach_add.ScalarList`) has each of its numbers traced."""
    for i, default in traced:
        v = bound[i]
        if type(v) is type(default) and v == default:
            continue
        if isinstance(v, (list, tuple)):
            v = bound[i] = list(v)
            _wrap_numbers(v, range(len(v)))
        else:
            _wrap_numbers(bound, (i,))


class _ScalarSlot:
    """A CPU 0-dim tensor: traced as a weakly typed scalar."""

    __slots__ = ("index", "tensor")

    def __init__(self, index: int, tensor: torch.Tensor):
        self.index = index
        self.tensor = tensor


class _Call:
    """One call's flattened arguments: the jit inputs, the device and the generator."""

    __slots__ = ("device", "generator", "inputs")

    def __init__(self):
        self.inputs: list[Any] = []
        self.device: int | None = None
        self.generator = None

    def walk(self, x):
        if isinstance(x, WrappedNumber):
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
                # (sizes, dtype) for a tensor that is its whole buffer, else the full geometry
                # (with the conj and neg bits when set: _arg_info leaves such tensors to this path).
                if key is not None:
                    return key
                geom = tensor_geometry(x, buf)
                bits = math_bits(x)
                return geom if bits == (False, False) else (geom, bits)
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
    if isinstance(x, WrappedNumber):
        counter[0] += 1
        return _ScalarSlot(counter[0] - 1, x.value)
    if isinstance(x, torch.Tensor):
        i = counter[0]
        counter[0] += 1
        if x.device.type == "tpu":
            return _TensorSlot(i, tensor_geometry(x, call.inputs[i]), math_bits(x))
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
    dtype = NUMPY_TO_TORCH[g.dtype]
    if g.offset == 0 and geo.is_contiguous(g.sizes, g.strides):
        return torch.empty_strided(g.sizes, g.strides, dtype=dtype, device="meta")
    base = torch.empty(geo.storage_elements(g), dtype=dtype, device="meta")
    return base.as_strided(g.sizes, g.strides, g.offset)


def _meta_device(x):
    """A factory's `device=tpu` argument runs on meta too (else the meta run recurses)."""
    if isinstance(x, torch.device) and x.type == "tpu":
        return torch.device("meta")
    return x


class _Entry:
    __slots__ = (
        "compiled",
        "fast",
        "fresh_layout",
        "fresh_meta",
        "job",
        "lazy_avals",
        "mutable_shapes",
        "mutable_specs",
        "out_tree",
        "reads_precision",
        "run",
        "traceable",
    )

    def __init__(self, run, fresh_meta, mutable_shapes):
        self.run = run
        self.traceable = None  # the jitted lowering (lazy mode traces it); None for a loaded executable
        self.compiled = False  # run has been called (jax compiled it); lazy mode only traces it
        self.fast = None  # what the C++ path needs (direct call, fresh output specs, self's spec), or False
        self.job = None  # its background compile (platforms/cpu/background_compile.py); False: compiles at its call
        self.lazy_avals = None  # the flat results' shapes, for lazy mode
        self.fresh_meta = fresh_meta
        self.fresh_layout = _fresh_layout(fresh_meta)  # meta strides where the buffer is laid out with them
        self.mutable_shapes = mutable_shapes  # meta shapes of mutable args after the op
        self.out_tree = None
        self.mutable_specs = None  # (dtype, length) of each new mutable-arg buffer, set when traced
        self.reads_precision = True  # the trace read the matmul precision (set when traced)


def _meta_leaf(m) -> bool:
    return isinstance(m, torch.Tensor)


def _layout_strides(m) -> tuple[int, ...] | None:
    """A fresh output's meta strides where its tensor takes them: a dense layout its buffer is
    transposed to (channels_last, a transpose), or the contiguous layout with other strides on
    size-1 dims (as CPU's TensorIterator gives for some strided inputs)."""
    if not isinstance(m, torch.Tensor) or m.storage_offset() != 0:
        return None
    sizes, strides = tuple(m.shape), tuple(m.stride())
    if geo.dense_order(sizes, strides) is not None:
        return strides
    if all(isinstance(v, int) for v in (*sizes, *strides)) and geo.is_contiguous(sizes, strides):
        return strides if strides != geo.contiguous_strides(sizes) else None
    return None


def _fresh_layout(fresh_meta, logical: bool = False):
    """Per fresh output, the strides its buffer is laid out with, or None (contiguous). `logical`
    (N-D, sharded buffers) keeps every layout contiguous."""
    logical = logical or spmd.layer is not None
    return jax.tree_util.tree_map(lambda m: None if logical else _layout_strides(m), fresh_meta, is_leaf=_meta_leaf)


def _lay_out(value, meta, strides, keep_shape: bool):
    """A conformed fresh result as its buffer: transposed to the physical order of its meta
    strides (CPU's output memory format), then flat unless `keep_shape`."""
    if isinstance(meta, (list, tuple)):
        return type(meta)(_lay_out(v, m, st, keep_shape) for v, m, st in zip(value, meta, strides))
    if value is None or not isinstance(meta, torch.Tensor):
        return value
    order = None if strides is None else geo.dense_order(tuple(meta.shape), strides)
    if order is not None:
        value = jnp.transpose(value, order)
    return value if keep_shape else value.reshape(-1)


def _mutable_tensors(plan: OpPlan, bound: list) -> list[torch.Tensor | None]:
    return flatten_values([bound[i] for i in plan.mutable])


def _fresh_meta(plan: OpPlan, meta_result) -> list:
    results = meta_result if isinstance(meta_result, tuple) else (meta_result,)
    if len(plan.returns) == 0:
        results = ()
    return [results[i] for i, (kind, _) in enumerate(plan.returns) if kind == "fresh"]


def _storage_aliases(plan: OpPlan, bound: list) -> tuple[int, ...] | None:
    """For each mutable tensor, the first mutable tensor sharing its storage (e.g.
    _foreach_add_ on views of one base), or None when no two share one."""
    if len(plan.mutable) == 1 and not isinstance(bound[plan.mutable[0]], (list, tuple)):
        return None
    seen: dict[int, int] = {}
    groups = []
    for i, t in enumerate(_mutable_tensors(plan, bound)):
        # Keyed by buffer: a storage slice shares its parent's (its data_ptr is part-way in).
        key = None if t is None else t.untyped_storage().data_ptr() - _C._buffer_offset(t)
        groups.append(i if t is None else seen.setdefault(key, i))
    return tuple(groups) if any(g != i for i, g in enumerate(groups)) else None


def _build(plan: OpPlan, lowering: Lowering, call: _Call, bound: list, aliases=None, persist=None) -> _Entry:
    counter = [0]
    template = [_template(v, call, counter) for v in bound]
    factory_device = _factory_device(bound) if call.device is None else None
    return _build_from(plan, lowering, template, factory_device, aliases, persist)


def _build_from(plan: OpPlan, lowering: Lowering, template: list, factory_device, aliases, persist) -> _Entry:
    """The entry of a call whose arguments are `template` (slots for its tensors); a factory's
    outputs go to tpu device `factory_device`."""
    meta_args = [_meta_device(_substitute(v, _meta_tensor)) for v in template]
    try:
        meta_result = call_schema(plan.op, plan, meta_args)
    except Exception as meta_error:
        _raise_cpu_error(plan, lowering, template, meta_error)
        # CPU ran the call without an error: the meta kernel's error was CUDA's determinism
        # alert (histc, median), which XLA's deterministic kernels do not share.
        with _no_determinism_alerts():
            meta_result = call_schema(plan.op, plan, meta_args)
    if lowering.layout is not None:
        meta_result = lowering.layout(meta_args, meta_result)
    fresh_meta = _fresh_meta(plan, meta_result)
    mutable_slots = flatten_values([template[i] for i in plan.mutable])
    for slot in mutable_slots:
        if isinstance(slot, _TensorSlot):
            check_no_internal_overlap(slot.geom)
    fn = lowering.fn
    mutable_shapes = [
        None if m is None else tuple(m.shape) for m in flatten_values([meta_args[i] for i in plan.mutable])
    ]
    entry = _Entry(None, fresh_meta, mutable_shapes)
    tensor_slots: list[_TensorSlot] = []
    _substitute(template, lambda s: tensor_slots.append(s) if isinstance(s, _TensorSlot) else None)

    def run(inputs, rng):
        def materialize(slot):
            value = inputs[slot.index]
            if isinstance(slot, _TensorSlot):
                return apply_bits(geo.read(value, slot.geom), *slot.bits)
            return value

        values = [_substitute(v, materialize) for v in template]
        # Sharded (N-D) buffers in, N-D buffers out: a flat output would drop a per-dim sharding.
        keep_shape = any(inputs[slot.index].ndim != 1 for slot in tensor_slots)
        reads = precision.reads()
        result = call_lowering(fn, plan, values, rng)
        entry.reads_precision = precision.reads() != reads
        if plan.derived:
            # A list-returning functional op (_foreach_*) gives ([values],): flatten it.
            fresh, mutated = [], flatten_values(result)
        else:
            fresh, mutated = result[: plan.num_fresh], result[plan.num_fresh :]
            mutated = flatten_values(mutated)
        if keep_shape:  # an N-D buffer is the logical value
            entry.fresh_layout = _fresh_layout(fresh_meta, logical=True)
        fresh_out = [
            _lay_out(conform_tree(v, m, plan.op, True), m, st, keep_shape)
            for v, m, st in zip(fresh, fresh_meta, entry.fresh_layout)
        ]
        new_buffers = []
        latest = {}  # storage group -> its buffer with the writes so far
        for k, (slot, value) in enumerate(zip(mutable_slots, mutated)):
            if slot is None:
                new_buffers.append(None)
                continue
            group = aliases[k] if aliases else k
            _check_fits(jnp.shape(value), slot.geom.sizes)
            value = apply_bits(jnp.broadcast_to(value, slot.geom.sizes), *slot.bits)  # a conj view stores conj(value)
            buf = geo.write(latest.get(group, inputs[slot.index]), slot.geom, value)
            latest[group] = buf
            new_buffers.append(buf)
        entry.mutable_specs = [None if b is None else (NUMPY_TO_TORCH[np.dtype(b.dtype)], b.size) for b in new_buffers]
        flat_out, entry.out_tree = jax.tree_util.tree_flatten((fresh_out, new_buffers))
        return flat_out

    jit_kwargs = {}
    if factory_device is not None:
        jit_kwargs["out_shardings"] = jax.sharding.SingleDeviceSharding(client.jax_device(factory_device))
    if spmd.layer is not None:  # jax.jit retraces per buffer layout: flat, or N-D as mark_sharding left it
        entry.run = entry.traceable = jax.jit(run, **jit_kwargs)
        return entry
    entry.traceable = executable_cache.LazyJit(run, **jit_kwargs)
    # Compiled at the first call (then kept on disk, if persist, with what the trace set).
    options = platforms.op_compile_options()
    entry.run = executable_cache.FirstCall(entry.traceable, persist, lambda: _entry_state(entry), entry, "run", options)
    return entry


def _check_fits(shape: tuple, sizes: tuple) -> None:
    """CPU's error for an in-place result of another shape than the tensor it writes (x[5, 1].mul_(y[5, 5]))."""
    try:
        broadcast = tuple(np.broadcast_shapes(tuple(shape), tuple(sizes)))
    except ValueError:
        broadcast = tuple(shape)
    if broadcast != tuple(sizes):
        raise RuntimeError(f"output with shape {list(sizes)} doesn't match the broadcast shape {list(broadcast)}")


def _entry_state(entry: _Entry) -> tuple:
    """What a persisted entry needs besides its executable (meta tensors as (shape, dtype, strides))."""
    fresh = jax.tree_util.tree_map(
        lambda m: (tuple(m.shape), m.dtype, tuple(m.stride())), entry.fresh_meta, is_leaf=_meta_leaf
    )
    return fresh, entry.mutable_shapes, entry.mutable_specs, entry.out_tree, entry.fresh_layout, entry.reads_precision


def _load_entry(persist: str | None) -> _Entry | None:
    found = executable_cache.load(persist)
    if found is None:
        return None
    compiled, (fresh, mutable_shapes, mutable_specs, out_tree, fresh_layout, reads_precision) = found
    fresh_meta = jax.tree_util.tree_map(
        lambda s: torch.empty_strided(s[0], s[2], dtype=s[1], device="meta"),
        fresh,
        is_leaf=lambda s: isinstance(s, tuple) and len(s) == 3 and isinstance(s[1], torch.dtype),
    )
    entry = _Entry(compiled, fresh_meta, mutable_shapes)
    entry.mutable_specs, entry.out_tree, entry.fresh_layout = mutable_specs, out_tree, fresh_layout
    entry.reads_precision = reads_precision
    return entry


def _factory_device(bound: list) -> int:
    for v in bound:
        if isinstance(v, torch.device):
            return v.index if v.index is not None else _C._current_device()
    return _C._current_device()


@contextlib.contextmanager
def _no_determinism_alerts():
    """Determinism alerts off (torch.use_deterministic_algorithms), for a meta kernel."""
    if not torch.are_deterministic_algorithms_enabled():
        yield
        return
    warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    torch.use_deterministic_algorithms(False)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(True, warn_only=warn_only)


def _raise_cpu_error(plan: OpPlan, lowering: Lowering, template: list, meta_error: Exception) -> None:
    """Meta kernels (often Python refs) word errors differently from CPU: raise CPU's
    own error for the same call on small CPU stand-ins, if it has one. Returns only for a
    determinism alert CPU does not raise (meta kernels raise CUDA's on every device)."""

    def stand_in(slot):
        if isinstance(slot, _ScalarSlot):
            return slot.tensor
        return torch.ones(slot.geom.sizes, dtype=NUMPY_TO_TORCH[slot.geom.dtype])

    def on_cpu(x):
        return torch.device("cpu") if isinstance(x, torch.device) and x.type == "tpu" else x

    slots: list = []
    _substitute(template, lambda s: slots.append(s) or s)
    small = all(isinstance(s, _ScalarSlot) or s.geom.numel <= 1 << 16 for s in slots)
    if small:
        args = [on_cpu(_substitute(v, stand_in)) for v in template]
        try:
            with torch.random.fork_rng(devices=[]):  # a random op must not move CPU's generator
                call_schema(plan.op, plan, args)
        except Exception as cpu_error:
            raise cpu_error from None
        if "does not have a deterministic implementation" in str(meta_error):
            return
    raise meta_error


def _describe(sig: tuple) -> str:
    """A short readable form of a call signature, for debug output."""
    text = repr(sig)
    return text if len(text) <= 200 else text[:197] + "..."


def register_kernel(lib: torch.library.Library, op: OpOverload, lowering: Lowering, derived: bool, key: str) -> None:
    """Registers `op`'s tpu kernel on dispatch key `key`: behind the C++ steady-state path
    (csrc/eager_kernel.cc) where the op can take it, else the Python kernel alone."""
    plan = OpPlan(op, derived)
    kernel = make_kernel(op, lowering, derived, plan)
    fast = _fast_path_form(plan, lowering, key)
    if fast is None:
        lib.impl(op, kernel, key)
        return
    traced = [i for i, _ in plan.traced_scalars(lowering.traced)]
    schema = op._schema
    inplace = fast == "inplace"
    check = _per_call_check(lowering, derived)
    _C._register_eager_kernel(
        plan.label, schema.name, schema.overload_name, kernel, traced, inplace, storage_locks.table(), check
    )


def _per_call_check(lowering: Lowering, derived: bool) -> Callable | None:
    """What the C++ path runs before each call it takes: the op's host check (not a signature
    check), and its front path's choice, whose calls it hands to the Python kernel."""
    value = None if isinstance(lowering.check, SignatureCheck) else lowering.check
    front = None if derived else lowering.front
    if front is None:
        return value

    def check(*args, **kwargs):
        if front.takes(*args, **kwargs):
            return True  # not None: the Python kernel takes the call
        return None if value is None else value(*args, **kwargs)

    return check


def _fast_path_form(plan: OpPlan, lowering: Lowering, key: str) -> str | None:
    """ "functional" (fresh tensors out) or "inplace" (writes self, returns it) for an op the C++
    path can run on a hit: a jit lowering with no randomness and no out= tensors. The C++ path
    runs a host check (other than a signature check) and asks a front path before each call;
    in-place ops with either keep the Python path (it would run under self's lock). None for
    the others."""
    value_check = lowering.check is not None and not isinstance(lowering.check, SignatureCheck)
    if (
        key != "PrivateUse1"
        or lowering.eager
        or ((value_check or (lowering.front is not None and not plan.derived)) and plan.mutable)
        or lowering.random
        or plan.out_names
        or plan.generator_index is not None
    ):
        return None
    returns = plan.op._schema.returns
    tensors_out = all(str(r.type) == "Tensor" and kind == "fresh" for r, (kind, _) in zip(returns, plan.returns))
    if not plan.mutable and returns and tensors_out:
        return "functional"
    if plan.mutable == [0] and plan.returns == [("arg", 0)] and str(plan.op._schema.arguments[0].type) == "Tensor":
        return "inplace"
    return None


def make_kernel(op: OpOverload, lowering: Lowering, derived: bool, plan: OpPlan | None = None) -> Callable:
    """The Python kernel of `op` on tpu tensors: what torch.library calls, or the C++ path on a miss."""
    plan = plan or OpPlan(op, derived)
    _kernels[(str(op), derived)] = (plan, lowering)
    traced = plan.traced_scalars(lowering.traced)
    check = lowering.check
    if check is not None and derived and plan.out_names and not _takes_outs(check, plan.out_names):
        check = _without_outs(check, plan.out_set)
    if plan.mutable and lowering.apart_from:
        apart = _apart_check(plan, lowering.apart_from)
        check = apart if check is None else _both_checks(apart, check)
    if lowering.eager:
        fn = lowering.fn if check is None else _checked(lowering.fn, check)
        return _out_of_memory_as_torch(op, _storage_locked(plan, fn) if plan.mutable else fn)
    name = f"{op} {lowering.fn.__module__}.{lowering.fn.__qualname__}"  # the persistent key's op part
    front = None if derived else lowering.front
    # Pointwise ops run over a bucketed tensor's whole padded buffer (ops/growing.py): not those
    # with host checks, which would see the padding, nor out= forms.
    inplace = plan.mutable == [0] and plan.returns == [("arg", 0)]
    pointwise = (
        growing.is_pointwise(op)
        and check is None
        and not lowering.random
        and not plan.out_names
        and (inplace or (not plan.mutable and plan.returns == [("fresh", 0)]))
    )

    # CPU's TensorIterator rule for an elementwise write: no input may share part of its memory.
    # (Checked here only: the C++ path hands an in-place call whose input shares self's buffer here.)
    elementwise = torch.Tag.pointwise in op.tags and bool(plan.mutable)

    def kernel(*args, **kwargs):
        if check is not None:
            args, kwargs = _apply_check(check, args, kwargs)
        if front is not None:
            result = front.run(*args, **kwargs)
            if result is not None:
                return result
        if pointwise and growing.is_bucketed_call(args, kwargs):  # (no check: see `pointwise`)
            with storage_locks.held(args[:1] if inplace else ()):  # read, run and swap: atomic
                flat = growing.flatten_pointwise(args, kwargs, inplace)
                if flat is not None:
                    return growing.unflatten_result(kernel(*flat.args, **flat.kwargs), flat)
        bound = plan.bind(args, kwargs)
        if not plan.mutable:
            return run(args, kwargs, bound)
        written = _mutable_tensors(plan, bound)
        if any(t is not None and t.device.type != "tpu" for t in written):  # a CPU out= or self
            raise RuntimeError(
                "Expected all tensors to be on the same device, but found at least two devices, cpu and tpu!"
            )
        if elementwise:
            _check_no_partial_overlap(written, bound)
        with storage_locks.held(written):  # read, run and swap: atomic per storage
            return run(args, kwargs, bound)

    # Every way the kernel runs jax (a front path, reading a never-written buffer, the executable)
    # reports XLA's RESOURCE_EXHAUSTED as torch.OutOfMemoryError.
    kernel = _out_of_memory_as_torch(op, kernel)

    def run(args, kwargs, bound):
        _wrap_numbers(bound, plan.tensor_args)
        if traced:
            _wrap_scalars(bound, traced)
        call = _Call()
        sig = tuple(call.walk(v) for v in bound)
        if spmd.layer is not None:
            spmd.layer.place_inputs(call.inputs, bound)
        aliases = _storage_aliases(plan, bound) if plan.mutable else None
        device = call.device if call.device is not None else _factory_device(bound)
        # factories and wrapped floats depend on the default dtype, matmuls on the matmul precision
        key = (op, sig, torch.get_default_dtype(), aliases, precision.cache_key(), device, spmd.layer is None)
        entry = _cache.get(key)
        compile_start = None
        if entry is None and spmd.layer is None and tensors.lazy is None and view_gathers.moving_views(op, sig):
            if _host_tier_ok(lowering, plan, bound):  # the host reads any geometry: nothing to compile
                result = _run_on_host(op, plan, args, kwargs, bound, device)
                if result is not _FAILED:
                    return result
            mutated = {id(t) for t in _mutable_tensors(plan, bound) if t is not None}
            gathered = view_gathers.substitute(args, kwargs, mutated)
            if gathered is not None:  # the op again, on contiguous copies of its moving views
                return kernel(*gathered[0], **gathered[1])
        if entry is None:
            compile_start = time.perf_counter()
            persist = None if spmd.layer is not None else executable_cache.key_text("op", (name, *key[1:]))
            entry = _load_entry(persist)
            loaded = entry is not None
            if not loaded:
                entry = _build(plan, lowering, call, bound, aliases, persist)
            if plan.out_names and _resize_out_args(plan, bound, entry):
                return kernel(*args, **kwargs)
            _cache.put(key, entry)
            if loaded:
                entry.compiled = True  # loaded from disk: nothing to compile
            elif debug.enabled():
                debug.log("compile", f"{op} for {_describe(sig)}")
        if tensors.lazy is not None and spmd.layer is None:
            if entry.traceable is None:  # a loaded executable: lazy mode traces the lowering itself
                entry.traceable = _build(plan, lowering, call, bound, aliases).traceable
            rng_data = key_data(call.generator, device, 1)[0] if lowering.random else None
            flat = tensors.lazy.record(entry, call.inputs, rng_data, device)
        else:
            if tensors.lazy is not None:
                call.inputs = tensors.lazy.concrete(call.inputs)
            if entry.compiled:
                metrics.bump("op_cache_hits")
            else:
                state = "now" if entry.job is False else _background_state(entry, lowering, plan, call, bound, aliases)
                if state == "host":
                    result = _run_on_host(op, plan, args, kwargs, bound, device, entry)
                    if result is not _FAILED:
                        _C._offer_host_entry(plan.label, bound, entry.job, executable_cache.op_cache_size())
                        return result
                    entry.job = False
                entry.compiled = True
                metrics.bump("op_compiles")
                if state != "ready":
                    compile_start = compile_start or time.perf_counter()
            flat = _execute(entry, lowering, call, device, compile_start, op)
        fresh_values, new_buffers = jax.tree_util.tree_unflatten(entry.out_tree, flat)
        fresh = [_wrap_tree(v, m, st, device) for v, m, st in zip(fresh_values, entry.fresh_meta, entry.fresh_layout)]
        for t, buf, spec in zip(_mutable_tensors(plan, bound), new_buffers, entry.mutable_specs):
            if t is not None and buf is not None:
                if spmd.layer is not None:
                    buf = spmd.layer.keep_layout(_C._get_buffer(t), buf)
                _C._set_buffer(t, buf, *spec)
        if entry.fast is not False and spmd.layer is None and tensors.lazy is None:
            _offer(plan, bound, entry)
        results = []
        for kind, i in plan.returns:
            results.append(fresh[i] if kind == "fresh" else bound[i])
        if not results:
            return None
        return results[0] if len(results) == 1 else tuple(results)

    kernel.__name__ = f"tpu_{op._schema.name.split('::')[1]}_{op._overloadname}"
    return kernel


_FAILED = object()  # the host tier could not run a call


def _background_state(entry: _Entry, lowering: Lowering, plan: OpPlan, call: _Call, bound: list, aliases) -> str:
    """For a call of an entry not compiled yet: "host" (run the call on the host tier while the
    executable compiles in the background), "ready" (the background compile finished) or "now"
    (compile at this call: one the host tier cannot run, or after a failed background compile,
    whose error then surfaces here)."""
    job = entry.job
    if job is None:
        if not _host_runnable(entry, lowering, plan, bound):
            entry.job = False
            return "now"
        first_call = entry.run
        inputs = [_abstract(v) for v in call.inputs]
        level, dtype = precision.level(), torch.get_default_dtype()
        counter = [0]
        template = [_template(v, call, counter) for v in bound]
        factory_device = _factory_device(bound) if call.device is None else None
        request = (str(plan.op), plan.derived, template, factory_device, aliases, first_call.key, inputs, level, dtype)
        entry.job = background_compile.submit(
            lambda: _compile_in_background(first_call, inputs, level, dtype), ("op", request)
        )
        return "host"
    if not background_compile.called(job):
        return "host"
    entry.job = False
    if job.error is not None:
        return "now"
    if job.remote:  # compiled in the compile worker process: what its trace found comes with it
        try:
            entry.run, state = executable_cache.from_bytes(job.result)
        except Exception:  # not loadable here (a host callback): this call compiles it
            return "now"
        _, _, entry.mutable_specs, entry.out_tree, entry.fresh_layout, entry.reads_precision = state
    else:
        entry.run = job.result
    return "ready"


def _host_runnable(entry: _Entry, lowering: Lowering, plan: OpPlan, bound: list) -> bool:
    holdable = all(_holdable(m) for m in jax.tree_util.tree_leaves(entry.fresh_meta, is_leaf=_meta_leaf))
    return holdable and _host_tier_ok(lowering, plan, bound)


def _host_tier_ok(lowering: Lowering, plan: OpPlan, bound: list) -> bool:
    """Whether the host tier may run this call (see platforms/cpu/host_tier.py)."""
    if not lowering.host_tier or lowering.random or plan.out_names or plan.generator_index is not None:
        return False
    if spmd.layer is not None or tensors.lazy is not None or not host_tier.available():
        return False
    if plan.mutable and any(kind == "fresh" for kind, _ in plan.returns):
        return False  # the results are checked after the run, and then the writes would be made
    return all(host_tier.readable(t) for t in flatten_values(bound) if _is_tpu(t))


def _holdable(meta) -> bool:
    """Whether a tpu tensor can hold a result of `meta`'s dtype (CPU's kernel may make others)."""
    if not isinstance(meta, torch.Tensor):
        return True
    try:
        to_numpy_dtype(meta.dtype)
    except TypeError:
        return False
    return True


def _is_tpu(x) -> bool:
    return isinstance(x, torch.Tensor) and x.device.type == "tpu"


def _abstract(value):
    """What lowering needs of an executable input, without holding its buffer."""
    if isinstance(value, jax.Array):
        return jax.ShapeDtypeStruct(value.shape, value.dtype, sharding=value.sharding, weak_type=value.weak_type)
    return value


@compile_worker.handler("op")
def _compile_request(request: tuple) -> bytes:
    """In the compile worker: the executable of an eager op call `_background_state` described,
    with what its trace found (`_entry_state`), as executable_cache.to_bytes gives them."""
    name, derived, template, factory_device, aliases, persist, inputs, level, dtype = request
    plan, lowering = _kernels[(name, derived)]
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        entry = _build_from(plan, lowering, template, factory_device, aliases, persist)
        with precision.overridden(level):
            compiled = entry.run.compile(inputs, None)
    finally:
        torch.set_default_dtype(previous)
    body = executable_cache.to_bytes(compiled, _entry_state(entry))
    if body is None:
        raise RuntimeError(f"the executable of {name} cannot be serialized")
    return body


def _compile_in_background(first_call, inputs: list, level: str, dtype: torch.dtype):
    """The executable of `first_call` (an entry's FirstCall) for abstract `inputs`, traced under
    the matmul precision and default dtype of the call that asked for it."""
    if torch.get_default_dtype() != dtype:  # changed since: the call that collects it compiles
        raise RuntimeError("the default dtype changed while the op waited to compile")
    start = time.perf_counter()
    with precision.overridden(level):
        compiled = first_call.compile(inputs, None)
    metrics.record_compile("op", time.perf_counter() - start)
    return compiled


def _run_on_host(op: OpOverload, plan: OpPlan, args: tuple, kwargs: dict, bound: list, device: int, entry=None):
    """The call on the host tier, or _FAILED when its CPU kernel raised or its fresh results are
    not laid out as `entry`'s executable's will be (the executable then runs the call, as it
    would have without the host tier, and raises what it raises). Out of memory raises."""
    try:
        result = host_tier.run(op, args, kwargs, device, _mutable_tensors(plan, bound))
    except torch.OutOfMemoryError:  # (a tensor's value could not be computed): the executable's would fail too
        raise
    except Exception:
        return _FAILED
    if entry is None:
        return result
    results = result if isinstance(result, tuple) else (result,)
    fresh = [r for r, (kind, _) in zip(results, plan.returns) if kind == "fresh"]
    if not all(_laid_out_alike(r, m, st) for r, m, st in zip(fresh, entry.fresh_meta, entry.fresh_layout)):
        return _FAILED
    return result


def _laid_out_alike(result, meta, strides) -> bool:
    """Whether a host-tier result has the dtype, shape and strides (where they matter) that the
    executable's result of `meta`, laid out with `strides` (None: contiguous), will have."""
    if isinstance(meta, (list, tuple)):
        return isinstance(result, (list, tuple)) and all(map(_laid_out_alike, result, meta, strides))
    if not isinstance(meta, torch.Tensor):
        return not isinstance(result, torch.Tensor)
    if not isinstance(result, torch.Tensor) or result.dtype != meta.dtype or result.shape != meta.shape:
        return False
    expected = strides if strides is not None else geo.contiguous_strides(tuple(meta.shape))
    return all(n <= 1 or a == b for n, a, b in zip(meta.shape, result.stride(), expected))


def _offer(plan: OpPlan, bound: list, entry: _Entry) -> None:
    """Offers `entry`'s executable to the C++ path for the call that missed (it takes it only
    when this call is the one its kernel is running, unchanged)."""
    run = getattr(entry.run, "_call", None)  # the compiled executable's C++ call
    if run is None:
        return
    if entry.fast is None:
        direct = executable_cache.direct_call(entry.run)
        fresh = []
        for m, strides in zip(entry.fresh_meta, entry.fresh_layout):
            if not isinstance(m, torch.Tensor):  # a list or None result: the Python path
                entry.fast = False
                return
            fresh.append((tuple(m.shape), strides, m.dtype))
        specs = entry.mutable_specs or []
        if entry.out_tree.num_leaves != len(fresh) + len(specs) or len(specs) > 1:
            entry.fast = False
            return
        entry.fast = (direct, fresh, specs[0] if specs else None)
    direct, fresh, self_spec = entry.fast
    _C._offer_eager_entry(
        plan.label, bound, run, direct, entry.reads_precision, fresh, self_spec, executable_cache.op_cache_size()
    )


def _storage_locked(plan: OpPlan, fn: Callable) -> Callable:
    """Eager lowering `fn` of a mutating op, holding its mutated storages' locks."""

    def run(*args, **kwargs):
        with storage_locks.held(_mutable_tensors(plan, plan.bind(args, kwargs))):
            return fn(*args, **kwargs)

    run.__name__ = fn.__name__
    return run


def _out_of_memory_as_torch(op: OpOverload, fn: Callable) -> Callable:
    """Kernel `fn` of `op`, raising XLA's RESOURCE_EXHAUSTED as torch.OutOfMemoryError."""

    def run(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except jax.errors.JaxRuntimeError as error:
            memory.raise_if_out_of_memory(error, _device_of_call(args, kwargs), f"running {op}")
            raise

    run.__name__ = fn.__name__
    return run


def _device_of_call(args: tuple, kwargs: dict) -> int:
    """The tpu device an op call ran on (its first tpu tensor's or device argument's), where an
    out-of-memory error is reported."""
    for v in flatten_values([*args, *kwargs.values()]):
        if isinstance(v, torch.Tensor) and v.device.type == "tpu":
            return v.device.index
        if isinstance(v, torch.device) and v.type == "tpu" and v.index is not None:
            return v.index
    return _C._current_device()


def _apply_check(check: Callable, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """Runs a host check; it may return replacement arguments (a CPU scalar moved to the device)."""
    replaced = check(*args, **kwargs)
    return (args, kwargs) if replaced is None else replaced


def _takes_outs(check: Callable, out_names: list[str]) -> bool:
    """Whether a check names the out= tensors (frexp's dtype rules) or takes any keyword."""
    params = inspect.signature(check.fn if isinstance(check, SignatureCheck) else check).parameters
    return any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()) or all(n in params for n in out_names)


def _apart_check(plan: OpPlan, names: tuple[str, ...]) -> Callable:
    """The check that the tensors an in-place or out= form writes share no memory with arguments `names`."""
    read = [plan.arg_names.index(n) for n in names]

    def run(*args, **kwargs):
        bound = plan.bind(args, kwargs)
        others = flatten_values([bound[i] for i in read])
        for written in _mutable_tensors(plan, bound):
            for other in others:
                if written is not None and isinstance(other, torch.Tensor):
                    check_no_overlap(written, other)

    return run


def _check_no_partial_overlap(written: list, bound: list) -> None:
    for arg in bound:
        if isinstance(arg, torch.Tensor):
            for w in written:
                if w is not None and w is not arg:
                    check_no_overlap(w, arg, partial_only=True)


def _both_checks(first: Callable, second: Callable) -> Callable:
    def run(*args, **kwargs):
        args, kwargs = _apply_check(first, args, kwargs)
        return _apply_check(second, args, kwargs)

    return run


def _without_outs(check: Callable, out_names: frozenset) -> Callable:
    """A functional op's check, run for its derived out= variant: it sees the call without the out tensors."""

    def run(*args, **kwargs):
        outs = {k: v for k, v in kwargs.items() if k in out_names}
        replaced = check(*args, **{k: v for k, v in kwargs.items() if k not in out_names})
        if replaced is None:
            return None
        new_args, new_kwargs = replaced
        return new_args, {**new_kwargs, **outs}

    return run


def _checked(fn: Callable, check: Callable) -> Callable:
    """Eager lowering `fn` behind its host check."""

    def run(*args, **kwargs):
        args, kwargs = _apply_check(check, args, kwargs)
        return fn(*args, **kwargs)

    run.__name__ = fn.__name__
    return run


def _execute(entry: _Entry, lowering: Lowering, call: _Call, device: int, compile_start, op) -> list:
    rng = None
    if lowering.random:
        rng = key_from_data_jit(key_data(call.generator, device, 1)[0])
    try:
        flat = entry.run(call.inputs, rng)
    except jax.errors.JaxRuntimeError as error:
        memory.raise_if_out_of_memory(error, device, f"running {op}")
        raise
    if compile_start is not None:  # jax.jit traces and compiles on the first call
        metrics.record_compile("op", time.perf_counter() - compile_start)
    metrics.bump("executions")
    return flat


def _resize_out_args(plan: OpPlan, bound: list, entry: _Entry) -> bool:
    """Resizes out= tensors to the result shapes, as CPU does. True if any changed."""
    changed = False
    inputs = [v for v in flatten_values(bound) if isinstance(v, torch.Tensor)]
    for t, shape in zip(_mutable_tensors(plan, bound), entry.mutable_shapes):
        if t is not None and shape is not None and tuple(t.shape) != shape:
            if sum(v is t for v in inputs) > 1:  # the out tensor is also an input (ldexp_ as ldexp.out)
                raise RuntimeError(f"output with shape {list(t.shape)} doesn't match the broadcast shape {list(shape)}")
            if t.numel() != 0:
                warnings.warn(
                    f"An output with one or more elements was resized since it had shape {list(t.shape)}, "
                    f"which does not match the required output shape {list(shape)}. This behavior is "
                    "deprecated, and in a future PyTorch release outputs will not be resized unless they "
                    "have zero elements. You can explicitly reuse an out tensor t by resizing it, inplace, "
                    "to zero elements with t.resize_(0).",
                    UserWarning,
                    stacklevel=4,  # _resize_out_args, run, kernel, the caller
                )
            t.resize_(shape)
            changed = True
    return changed


def _wrap_tree(value, meta, strides, device: int):
    if isinstance(meta, (list, tuple)):
        return [_wrap_tree(v, m, st, device) for v, m, st in zip(value, meta, strides)]
    if meta is None or value is None:
        return None
    t = _C._wrap(value, list(meta.shape), meta.dtype, device)
    if strides is not None:  # the buffer holds the value in the meta strides' order
        t.as_strided_(meta.shape, strides)
    return t
