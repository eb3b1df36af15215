"""The dispatcher's calls on the host tier (platforms/cpu/host_tier.py), where there is one.

On the CPU client a call whose entry has not compiled yet runs with PyTorch's CPU kernel on the
tensors' host memory while its executable compiles in the background (`background_state`), and
a call on moving views runs there without compiling at all; `host_tier_ok` says which calls may.
Elsewhere `host_tier.available()` is False and none of this runs. The compile worker rebuilds an
op's entry from the request `background_state` sends (`kernels`: what each registered kernel runs).
"""

from __future__ import annotations

import time

import jax
import torch
from torch._ops import OpOverload

from torch_tpu import metrics
from torch_tpu.ops import checks, precision, spmd, tensors
from torch_tpu.ops import geometry as geo
from torch_tpu.ops.dtypes import to_numpy_dtype
from torch_tpu.ops.op_entries import (
    Call,
    Entry,
    build_from,
    entry_state,
    factory_device_of,
    meta_leaf,
    mutable_tensors,
    to_template,
)
from torch_tpu.ops.registry import Lowering
from torch_tpu.ops.schema import OpPlan, flatten_values
from torch_tpu.platforms.cpu import background_compile, compile_worker, host_tier
from torch_tpu.runtime import executable_cache

# (op name, derived, platform of its rule or None) -> what that kernel runs
kernels: dict[tuple[str, bool, str | None], tuple[OpPlan, Lowering]] = {}

FAILED = object()  # the host tier could not run a call


def background_state(entry: Entry, kernel: tuple, call: Call, bound: list, aliases) -> str:
    """For a call of an entry not compiled yet: "host" (run the call on the host tier while the
    executable compiles in the background), "ready" (the background compile finished) or "now"
    (compile at this call: one the host tier cannot run, or after a failed background compile,
    whose error then surfaces here). `kernel`: the key of the op's kernel in `kernels`."""
    job = entry.job
    if job is None:
        plan, lowering = kernels[kernel]
        if not _host_runnable(entry, lowering, plan, bound):
            entry.job = False
            return "now"
        first_call = entry.run
        inputs = [_abstract(v) for v in call.inputs]
        level, dtype = precision.level(), torch.get_default_dtype()
        counter = [0]
        template = [to_template(v, call, counter) for v in bound]
        factory_device = factory_device_of(bound) if call.device is None else None
        request = (kernel, template, factory_device, aliases, first_call.key, inputs, level, dtype)
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
        _, _, entry.mutable_specs, entry.out_tree, entry.fresh_layout, entry.reads_precision, entry.quick = state
    else:
        entry.run = job.result
    return "ready"


def _host_runnable(entry: Entry, lowering: Lowering, plan: OpPlan, bound: list) -> bool:
    holdable = all(_holdable(m) for m in jax.tree_util.tree_leaves(entry.fresh_meta, is_leaf=meta_leaf))
    return holdable and host_tier_ok(lowering, plan, bound)


def host_tier_ok(lowering: Lowering, plan: OpPlan, bound: list) -> bool:
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
    """In the compile worker: the executable of an eager op call `background_state` described,
    with what its trace found (`entry_state`), as executable_cache.to_bytes gives them."""
    kernel, template, factory_device, aliases, persist, inputs, level, dtype = request
    plan, lowering = kernels[kernel]
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        entry = build_from(plan, lowering, template, factory_device, aliases, persist)
        with precision.overridden(level):
            compiled = entry.run.compile(inputs, None)
    finally:
        torch.set_default_dtype(previous)
    body = executable_cache.to_bytes(compiled, entry_state(entry))
    if body is None:
        raise RuntimeError(f"the executable of {kernel[0]} cannot be serialized")
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


def run_on_host(op: OpOverload, plan: OpPlan, args: tuple, kwargs: dict, bound: list, device: int, entry=None):
    """The call on the host tier, or FAILED when its CPU kernel raised or its fresh results are
    not laid out as `entry`'s executable's will be (the executable then runs the call, as it
    would have without the host tier, and raises what it raises), and while jax's nan/inf checks
    are on (they check executables' results). Out of memory raises."""
    if checks.jax_value_checks_on():
        return FAILED
    try:
        result = host_tier.run(op, args, kwargs, device, mutable_tensors(plan, bound))
    except torch.OutOfMemoryError:  # (a tensor's value could not be computed): the executable's would fail too
        raise
    except Exception:
        return FAILED
    if entry is None:
        return result
    results = result if isinstance(result, tuple) else (result,)
    fresh = [r for r, (kind, _) in zip(results, plan.returns) if kind == "fresh"]
    if not all(_laid_out_alike(r, m, st) for r, m, st in zip(fresh, entry.fresh_meta, entry.fresh_layout)):
        return FAILED
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
