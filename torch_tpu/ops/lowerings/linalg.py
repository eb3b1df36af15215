"""Matrix products and linear algebra: mm/bmm/addmm family, decompositions, solves."""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import jax.scipy.linalg as jsl
import torch
from jax import lax
from jax._src.lax import linalg as lax_linalg  # geqrf and ormqr: LAPACK's forms, not re-exported by jax.lax

from torch_tpu import metrics
from torch_tpu.ops import precision
from torch_tpu.ops.checks import c_type_name
from torch_tpu.ops.dtypes import to_opmath, type_name
from torch_tpu.ops.registry import aten, lower, signature_check
from torch_tpu.ops.tensors import from_jax, to_jax
from torch_tpu.runtime import executable_cache

HIGHEST = lax.Precision.HIGHEST


def _full_precision(fn):
    """Runs a decomposition's inner matmuls at float32 precision (TPU defaults to bf16 passes)."""

    @functools.wraps(fn)
    def wrapped(*args, **kwargs):
        with jax.default_matmul_precision("highest"):
            return fn(*args, **kwargs)

    return wrapped


def _is_low_float(dtype) -> bool:
    return jnp.issubdtype(dtype, jnp.floating) and jnp.dtype(dtype).itemsize < 4


def matmul(a: jax.Array, b: jax.Array, rounded: bool = True) -> jax.Array:
    """jnp.matmul; half floats accumulate in float32, as on CPU (rounded=False: the float32
    sums), and float32 takes torch.get_float32_matmul_precision() (ops/precision.py)."""
    if _is_low_float(a.dtype) and a.dtype == b.dtype:
        product = jnp.matmul(a, b, precision=HIGHEST, preferred_element_type=jnp.float32)
        return product.astype(a.dtype) if rounded else product
    return jnp.matmul(a, b, precision=precision.matmul(a, b))


def _scaled_sum(self, product, beta, alpha):
    """beta * self + alpha * product; beta == 0 ignores self (even nan/inf), as in torch.
    Integer results take the scalars truncated to integers, as CPU does. Half floats (a float32
    `product` of half inputs) are scaled and summed in float32 and rounded once, as CPU's gemm.
    A traced beta or alpha (a jax scalar) takes the same arithmetic, selected by value in the graph."""
    if _is_low_float(self.dtype) and product.dtype == jnp.float32:
        return _scaled_sum(self.astype(jnp.float32), product, beta, alpha).astype(self.dtype)
    integral = not jnp.issubdtype(product.dtype, jnp.inexact)
    if integral:
        alpha, beta = (int(v) if isinstance(v, (int, float)) else v.astype(product.dtype) for v in (alpha, beta))
    if not isinstance(alpha, (int, float)) or alpha != 1:
        product = product * alpha
    shape = jnp.broadcast_shapes(self.shape, product.shape)
    if isinstance(beta, (int, float)):
        if beta == 0:
            return jnp.broadcast_to(product, shape)
        return (self if beta == 1 else self * beta) + product
    return jnp.where(beta == 0, jnp.broadcast_to(product, shape), self * beta + product)


@signature_check
def _mm_check(self, mat2, *args, **kwargs):
    if self.dtype != mat2.dtype:
        a, b = c_type_name(self.dtype), c_type_name(mat2.dtype)
        raise RuntimeError(f"expected m1 and m2 to have the same dtype, but got: {a} != {b}")


@signature_check
def _bmm_check(self, mat2, *args, **kwargs):
    if self.dtype != mat2.dtype:
        raise RuntimeError(f"expected scalar type {type_name(self.dtype)} but found {type_name(mat2.dtype)}")


@signature_check
def _addmm_check(self, mat1, mat2, *args, **kwargs):
    _mm_check(mat1, mat2)
    if self.dtype != mat2.dtype:
        raise RuntimeError(
            f"self and mat2 must have the same dtype, but got {type_name(self.dtype)} and {type_name(mat2.dtype)}"
        )


