"""Factory ops: fills, full/zeros/ones, arange, eye, linspace/logspace, casts, clone."""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np
import torch
from jax import lax

from torch_tpu.ops.dtypes import jax_dtype, rounded_to, to_numpy_dtype
from torch_tpu.ops.promotion import cast
from torch_tpu.ops.registry import FrontPath, aten, lower


def _filled(shape, value, dtype) -> jnp.ndarray:
    """`value` (Python scalar or traced scalar) cast as torch casts, broadcast to `shape`."""
    return jnp.broadcast_to(cast(value, dtype), shape)


def _scalar_dtype(*values, dtype=None) -> np.dtype:
    """The dtype a factory infers from its Scalar arguments, as torch does."""
    if dtype is not None:
        return to_numpy_dtype(dtype)
    kinds = [_kind(v) for v in values]
    if complex in kinds:
        return jnp.dtype(np.complex128 if torch.get_default_dtype() == torch.float64 else np.complex64)
    if float in kinds:
        return jax_dtype(None)
    if all(k is bool for k in kinds):
        return np.dtype(np.bool_)
    return np.dtype(np.int64)


def _kind(value) -> type:
    """bool, int, float or complex: of a Python scalar, or of a traced one (`Lowering.traced`)."""
    if not hasattr(value, "dtype"):
        return type(value)
    if value.dtype == np.bool_:
        return bool
    return (
        complex
        if jnp.issubdtype(value.dtype, jnp.complexfloating)
        else float
        if jnp.issubdtype(value.dtype, jnp.floating)
        else int
    )


# ---- fills ------------------------------------------------------------------


_C_TYPE_NAMES = {
    np.float16: "c10::Half",
    np.float32: "float",
    np.float64: "double",
    np.int8: "int8_t",
    np.int16: "int16_t",
    np.int32: "int",
    np.int64: "int64_t",
    np.uint8: "uint8_t",
}


def _check_overflow(value, dtype: np.dtype) -> None:
    """c10::checked_convert: a Scalar fill value must fit the dtype (negative ints may wrap to unsigned)."""
    if not isinstance(value, (int, float)) or isinstance(value, bool) or dtype == np.bool_:
        return
    if jnp.issubdtype(dtype, jnp.floating):
        info = jnp.finfo(dtype)
        bad = math.isfinite(value) and not float(info.min) <= value <= float(info.max)
    elif jnp.issubdtype(dtype, jnp.integer):
        info = jnp.iinfo(dtype)
        if isinstance(value, float) and not math.isfinite(value):
            bad = True
        elif isinstance(value, int) and value < 0 and info.min == 0:
            bad = -value > info.max
        else:
            bad = not info.min <= value <= info.max
    else:
        return
    if bad:
        name = _C_TYPE_NAMES.get(np.dtype(dtype).type, "c10::BFloat16")
        raise RuntimeError(f"value cannot be converted to type {name} without overflow")


def _check_fill(self, value):
    """Eager: CPU's overflow error, on the Python value (the lowering sees a traced one)."""
    if isinstance(self, torch.Tensor):
        _check_overflow(value, to_numpy_dtype(self.dtype))


def _check_full(size, fill_value, *, dtype=None, layout=None, device=None, pin_memory=None):
    _check_overflow(fill_value, _scalar_dtype(fill_value, dtype=dtype))


@lower(aten.fill_.Scalar, aten.fill_.Tensor, traced=("value",), check=_check_fill)
def fill_(self, value):
    _check_overflow(value, self.dtype)
    return _filled(self.shape, value, self.dtype)


@lower(aten.zero_.default)
def zero_(self):
    return jnp.zeros_like(self)


@lower(aten.full.default, traced=("fill_value",), check=_check_full)
def full(size, fill_value, *, dtype=None, layout=None, device=None, pin_memory=None):
    dtype = _scalar_dtype(fill_value, dtype=dtype)
    _check_overflow(fill_value, dtype)
    if isinstance(fill_value, complex) and not jnp.issubdtype(dtype, jnp.complexfloating):
        raise RuntimeError(f"value cannot be converted to type {jnp.dtype(dtype).name} without overflow")
    return _filled(tuple(size), fill_value, dtype)


@lower(aten.zeros.default)
def zeros(size, *, dtype=None, layout=None, device=None, pin_memory=None):
    return jnp.zeros(tuple(size), jax_dtype(dtype))


@lower(aten.ones.default)
def ones(size, *, dtype=None, layout=None, device=None, pin_memory=None):
    return jnp.ones(tuple(size), jax_dtype(dtype))


@lower(aten._efficientzerotensor.default)
def efficientzerotensor(size, *, dtype=None, layout=None, device=None, pin_memory=None):
    """Autograd's zero gradients: plain zeros here."""
    return jnp.zeros(tuple(size), jax_dtype(dtype))


@lower(aten.scalar_tensor.default, traced=("s",))
def scalar_tensor(s, *, dtype=None, layout=None, device=None, pin_memory=None):
    return _filled((), s, jax_dtype(dtype))


# ---- ranges -----------------------------------------------------------------


def _acc_dtype(dtype: np.dtype) -> np.dtype:
    """CPU's accumulation type for range factories."""
    if jnp.issubdtype(dtype, jnp.integer) or dtype == np.bool_:
        return np.dtype(np.int64)
    if dtype.itemsize < 4:
        return np.dtype(np.float32)
    return np.dtype(np.float64)


def _arange_size(start, end, step, dtype: np.dtype) -> int:
    """CPU's size: exact integer arithmetic (bounds truncated to integers) for int64, else doubles."""
    if dtype == np.int64:
        start, end, step = int(start), int(end), int(step)
        sgn = (step > 0) - (step < 0)
        span = end - start + step - sgn
        quotient = abs(span) // abs(step)  # C's truncating division
        return quotient if (span >= 0) == (step > 0) else -quotient
    return math.ceil((float(end) - float(start)) / float(step))


