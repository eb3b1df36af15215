"""What an op's schema says, and the one calling convention of a lowering (eager and graph)."""

from __future__ import annotations

import jax.numpy as jnp
import torch
from torch._ops import OpOverload

from torch_tpu.ops.dtypes import TORCH_TO_NUMPY


class OpPlan:
    """What a schema says about mutation and returns, computed once per op."""

    def __init__(self, op: OpOverload, derived: bool):
        schema = op._schema
        self.op = op
        self.label = str(op)  # names the op to the C++ path
        self.derived = derived  # lowering is the functional op; outputs go to mutable args
        self.arg_names = [a.name for a in schema.arguments]
        self.kwarg_only = {a.name for a in schema.arguments if a.kwarg_only}
        self.mutable = [i for i, a in enumerate(schema.arguments) if a.alias_info and a.alias_info.is_write]
        self.out_names = [a.name for a in schema.arguments if a.is_out]
        self.out_set = frozenset(self.out_names)
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
        # ATen `Scalar` / `Scalar?` / `Scalar[]` arguments: name -> index.
        self.scalar_args = {
            a.name: i
            for i, a in enumerate(schema.arguments)
            if str(a.type) in ("number", "Optional[number]", "List[number]")
        }
        self._defaults = [(a.name, schema_default(a) if a.has_default_value() else None) for a in schema.arguments]
        self.generator_index = next((i for i, a in enumerate(schema.arguments) if "Generator" in str(a.type)), None)

    def traced_scalars(self, names) -> tuple[tuple[int, object], ...]:
        """(index, schema default) of each Scalar argument in `names` (others are not Scalars here)."""
        return tuple(
            (self.scalar_args[n], self._defaults[self.scalar_args[n]][1]) for n in names if n in self.scalar_args
        )

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


def schema_default(arg):
    value = arg.default_value
    if isinstance(value, int) and "ScalarType" in str(arg.real_type):
        return _SCALAR_TYPES[value]
    return value


def flatten_values(values) -> list:
    flat: list = []
    for v in values:
        if isinstance(v, (list, tuple)):
            flat.extend(v)
        else:
            flat.append(v)
    return flat


def conform_tree(value, meta, op, keep_shape: bool = False):
    """Casts a lowering's result to the dtypes PyTorch's meta run gave and checks its shapes (a
    symbolic dim matches any size); flat unless `keep_shape`."""
    if isinstance(meta, (list, tuple)):
        values = value if isinstance(value, (list, tuple)) or hasattr(value, "shape") else [value]
        return type(meta)(conform_tree(v, m, op, keep_shape) for v, m in zip(values, meta))
    if meta is None or value is None:
        return None
    if not isinstance(meta, torch.Tensor):
        return value  # a number or SymInt result is the lowering's own
    value = jnp.asarray(value)
    dtype = TORCH_TO_NUMPY[meta.dtype]
    if value.dtype != dtype:
        value = value.astype(dtype)
    if value.ndim != meta.dim() or any(
        isinstance(want, int) and got != want for got, want in zip(value.shape, meta.shape)
    ):
        raise AssertionError(
            f"torch_tpu lowering of {op} produced shape {tuple(value.shape)}, expected {tuple(meta.shape)}"
        )
    return value if keep_shape else value.reshape(-1)


def lowering_args(plan: OpPlan, values: list, rng=None) -> tuple[list, dict]:
    """A lowering's positional and keyword arguments from schema-ordered `values`: out= and
    generator arguments are dropped (the key comes as `rng=`)."""
    pos, kw = [], {}
    for index, (name, value) in enumerate(zip(plan.arg_names, values)):
        if name in plan.out_set or index == plan.generator_index:
            continue
        if name in plan.kwarg_only or kw:
            kw[name] = value
        else:
            pos.append(value)
    if rng is not None:
        kw["rng"] = rng
    return pos, kw


def call_lowering(fn, plan: OpPlan, values: list, rng=None) -> list:
    """Calls lowering `fn` on schema-ordered `values`; its results as a list (a lowering returns
    its results in a tuple, or one bare array)."""
    pos, kw = lowering_args(plan, values, rng)
    result = fn(*pos, **kw)
    return list(result) if isinstance(result, (tuple, list)) else [result]


def call_schema(op: OpOverload, plan: OpPlan, bound: list):
    pos, kw = [], {}
    for name, value in zip(plan.arg_names, bound):
        if name in plan.kwarg_only or kw:
            kw[name] = value
        else:
            pos.append(value)
    return op(*pos, **kw)