@lower(aten.mm.default, check=_mm_check)
def mm(self, mat2):
    return matmul(self, mat2)


@lower(aten.bmm.default, check=_bmm_check)
def bmm(self, mat2):
    return matmul(self, mat2)


@lower(aten.addmm.default, check=_addmm_check, traced=("beta", "alpha"))
def addmm(self, mat1, mat2, *, beta=1, alpha=1):
    return _scaled_sum(self, matmul(mat1, mat2, rounded=False), beta, alpha)


@lower(aten.baddbmm.default, traced=("beta", "alpha"))
def baddbmm(self, batch1, batch2, *, beta=1, alpha=1):
    return _scaled_sum(self, matmul(batch1, batch2, rounded=False), beta, alpha)


@lower(aten.addbmm.default, traced=("beta", "alpha"))
def addbmm(self, batch1, batch2, *, beta=1, alpha=1):
    if _is_low_float(batch1.dtype) and batch1.dtype == batch2.dtype and batch1.shape[0] > 0:
        # CPU adds the batches one addmm at a time, rounding to the half float after each.
        out = jnp.broadcast_to(self, (batch1.shape[1], batch2.shape[2]))
        for b in range(batch1.shape[0]):
            out = _scaled_sum(out, matmul(batch1[b], batch2[b], rounded=False), beta if b == 0 else 1, alpha)
        return out
    product = jnp.einsum("bij,bjk->ik", batch1, batch2, precision=precision.matmul(batch1, batch2))
    return _scaled_sum(self, product, beta, alpha)


@lower(aten.dot.default)
def dot(self, tensor):
    return matmul(self, tensor)


@lower(aten.vdot.default)
def vdot(self, other):
    return matmul(jnp.conj(self), other)


@lower(aten.mv.default)
def mv(self, vec):
    return matmul(self, vec)


@lower(aten.addmv.default, traced=("beta", "alpha"))
def addmv(self, mat, vec, *, beta=1, alpha=1):
    return _scaled_sum(self, matmul(mat, vec, rounded=False), beta, alpha)


@lower(aten.trace.default)
def trace(self):
    dtype = jnp.int64 if jnp.issubdtype(self.dtype, jnp.integer) or self.dtype == jnp.bool_ else self.dtype
    return jnp.trace(self.astype(dtype))


# ---- decompositions ---------------------------------------------------------


def _lu(A):
    """LU with partial pivoting: (LU, 1-based int32 pivots, permutation)."""
    lu, pivots, perm = lax.linalg.lu(A)
    return lu, pivots.astype(jnp.int32) + 1, perm


def _lu_info(lu):
    """LAPACK's getrf info: 1 + index of the first exactly-zero pivot, else 0."""
    diag = jnp.diagonal(lu, axis1=-2, axis2=-1)
    zero = diag == 0
    if diag.shape[-1] == 0:
        return jnp.zeros(diag.shape[:-1], jnp.int32)
    first = jnp.argmax(zero, axis=-1).astype(jnp.int32) + 1
    return jnp.where(jnp.any(zero, axis=-1), first, 0).astype(jnp.int32)


def _pivot_sign(pivots):
    """The permutation's sign from 1-based getrf pivots."""
    n = pivots.shape[-1]
    swaps = jnp.sum(pivots != jnp.arange(1, n + 1, dtype=pivots.dtype), axis=-1)
    return jnp.where(swaps % 2 == 0, 1, -1)


def _det_parts(A, log):
    lu, pivots, _ = _lu(A)
    diag = jnp.diagonal(lu, axis1=-2, axis2=-1)
    sign = _pivot_sign(pivots).astype(A.dtype)
    if log:
        sign = jnp.prod(jnp.sign(diag), axis=-1) * sign
        return sign, jnp.sum(jnp.log(jnp.abs(diag)), axis=-1), lu, pivots
    return jnp.prod(diag, axis=-1) * sign, lu, pivots


