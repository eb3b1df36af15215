"""torch._grouped_mm (the MoE expert matmul) as lax.ragged_dot: no host sync on the offsets.

Offsets are cumulative group ends. Rows (or columns) past the last offset are left uninitialized
by ATen's kernels; here they are 0. The eager kernel checks its inputs as CPU's kernel does
(float32, float16 and bfloat16); graphs take the jax function. torch's meta function takes
bfloat16 only (CUDA's rule), so tracing (torch.compile, export) of tpu inputs uses the fake
rule below: CPU's checks and the contiguous output the kernel makes, in every dtype eager takes.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import torch
from jax import lax
from torch._subclasses import fake_impls

from torch_tpu import metrics
from torch_tpu.ops.registry import aten, lower
from torch_tpu.ops.tensors import from_jax, to_jax

_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _sizes(offs):
    offs = offs.astype(jnp.int32)
    return jnp.diff(offs, prepend=jnp.zeros((1,), jnp.int32))


def _precision(x) -> lax.Precision:
    """float32 products exact, as CPU's kernel; bfloat16 and float16 ones are exact in one pass, and
    XLA:TPU's ragged_dot kernel rejects HIGHEST for them (Mosaic: "Bad lhs type")."""
    return lax.Precision.HIGHEST if x.dtype == jnp.float32 else lax.Precision.DEFAULT


def _ragged(lhs, rhs, sizes, out_dtype):
    product = lax.ragged_dot(lhs, rhs, sizes, precision=_precision(lhs), preferred_element_type=jnp.float32)
    return product.astype(out_dtype)


def _grouped_mm(self, mat2, offs=None, bias=None, out_dtype=None):
    dtype = self.dtype
    if self.ndim == 2 and mat2.ndim == 3:  # (M, K) rows in groups x (G, K, N) -> (M, N)
        return _ragged(self, mat2, _sizes(offs), dtype)
    if self.ndim == 3 and mat2.ndim == 2:  # (G, M, K) x (K, N) columns in groups -> (M, N)
        return _ragged(mat2.T, jnp.swapaxes(self, 1, 2), _sizes(offs), dtype).T
    if self.ndim == 2 and mat2.ndim == 2:  # (M, K) x (K, N), K in groups -> (G, M, N)
        numbers = lax.RaggedDotDimensionNumbers(
            dot_dimension_numbers=(([1], [0]), ([], [])), lhs_ragged_dimensions=[1], rhs_group_dimensions=[]
        )
        product = lax.ragged_dot_general(
            self, mat2, _sizes(offs), numbers, precision=_precision(self), preferred_element_type=jnp.float32
        )
        return product.astype(dtype)
    product = jnp.matmul(self, mat2, precision=_precision(self), preferred_element_type=jnp.float32)
    return product.astype(dtype)


_grouped_mm_jit = jax.jit(_grouped_mm)


def _check_strides(mat: torch.Tensor) -> None:
    """at::native::check_valid_strides_and_return_transposed: one unit stride, the other 16-byte aligned."""
    strides, sizes = mat.stride(), mat.shape
    alignment = 16 // mat.element_size()
    if strides[-2] == 1 and strides[-1] >= max(1, sizes[-2]):
        lead = strides[-1]
    elif strides[-1] == 1 and strides[-2] >= max(1, sizes[-1]):
        lead = strides[-2]
    else:
        raise RuntimeError(f"Invalid strides/sizes, got {list(strides)} for strides and {list(sizes)} for sizes")
    if lead % alignment:
        raise RuntimeError("strides should be multiple of 16 bytes")


def _check(mat_a, mat_b, offs, bias, out_dtype) -> None:
    """at::native::_grouped_mm_validate_inputs and the output checks of CPU's _grouped_mm."""
    for name, mat in (("mat_a", mat_a), ("mat_b", mat_b)):
        if mat.dtype not in _DTYPES:
            raise RuntimeError(f"Expected {name} to be Float32, BFloat16 or Float16 matrix, got {mat.dtype}")
    if mat_a.dim() not in (2, 3):
        raise RuntimeError("mat_a has to be 2 or 3d")
    if mat_b.dim() not in (2, 3):
        raise RuntimeError("mat_b has to be 2 or 3d")
    a_2d, b_2d = mat_a.dim() == 2, mat_b.dim() == 2
    if (not a_2d or not b_2d) and mat_a.shape[-1] != mat_b.shape[-2]:
        raise RuntimeError("contraction dimension of mat_a and mat_b must match")
    _check_strides(mat_a)
    _check_strides(mat_b)
    if (offs is not None) != (a_2d or b_2d):
        raise RuntimeError("Have to provide offsets if there is a 2d matrix, or no offset if both matrices are 3d")
    if offs is not None:
        if offs.dim() != 1:
            raise RuntimeError("offs has to be 1D")
        if offs.dtype != torch.int32:
            raise RuntimeError("Offsets have to be int32")
    if bias is not None:
        raise RuntimeError("Bias not supported yet")
    if (out_dtype or mat_a.dtype) != mat_a.dtype:
        raise RuntimeError("Grouped gemm output dtype must match `mat_a` dtype")
    if a_2d != b_2d and offs.shape[0] != (mat_b.shape[0] if a_2d else mat_a.shape[0]):
        raise RuntimeError("matrix batch sizes have to match")
    if not a_2d and not b_2d and mat_a.shape[0] != mat_b.shape[0]:
        raise RuntimeError("batched dimension has to match")


@lower(aten._grouped_mm.default, eager=True, graph=_grouped_mm)
def grouped_mm(self, mat2, offs=None, bias=None, out_dtype=None):
    _check(self, mat2, offs, bias, out_dtype)
    metrics.bump("executions")
    out = _grouped_mm_jit(to_jax(self), to_jax(mat2), None if offs is None else to_jax(offs))
    return from_jax(out, self.device.index)


def _out_size(mat_a, mat_b, offs) -> list:
    if mat_a.dim() == 2:
        return [offs.size(0), mat_a.size(0), mat_b.size(1)] if mat_b.dim() == 2 else [mat_a.size(0), mat_b.size(-1)]
    return [mat_a.size(1), mat_b.size(1)] if mat_b.dim() == 2 else [mat_a.size(0), mat_a.size(1), mat_b.size(-1)]


@fake_impls.register_op_impl(lambda func: func is aten._grouped_mm.default)
def _fake_grouped_mm(fake_mode, func, mat_a, mat_b, offs=None, bias=None, out_dtype=None):
    """FakeTensor rule for tpu inputs (other devices keep torch's meta function)."""
    if mat_a.device.type != "tpu":
        return NotImplemented
    _check(mat_a, mat_b, offs, bias, out_dtype)
    with fake_mode:
        return torch.empty(_out_size(mat_a, mat_b, offs), dtype=mat_a.dtype, device=mat_a.device)
