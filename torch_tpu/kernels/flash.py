"""Flash attention in Pallas: blockwise online softmax forward (saves the logsumexp) and a
backward that recomputes the attention probabilities block by block.

Layout (batch, heads, seq, head_dim) like scaled_dot_product_attention. Key/value may have
fewer heads than the query (grouped-query attention). `causal` masks as SDPA's is_causal does
(query i sees keys j <= i). Sequence lengths that do not divide the block are padded and masked.

The grid walks (batch, head, query block, key block) with the key blocks innermost: running
max, denominator and output accumulate in VMEM scratch, so VMEM holds a few blocks whatever the
sequence length. Causal blocks above the diagonal are skipped, and their index maps repeat the
last block needed, so they cost no DMA. The backward runs two kernels: dq over (query block, key
block), and dk/dv over (key block, query block) where the grouped query heads of one key head
are walked inside the reduction, so dk and dv need no per-query-head copy.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import jax
import jax.numpy as jnp
import torch
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from torch_tpu.kernels import _custom_ops, _pallas
from torch_tpu.kernels._pallas import NEG_INF
from torch_tpu.platforms.tpu import mosaic
from torch_tpu.platforms.tpu.mosaic import ARBITRARY, LANES, PARALLEL

SUPPORTED_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
MAX_HEAD_DIM = 256
# The largest block along a sequence: bigger blocks mean fewer grid steps (each ~0.35 us) and
# fuller MXU passes; VMEM bounds them (see _Blocks).
_MAX_BLOCK = 512

_A_BT = (((1,), (1,)), ((), ()))  # a @ b.T


def _dot_t(a: jax.Array, b: jax.Array, precision) -> jax.Array:
    return lax.dot_general(a, b, _A_BT, precision=precision, preferred_element_type=jnp.float32)


def _dot(a: jax.Array, b: jax.Array, precision) -> jax.Array:
    return lax.dot(a, b, precision=precision, preferred_element_type=jnp.float32)


def _valid(q_block, kv_block, p, causal: bool, kv_len=None):
    """The (block_q, block_k) mask of scores to keep, or None where every score is kept. `kv_len`:
    a traced key length (keys past it are padding), else the static one."""
    shape = (p.block_q, p.block_k)
    cols = kv_block * p.block_k + lax.broadcasted_iota(jnp.int32, shape, 1)
    if kv_len is not None:
        valid = cols < kv_len
    else:
        valid = cols < p.kv_len if p.kv_pad != p.kv_len else None
    if causal:
        rows = q_block * p.block_q + lax.broadcasted_iota(jnp.int32, shape, 0)
        valid = cols <= rows if valid is None else valid & (cols <= rows)
    return valid


def _for_visible_blocks(step, i, j, p, causal: bool) -> None:
    """Runs kernel body `step` for query block i and key block j, unless causal masks every key of
    the pair (the key block lies wholly after the query block)."""
    if causal:
        pl.when(j * p.block_k <= (i + 1) * p.block_q - 1)(step)
    else:
        step()


def _last_kv_block(q_block, block_q: int, block_k: int, num_kv_blocks: int):
    """The last key block a causal query block sees."""
    return jnp.minimum(lax.div((q_block + 1) * block_q - 1, block_k), num_kv_blocks - 1)


def _first_q_block(kv_block, block_q: int, block_k: int):
    """The first query block that sees a causal key block."""
    return lax.div(kv_block * block_k, block_q)


# ---- kernels ------------------------------------------------------------------


def _fwd_kernel(q_ref, k_ref, v_ref, o_ref, lse_ref, m_scr, l_scr, acc_scr, *, sm_scale, causal, p, kv_len=None):
    i, j = pl.program_id(2), pl.program_id(3)

    @pl.when(j == 0)
    def _start():
        m_scr[...] = jnp.full(m_scr.shape, -jnp.inf, jnp.float32)
        l_scr[...] = jnp.zeros(l_scr.shape, jnp.float32)
        acc_scr[...] = jnp.zeros(acc_scr.shape, jnp.float32)

    def _step():
        s = _dot_t(q_ref[...], k_ref[...], p.precision) * sm_scale
        valid = _valid(i, j, p, causal, kv_len)
        if valid is not None:
            s = jnp.where(valid, s, NEG_INF)
        m_prev, l_prev = m_scr[...], l_scr[...]
        m_next = jnp.maximum(m_prev, jnp.max(s, axis=1)[:, None])  # (block_q, LANES)
        probs = jnp.exp(s - _pallas.to_lanes(m_next, p.block_k))
        if valid is not None:
            probs = jnp.where(valid, probs, 0.0)
        alpha = jnp.exp(m_prev - m_next)
        l_scr[...] = alpha * l_prev + jnp.sum(probs, axis=1)[:, None]
        m_scr[...] = m_next
        v = v_ref[...]
        acc_scr[...] = acc_scr[...] * _pallas.to_lanes(alpha, p.dv) + _dot(probs.astype(v.dtype), v, p.precision)

    _for_visible_blocks(_step, i, j, p, causal)

    @pl.when(j == pl.num_programs(3) - 1)
    def _finish():
        denom = l_scr[...]
        denom = jnp.where(denom == 0.0, 1.0, denom)
        o_ref[...] = (acc_scr[...] * _pallas.to_lanes(1.0 / denom, p.dv)).astype(o_ref.dtype)
        lse_ref[...] = m_scr[...] + jnp.log(denom)


def _probs_and_ds(q, k, v, do, lse, delta, valid, sm_scale, p):
    """Recomputed probabilities and the score gradient (before sm_scale) of one block pair."""
    probs = jnp.exp(_dot_t(q, k, p.precision) * sm_scale - _pallas.to_lanes(lse, p.block_k))
    if valid is not None:
        probs = jnp.where(valid, probs, 0.0)
    ds = probs * (_dot_t(do, v, p.precision) - _pallas.to_lanes(delta, p.block_k))
    return probs, ds


def _dq_kernel(q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, dq_ref, dq_scr, *, sm_scale, causal, p, kv_len=None):
    i, j = pl.program_id(2), pl.program_id(3)

    @pl.when(j == 0)
    def _start():
        dq_scr[...] = jnp.zeros(dq_scr.shape, jnp.float32)

    def _step():
        k = k_ref[...]
        valid = _valid(i, j, p, causal, kv_len)
        _, ds = _probs_and_ds(q_ref[...], k, v_ref[...], do_ref[...], lse_ref[...], delta_ref[...], valid, sm_scale, p)
        dq_scr[...] += _dot(ds.astype(k.dtype), k, p.precision)

    _for_visible_blocks(_step, i, j, p, causal)

    @pl.when(j == pl.num_programs(3) - 1)
    def _finish():
        dq_ref[...] = (dq_scr[...] * sm_scale).astype(dq_ref.dtype)


def _dkv_kernel(
    q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, dk_ref, dv_ref, dk_scr, dv_scr, *, sm_scale, causal, p, kv_len=None
):
    # Grid (batch, key head, key block j, t): t walks the key head's query heads and query blocks.
    j, t = pl.program_id(2), pl.program_id(3)
    i = lax.rem(t, p.num_q_blocks)

    @pl.when(t == 0)
    def _start():
        dk_scr[...] = jnp.zeros(dk_scr.shape, jnp.float32)
        dv_scr[...] = jnp.zeros(dv_scr.shape, jnp.float32)

    def _step():
        q, do = q_ref[...], do_ref[...]
        valid = _valid(i, j, p, causal, kv_len)
        probs, ds = _probs_and_ds(q, k_ref[...], v_ref[...], do, lse_ref[...], delta_ref[...], valid, sm_scale, p)
        dv_scr[...] += _dot(probs.T.astype(do.dtype), do, p.precision)
        dk_scr[...] += _dot(ds.T.astype(q.dtype), q, p.precision)

    _for_visible_blocks(_step, i, j, p, causal)

    @pl.when(t == pl.num_programs(3) - 1)
    def _finish():
        dk_ref[...] = (dk_scr[...] * sm_scale).astype(dk_ref.dtype)
        dv_ref[...] = dv_scr[...].astype(dv_ref.dtype)


# ---- jax entry points -----------------------------------------------------------


def _reading_key_length(kernel: Callable) -> Callable:
    """`kernel` behind a prefetched scalar, the traced key length: refs (kv_len, *refs)."""

    def run(kv_len_ref, *refs, **kwargs):
        return kernel(*refs, kv_len=kv_len_ref[0], **kwargs)

    return run


def _launch(kernel: Callable, kv_len, grid_spec_args: dict, **call_args) -> Callable:
    """_pallas.call of `kernel`; with a traced `kv_len`, a scalar-prefetch grid whose first
    operand is that length (index maps take it as a trailing argument, which they ignore)."""
    if kv_len is None:
        return _pallas.call(kernel, grid_spec=pl.GridSpec(**grid_spec_args), **call_args)
    grid_spec = pltpu.PrefetchScalarGridSpec(num_scalar_prefetch=1, **grid_spec_args)
    run = _pallas.call(_reading_key_length(kernel), grid_spec=grid_spec, **call_args)
    length = jnp.reshape(kv_len, (1,)).astype(jnp.int32)
    return lambda *operands: run(length, *operands)


class _Blocks:
    """Block sizes and padded extents of one attention problem (static: shapes and dtype)."""

    def __init__(self, q_shape, k_shape, v_shape, dtype, precision):
        self.precision = precision
        self.batch, self.heads, self.q_len, self.head_dim = q_shape
        self.kv_heads, self.kv_len, self.v_dim = k_shape[1], k_shape[2], v_shape[3]
        self.group = self.heads // self.kv_heads
        self.d = mosaic.lane_dim(self.head_dim)
        self.dv = mosaic.lane_dim(self.v_dim)
        # Wide float32 rows take half the block: a block pair's operands and scores stay in VMEM.
        largest = _MAX_BLOCK if max(self.d, self.dv) * jnp.dtype(dtype).itemsize <= 256 else _MAX_BLOCK // 2
        self.block_q = mosaic.row_block(self.q_len, dtype, largest)
        self.block_k = mosaic.lane_block(self.kv_len, largest)
        self.q_pad = mosaic.round_up(self.q_len, self.block_q)
        self.kv_pad = mosaic.round_up(self.kv_len, self.block_k)
        self.num_q_blocks = self.q_pad // self.block_q
        self.num_kv_blocks = self.kv_pad // self.block_k

    def q(self, x, dim):  # (B, H, L, D) -> padded
        return _pallas.pad_to(_pallas.pad_to(x, 2, self.q_pad), 3, dim)

    def kv(self, x, dim):
        return _pallas.pad_to(_pallas.pad_to(x, 2, self.kv_pad), 3, dim)

    def kv_index(self, i, j, causal: bool):
        """The key block a (query block i, key block j) step reads: past a causal query block's
        last key block, that last block again (no new DMA)."""
        return jnp.minimum(j, _last_kv_block(i, self.block_q, self.block_k, self.num_kv_blocks)) if causal else j

    def q_index(self, i, j, causal: bool):
        """The query block a (key block j, query block i) step reads: before a causal key block's
        first query block, that first block (no new DMA)."""
        return jnp.maximum(i, _first_q_block(j, self.block_q, self.block_k)) if causal else i


def _scratch(rows: int, width: int):
    return pltpu.VMEM((rows, width), jnp.float32)


def flash_attention_forward(q, k, v, causal: bool, sm_scale: float, kv_len=None):
    """(out, logsumexp) for q (B, H, L, D), k (B, Hk, S, D), v (B, Hk, S, Dv); logsumexp is float32
    (B, H, L). `kv_len`: a traced int, keys at and past it are padding (masked)."""
    out_dtype = q.dtype
    q, k, v = _pallas.as_computed(q, k, v)
    p = _Blocks(q.shape, k.shape, v.shape, q.dtype, _pallas.dot_precision(q, k, v))
    group = p.group
    q_spec = pl.BlockSpec((None, None, p.block_q, p.d), lambda b, h, i, j, *_: (b, h, i, 0))
    kv_spec = lambda dim: pl.BlockSpec(
        (None, None, p.block_k, dim), lambda b, h, i, j, *_: (b, lax.div(h, group), p.kv_index(i, j, causal), 0)
    )
    out_spec = pl.BlockSpec((None, None, p.block_q, p.dv), lambda b, h, i, j, *_: (b, h, i, 0))
    rows_spec = pl.BlockSpec((None, None, p.block_q, LANES), lambda b, h, i, j, *_: (b, h, i, 0))
    grid_spec = dict(
        grid=(p.batch, p.heads, p.num_q_blocks, p.num_kv_blocks),
        in_specs=[q_spec, kv_spec(p.d), kv_spec(p.dv)],
        out_specs=[out_spec, rows_spec],
        scratch_shapes=[_scratch(p.block_q, LANES), _scratch(p.block_q, LANES), _scratch(p.block_q, p.dv)],
    )
    out, lse = _launch(
        functools.partial(_fwd_kernel, sm_scale=sm_scale, causal=causal, p=p),
        kv_len,
        grid_spec,
        out_shape=[
            jax.ShapeDtypeStruct((p.batch, p.heads, p.q_pad, p.dv), q.dtype),
            jax.ShapeDtypeStruct((p.batch, p.heads, p.q_pad, LANES), jnp.float32),
        ],
        semantics=(PARALLEL, PARALLEL, PARALLEL, ARBITRARY),
        name="flash_attention_fwd",
    )(p.q(q, p.d), p.kv(k, p.d), p.kv(v, p.dv))
    return out[:, :, : p.q_len, : p.v_dim].astype(out_dtype), lse[:, :, : p.q_len, 0]


def flash_attention_backward(dout, q, k, v, out, lse, causal: bool, sm_scale: float, kv_len=None):
    """(dq, dk, dv) of flash_attention_forward, recomputing the probabilities from `lse`."""
    dtypes = (q.dtype, k.dtype, v.dtype)
    delta = jnp.sum(dout.astype(jnp.float32) * out.astype(jnp.float32), axis=-1)
    q, k, v, dout = _pallas.as_computed(q, k, v, dout)
    p = _Blocks(q.shape, k.shape, v.shape, q.dtype, _pallas.dot_precision(q, k, v))
    qp, kp, vp, dop = p.q(q, p.d), p.kv(k, p.d), p.kv(v, p.dv), p.q(dout, p.dv)
    lsep = _pallas.across_lanes(_pallas.pad_to(lse.astype(jnp.float32), 2, p.q_pad))
    deltap = _pallas.across_lanes(_pallas.pad_to(delta, 2, p.q_pad))
    group, num_q_blocks = p.group, p.num_q_blocks

    # dq: grid (batch, head, query block i, key block j).
    q_spec = lambda dim: pl.BlockSpec((None, None, p.block_q, dim), lambda b, h, i, j, *_: (b, h, i, 0))
    kv_spec = lambda dim: pl.BlockSpec(
        (None, None, p.block_k, dim), lambda b, h, i, j, *_: (b, lax.div(h, group), p.kv_index(i, j, causal), 0)
    )
    dq = _launch(
        functools.partial(_dq_kernel, sm_scale=sm_scale, causal=causal, p=p),
        kv_len,
        dict(
            grid=(p.batch, p.heads, p.num_q_blocks, p.num_kv_blocks),
            in_specs=[q_spec(p.d), kv_spec(p.d), kv_spec(p.dv), q_spec(p.dv), q_spec(LANES), q_spec(LANES)],
            out_specs=q_spec(p.d),
            scratch_shapes=[_scratch(p.block_q, p.d)],
        ),
        out_shape=jax.ShapeDtypeStruct(qp.shape, q.dtype),
        semantics=(PARALLEL, PARALLEL, PARALLEL, ARBITRARY),
        name="flash_attention_dq",
    )(qp, kp, vp, dop, lsep, deltap)

    # dk, dv: grid (batch, key head g, key block j, t), t = query head in the group * blocks + query block.
    def q_of(b, g, j, t, *_):
        return (b, g * group + lax.div(t, num_q_blocks), p.q_index(lax.rem(t, num_q_blocks), j, causal), 0)

    rows_of = lambda dim: pl.BlockSpec((None, None, p.block_q, dim), q_of)
    kv_own = lambda dim: pl.BlockSpec((None, None, p.block_k, dim), lambda b, g, j, t, *_: (b, g, j, 0))
    dk, dv = _launch(
        functools.partial(_dkv_kernel, sm_scale=sm_scale, causal=causal, p=p),
        kv_len,
        dict(
            grid=(p.batch, p.kv_heads, p.num_kv_blocks, group * num_q_blocks),
            in_specs=[rows_of(p.d), kv_own(p.d), kv_own(p.dv), rows_of(p.dv), rows_of(LANES), rows_of(LANES)],
            out_specs=[kv_own(p.d), kv_own(p.dv)],
            scratch_shapes=[_scratch(p.block_k, p.d), _scratch(p.block_k, p.dv)],
        ),
        out_shape=[jax.ShapeDtypeStruct(kp.shape, k.dtype), jax.ShapeDtypeStruct(vp.shape, v.dtype)],
        semantics=(PARALLEL, PARALLEL, PARALLEL, ARBITRARY),
        name="flash_attention_dkv",
    )(qp, kp, vp, dop, lsep, deltap)

    return (
        dq[:, :, : p.q_len, : p.head_dim].astype(dtypes[0]),
        dk[:, :, : p.kv_len, : p.head_dim].astype(dtypes[1]),
        dv[:, :, : p.kv_len, : p.v_dim].astype(dtypes[2]),
    )


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
