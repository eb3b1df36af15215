"""One op signature's entry: what a call of that signature compiles to, and what running it needs.

The dispatcher (dispatcher.py) walks a call's arguments into its signature, the cache key, and
its jit inputs (`Call.walk`). On a miss `build` runs the op on meta tensors (PyTorch's own output
shapes, dtypes and errors; CPU's error where the meta kernel words it otherwise) and wraps the
lowering in one jitted function: it reads each tensor through its geometry, conforms the results
to the meta ones, lays them out in CPU's strides and writes the mutated buffers. The entry holds
that function (compiled at its first call and persisted with `entry_state`; `load_entry` brings
it back) and what wrapping its outputs needs.
"""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Callable, Iterable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import torch

from torch_tpu import _C, platforms
from torch_tpu.ops import geometry as geo
from torch_tpu.ops import op_tier_up, precision, spmd
from torch_tpu.ops.dtypes import NUMPY_TO_TORCH
from torch_tpu.ops.geometry import check_no_internal_overlap
from torch_tpu.ops.registry import Lowering
from torch_tpu.ops.schema import OpPlan, call_lowering, call_schema, conform_tree, flatten_values
from torch_tpu.ops.tensors import apply_bits, buffer_of, math_bits, tensor_geometry
from torch_tpu.runtime import client, executable_cache


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


def wrap_numbers(bound: list, positions: Iterable[int]) -> None:
    for i in positions:
        v = bound[i]
        if isinstance(v, (bool, float)) or (isinstance(v, int) and -(2**63) <= v < 2**63):
            bound[i] = WrappedNumber(v)


def wrap_scalars(bound: list, traced: tuple[tuple[int, object], ...]) -> None:
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
            wrap_numbers(v, range(len(v)))
        else:
            wrap_numbers(bound, (i,))


class _ScalarSlot:
    """A CPU 0-dim tensor: traced as a weakly typed scalar."""

    __slots__ = ("index", "tensor")

    def __init__(self, index: int, tensor: torch.Tensor):
        self.index = index
        self.tensor = tensor


class Call:
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
                    buf = buffer_of(x, recorded=True)  # (zeros made in the trace while recording)
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


def to_template(x, call: Call, counter: list[int]):
    """`x` with tensors replaced by slots, in the same order as Call.walk."""
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
        return type(x)(to_template(v, call, counter) for v in x)
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


class Entry:
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
        "persist",
        "quick",
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
        self.persist = None  # its persistent key (None: not persisted); a lazy trace's key holds it
        self.mutable_specs = None  # (dtype, length) of each new mutable-arg buffer, set when traced
        self.reads_precision = True  # the trace read the matmul precision (set when traced)
        self.quick = False  # compiled at low effort, to be recompiled at XLA's default (op_tier_up.py)


def meta_leaf(m) -> bool:
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
    return jax.tree_util.tree_map(lambda m: None if logical else _layout_strides(m), fresh_meta, is_leaf=meta_leaf)


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


def mutable_tensors(plan: OpPlan, bound: list) -> list[torch.Tensor | None]:
    return flatten_values([bound[i] for i in plan.mutable])


def _fresh_meta(plan: OpPlan, meta_result) -> list:
    results = meta_result if isinstance(meta_result, tuple) else (meta_result,)
    if len(plan.returns) == 0:
        results = ()
    return [results[i] for i, (kind, _) in enumerate(plan.returns) if kind == "fresh"]


def storage_aliases(plan: OpPlan, bound: list) -> tuple[int, ...] | None:
    """For each mutable tensor, the first mutable tensor sharing its storage (e.g.
    _foreach_add_ on views of one base), or None when no two share one."""
    if len(plan.mutable) == 1 and not isinstance(bound[plan.mutable[0]], (list, tuple)):
        return None
    seen: dict[int, int] = {}
    groups = []
    for i, t in enumerate(mutable_tensors(plan, bound)):
        # Keyed by buffer: a storage slice shares its parent's (its data_ptr is part-way in).
        key = None if t is None else t.untyped_storage().data_ptr() - _C._buffer_offset(t)
        groups.append(i if t is None else seen.setdefault(key, i))
    return tuple(groups) if any(g != i for i, g in enumerate(groups)) else None