@functools.partial(executable_cache.jit, static_argnums=(1, 2))
@_full_precision
def _det_jit(A, log, transpose):
    # det(A^T) = det(A): CPU factors A^T when A is contiguous and real, and the
    # backward (linalg_lu_solve with adjoint = not that) relies on it.
    return _det_parts(jnp.swapaxes(A, -1, -2) if transpose else A, log)


def _eager_det(op, A, log):
    """Eager because the returned LU depends on A's strides, as on CPU."""
    metas = op(torch.empty_strided(A.shape, A.stride(), dtype=A.dtype, device="meta"))
    transpose = A.is_contiguous() and not A.is_complex()
    values = _det_jit(to_jax(A), log, transpose)
    metrics.bump("executions")
    return tuple(from_jax(v, A.device.index, m.dtype) for v, m in zip(values, metas))


@lower(aten._linalg_det.default, eager=True)
def linalg_det(A):
    return _eager_det(aten._linalg_det.default, A, log=False)


@lower(aten._linalg_slogdet.default, eager=True)
def linalg_slogdet(A):
    return _eager_det(aten._linalg_slogdet.default, A, log=True)


@lower(aten.linalg_lu_factor_ex.default)
@_full_precision
def linalg_lu_factor_ex(A, *, pivot=True, check_errors=False):
    if not pivot:
        raise RuntimeError("linalg.lu_factor: LU without pivoting is not implemented on the tpu")
    lu, pivots, _ = _lu(A)
    return lu, pivots, _lu_info(lu)


def _permutation_matrix(perm, dtype):
    """P with A = P @ L @ U for lax's A[perm] = L @ U."""
    return jnp.swapaxes(jax.nn.one_hot(perm, perm.shape[-1], dtype=dtype), -1, -2)


def _unpack_lu(lu):
    m, n = lu.shape[-2:]
    k = min(m, n)
    L = jnp.tril(lu[..., :, :k], -1) + jnp.eye(m, k, dtype=lu.dtype)
    U = jnp.triu(lu[..., :k, :])
    return L, U


@lower(aten.linalg_lu.default)
@_full_precision
def linalg_lu(A, *, pivot=True):
    if not pivot:
        raise RuntimeError("linalg.lu: LU without pivoting is not implemented on the tpu")
    lu, _, perm = _lu(A)
    return (_permutation_matrix(perm, A.dtype), *_unpack_lu(lu))


@lower(aten.lu_unpack.default)
def lu_unpack(LU_data, LU_pivots, unpack_data=True, unpack_pivots=True):
    empty = jnp.zeros((0,), LU_data.dtype)
    P = empty
    if unpack_pivots:
        perm = lax.linalg.lu_pivots_to_permutation(LU_pivots.astype(jnp.int32) - 1, LU_data.shape[-2])
        P = _permutation_matrix(perm, LU_data.dtype)
    L, U = _unpack_lu(LU_data) if unpack_data else (empty, empty)
    return P, L, U


def _permute_rows(pivots, B):
    """P^T B for getrf pivots (applied as row swaps), batched like B."""
    perm = lax.linalg.lu_pivots_to_permutation(pivots - 1, B.shape[-2])
    perm = jnp.broadcast_to(perm, (*B.shape[:-2], B.shape[-2]))
    return jnp.take_along_axis(B, perm[..., None], axis=-2)


def _lu_solve(lu, pivots, B, adjoint=False):
    """Solves A X = B (or A^H X = B) from A's getrf factors; B is a batch of matrices."""
    batch = jnp.broadcast_shapes(lu.shape[:-2], B.shape[:-2])
    lu = jnp.broadcast_to(lu, batch + lu.shape[-2:])
    pivots = jnp.broadcast_to(pivots, batch + pivots.shape[-1:])
    B = jnp.broadcast_to(B, batch + B.shape[-2:])
    if not adjoint:
        X = _permute_rows(pivots, B)
        X = lax.linalg.triangular_solve(lu, X, left_side=True, lower=True, unit_diagonal=True)
        return lax.linalg.triangular_solve(lu, X, left_side=True, lower=False)
    X = lax.linalg.triangular_solve(lu, B, left_side=True, lower=False, transpose_a=True, conjugate_a=True)
    X = lax.linalg.triangular_solve(
        lu, X, left_side=True, lower=True, unit_diagonal=True, transpose_a=True, conjugate_a=True
    )
    n = B.shape[-2]
    perm = lax.linalg.lu_pivots_to_permutation(pivots - 1, n)
    inverse = jnp.argsort(perm, axis=-1)
    return jnp.take_along_axis(X, inverse[..., None], axis=-2)


