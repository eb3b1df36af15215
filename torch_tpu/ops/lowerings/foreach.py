"""The _foreach_* family: a functional _foreach_ op returns `([one array per list element],)`; its
in-place (`_foreach_add_.List`) and out= variants are derived from it, so the whole list updates in one
executable."""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import torch
from jax import lax

from torch_tpu import metrics
from torch_tpu.ops import precision, tensors
from torch_tpu.ops.dtypes import to_opmath
from torch_tpu.ops.registry import aten, lower
from torch_tpu.ops.tensors import from_jax, to_jax, write_jax
from torch_tpu.runtime import executable_cache


def _map(fn, *lists):
    return ([fn(*xs) for xs in zip(*lists)],)


def _pow(x, exponent):
    """torch's pow with CPU's exact special cases for common exponents."""
    if isinstance(exponent, (int, float)) and not isinstance(exponent, bool):
        if jnp.issubdtype(x.dtype, jnp.inexact):
            if exponent == 2:
                return x * x
            if exponent == 3:
                return x * x * x
            if exponent == 0.5:
                return jnp.sqrt(x)
            if exponent == -0.5:
                return lax.rsqrt(x)
            if exponent == -1:
                return 1 / x
            if exponent == -2:
                return 1 / (x * x)
        integral = isinstance(exponent, int) or float(exponent).is_integer()
        if integral and (jnp.issubdtype(x.dtype, jnp.inexact) or exponent >= 0):
            return lax.integer_pow(x, int(exponent))
    return jnp.power(x, exponent)


# ---- binary: List / Scalar / ScalarList / Tensor overloads ------------------


@lower(aten._foreach_add.List, aten._foreach_add.Tensor)
def foreach_add_list(self, other, *, alpha=1):
    others = other if isinstance(other, (list, tuple)) else [other] * len(self)
    return _map(lambda x, y: x + (y * alpha if alpha != 1 else y), self, others)


@lower(aten._foreach_add.Scalar)
def foreach_add_scalar(self, scalar):
    return _map(lambda x: x + scalar, self)


@lower(aten._foreach_add.ScalarList)
def foreach_add_scalar_list(self, scalars):
    return _map(lambda x, s: x + s, self, scalars)


@lower(aten._foreach_sub.List)
def foreach_sub_list(self, other, *, alpha=1):
    return _map(lambda x, y: x - (y * alpha if alpha != 1 else y), self, other)


@lower(aten._foreach_sub.Scalar)
def foreach_sub_scalar(self, scalar):
    return _map(lambda x: x - scalar, self)


@lower(aten._foreach_sub.ScalarList)
def foreach_sub_scalar_list(self, scalars):
    return _map(lambda x, s: x - s, self, scalars)


def _broadcast_other(self, other):
    return other if isinstance(other, (list, tuple)) else [other] * len(self)


@lower(aten._foreach_mul.List, aten._foreach_mul.Tensor)
def foreach_mul_list(self, other):
    return _map(lambda x, y: x * y, self, _broadcast_other(self, other))


@lower(aten._foreach_mul.Scalar)
def foreach_mul_scalar(self, scalar):
    return _map(lambda x: x * scalar, self)


@lower(aten._foreach_mul.ScalarList)
def foreach_mul_scalar_list(self, scalars):
    return _map(lambda x, s: x * s, self, scalars)


def _div(x, y):
    # torch's true division: integers divide as floats.
    if not jnp.issubdtype(jnp.result_type(x, y), jnp.inexact):
        x = x.astype(jnp.float32)
    return x / y


@lower(aten._foreach_div.List, aten._foreach_div.Tensor)
def foreach_div_list(self, other):
    return _map(_div, self, _broadcast_other(self, other))


@lower(aten._foreach_div.Scalar)
def foreach_div_scalar(self, scalar):
    return _map(lambda x: _div(x, scalar), self)


@lower(aten._foreach_div.ScalarList)
def foreach_div_scalar_list(self, scalars):
    return _map(_div, self, scalars)


@lower(aten._foreach_pow.List)
def foreach_pow_list(self, exponent):
    return _map(jnp.power, self, exponent)