def build(plan: OpPlan, lowering: Lowering, call: Call, bound: list, aliases=None, persist=None) -> Entry:
    counter = [0]
    template = [to_template(v, call, counter) for v in bound]
    factory_device = factory_device_of(bound) if call.device is None else None
    return build_from(plan, lowering, template, factory_device, aliases, persist)


def build_from(plan: OpPlan, lowering: Lowering, template: list, factory_device, aliases, persist) -> Entry:
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
    entry = Entry(None, fresh_meta, mutable_shapes)
    shaped = platforms.shaped_buffers()
    tensor_slots: list[_TensorSlot] = []
    _substitute(template, lambda s: tensor_slots.append(s) if isinstance(s, _TensorSlot) else None)

    def run(inputs, rng):
        def materialize(slot):
            value = inputs[slot.index]
            if isinstance(slot, _TensorSlot):
                return apply_bits(geo.read(value, slot.geom), *slot.bits)
            return value

        values = [_substitute(v, materialize) for v in template]
        # Shaped buffers out where the platform keeps them (TPU), and for N-D (sharded) buffers in:
        # a flat output would drop a per-dim sharding.
        nd_inputs = any(inputs[slot.index].ndim != 1 for slot in tensor_slots)
        keep_shape = shaped or nd_inputs
        reads = precision.reads()
        result = call_lowering(fn, plan, values, rng)
        entry.reads_precision = precision.reads() != reads
        if plan.derived:
            # A list-returning functional op (_foreach_*) gives ([values],): flatten it.
            fresh, mutated = [], flatten_values(result)
        else:
            fresh, mutated = result[: plan.num_fresh], result[plan.num_fresh :]
            mutated = flatten_values(mutated)
        if nd_inputs and not shaped:  # a sharded buffer is the logical value
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
            buf = geo.write(latest.get(group, inputs[slot.index]), slot.geom, value, shaped)
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
    after = None if options is None else functools.partial(op_tier_up.after_first_compile, plan.label, entry)
    entry.run = executable_cache.FirstCall(
        entry.traceable, persist, lambda: entry_state(entry), entry, "run", options, after
    )
    return entry


def _check_fits(shape: tuple, sizes: tuple) -> None:
    """CPU's error for an in-place result of another shape than the tensor it writes (x[5, 1].mul_(y[5, 5]))."""
    try:
        broadcast = tuple(np.broadcast_shapes(tuple(shape), tuple(sizes)))
    except ValueError:
        broadcast = tuple(shape)
    if broadcast != tuple(sizes):
        raise RuntimeError(f"output with shape {list(sizes)} doesn't match the broadcast shape {list(broadcast)}")


def entry_state(entry: Entry) -> tuple:
    """What a persisted entry needs besides its executable (meta tensors as (shape, dtype, strides))."""
    fresh = jax.tree_util.tree_map(
        lambda m: (tuple(m.shape), m.dtype, tuple(m.stride())), entry.fresh_meta, is_leaf=meta_leaf
    )
    return (
        fresh,
        entry.mutable_shapes,
        entry.mutable_specs,
        entry.out_tree,
        entry.fresh_layout,
        entry.reads_precision,
        entry.quick,
    )


def load_entry(persist: str | None) -> Entry | None:
    found = executable_cache.load(persist)
    if found is None:
        return None
    compiled, (fresh, mutable_shapes, mutable_specs, out_tree, fresh_layout, reads_precision, quick) = found
    fresh_meta = jax.tree_util.tree_map(
        lambda s: torch.empty_strided(s[0], s[2], dtype=s[1], device="meta"),
        fresh,
        is_leaf=lambda s: isinstance(s, tuple) and len(s) == 3 and isinstance(s[1], torch.dtype),
    )
    entry = Entry(compiled, fresh_meta, mutable_shapes)
    entry.mutable_specs, entry.out_tree, entry.fresh_layout = mutable_specs, out_tree, fresh_layout
    entry.reads_precision, entry.quick = reads_precision, quick
    return entry


def factory_device_of(bound: list) -> int:
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


def describe(sig: tuple) -> str:
    """A short readable form of a call signature, for debug output."""
    text = repr(sig)
    return text if len(text) <= 200 else text[:197] + "..."