def _is_vector_rhs(A, B) -> bool:
    return B.ndim == 1 or (B.ndim == A.ndim - 1 and B.shape == A.shape[:-1])


@lower(aten._linalg_solve_ex.default)
@_full_precision
def linalg_solve_ex(A, B, *, left=True, check_errors=False):
    lu, pivots, _ = _lu(A)
    vector = _is_vector_rhs(A, B)
    rhs = B[..., None] if vector else B
    if left:
        X = _lu_solve(lu, pivots, rhs)
    else:
        # X A = B  <=>  A^H X^H = B^H
        Bh = jnp.conj(jnp.swapaxes(rhs, -1, -2))
        X = jnp.conj(jnp.swapaxes(_lu_solve(lu, pivots, Bh, adjoint=True), -1, -2))
    if vector:
        X = X[..., 0]
    return X, lu, pivots, _lu_info(lu)


@lower(aten.linalg_lu_solve.default)
@_full_precision
def linalg_lu_solve(LU, pivots, B, *, left=True, adjoint=False):
    if left:
        return _lu_solve(LU, pivots, B, adjoint=adjoint)
    # X A = B  <=>  A^H X^H = B^H (adjoint flips)
    Bh = jnp.conj(jnp.swapaxes(B, -1, -2))
    return jnp.conj(jnp.swapaxes(_lu_solve(LU, pivots, Bh, adjoint=not adjoint), -1, -2))


@lower(aten.linalg_inv_ex.default)
@_full_precision
def linalg_inv_ex(A, *, check_errors=False):
    lu, pivots, _ = _lu(A)
    eye = jnp.broadcast_to(jnp.eye(A.shape[-1], dtype=A.dtype), A.shape)
    return _lu_solve(lu, pivots, eye), _lu_info(lu)


@lower(aten.linalg_cholesky_ex.default)
@_full_precision
def linalg_cholesky_ex(A, *, upper=False, check_errors=False):
    L = jnp.tril(lax.linalg.cholesky(A, symmetrize_input=False))
    # A failed factorization leaves nan on the diagonal from the first bad pivot on.
    bad = ~jnp.isfinite(jnp.diagonal(L, axis1=-2, axis2=-1))
    if A.shape[-1] == 0:
        return L, jnp.zeros(A.shape[:-2], jnp.int32)
    first = jnp.argmax(bad, axis=-1).astype(jnp.int32) + 1
    info = jnp.where(jnp.any(bad, axis=-1), first, 0).astype(jnp.int32)
    if upper:
        L = jnp.conj(jnp.swapaxes(L, -1, -2))
    return L, info


@lower(aten.cholesky_solve.default)
@_full_precision
def cholesky_solve(self, input2, upper=False):
    batch = jnp.broadcast_shapes(self.shape[:-2], input2.shape[:-2])
    B = jnp.broadcast_to(self, batch + self.shape[-2:])
    L = jnp.broadcast_to(input2, batch + input2.shape[-2:])
    if upper:
        L = jnp.conj(jnp.swapaxes(L, -1, -2))
    Y = lax.linalg.triangular_solve(L, B, left_side=True, lower=True)
    return lax.linalg.triangular_solve(L, Y, left_side=True, lower=True, transpose_a=True, conjugate_a=True)