@lower(aten._foreach_pow.Scalar)
def foreach_pow_scalar(self, exponent):
    return _map(lambda x: _pow(x, exponent), self)


@lower(aten._foreach_pow.ScalarList)
def foreach_pow_scalar_list(self, exponent):
    return _map(_pow, self, exponent)


@lower(aten._foreach_pow.ScalarAndTensor)
def foreach_pow_scalar_and_tensor(self, exponent):
    return _map(lambda e: jnp.power(self, e), exponent)


# clamp_min/clamp_max and maximum/minimum agree elementwise (NaN propagates in both).
@lower(
    aten._foreach_clamp_min.List,
    aten._foreach_clamp_min.ScalarList,
    aten._foreach_maximum.List,
    aten._foreach_maximum.ScalarList,
)
def foreach_maximum_list(self, other):
    return _map(jnp.maximum, self, other)


@lower(aten._foreach_clamp_min.Scalar, aten._foreach_maximum.Scalar)
def foreach_maximum_scalar(self, scalar):
    return _map(lambda x: jnp.maximum(x, scalar), self)


@lower(
    aten._foreach_clamp_max.List,
    aten._foreach_clamp_max.ScalarList,
    aten._foreach_minimum.List,
    aten._foreach_minimum.ScalarList,
)
def foreach_minimum_list(self, other):
    return _map(jnp.minimum, self, other)


@lower(aten._foreach_clamp_max.Scalar, aten._foreach_minimum.Scalar)
def foreach_minimum_scalar(self, scalar):
    return _map(lambda x: jnp.minimum(x, scalar), self)


# ---- ternary ----------------------------------------------------------------


def _addcmul(x, t1, t2, value):
    return to_opmath(x) + value * to_opmath(t1) * to_opmath(t2)


def _addcdiv(x, t1, t2, value):
    return to_opmath(x) + value * to_opmath(t1) / to_opmath(t2)


@lower(aten._foreach_addcmul.Scalar)
def foreach_addcmul_scalar(self, tensor1, tensor2, value=1):
    return _map(lambda x, a, b: _addcmul(x, a, b, value), self, tensor1, tensor2)


@lower(aten._foreach_addcmul.ScalarList)
def foreach_addcmul_scalar_list(self, tensor1, tensor2, scalars):
    return _map(_addcmul, self, tensor1, tensor2, scalars)


@lower(aten._foreach_addcdiv.Scalar)
def foreach_addcdiv_scalar(self, tensor1, tensor2, value=1):
    return _map(lambda x, a, b: _addcdiv(x, a, b, value), self, tensor1, tensor2)


@lower(aten._foreach_addcdiv.ScalarList)
def foreach_addcdiv_scalar_list(self, tensor1, tensor2, scalars):
    return _map(_addcdiv, self, tensor1, tensor2, scalars)


def _lerp(x, end, weight):
    """CPU's lerp: exact at both ends."""
    x, end = to_opmath(x), to_opmath(end)
    weight = to_opmath(weight) if hasattr(weight, "dtype") else weight
    return jnp.where(jnp.abs(weight) < 0.5, x + weight * (end - x), end - (end - x) * (1 - weight))


@lower(aten._foreach_lerp.List, aten._foreach_lerp.ScalarList)
def foreach_lerp_list(self, tensors1, weights):
    return _map(_lerp, self, tensors1, weights)


@lower(aten._foreach_lerp.Scalar)
def foreach_lerp_scalar(self, tensors1, weight):
    return _map(lambda x, e: _lerp(x, e, weight), self, tensors1)


# ---- per-element scalars as data ------------------------------------------
# Optimizers pass Scalar[] lists that change every step (Adam's bias-corrected
# step sizes), and .Tensor overloads take them as a CPU tensor. The in-place
# variants run eagerly with the scalars as a traced array, so a new step
# reuses the executable instead of compiling one per set of values.

_PER_SCALAR = {
    "add_scaled": lambda x, y, s: x + y * s,
    "sub_scaled": lambda x, y, s: x - y * s,
    "add": lambda x, s: x + s,
    "sub": lambda x, s: x - s,
    "mul": lambda x, s: x * s,
    "div": lambda x, s: _div(x, s),
    "addcmul": _addcmul,
    "addcdiv": _addcdiv,
    "lerp": _lerp,
}


