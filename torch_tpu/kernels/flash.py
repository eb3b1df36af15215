"""Flash attention in Pallas: blockwise online softmax forward (saves the logsumexp) and a
backward that recomputes the attention probabilities block by block.

Layout (batch, heads, seq, head_dim) like scaled_dot_product_attention. Key/value may have
fewer heads than the query (grouped-query attention). `causal` masks as SDPA's is_causal does
(query i sees keys j <= i). Sequence lengths that do not divide the block are padded and masked.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import torch
from jax import lax
from jax.experimental import pallas as pl

from torch_tpu.kernels import _custom_ops, _pallas

SUPPORTED_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
MAX_HEAD_DIM = 256


def _dot_t(a: jax.Array, b: jax.Array) -> jax.Array:
    """a @ b.T in float32."""
    return lax.dot_general(a, b, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32)


def _t_dot(a: jax.Array, b: jax.Array) -> jax.Array:
    """a.T @ b in float32."""
    return lax.dot_general(a, b, (((0,), (0,)), ((), ())), preferred_element_type=jnp.float32)


def _dot(a: jax.Array, b: jax.Array) -> jax.Array:
    return lax.dot_general(a, b, (((1,), (0,)), ((), ())), preferred_element_type=jnp.float32)


def _mask(rows: jax.Array, cols: jax.Array, q_len: int, kv_len: int, causal: bool) -> jax.Array:
    valid = (cols < kv_len) & (rows < q_len)
    if causal:
        valid &= cols <= rows
    return valid


# ---- kernels ------------------------------------------------------------------


def _fwd_kernel(q_ref, k_ref, v_ref, o_ref, lse_ref, *, sm_scale, causal, block_k, q_len, kv_len):
    block_q = q_ref.shape[0]
    q_index = pl.program_id(2)
    num_kv_blocks = k_ref.shape[0] // block_k
    upper = num_kv_blocks
    if causal:  # key blocks wholly after this query block's last row contribute nothing
        upper = jnp.minimum(num_kv_blocks, ((q_index + 1) * block_q + block_k - 1) // block_k)
    q = q_ref[...]
    rows = q_index * block_q + lax.broadcasted_iota(jnp.int32, (block_q, block_k), 0)

    def body(j, carry):
        m, denom, acc = carry
        start = pl.multiple_of(j * block_k, block_k)
        k = k_ref[pl.ds(start, block_k), :]
        v = v_ref[pl.ds(start, block_k), :]
        cols = start + lax.broadcasted_iota(jnp.int32, (block_q, block_k), 1)
        valid = _mask(rows, cols, q_len, kv_len, causal)
        s = jnp.where(valid, _dot_t(q, k) * sm_scale, _pallas.NEG_INF)
        m_new = jnp.maximum(m, s.max(axis=1))
        p = jnp.where(valid, jnp.exp(s - m_new[:, None]), 0.0)
        alpha = jnp.exp(m - m_new)
        denom_new = alpha * denom + p.sum(axis=1)
        acc_new = acc * alpha[:, None] + _dot(p.astype(v.dtype), v)
        return m_new, denom_new, acc_new

    init = (
        jnp.full((block_q,), _pallas.NEG_INF, jnp.float32),
        jnp.zeros((block_q,), jnp.float32),
        jnp.zeros(o_ref.shape, jnp.float32),
    )
    m, denom, acc = lax.fori_loop(jnp.int32(0), jnp.asarray(upper, jnp.int32), body, init)
    denom = jnp.where(denom == 0.0, 1.0, denom)  # padded rows
    o_ref[...] = (acc / denom[:, None]).astype(o_ref.dtype)
    lse_ref[...] = m + jnp.log(denom)


def _dq_kernel(q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, dq_ref, *, sm_scale, causal, block_k, q_len, kv_len):
    block_q = q_ref.shape[0]
    q_index = pl.program_id(2)
    num_kv_blocks = k_ref.shape[0] // block_k
    upper = num_kv_blocks
    if causal:
        upper = jnp.minimum(num_kv_blocks, ((q_index + 1) * block_q + block_k - 1) // block_k)
    q, do = q_ref[...], do_ref[...]
    lse, delta = lse_ref[...], delta_ref[...]
    rows = q_index * block_q + lax.broadcasted_iota(jnp.int32, (block_q, block_k), 0)

    def body(j, dq):
        start = pl.multiple_of(j * block_k, block_k)
        k = k_ref[pl.ds(start, block_k), :]
        v = v_ref[pl.ds(start, block_k), :]
        cols = start + lax.broadcasted_iota(jnp.int32, (block_q, block_k), 1)
        valid = _mask(rows, cols, q_len, kv_len, causal)
        p = jnp.where(valid, jnp.exp(_dot_t(q, k) * sm_scale - lse[:, None]), 0.0)
        ds = p * (_dot_t(do, v) - delta[:, None])
        return dq + _dot(ds.astype(k.dtype), k)

    dq = lax.fori_loop(jnp.int32(0), jnp.asarray(upper, jnp.int32), body, jnp.zeros(dq_ref.shape, jnp.float32))
    dq_ref[...] = (dq * sm_scale).astype(dq_ref.dtype)


def _dkv_kernel(
    q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, dk_ref, dv_ref, *, sm_scale, causal, block_q, q_len, kv_len
):
    block_k = k_ref.shape[0]
    kv_index = pl.program_id(2)
    num_q_blocks = q_ref.shape[0] // block_q
    lower = 0
    if causal:  # query blocks wholly before this key block see none of it
        lower = (kv_index * block_k) // block_q
    k, v = k_ref[...], v_ref[...]
    cols = kv_index * block_k + lax.broadcasted_iota(jnp.int32, (block_q, block_k), 1)

    def body(i, carry):
        dk, dv = carry
        start = pl.multiple_of(i * block_q, block_q)
        q = q_ref[pl.ds(start, block_q), :]
        do = do_ref[pl.ds(start, block_q), :]
        lse = lse_ref[pl.ds(start, block_q)]
        delta = delta_ref[pl.ds(start, block_q)]
        rows = start + lax.broadcasted_iota(jnp.int32, (block_q, block_k), 0)
        valid = _mask(rows, cols, q_len, kv_len, causal)
        p = jnp.where(valid, jnp.exp(_dot_t(q, k) * sm_scale - lse[:, None]), 0.0)
        dv = dv + _t_dot(p.astype(do.dtype), do)
        ds = p * (_dot_t(do, v) - delta[:, None])
        dk = dk + _t_dot(ds.astype(q.dtype), q)
        return dk, dv

    init = (jnp.zeros(dk_ref.shape, jnp.float32), jnp.zeros(dv_ref.shape, jnp.float32))
    dk, dv = lax.fori_loop(jnp.asarray(lower, jnp.int32), jnp.int32(num_q_blocks), body, init)
    dk_ref[...] = (dk * sm_scale).astype(dk_ref.dtype)
    dv_ref[...] = dv.astype(dv_ref.dtype)


# ---- jax entry points -----------------------------------------------------------


class _Padded:
    """Block sizes and padded extents of one attention problem."""

    def __init__(self, q_shape, k_shape, v_shape):
        self.batch, self.heads, self.q_len, self.head_dim = q_shape
        self.kv_heads, self.kv_len, self.v_dim = k_shape[1], k_shape[2], v_shape[3]
        self.group = self.heads // self.kv_heads
        self.block_q = _pallas.block_for(self.q_len)
        self.block_k = _pallas.block_for(self.kv_len)
        self.q_pad = _pallas.round_up(self.q_len, self.block_q)
        self.kv_pad = _pallas.round_up(self.kv_len, self.block_k)
        self.d_pad = _pallas.block_for(self.head_dim, largest=1 << 30)
        self.dv_pad = _pallas.block_for(self.v_dim, largest=1 << 30)

    def q(self, x):  # (B, H, L, D) -> padded
        return _pallas.pad_to(_pallas.pad_to(x, 2, self.q_pad), 3, self.d_pad)

    def kv(self, x, dim):
        return _pallas.pad_to(_pallas.pad_to(x, 2, self.kv_pad), 3, dim)

    def q_spec(self, dim):
        return pl.BlockSpec((None, None, self.block_q, dim), lambda b, h, i: (b, h, i, 0))

    def q_row_spec(self):
        return pl.BlockSpec((None, None, self.block_q), lambda b, h, i: (b, h, i))

    def kv_full_spec(self, dim):
        group = self.group
        return pl.BlockSpec((None, None, self.kv_pad, dim), lambda b, h, i: (b, h // group, 0, 0))


def flash_attention_forward(q, k, v, causal: bool, sm_scale: float):
    """(out, logsumexp) for q (B, H, L, D), k (B, Hk, S, D), v (B, Hk, S, Dv); logsumexp is float32 (B, H, L)."""
    p = _Padded(q.shape, k.shape, v.shape)
    kernel = functools.partial(
        _fwd_kernel, sm_scale=sm_scale, causal=causal, block_k=p.block_k, q_len=p.q_len, kv_len=p.kv_len
    )
    out, lse = pl.pallas_call(
        kernel,
        grid=(p.batch, p.heads, p.q_pad // p.block_q),
        in_specs=[p.q_spec(p.d_pad), p.kv_full_spec(p.d_pad), p.kv_full_spec(p.dv_pad)],
        out_specs=[p.q_spec(p.dv_pad), p.q_row_spec()],
        out_shape=[
            jax.ShapeDtypeStruct((p.batch, p.heads, p.q_pad, p.dv_pad), q.dtype),
            jax.ShapeDtypeStruct((p.batch, p.heads, p.q_pad), jnp.float32),
        ],
        interpret=_pallas.interpret(),
        name="flash_attention_fwd",
    )(p.q(q), p.kv(k, p.d_pad), p.kv(v, p.dv_pad))
    return out[:, :, : p.q_len, : p.v_dim], lse[:, :, : p.q_len]


def flash_attention_backward(dout, q, k, v, out, lse, causal: bool, sm_scale: float):
    """(dq, dk, dv) of flash_attention_forward, recomputing the probabilities from `lse`."""
    p = _Padded(q.shape, k.shape, v.shape)
    delta = jnp.sum(dout.astype(jnp.float32) * out.astype(jnp.float32), axis=-1)
    qp, kp, vp = p.q(q), p.kv(k, p.d_pad), p.kv(v, p.dv_pad)
    dop = _pallas.pad_to(_pallas.pad_to(dout.astype(q.dtype), 2, p.q_pad), 3, p.dv_pad)
    lsep, deltap = _pallas.pad_to(lse, 2, p.q_pad), _pallas.pad_to(delta, 2, p.q_pad)
    common = dict(sm_scale=sm_scale, causal=causal, q_len=p.q_len, kv_len=p.kv_len)
    interpret = _pallas.interpret()

    dq = pl.pallas_call(
        functools.partial(_dq_kernel, block_k=p.block_k, **common),
        grid=(p.batch, p.heads, p.q_pad // p.block_q),
        in_specs=[
            p.q_spec(p.d_pad),
            p.kv_full_spec(p.d_pad),
            p.kv_full_spec(p.dv_pad),
            p.q_spec(p.dv_pad),
            p.q_row_spec(),
            p.q_row_spec(),
        ],
        out_specs=p.q_spec(p.d_pad),
        out_shape=jax.ShapeDtypeStruct(qp.shape, q.dtype),
        interpret=interpret,
        name="flash_attention_dq",
    )(qp, kp, vp, dop, lsep, deltap)

    group = p.group
    q_full = lambda dim: pl.BlockSpec((None, None, p.q_pad, dim), lambda b, h, j: (b, h, 0, 0))
    kv_block = lambda dim: pl.BlockSpec((None, None, p.block_k, dim), lambda b, h, j: (b, h // group, j, 0))
    per_head = lambda dim: pl.BlockSpec((None, None, p.block_k, dim), lambda b, h, j: (b, h, j, 0))
    rows_full = pl.BlockSpec((None, None, p.q_pad), lambda b, h, j: (b, h, 0))
    # One dk/dv per query head (float32), summed over each key head's group below.
    dk, dv = pl.pallas_call(
        functools.partial(_dkv_kernel, block_q=p.block_q, **common),
        grid=(p.batch, p.heads, p.kv_pad // p.block_k),
        in_specs=[q_full(p.d_pad), kv_block(p.d_pad), kv_block(p.dv_pad), q_full(p.dv_pad), rows_full, rows_full],
        out_specs=[per_head(p.d_pad), per_head(p.dv_pad)],
        out_shape=[
            jax.ShapeDtypeStruct((p.batch, p.heads, p.kv_pad, p.d_pad), jnp.float32),
            jax.ShapeDtypeStruct((p.batch, p.heads, p.kv_pad, p.dv_pad), jnp.float32),
        ],
        interpret=interpret,
        name="flash_attention_dkv",
    )(qp, kp, vp, dop, lsep, deltap)

    def per_kv_head(x, dim):
        x = x.reshape(p.batch, p.kv_heads, p.group, p.kv_pad, x.shape[-1]).sum(axis=2)
        return x[:, :, : p.kv_len, :dim].astype(k.dtype)

    return dq[:, :, : p.q_len, : p.head_dim], per_kv_head(dk, p.head_dim), per_kv_head(dv, p.v_dim)


# ---- torch ops -------------------------------------------------------------------


def _fwd_fake(q, k, v, causal, sm_scale):
    out = q.new_empty((*q.shape[:-1], v.shape[-1]))
    return out, q.new_empty(q.shape[:-1], dtype=torch.float32)


def _bwd_fake(dout, q, k, v, out, lse, causal, sm_scale):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def attention_on_cpu(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, sm_scale: float):
    """The forward's (out, logsumexp) with CPU's flash attention kernel, grouped key/value heads
    repeated for the query heads that share them: the forward ops' CPU kernel (the host tier's)."""
    group = q.shape[1] // k.shape[1]
    if group > 1:
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, causal, scale=sm_scale)
    return out.contiguous(), lse.contiguous()  # laid out as the lowering's (CPU's kernel may transpose them)


def define_attention_ops(name: str, forward, backward) -> tuple:
    """`tpu_kernels::<name>_fwd` and `<name>_bwd`: attention with this kernel's contract
    (forward gives (out, logsumexp); backward gives (dq, dk, dv)), lowered to `forward`/`backward`."""
    forward_op = _custom_ops.define(
        f"{name}_fwd(Tensor q, Tensor k, Tensor v, bool causal, float sm_scale) -> (Tensor, Tensor)",
        forward,
        _fwd_fake,
        attention_on_cpu,
    )
    backward_op = _custom_ops.define(
        f"{name}_bwd(Tensor grad_out, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, bool causal, "
        "float sm_scale) -> (Tensor, Tensor, Tensor)",
        backward,
        _bwd_fake,
    )
    return forward_op, backward_op


forward_op, backward_op = define_attention_ops("flash_attention", flash_attention_forward, flash_attention_backward)


def check_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    """Raises RuntimeError, worded like SDPA's checks, for inputs the kernel cannot take."""
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise RuntimeError(
            "flash_attention: expected 4-D query, key and value (batch, heads, seq, head_dim), got "
            f"query.dim: {q.dim()}, key.dim: {k.dim()}, value.dim: {v.dim()}"
        )
    if not (q.dtype == k.dtype == v.dtype):
        raise RuntimeError(
            "Expected query, key, and value to have the same dtype, but got query.dtype: "
            f"{q.dtype} key.dtype: {k.dtype} and value.dtype: {v.dtype} instead."
        )
    if q.dtype not in SUPPORTED_DTYPES:
        raise RuntimeError(f"flash_attention: dtype {q.dtype} is not supported (float32, bfloat16, float16)")
    if not (q.device == k.device == v.device) or q.device.type != "tpu":
        raise RuntimeError(
            f"flash_attention: expected query, key and value on one tpu device, got {q.device}, {k.device}, {v.device}"
        )
    if q.shape[-1] != k.shape[-1]:
        raise RuntimeError(f"flash_attention: query and key head dims differ: {q.shape[-1]} and {k.shape[-1]}")
    if max(q.shape[-1], v.shape[-1]) > MAX_HEAD_DIM:
        raise RuntimeError(f"flash_attention: head dims above {MAX_HEAD_DIM} are not supported")
    if k.shape[:3] != v.shape[:3]:
        raise RuntimeError(
            f"flash_attention: key {tuple(k.shape)} and value {tuple(v.shape)} differ in batch, heads or length"
        )
    if q.shape[0] != k.shape[0]:
        raise RuntimeError(f"flash_attention: batch sizes differ: query {q.shape[0]}, key {k.shape[0]}")
    if k.shape[1] == 0 or q.shape[1] % k.shape[1] != 0:
        raise RuntimeError(
            f"flash_attention: the number of query heads ({q.shape[1]}) must be a multiple of the number of "
            f"key/value heads ({k.shape[1]})"
        )
    if k.shape[2] == 0:
        raise RuntimeError("flash_attention: key and value have zero length")


class FlashAttention(torch.autograd.Function):
    """Pallas forward and backward; saves (q, k, v, out, logsumexp)."""

    @staticmethod
    def forward(ctx, q, k, v, causal: bool, sm_scale: float):
        out, lse = forward_op(q, k, v, causal, sm_scale)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.causal = causal
        ctx.sm_scale = sm_scale
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = backward_op(grad_out, q, k, v, out, lse, ctx.causal, ctx.sm_scale)
        return dq, dk, dv, None, None


def flash_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False, sm_scale: float | None = None
) -> torch.Tensor:
    """softmax(q @ k.T * sm_scale [+ causal mask]) @ v on tpu tensors, differentiable.

    q: (batch, heads, q_len, head_dim); k: (batch, kv_heads, kv_len, head_dim); v: (batch,
    kv_heads, kv_len, v_dim), with heads a multiple of kv_heads. sm_scale defaults to
    1/sqrt(head_dim). float32, bfloat16 or float16.
    """
    check_inputs(q, k, v)
    if sm_scale is None:
        sm_scale = 1.0 / math.sqrt(q.shape[-1])
    return FlashAttention.apply(q, k, v, bool(causal), float(sm_scale))