@lower(aten.linalg_qr.default)
@_full_precision
def linalg_qr(A, mode="reduced"):
    if mode == "r":
        R = jnp.linalg.qr(A, mode="r")
        return jnp.zeros((0,), A.dtype), R
    Q, R = jnp.linalg.qr(A, mode="complete" if mode == "complete" else "reduced")
    return Q, R


@lower(aten._linalg_svd.default)
@_full_precision
def linalg_svd(A, full_matrices=False, compute_uv=True, *, driver=None):
    if not compute_uv:
        S = jnp.linalg.svd(A, compute_uv=False)
        empty = jnp.zeros((0,), A.dtype)
        return empty, S, empty
    U, S, Vh = jnp.linalg.svd(A, full_matrices=full_matrices)
    return U, S, Vh


@lower(aten._linalg_eigh.default)
@_full_precision
def linalg_eigh(A, UPLO="L", compute_v=True):
    lower_ = UPLO.upper() == "L"
    V, w = lax.linalg.eigh(A, lower=lower_, symmetrize_input=False)
    if not compute_v:
        return w, jnp.zeros((0,), A.dtype)
    return w, V


def _broadcast_batch(A, B):
    batch = jnp.broadcast_shapes(A.shape[:-2], B.shape[:-2])
    return jnp.broadcast_to(A, batch + A.shape[-2:]), jnp.broadcast_to(B, batch + B.shape[-2:])


@lower(aten.triangular_solve.default)
@_full_precision
def triangular_solve(self, A, upper=True, transpose=False, unitriangular=False):
    A, B = _broadcast_batch(A, self)
    X = lax.linalg.triangular_solve(
        A, B, left_side=True, lower=not upper, transpose_a=transpose, unit_diagonal=unitriangular
    )
    return X, A


@lower(aten.linalg_solve_triangular.default)
@_full_precision
def linalg_solve_triangular(self, B, *, upper, left=True, unitriangular=False):
    A, B = _broadcast_batch(self, B)
    return lax.linalg.triangular_solve(A, B, left_side=left, lower=not upper, unit_diagonal=unitriangular)


@lower(aten.cholesky_inverse.default)
@_full_precision
def cholesky_inverse(self, upper=False):
    eye = jnp.broadcast_to(jnp.eye(self.shape[-1], dtype=self.dtype), self.shape)
    return cholesky_solve(eye, self, upper)


@lower(aten.linalg_householder_product.default)
@_full_precision
def linalg_householder_product(input, tau):
    return lax.linalg.householder_product(input, tau)


@executable_cache.jit
@_full_precision
def _geqrf(a):
    return lax_linalg.geqrf(a)


@lower(aten.geqrf.default, eager=True, graph=_full_precision(lambda self: lax_linalg.geqrf(self)))
def geqrf(self):
    """LAPACK's geqrf, as CPU returns it: R above the diagonal, the Householder vectors below, and
    tau. Eager: torch has no meta kernel for it."""
    if self.dim() < 2:
        raise RuntimeError("torch.geqrf: input must have at least 2 dimensions.")
    if self.dtype not in (torch.float32, torch.float64, torch.complex64, torch.complex128):
        raise NotImplementedError(f"\"geqrf_cpu\" not implemented for '{type_name(self.dtype)}'")
    a, tau = _geqrf(to_jax(self))
    metrics.bump("executions")
    return from_jax(a, self.device.index), from_jax(tau, self.device.index)


@lower(aten.ormqr.default)
@_full_precision
def ormqr(self, input2, input3, left=True, transpose=False):
    """Q (from geqrf's vectors and tau) times input3: on the left or right, Q or its (conjugate) transpose."""
    return lax_linalg.ormqr(self, input2, input3, left=left, transpose=transpose)


@lower(aten.linalg_matrix_exp.default)
@_full_precision
def linalg_matrix_exp(self):
    return jsl.expm(self)


@lower(aten.linalg_cross.default)
def linalg_cross(self, other, *, dim=-1):
    shape = jnp.broadcast_shapes(self.shape, other.shape)
    return jnp.cross(jnp.broadcast_to(self, shape), jnp.broadcast_to(other, shape), axis=dim)


