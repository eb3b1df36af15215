"""The visible CPU fallback for ops without a lowering: counted in metrics and
warned about once per op."""

from __future__ import annotations

import torch
from torch.utils._pytree import tree_flatten, tree_map

from torch_tpu import debug, metrics


def _to_cpu(x):
    if isinstance(x, torch.Tensor) and x.device.type == "tpu":
        metrics.bump("host_transfers")
        return x.cpu()
    return x


def _schema_outs(schema) -> set[str]:
    return {a.name for a in schema.arguments if a.is_out}


def _out_on_device(schema, args: tuple, kwargs: dict, device: torch.device) -> None:
    """CUDA's error for an out= tensor on another device than the op's tpu inputs (the fallback
    would write a CPU out= tensor, where the CPU op would need it on the CPU)."""
    leaves = tree_flatten((args, [v for k, v in kwargs.items() if k not in _schema_outs(schema)]))[0]
    if not any(isinstance(x, torch.Tensor) and x.device.type == "tpu" for x in leaves):
        return
    for a in schema.arguments:
        t = kwargs.get(a.name) if a.is_out else None
        if isinstance(t, torch.Tensor) and t.device.type != "tpu":
            raise RuntimeError(
                f"Expected all tensors to be on the same device, but found at least two devices, {device} and "
                f"{t.device}!"
            )


def _numbers_as_tensors(schema, args: tuple) -> tuple:
    """A Python number where the schema takes a Tensor (a wrapped scalar, e.g. n_scalar_out's `n`
    re-dispatched to .out) as a 0-dim CPU tensor: a same-kind 0-dim tensor promotes as a number does."""
    fixed = list(args)
    for i, (a, v) in enumerate(zip(schema.arguments, args)):
        if isinstance(v, (bool, int, float, complex)) and isinstance(a.type, torch.TensorType):
            fixed[i] = torch.tensor(v)
    return tuple(fixed)


def _device_of(args, kwargs) -> torch.device:
    found = []

    def visit(x):
        if isinstance(x, torch.Tensor) and x.device.type == "tpu":
            found.append(x.device)
        return x

    tree_map(visit, (args, kwargs))
    return found[0] if found else torch.device("tpu", torch.tpu.current_device())


def cpu_fallback(op, args, kwargs):
    name = str(op)
    metrics.record_fallback(name)
    debug.warn_once(
        name,
        f"torch_tpu: {name} has no tpu lowering yet; it runs on the CPU (counted in "
        "torch_tpu.metrics.counters()['cpu_fallbacks'])",
        stacklevel=3,
    )
    debug.log("fallback", f"{name} runs on the CPU")
    schema = op._schema
    for r in schema.returns:
        if r.alias_info is not None and not r.alias_info.is_write:
            raise NotImplementedError(
                f"torch_tpu: {name} returns a view and has no tpu kernel; a CPU fallback cannot alias"
            )
    device = _device_of(args, kwargs)
    _out_on_device(schema, args, kwargs, device)
    cpu_args, cpu_kwargs = tree_map(_to_cpu, (_numbers_as_tensors(schema, args), kwargs))
    if "device" in cpu_kwargs and isinstance(cpu_kwargs["device"], torch.device):
        if cpu_kwargs["device"].type == "tpu":
            cpu_kwargs["device"] = torch.device("cpu")
    result = op(*cpu_args, **cpu_kwargs)

    # Write mutated arguments back to their tpu tensors.
    bound = list(args) + [kwargs.get(a.name) for a in schema.arguments[len(args) :]]
    cpu_bound = list(cpu_args) + [cpu_kwargs.get(a.name) for a in schema.arguments[len(args) :]]
    written: dict[frozenset, object] = {}
    for arg, original, cpu_value in zip(schema.arguments, bound, cpu_bound):
        if arg.alias_info is not None and arg.alias_info.is_write:
            written[frozenset(arg.alias_info.before_set)] = original
            pairs = zip(original, cpu_value) if isinstance(original, (list, tuple)) else [(original, cpu_value)]
            for dst, src in pairs:
                if isinstance(dst, torch.Tensor) and dst.device.type == "tpu":
                    if dst.shape != src.shape:
                        dst.resize_(src.shape)
                    dst.copy_(src)

    def to_device(x):
        if isinstance(x, torch.Tensor):
            return x.to(device)
        return x

    results = result if isinstance(result, tuple) else (result,)
    out = []
    for r, value in zip(schema.returns, results):
        if r.alias_info is not None:
            out.append(written[frozenset(r.alias_info.before_set)])
        else:
            out.append(tree_map(to_device, value))
    if not isinstance(result, tuple):
        return out[0] if out else result
    return tuple(out)
