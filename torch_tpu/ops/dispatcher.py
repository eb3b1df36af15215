"""Runs an ATen op on tpu tensors through its lowering.

Per call: read each tpu tensor as (flat buffer, geometry), look the call's
signature up in the op executable cache, run the jitted function, then wrap
fresh outputs in new storages and swap the buffers of mutated arguments.
On a cache miss the op first runs on meta tensors: that gives PyTorch's own
output shapes, dtypes and error checks (op_entries.py builds the entry). Where a
host tier exists (the CPU client), a call not compiled yet runs there while its
executable compiles (host_tier_calls.py).
"""

from __future__ import annotations

import inspect
import time
import warnings
from collections.abc import Callable

import jax
import torch
from torch._ops import OpOverload

from torch_tpu import _C, debug, metrics, platforms
from torch_tpu.device import memory
from torch_tpu.ops import growing, host_tier_calls, op_tier_up, precision, spmd, storage_locks, tensors, view_gathers
from torch_tpu.ops.checks import check_no_overlap, jax_value_checks_on
from torch_tpu.ops.op_entries import (
    Call,
    Entry,
    build,
    describe,
    factory_device_of,
    load_entry,
    mutable_tensors,
    storage_aliases,
    wrap_numbers,
    wrap_scalars,
)
from torch_tpu.ops.registry import Lowering, SignatureCheck
from torch_tpu.ops.rng import key_data, key_from_data_jit
from torch_tpu.ops.schema import OpPlan, flatten_values
from torch_tpu.runtime import executable_cache

_cache = executable_cache.ExecutableCache()


def register_kernel(
    lib: torch.library.Library,
    op: OpOverload,
    lowering: Lowering,
    derived: bool,
    key: str,
    rules: dict[str, Lowering] | None = None,
) -> None:
    """Registers `op`'s tpu kernel on dispatch key `key`: behind the C++ steady-state path
    (csrc/eager_kernel.cc) where the op can take it, else the Python kernel alone. With platform
    `rules` beside the portable `lowering` ({platform: rule}, ops/registry.py), each call runs the
    Python kernel of the rule for `platforms.lowering_platform()` (the C++ path takes none)."""
    plan = OpPlan(op, derived)
    if rules:
        lib.impl(op, _kernel_per_platform(op, lowering, rules, derived, plan), key)
        return
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


def _kernel_per_platform(
    op: OpOverload, portable: Lowering, rules: dict[str, Lowering], derived: bool, plan: OpPlan
) -> Callable:
    """The kernel of an op with platform rules: per call, the Python kernel of the rule of
    `platforms.lowering_platform()`, else of the portable rule."""
    kernels = {platform: make_kernel(op, rule, derived, plan, platform) for platform, rule in rules.items()}
    fallback = make_kernel(op, portable, derived, plan)

    def kernel(*args, **kwargs):
        return kernels.get(platforms.lowering_platform(), fallback)(*args, **kwargs)

    kernel.__name__ = fallback.__name__
    return kernel


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