def cholesky(self, upper=False):
    return linalg_cholesky_ex(self, upper=upper)[0]


if hasattr(aten, "cholesky"):  # torch 2.14 removed aten::cholesky (and torch.cholesky)
    lower(aten.cholesky.default)(cholesky)


# ---- cdist ------------------------------------------------------------------


def _pairwise_diff(x1, x2):
    batch = jnp.broadcast_shapes(x1.shape[:-2], x2.shape[:-2])
    x1 = jnp.broadcast_to(x1, batch + x1.shape[-2:])
    x2 = jnp.broadcast_to(x2, batch + x2.shape[-2:])
    return x1[..., :, None, :] - x2[..., None, :, :]


def _p_norm_last(d, p):
    """The p-norm of |differences| `d` over the last axis, as cdist/pdist compute it."""
    if p == 0:
        return jnp.sum(d != 0, axis=-1).astype(d.dtype)
    if p == 1:
        return jnp.sum(d, axis=-1)
    if p == 2:
        return jnp.sqrt(jnp.sum(d * d, axis=-1))
    if math.isinf(p):
        return jnp.max(d, axis=-1, initial=0)
    return jnp.sum(d**p, axis=-1) ** (1 / p)


def _p_norm_grad(diff, dist, p):
    """d dist / d diff for a p-norm distance (CPU's cdist/pdist backward cases)."""
    if p == 0:
        return jnp.zeros_like(diff)
    if p == 1:
        return jnp.sign(diff)
    if p == 2:
        return jnp.where(dist == 0, 0, diff / jnp.where(dist == 0, 1, dist))
    if math.isinf(p):
        return jnp.sign(diff) * (jnp.abs(diff) == dist)
    safe = jnp.where(dist == 0, 1, dist)
    local = jnp.sign(diff) * jnp.abs(diff) ** (p - 1) / safe ** (p - 1)
    return jnp.where((dist == 0) | ((diff == 0) & (p < 1)), 0, local)


@lower(aten._cdist_forward.default)
def cdist_forward(x1, x2, p, compute_mode):
    return _p_norm_last(jnp.abs(_pairwise_diff(to_opmath(x1), to_opmath(x2))), p)


@lower(aten._cdist_backward.default)
def cdist_backward(grad, x1, x2, p, cdist):
    diff = _pairwise_diff(to_opmath(x1), to_opmath(x2))
    g, dist = to_opmath(grad)[..., None], to_opmath(cdist)[..., None]
    return jnp.sum(_p_norm_grad(diff, dist, p) * g, axis=-2).reshape(x1.shape)


# ---- pdist ------------------------------------------------------------------


def _pair_rows(n: int):
    """The (i, j) row pairs with i < j, in CPU's (row-major upper triangle) order."""
    return jnp.triu_indices(n, k=1)


@lower(aten._pdist_forward.default)
def pdist_forward(self, p=2.0):
    n = self.shape[0]
    if n <= 1:
        return jnp.zeros((0,), self.dtype)
    i, j = _pair_rows(n)
    x = to_opmath(self)
    d = jnp.abs(x[i] - x[j])
    return _p_norm_last(d, p).astype(self.dtype)


@lower(aten._pdist_backward.default)
def pdist_backward(grad, self, p, pdist):
    """CPU's subgradients: zero where a distance is zero (and at zero differences for p < 1)."""
    n, m = self.shape
    if n <= 1 or m == 0:
        return jnp.zeros_like(self)
    i, j = _pair_rows(n)
    x = to_opmath(self)
    diff = x[i] - x[j]
    g, dist = to_opmath(grad)[:, None], to_opmath(pdist)[:, None]
    local = _p_norm_grad(diff, dist, p) * g
    out = jnp.zeros_like(x).at[i].add(local).at[j].add(-local)
    return out.astype(self.dtype)