@functools.partial(executable_cache.jit, static_argnums=0)
def _per_scalar_step(name, lists, scalars):
    fn = _PER_SCALAR[name]
    return [fn(*xs, scalars[i].astype(to_opmath(xs[0]).dtype)) for i, xs in enumerate(zip(*lists))]


def _scalar_array(scalars, tensors) -> np.ndarray:
    if isinstance(scalars, torch.Tensor):
        values = scalars.detach().cpu().reshape(-1).tolist()
    else:
        values = list(scalars)
    if len(values) != len(tensors):
        raise RuntimeError(
            f"Tensor list must have same number of elements as scalar list, got {len(tensors)} and {len(values)}"
        )
    floating = any(isinstance(v, float) for v in values) or any(t.is_floating_point() for t in tensors)
    wide = any(t.dtype == torch.float64 for t in tensors)
    dtype = (jnp.float64 if wide else jnp.float32) if floating else jnp.int64
    return np.asarray(values, dtype)  # numpy: an eager jnp conversion would trace and compile


def _run_per_scalar(name, self, others, scalars):
    if not self:
        return []
    if any(not t.is_floating_point() for t in self) and any(isinstance(v, float) for v in _as_values(scalars)):
        raise RuntimeError("result type Float can't be cast to the desired output type " + str(self[0].dtype))
    if tensors.lazy is not None:  # lazy mode: recorded, not run
        lists = [[tensors.lazy.read(t) for t in ts] for ts in (self, *others)]
        return tensors.lazy.call(_per_scalar_step, (name,), lists, _scalar_array(scalars, self))
    lists = [[to_jax(t) for t in ts] for ts in (self, *others)]
    metrics.bump("executions")
    return _per_scalar_step(name, lists, _scalar_array(scalars, self))


def _as_values(scalars):
    return scalars.reshape(-1).tolist() if isinstance(scalars, torch.Tensor) else list(scalars)


def _register_per_scalar_inplace(name: str, op, n_others: int):
    @lower(op, eager=True)
    def foreach_per_scalar_(self, *args):
        others, scalars = args[:n_others], args[n_others]
        for t, v in zip(self, _run_per_scalar(name, self, others, scalars)):
            write_jax(t, v)

    foreach_per_scalar_.__name__ = f"foreach_{name}_per_scalar_"


def _register_per_scalar_functional(name: str, op):
    @lower(op, eager=True)
    def foreach_per_scalar(self, tensor1, tensor2, scalars):
        values = _run_per_scalar(name, self, (tensor1, tensor2), scalars)
        return [from_jax(v, t.device.index, torch.result_type(t, 1.0)) for t, v in zip(self, values)]

    foreach_per_scalar.__name__ = f"foreach_{name}_per_scalar"


def _register_scalar_as_traced(name: str, op, n_others: int, arg: str):
    """In-place ops whose one Scalar (`alpha`, `value`, `weight`, the scalar itself) tracks the
    learning rate: traced like a Scalar[] of that value, so an LR scheduler does not recompile."""

    @lower(op, eager=True)
    def foreach_traced_scalar_(self, *args, **kwargs):
        others = args[:n_others]
        rest = args[n_others:]
        scalar = rest[0] if rest else kwargs.get(arg, 1)
        for t, v in zip(self, _run_per_scalar(name, self, others, [scalar] * len(self))):
            write_jax(t, v)

    foreach_traced_scalar_.__name__ = f"foreach_{name}_traced_scalar_"


for _name in ("add", "sub", "mul", "div"):
    _register_per_scalar_inplace(_name, getattr(aten, f"_foreach_{_name}_").ScalarList, 0)
    _register_scalar_as_traced(_name, getattr(aten, f"_foreach_{_name}_").Scalar, 0, "scalar")