def make_kernel(
    op: OpOverload, lowering: Lowering, derived: bool, plan: OpPlan | None = None, platform: str | None = None
) -> Callable:
    """The Python kernel of `op` on tpu tensors: what torch.library calls, or the C++ path on a miss.
    `platform`: the platform whose rule `lowering` is (None: the portable rule); the executables of
    each rule are cached apart."""
    plan = plan or OpPlan(op, derived)
    rule_key = (str(op), derived, platform)
    host_tier_calls.kernels[rule_key] = (plan, lowering)
    cached_op = op if platform is None else (op, platform)  # the first part of the cache key
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
        written = mutable_tensors(plan, bound)
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
        wrap_numbers(bound, plan.tensor_args)
        if traced:
            wrap_scalars(bound, traced)
        call = Call()
        sig = tuple(call.walk(v) for v in bound)
        if spmd.layer is not None:
            spmd.layer.place_inputs(call.inputs, bound)
        aliases = storage_aliases(plan, bound) if plan.mutable else None
        device = call.device if call.device is not None else factory_device_of(bound)
        # factories and wrapped floats depend on the default dtype, matmuls on the matmul precision
        key = (cached_op, sig, torch.get_default_dtype(), aliases, precision.cache_key(), device, spmd.layer is None)
        entry = _cache.get(key)
        compile_start = None
        if entry is None and spmd.layer is None and tensors.lazy is None and view_gathers.moving_views(op, sig):
            if host_tier_calls.host_tier_ok(lowering, plan, bound):  # the host reads any geometry: nothing to compile
                result = host_tier_calls.run_on_host(op, plan, args, kwargs, bound, device)
                if result is not host_tier_calls.FAILED:
                    return result
            mutated = {id(t) for t in mutable_tensors(plan, bound) if t is not None}
            gathered = view_gathers.substitute(args, kwargs, mutated)
            if gathered is not None:  # the op again, on contiguous copies of its moving views
                return kernel(*gathered[0], **gathered[1])
        if entry is None:
            compile_start = time.perf_counter()
            persist = None
            if spmd.layer is None:
                persist = executable_cache.key_text("op", (name, *key[1:], platforms.shaped_buffers()))
            entry = load_entry(persist)
            loaded = entry is not None
            if not loaded:
                entry = build(plan, lowering, call, bound, aliases, persist)
            entry.persist = persist
            if loaded and entry.quick:  # its recompile did not finish in the process that saved it
                traceable = build(plan, lowering, call, bound, aliases).traceable
                entry.run = op_tier_up.RecompileLoaded(plan.label, entry, entry.run, traceable)
            if plan.out_names and _resize_out_args(plan, bound, entry):
                return kernel(*args, **kwargs)
            _cache.put(key, entry)
            if loaded:
                entry.compiled = True  # loaded from disk: nothing to compile
            elif debug.enabled():
                debug.log("compile", f"{op} for {describe(sig)}")
        if tensors.lazy is not None and spmd.layer is None:
            if entry.traceable is None:  # a loaded executable: lazy mode traces the lowering itself
                entry.traceable = build(plan, lowering, call, bound, aliases).traceable
            rng_data = key_data(call.generator, device, 1)[0] if lowering.random else None
            flat = tensors.lazy.record(entry, call.inputs, rng_data, device)
        else:
            if tensors.lazy is not None:
                call.inputs = tensors.lazy.concrete(call.inputs)
            if entry.compiled:
                metrics.bump("op_cache_hits")
            else:
                state = (
                    "now"
                    if entry.job is False
                    else host_tier_calls.background_state(entry, rule_key, call, bound, aliases)
                )
                if state == "host":
                    result = host_tier_calls.run_on_host(op, plan, args, kwargs, bound, device, entry)
                    if result is not host_tier_calls.FAILED:
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
        for t, buf, spec in zip(mutable_tensors(plan, bound), new_buffers, entry.mutable_specs):
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


def _offer(plan: OpPlan, bound: list, entry: Entry) -> None:
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
        with storage_locks.held(mutable_tensors(plan, plan.bind(args, kwargs))):
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
        for written in mutable_tensors(plan, bound):
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


def _execute(entry: Entry, lowering: Lowering, call: Call, device: int, compile_start, op) -> list:
    rng = None
    if lowering.random:
        rng = key_from_data_jit(key_data(call.generator, device, 1)[0])
    run = entry.run
    if entry.traceable is not None and jax_value_checks_on():
        run = entry.traceable  # jax.jit's call applies them; a compiled executable's may not
    try:
        flat = run(call.inputs, rng)
    except jax.errors.JaxRuntimeError as error:
        memory.raise_if_out_of_memory(error, device, f"running {op}")
        raise
    if compile_start is not None:  # jax.jit traces and compiles on the first call
        metrics.record_compile("op", time.perf_counter() - compile_start)
    metrics.bump("executions")
    return flat


def _resize_out_args(plan: OpPlan, bound: list, entry: Entry) -> bool:
    """Resizes out= tensors to the result shapes, as CPU does. True if any changed."""
    changed = False
    inputs = [v for v in flatten_values(bound) if isinstance(v, torch.Tensor)]
    for t, shape in zip(mutable_tensors(plan, bound), entry.mutable_shapes):
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
