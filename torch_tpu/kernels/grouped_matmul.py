"""MegaBlocks-style grouped matmul in Pallas, for mixture-of-experts layers.

gmm(lhs [m, k], rhs [groups, k, n], group_sizes [groups]) multiplies the rows of lhs in
group g (rows are sorted by group: group g owns the next group_sizes[g] rows) by rhs[g].
tgmm(lhs [m, k], grad [m, n], group_sizes) gives each group's lhs_g.T @ grad_g, [groups, k, n]:
the rhs gradient. Rows past sum(group_sizes) belong to no group: their output is zero.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import torch
from jax import lax
from jax.experimental import pallas as pl

from torch_tpu.kernels import _custom_ops, _pallas

SUPPORTED_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _offsets(group_sizes: jax.Array) -> jax.Array:
    """[0, cumsum(group_sizes)...] as int32: group g owns rows offsets[g]:offsets[g + 1]."""
    sizes = group_sizes.astype(jnp.int32)
    return jnp.concatenate([jnp.zeros((1,), jnp.int32), jnp.cumsum(sizes, dtype=jnp.int32)])


def _gmm_kernel(offsets_ref, first_ref, last_ref, lhs_ref, rhs_ref, out_ref):
    block_m = lhs_ref.shape[0]
    tile = pl.program_id(0)
    lhs = lhs_ref[...]
    rows = tile * block_m + lax.broadcasted_iota(jnp.int32, out_ref.shape, 0)

    def body(g, acc):
        in_group = (rows >= offsets_ref[g]) & (rows < offsets_ref[g + 1])
        product = lax.dot_general(lhs, rhs_ref[g], (((1,), (0,)), ((), ())), preferred_element_type=jnp.float32)
        return acc + jnp.where(in_group, product, 0.0)

    acc = lax.fori_loop(first_ref[tile], last_ref[tile] + 1, body, jnp.zeros(out_ref.shape, jnp.float32))
    out_ref[...] = acc.astype(out_ref.dtype)


def _tgmm_kernel(offsets_ref, lhs_ref, grad_ref, out_ref, *, block_m):
    group = pl.program_id(0)
    start, end = offsets_ref[group], offsets_ref[group + 1]

    def body(tile, acc):
        first_row = pl.multiple_of(tile * block_m, block_m)
        rows = first_row + lax.broadcasted_iota(jnp.int32, (block_m, 1), 0)
        x = lhs_ref[pl.ds(first_row, block_m), :]
        x = jnp.where((rows >= start) & (rows < end), x, jnp.zeros_like(x))
        y = grad_ref[pl.ds(first_row, block_m), :]
        return acc + lax.dot_general(x, y, (((0,), (0,)), ((), ())), preferred_element_type=jnp.float32)

    acc = lax.fori_loop(start // block_m, (end + block_m - 1) // block_m, body, jnp.zeros(out_ref.shape, jnp.float32))
    out_ref[...] = acc.astype(out_ref.dtype)


def _blocks(m: int, k: int, n: int):
    block_m, block_n = _pallas.block_for(m), _pallas.block_for(n)
    return (
        block_m,
        block_n,
        _pallas.round_up(m, block_m),
        _pallas.block_for(k, largest=1 << 30),
        _pallas.round_up(n, block_n),
    )


def gmm_jax(lhs: jax.Array, rhs: jax.Array, group_sizes: jax.Array) -> jax.Array:
    """The grouped matmul on jax arrays: [m, k] x [groups, k, n] -> [m, n]."""
    (m, k), (groups, _, n) = lhs.shape, rhs.shape
    block_m, block_n, m_pad, k_pad, n_pad = _blocks(m, k, n)
    offsets = _offsets(group_sizes)
    num_tiles = m_pad // block_m
    tile_starts = jnp.arange(num_tiles, dtype=jnp.int32) * block_m
    # The groups each row tile overlaps form one contiguous range first..last.
    first = jnp.searchsorted(offsets[1:], tile_starts, side="right").astype(jnp.int32)
    last = jnp.searchsorted(offsets[1:], tile_starts + block_m - 1, side="right").astype(jnp.int32)
    first, last = jnp.minimum(first, groups - 1), jnp.minimum(last, groups - 1)
    lhs_p = _pallas.pad_to(_pallas.pad_to(lhs, 0, m_pad), 1, k_pad)
    rhs_p = _pallas.pad_to(_pallas.pad_to(rhs, 1, k_pad), 2, n_pad)
    scalars = _pallas.scalar_spec()
    out = pl.pallas_call(
        _gmm_kernel,
        grid=(num_tiles, n_pad // block_n),
        in_specs=[
            scalars,
            scalars,
            scalars,
            pl.BlockSpec((block_m, k_pad), lambda i, j: (i, 0)),
            pl.BlockSpec((groups, k_pad, block_n), lambda i, j: (0, 0, j)),
        ],
        out_specs=pl.BlockSpec((block_m, block_n), lambda i, j: (i, j)),
        out_shape=jax.ShapeDtypeStruct((m_pad, n_pad), lhs.dtype),
        interpret=_pallas.interpret(),
        name="gmm",
    )(offsets, first, last, lhs_p, rhs_p)
    return out[:m, :n]


def tgmm_jax(lhs: jax.Array, grad: jax.Array, group_sizes: jax.Array) -> jax.Array:
    """Per group lhs_g.T @ grad_g on jax arrays: [m, k], [m, n] -> [groups, k, n]."""
    (m, k), n, groups = lhs.shape, grad.shape[1], group_sizes.shape[0]
    block_m, block_n, m_pad, k_pad, n_pad = _blocks(m, k, n)
    lhs_p = _pallas.pad_to(_pallas.pad_to(lhs, 0, m_pad), 1, k_pad)
    grad_p = _pallas.pad_to(_pallas.pad_to(grad.astype(lhs.dtype), 0, m_pad), 1, n_pad)
    out = pl.pallas_call(
        functools.partial(_tgmm_kernel, block_m=block_m),
        grid=(groups, n_pad // block_n),
        in_specs=[
            _pallas.scalar_spec(),
            pl.BlockSpec((m_pad, k_pad), lambda g, j: (0, 0)),
            pl.BlockSpec((m_pad, block_n), lambda g, j: (0, j)),
        ],
        out_specs=pl.BlockSpec((None, k_pad, block_n), lambda g, j: (g, 0, j)),
        out_shape=jax.ShapeDtypeStruct((groups, k_pad, n_pad), lhs.dtype),
        interpret=_pallas.interpret(),
        name="tgmm",
    )(_offsets(group_sizes), lhs_p, grad_p)
    return out[:, :k, :n]


def _gmm_fake(lhs, rhs, group_sizes):
    return lhs.new_empty((lhs.shape[0], rhs.shape[2]))


def _tgmm_fake(lhs, grad, group_sizes):
    return lhs.new_empty((group_sizes.shape[0], lhs.shape[1], grad.shape[1]))


gmm_op = _custom_ops.define("gmm(Tensor lhs, Tensor rhs, Tensor group_sizes) -> Tensor", gmm_jax, _gmm_fake)
tgmm_op = _custom_ops.define("tgmm(Tensor lhs, Tensor grad, Tensor group_sizes) -> Tensor", tgmm_jax, _tgmm_fake)


def _check(lhs: torch.Tensor, rhs: torch.Tensor, group_sizes: torch.Tensor) -> None:
    if lhs.dim() != 2 or rhs.dim() != 3 or group_sizes.dim() != 1:
        raise RuntimeError(
            "gmm: expected lhs [m, k], rhs [groups, k, n] and group_sizes [groups], got shapes "
            f"{tuple(lhs.shape)}, {tuple(rhs.shape)} and {tuple(group_sizes.shape)}"
        )
    if lhs.shape[1] != rhs.shape[1]:
        raise RuntimeError(f"gmm: lhs has k={lhs.shape[1]} columns but rhs has k={rhs.shape[1]} rows per group")
    if group_sizes.shape[0] != rhs.shape[0] or rhs.shape[0] == 0:
        raise RuntimeError(f"gmm: {group_sizes.shape[0]} group sizes for {rhs.shape[0]} groups of rhs")
    if lhs.dtype != rhs.dtype or lhs.dtype not in SUPPORTED_DTYPES:
        raise RuntimeError(
            "gmm: lhs and rhs must have one floating dtype (float32, bfloat16, float16), got "
            f"{lhs.dtype} and {rhs.dtype}"
        )
    if group_sizes.dtype not in (torch.int32, torch.int64):
        raise RuntimeError(f"gmm: group_sizes must be int32 (or int64), got {group_sizes.dtype}")
    if not (lhs.device == rhs.device == group_sizes.device) or lhs.device.type != "tpu":
        raise RuntimeError(
            f"gmm: expected tensors on one tpu device, got {lhs.device}, {rhs.device} and {group_sizes.device}"
        )


class GroupedMatmul(torch.autograd.Function):
    """gmm forward; backward dlhs = gmm(grad, rhs^T), drhs = tgmm(lhs, grad)."""

    @staticmethod
    def forward(ctx, lhs, rhs, group_sizes):
        ctx.save_for_backward(lhs, rhs, group_sizes)
        return gmm_op(lhs, rhs, group_sizes)

    @staticmethod
    def backward(ctx, grad):
        lhs, rhs, group_sizes = ctx.saved_tensors
        dlhs = gmm_op(grad, rhs.transpose(1, 2), group_sizes) if ctx.needs_input_grad[0] else None
        drhs = tgmm_op(lhs, grad, group_sizes) if ctx.needs_input_grad[1] else None
        return dlhs, drhs, None


def gmm(lhs: torch.Tensor, rhs: torch.Tensor, group_sizes: torch.Tensor) -> torch.Tensor:
    """Grouped matmul on tpu tensors, differentiable in lhs and rhs.

    lhs [m, k] has its rows sorted by group; rhs [groups, k, n]; group_sizes [groups] (int32)
    counts the rows of each group. Row r of the result is lhs[r] @ rhs[g] for the group g
    owning row r; rows past sum(group_sizes) are zero.
    """
    _check(lhs, rhs, group_sizes)
    return GroupedMatmul.apply(lhs, rhs, group_sizes)