@lower(aten.arange.start_step)
def arange(start, end, step=1, *, dtype=None, layout=None, device=None, pin_memory=None):
    out = _scalar_dtype(start, end, step, dtype=dtype)
    acc = _acc_dtype(out)
    n = max(_arange_size(start, end, step, out), 0)
    cast = int if acc == np.int64 else float
    return (cast(start) + lax.iota(acc, n) * cast(step)).astype(out)


@lower(aten.arange.start_out, eager=True)
def arange_out(start, end, step=1, *, out):
    result = aten.arange.start_step(start, end, step, dtype=out.dtype, device=out.device)
    if out.shape != result.shape:
        out.resize_(result.shape)
    return out.copy_(result)


@lower(aten.eye.default, aten.eye.m)
def eye(n, m=None, *, dtype=None, layout=None, device=None, pin_memory=None):
    return jnp.eye(n, n if m is None else m, dtype=jax_dtype(dtype))


def _linspace_values(start, end, steps: int, dtype: np.dtype) -> jnp.ndarray:
    """CPU's linspace: from start for the first half, from end for the second."""
    integral = jnp.issubdtype(dtype, jnp.integer) or dtype == np.bool_
    step_dtype = np.dtype(np.float64) if integral else (np.dtype(np.float32) if dtype.itemsize < 4 else dtype)
    start = cast(cast(start, dtype), step_dtype)
    end = cast(cast(end, dtype), step_dtype)
    if steps == 1:
        return jnp.broadcast_to(start, (1,)).astype(dtype)
    # Reduced-precision floats round after every operation, as c10::Half/BFloat16 arithmetic does.
    r = (lambda v: rounded_to(v, dtype)) if step_dtype != dtype and not integral else (lambda v: v)
    step = r(r(end - start) / (steps - 1))
    idx = lax.iota(step_dtype, steps)
    low = r(start + r(step * r(idx)))
    high = r(end - r(step * r(steps - idx - 1)))
    return jnp.where(idx < steps // 2, low, high).astype(dtype)


@lower(aten.linspace.default, aten.linspace.Tensor_Tensor, aten.linspace.Tensor_Scalar, aten.linspace.Scalar_Tensor)
def linspace(start, end, steps, *, dtype=None, layout=None, device=None, pin_memory=None):
    return _linspace_values(start, end, steps, jax_dtype(dtype))


@lower(aten.logspace.default, aten.logspace.Tensor_Tensor, aten.logspace.Tensor_Scalar, aten.logspace.Scalar_Tensor)
def logspace(start, end, steps, base=10.0, *, dtype=None, layout=None, device=None, pin_memory=None):
    """CPU's logspace: bounds cast to the dtype, exponents and powers in double."""
    out = jax_dtype(dtype)
    f64 = np.dtype(np.float64)
    start, end = cast(cast(start, out), f64), cast(cast(end, out), f64)
    if steps == 1:
        return jnp.power(base, jnp.broadcast_to(start, (1,))).astype(out)
    step = (end - start) / (steps - 1)
    idx = lax.iota(f64, steps)
    exponents = jnp.where(idx < steps // 2, start + step * idx, end - step * (steps - idx - 1))
    return jnp.power(base, exponents).astype(out)


# ---- casts and copies -------------------------------------------------------


@lower(aten.clone.default)
def clone(self, *, memory_format=None):
    return self


def _is_transfer(self, *, dtype=None, device=None, **_):
    """Whether a _to_copy call is more than a cast on its tensor's device: a transfer, or complex."""
    target = self.device if device is None else torch.device(device)
    same_device = self.device.type == "tpu" and target.type == "tpu" and target.index in (None, self.device.index)
    return not (same_device and not self.is_complex() and (dtype is None or not dtype.is_complex))


def _transfer(self, *, dtype=None, layout=None, device=None, pin_memory=None, non_blocking=False, memory_format=None):
    """A _to_copy that `_is_transfer` takes, through copy_ into a new tensor; None for the others."""
    if not _is_transfer(self, dtype=dtype, device=device):
        return None
    out = torch.empty_like(
        self,
        dtype=dtype,
        device=self.device if device is None else torch.device(device),
        pin_memory=bool(pin_memory),
        memory_format=memory_format or torch.preserve_format,
    )
    return out.copy_(self, non_blocking)


@lower(aten._to_copy.default, front=FrontPath(_is_transfer, _transfer))
def to_copy(self, *, dtype=None, layout=None, device=None, pin_memory=None, non_blocking=False, memory_format=None):
    """A dtype conversion on the tensor's own device (transfers take the front path)."""
    if dtype is None:
        return self
    return cast(self, to_numpy_dtype(dtype))


@lower(torch.ops.prims.convert_element_type.default, graph_only=True)
def convert_element_type(out, a, dtype):
    """What dynamo's float tensorifying inserts around a traced Python float (`x * v`)."""
    return cast(a, to_numpy_dtype(dtype))


def _tri_indices(fn, row, col, offset):
    rows, cols = fn(row, offset, col)
    return jnp.asarray(np.stack([rows, cols]).reshape(2, -1), jnp.int64)


@lower(aten.triu_indices.default)
def triu_indices(row, col, offset=0, *, dtype=None, layout=None, device=None, pin_memory=None):
    return _tri_indices(np.triu_indices, row, col, offset)


@lower(aten.tril_indices.default)
def tril_indices(row, col, offset=0, *, dtype=None, layout=None, device=None, pin_memory=None):
    return _tri_indices(np.tril_indices, row, col, offset)
