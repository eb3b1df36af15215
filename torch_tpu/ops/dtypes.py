"""torch dtype <-> numpy/jax dtype."""

from __future__ import annotations

import jax.numpy as jnp
import ml_dtypes
import numpy as np
import torch
from jax import lax

TORCH_TO_NUMPY: dict[torch.dtype, np.dtype] = {
    torch.float32: np.dtype(np.float32),
    torch.float64: np.dtype(np.float64),
    torch.float16: np.dtype(np.float16),
    torch.bfloat16: np.dtype(ml_dtypes.bfloat16),
    torch.int8: np.dtype(np.int8),
    torch.int16: np.dtype(np.int16),
    torch.int32: np.dtype(np.int32),
    torch.int64: np.dtype(np.int64),
    torch.uint8: np.dtype(np.uint8),
    torch.uint16: np.dtype(np.uint16),
    torch.uint32: np.dtype(np.uint32),
    torch.uint64: np.dtype(np.uint64),
    torch.bool: np.dtype(np.bool_),
    torch.complex64: np.dtype(np.complex64),
    torch.complex128: np.dtype(np.complex128),
    torch.float8_e4m3fn: np.dtype(ml_dtypes.float8_e4m3fn),
    torch.float8_e5m2: np.dtype(ml_dtypes.float8_e5m2),
    torch.float8_e4m3fnuz: np.dtype(ml_dtypes.float8_e4m3fnuz),
    torch.float8_e5m2fnuz: np.dtype(ml_dtypes.float8_e5m2fnuz),
}
NUMPY_TO_TORCH: dict[np.dtype, torch.dtype] = {v: k for k, v in TORCH_TO_NUMPY.items()}


def to_numpy_dtype(dtype: torch.dtype) -> np.dtype:
    try:
        return TORCH_TO_NUMPY[dtype]
    except KeyError:
        raise TypeError(f"tpu tensors do not support dtype {dtype}") from None


def to_torch_dtype(dtype) -> torch.dtype:
    return NUMPY_TO_TORCH[np.dtype(dtype)]


def jax_dtype(dtype: torch.dtype | None, default: torch.dtype | None = None):
    """The jax dtype for an optional torch dtype argument."""
    if dtype is None:
        dtype = default if default is not None else torch.get_default_dtype()
    return jnp.dtype(to_numpy_dtype(dtype))


def opmath(dtype) -> np.dtype:
    """The type CPU computes reduced-precision floats in (its opmath type): float32 for halves."""
    if jnp.issubdtype(dtype, jnp.floating) and np.dtype(dtype).itemsize < 4:
        return np.dtype(np.float32)
    return np.dtype(dtype)


def to_opmath(x):
    """`x` in its opmath type (None stays None)."""
    return None if x is None else x.astype(opmath(x.dtype))


def rounded_to(x, dtype):
    """`x` (in a wider float type) rounded to `dtype`'s precision and range, as c10::BFloat16 and
    c10::Half arithmetic rounds after every operation. An explicit reduce_precision: XLA:TPU folds
    a convert to a narrower type and back away (excess precision), XLA:CPU keeps it."""
    info = jnp.finfo(dtype)
    return lax.reduce_precision(x, exponent_bits=info.nexp, mantissa_bits=info.nmant)


def narrow_indices(index, size: int):
    """int64 indices into a dim of `size` as int32 where int32 holds every valid index: TPUs have
    no 64-bit integer units (XLA emulates them), so int32 index arithmetic runs natively. Callers
    range-check the int64 values (an index out of range raises, as on CPU)."""
    if index.dtype == jnp.int64 and size < 2**31:
        return index.astype(jnp.int32)
    return index


def type_name(dtype) -> str:
    """ATen's name of a torch or numpy dtype ("Float", "Long", ...), as its messages spell it."""
    if not isinstance(dtype, torch.dtype):
        dtype = to_torch_dtype(dtype)
    return torch.empty(0, dtype=dtype).type().removeprefix("torch.").removesuffix("Tensor")
