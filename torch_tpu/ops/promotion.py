"""Type promotion as CPU does it (c10's promoteTypes with wrapped numbers), and the dtype checks of CPU's kernels."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import torch
from jax import lax

from torch_tpu.ops.dtypes import opmath, to_numpy_dtype, to_torch_dtype, type_name

PYTHON_SCALARS = (bool, int, float, complex)


def _to_complex(dtype: torch.dtype) -> torch.dtype:
    return {torch.float64: torch.complex128}.get(dtype, torch.complex64)


def _combine_categories(higher: torch.dtype | None, low: torch.dtype | None) -> torch.dtype | None:
    """c10's combine_categories: a higher-priority operand wins unless it is of a lower category."""
    if higher is None:
        return low
    if low is None:
        return higher
    if higher.is_complex:
        return higher
    if low.is_complex:
        return _to_complex(higher) if higher.is_floating_point else low
    if higher.is_floating_point:
        return higher
    if higher == torch.bool or low.is_floating_point:
        return torch.promote_types(higher, low)
    return higher


def _promote(current: torch.dtype | None, dtype: torch.dtype) -> torch.dtype:
    return dtype if current is None else torch.promote_types(current, dtype)


def _wrapped_dtype(x) -> torch.dtype:
    """The dtype torch gives a wrapped Python number."""
    if isinstance(x, bool):
        return torch.bool
    if isinstance(x, int):
        return torch.int64
    if isinstance(x, complex):
        return _to_complex(torch.get_default_dtype())
    if isinstance(x, float):
        return torch.get_default_dtype()
    dtype = to_torch_dtype(x.dtype)  # a weakly typed traced scalar
    if dtype.is_complex:
        return _to_complex(torch.get_default_dtype())
    return torch.get_default_dtype() if dtype.is_floating_point else dtype


def _is_wrapped(x) -> bool:
    """Python scalars and weakly typed traced scalars (CPU 0-dim tensors, `x + 2`)."""
    return isinstance(x, PYTHON_SCALARS) or bool(getattr(x, "weak_type", False))


def result_dtype(*operands) -> np.dtype:
    """torch.result_type over jax arrays and scalars (None operands are skipped)."""
    dim = zero = wrapped = None
    for x in operands:
        if x is None:
            continue
        if _is_wrapped(x):
            wrapped = _promote(wrapped, _wrapped_dtype(x))
        elif x.ndim == 0:
            zero = _promote(zero, to_torch_dtype(x.dtype))
        else:
            dim = _promote(dim, to_torch_dtype(x.dtype))
    return to_numpy_dtype(_combine_categories(dim, _combine_categories(zero, wrapped)))


def cast(x, dtype: np.dtype):
    """`x` (array or Python scalar) converted to `dtype`, wrapping ints as C casts do."""
    if x is None:
        return None
    if isinstance(x, PYTHON_SCALARS):
        x = np.asarray(x)
    if x.dtype == np.bool_ and jnp.issubdtype(dtype, jnp.inexact):
        # Via uint8: XLA rewrites convert(pred) / y as select(pred, 1 / y, 0), losing 0 / 0 = nan.
        x = lax.convert_element_type(x, np.uint8)
    elif dtype == np.uint8 and jnp.issubdtype(x.dtype, jnp.inexact):
        x = lax.convert_element_type(x, np.int64)  # c10 casts floats to uint8 through int64 (wrapping)
    return lax.convert_element_type(x, dtype)


def promote(*operands):
    """(common dtype, operands cast to it)."""
    dtype = result_dtype(*operands)
    return dtype, [cast(x, dtype) for x in operands]


def is_integral(dtype: np.dtype) -> bool:
    """Integer or bool."""
    return not jnp.issubdtype(dtype, jnp.inexact)


def float_dtype(dtype: np.dtype) -> np.dtype:
    """Integer and bool inputs of float functions compute in the default dtype."""
    return to_numpy_dtype(torch.get_default_dtype()) if is_integral(dtype) else np.dtype(dtype)


def to_float(*operands):
    """Operands promoted, moved to a float type, in opmath."""
    dtype = opmath(float_dtype(result_dtype(*operands)))
    return [cast(x, dtype) for x in operands]


def float_args(*operands):
    """Operands promoted, in opmath (floats only: the op rejects other dtypes)."""
    dtype = opmath(result_dtype(*operands))
    return [cast(x, dtype) for x in operands]


def require(name: str, dtype: np.dtype, *, bool_ok=True, int_ok=True, float_ok=True) -> None:
    """Raises CPU's NotImplementedError for a dtype its kernel does not dispatch on."""
    dtype = np.dtype(dtype)
    ok = bool_ok if dtype == np.bool_ else int_ok if is_integral(dtype) else float_ok
    if not ok:
        raise NotImplementedError(f"\"{name}\" not implemented for '{type_name(dtype)}'")


# The error CPU raises for bool operands of sub and relu: NotImplementedError from torch 2.14 on.
BOOL_UNSUPPORTED = (
    NotImplementedError if tuple(int(p) for p in torch.__version__.split(".")[:2]) >= (2, 14) else RuntimeError
)


def any_bool(*operands) -> bool:
    return any(
        isinstance(x, bool) or (not isinstance(x, PYTHON_SCALARS) and x is not None and x.dtype == np.bool_)
        for x in operands
    )