_register_scalar_as_traced("add_scaled", aten._foreach_add_.List, 1, "alpha")
_register_scalar_as_traced("sub_scaled", aten._foreach_sub_.List, 1, "alpha")
_register_scalar_as_traced("lerp", aten._foreach_lerp_.Scalar, 1, "weight")
_register_per_scalar_inplace("lerp", aten._foreach_lerp_.ScalarList, 1)
for _name in ("addcmul", "addcdiv"):
    _register_per_scalar_inplace(_name, getattr(aten, f"_foreach_{_name}_").ScalarList, 2)
    _register_per_scalar_inplace(_name, getattr(aten, f"_foreach_{_name}_").Tensor, 2)
    _register_scalar_as_traced(_name, getattr(aten, f"_foreach_{_name}_").Scalar, 2, "value")
    _register_per_scalar_functional(_name, getattr(aten, f"_foreach_{_name}").Tensor)


# ---- unary ------------------------------------------------------------------


def _float_unary(fn):
    def apply(x):
        if not jnp.issubdtype(x.dtype, jnp.inexact):
            x = x.astype(jnp.float32)
        return fn(x)

    return apply


def _sign(x):
    return x if x.dtype == jnp.bool_ else jnp.sign(x)


_UNARY = {
    "abs": jnp.abs,
    "neg": jnp.negative,
    "sign": _sign,
    "sqrt": _float_unary(jnp.sqrt),
    "rsqrt": _float_unary(lax.rsqrt),
    "reciprocal": _float_unary(lambda x: 1 / x),
    "exp": _float_unary(jnp.exp),
    "expm1": _float_unary(jnp.expm1),
    "log": _float_unary(jnp.log),
    "log1p": _float_unary(jnp.log1p),
    "log2": _float_unary(jnp.log2),
    "log10": _float_unary(jnp.log10),
    "sigmoid": _float_unary(jax.nn.sigmoid),
    "tanh": _float_unary(jnp.tanh),
    "sin": _float_unary(jnp.sin),
    "cos": _float_unary(jnp.cos),
    "tan": _float_unary(jnp.tan),
    "erf": _float_unary(lax.erf),
    "erfc": _float_unary(lax.erfc),
    "floor": jnp.floor,
    "ceil": jnp.ceil,
    "round": jnp.round,
    "trunc": jnp.trunc,
    "frac": lambda x: x - jnp.trunc(x),
}


def _register_unary(name, fn):
    @lower(getattr(aten, f"_foreach_{name}").default)
    def foreach_unary(self):
        return _map(fn, self)

    foreach_unary.__name__ = f"foreach_{name}"


for _name, _fn in _UNARY.items():
    _register_unary(_name, _fn)


@lower(aten._foreach_zero.default)
def foreach_zero(self):
    return _map(jnp.zeros_like, self)


@lower(aten._foreach_copy.default)
def foreach_copy(self, src, non_blocking=False):
    return _map(lambda x, s: jnp.broadcast_to(s, x.shape).astype(x.dtype), self, src)


@lower(aten._foreach_clone.default)
def foreach_clone(self, *, memory_format=None):
    return _map(lambda x: x, self)


@lower(aten._foreach_mm.default)
def foreach_mm(self, mat2):
    return _map(lambda a, b: jnp.matmul(a, b, precision=precision.matmul(a, b)), self, mat2)


# ---- reductions -------------------------------------------------------------


def _norm(x, ord):
    a = jnp.abs(to_opmath(x))
    if a.size == 0:
        return jnp.zeros((), a.dtype) if ord != -math.inf else jnp.full((), jnp.inf, a.dtype)
    if ord == 2:
        return jnp.sqrt(jnp.sum(a * a))
    if ord == 1:
        return jnp.sum(a)
    if ord == math.inf:
        return jnp.max(a)
    if ord == -math.inf:
        return jnp.min(a)
    if ord == 0:
        return jnp.sum(a != 0).astype(a.dtype)
    return jnp.sum(a**ord) ** (1.0 / ord)


@lower(aten._foreach_norm.Scalar)
def foreach_norm(self, ord=2, dtype=None):
    return _map(lambda x: _norm(x, ord), self)


@lower(aten._foreach_max.default)
def foreach_max(self):
    return _map(jnp.max, self)
