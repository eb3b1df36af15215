"""MegaBlocks-style grouped matmul in Pallas, for mixture-of-experts layers.

gmm(lhs [m, k], rhs [groups, k, n], group_sizes [groups]) multiplies the rows of lhs in
group g (rows are sorted by group: group g owns the next group_sizes[g] rows) by rhs[g].
tgmm(lhs [m, k], grad [m, n], group_sizes) gives each group's lhs_g.T @ grad_g, [groups, k, n]:
the rhs gradient. Rows past sum(group_sizes) belong to no group: their output is zero.

Both walk a list of *visits*, (row tile, group) pairs in row order: a row tile is visited once
for each group its rows touch, so a tile straddling a group boundary is visited twice and every
visit streams only its own group's rhs block. The list is computed on device from group_sizes
and reaches the kernels by scalar prefetch (SMEM); its static length is tiles + groups - 1, the
most visits any group_sizes can need, and visits past the real ones repeat the last one
without computing. Consecutive visits of one output block accumulate in VMEM scratch.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import torch
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from torch_tpu.kernels import _custom_ops, _pallas
from torch_tpu.platforms.tpu import mosaic
from torch_tpu.platforms.tpu.mosaic import ARBITRARY, PARALLEL

SUPPORTED_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
_MAX_BLOCK = 512


def _whole_or(length: int, largest: int, multiple: int) -> int:
    """A block for an axis: the whole axis if it is short (Mosaic takes any whole axis), else `largest`."""
    return length if length <= largest else largest - largest % multiple


class _Tiles:
    """Blocks, padded extents and the visit count of one grouped matmul (static)."""

    def __init__(self, m: int, k: int, n: int, groups: int, dtype, precision):
        self.m, self.k, self.n, self.groups, self.precision = m, k, n, groups, precision
        self.block_m = mosaic.row_block(m, dtype, _MAX_BLOCK)
        self.block_k = _whole_or(k, _MAX_BLOCK, mosaic.LANES)
        self.block_n = _whole_or(n, _MAX_BLOCK, mosaic.LANES)
        self.m_pad = mosaic.round_up(m, self.block_m)
        self.k_pad = mosaic.round_up(k, self.block_k)
        self.n_pad = mosaic.round_up(n, self.block_n)
        self.num_tiles = self.m_pad // self.block_m
        self.num_visits = self.num_tiles + groups - 1


def _visits(group_sizes: jax.Array, t: _Tiles):
    """(tile, group, offsets, count): the visits' row tiles and groups (int32 [num_visits], the
    unused tail repeating the last visit), group row offsets (int32 [groups + 1]) and the number
    of real visits (int32 [1])."""
    sizes = group_sizes.astype(jnp.int32)
    offsets = jnp.concatenate([jnp.zeros((1,), jnp.int32), jnp.cumsum(sizes, dtype=jnp.int32)])
    starts = jnp.arange(t.num_tiles, dtype=jnp.int32) * t.block_m
    # The groups a tile's rows touch form one range first..last (rows past the groups: the last group).
    first = jnp.searchsorted(offsets[1:], starts, side="right").astype(jnp.int32)
    last = jnp.searchsorted(offsets[1:], starts + t.block_m - 1, side="right").astype(jnp.int32)
    first, last = jnp.minimum(first, t.groups - 1), jnp.minimum(last, t.groups - 1)
    per_tile = last - first + 1
    ends = jnp.cumsum(per_tile, dtype=jnp.int32)
    count = ends[-1]
    visit = jnp.minimum(jnp.arange(t.num_visits, dtype=jnp.int32), count - 1)
    tile = jnp.searchsorted(ends, visit, side="right").astype(jnp.int32)
    group = first[tile] + visit - (ends[tile] - per_tile[tile])
    return tile, group, offsets, count.reshape(1)


def _rows_of_group(tile, group, offsets_ref, shape, block_m: int):
    rows = tile * block_m + jax.lax.broadcasted_iota(jnp.int32, shape, 0)
    return (rows >= offsets_ref[group]) & (rows < offsets_ref[group + 1])


def _gmm_kernel(tile_ref, group_ref, offsets_ref, count_ref, lhs_ref, rhs_ref, out_ref, acc_scr, *, t: _Tiles):
    v, kk = pl.program_id(1), pl.program_id(2)
    last_visit, last_k = pl.num_programs(1) - 1, pl.num_programs(2) - 1
    tile = tile_ref[v]
    starts_tile = (v == 0) | (tile_ref[jnp.maximum(v - 1, 0)] != tile)
    ends_tile = (v == last_visit) | (tile_ref[jnp.minimum(v + 1, last_visit)] != tile)

    @pl.when(starts_tile & (kk == 0))
    def _start():
        acc_scr[...] = jnp.zeros(acc_scr.shape, jnp.float32)

    @pl.when(v < count_ref[0])
    def _step():
        lhs = lhs_ref[...]
        mine = _rows_of_group(tile, group_ref[v], offsets_ref, lhs.shape, t.block_m)
        lhs = jnp.where(mine, lhs, jnp.zeros_like(lhs))
        acc_scr[...] += jax.lax.dot(lhs, rhs_ref[...], precision=t.precision, preferred_element_type=jnp.float32)

    @pl.when(ends_tile & (kk == last_k))
    def _finish():
        out_ref[...] = acc_scr[...].astype(out_ref.dtype)


def _tgmm_kernel(tile_ref, group_ref, offsets_ref, count_ref, lhs_ref, grad_ref, out_ref, acc_scr, *, t: _Tiles):
    v = pl.program_id(2)
    last_visit = pl.num_programs(2) - 1
    group = group_ref[v]
    starts_group = (v == 0) | (group_ref[jnp.maximum(v - 1, 0)] != group)
    ends_group = (v == last_visit) | (group_ref[jnp.minimum(v + 1, last_visit)] != group)

    @pl.when(starts_group)
    def _start():
        acc_scr[...] = jnp.zeros(acc_scr.shape, jnp.float32)

    @pl.when(v < count_ref[0])
    def _step():
        lhs = lhs_ref[...]
        mine = _rows_of_group(tile_ref[v], group, offsets_ref, lhs.shape, t.block_m)
        lhs = jnp.where(mine, lhs, jnp.zeros_like(lhs))
        acc_scr[...] += jax.lax.dot(lhs.T, grad_ref[...], precision=t.precision, preferred_element_type=jnp.float32)

    @pl.when(ends_group)
    def _finish():
        out_ref[...] = acc_scr[...].astype(out_ref.dtype)


def gmm_jax(lhs: jax.Array, rhs: jax.Array, group_sizes: jax.Array) -> jax.Array:
    """The grouped matmul on jax arrays: [m, k] x [groups, k, n] -> [m, n]."""
    out_dtype = lhs.dtype
    lhs, rhs = _pallas.as_computed(lhs, rhs)
    (m, k), (groups, _, n) = lhs.shape, rhs.shape
    t = _Tiles(m, k, n, groups, lhs.dtype, _pallas.dot_precision(lhs, rhs))
    tile, group, offsets, count = _visits(group_sizes, t)
    lhs_p = _pallas.pad_to(_pallas.pad_to(lhs, 0, t.m_pad), 1, t.k_pad)
    rhs_p = _pallas.pad_to(_pallas.pad_to(rhs, 1, t.k_pad), 2, t.n_pad)
    grid_spec = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=4,
        grid=(t.n_pad // t.block_n, t.num_visits, t.k_pad // t.block_k),
        in_specs=[
            pl.BlockSpec((t.block_m, t.block_k), lambda j, v, kk, tile, group, *_: (tile[v], kk)),
            pl.BlockSpec((None, t.block_k, t.block_n), lambda j, v, kk, tile, group, *_: (group[v], kk, j)),
        ],
        out_specs=pl.BlockSpec((t.block_m, t.block_n), lambda j, v, kk, tile, group, *_: (tile[v], j)),
        scratch_shapes=[pltpu.VMEM((t.block_m, t.block_n), jnp.float32)],
    )
    out = _pallas.call(
        functools.partial(_gmm_kernel, t=t),
        grid_spec=grid_spec,
        out_shape=jax.ShapeDtypeStruct((t.m_pad, t.n_pad), lhs.dtype),
        semantics=(PARALLEL, ARBITRARY, ARBITRARY),
        name="gmm",
    )(tile, group, offsets, count, lhs_p, rhs_p)
    return out[:m, :n].astype(out_dtype)


def tgmm_jax(lhs: jax.Array, grad: jax.Array, group_sizes: jax.Array) -> jax.Array:
    """Per group lhs_g.T @ grad_g on jax arrays: [m, k], [m, n] -> [groups, k, n]."""
    out_dtype = lhs.dtype
    lhs, grad = _pallas.as_computed(lhs, grad.astype(lhs.dtype))
    (m, k), n, groups = lhs.shape, grad.shape[1], group_sizes.shape[0]
    t = _Tiles(m, k, n, groups, lhs.dtype, _pallas.dot_precision(lhs, grad))
    tile, group, offsets, count = _visits(group_sizes, t)
    lhs_p = _pallas.pad_to(_pallas.pad_to(lhs, 0, t.m_pad), 1, t.k_pad)
    grad_p = _pallas.pad_to(_pallas.pad_to(grad, 0, t.m_pad), 1, t.n_pad)
    grid_spec = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=4,
        grid=(t.k_pad // t.block_k, t.n_pad // t.block_n, t.num_visits),
        in_specs=[
            pl.BlockSpec((t.block_m, t.block_k), lambda kk, j, v, tile, group, *_: (tile[v], kk)),
            pl.BlockSpec((t.block_m, t.block_n), lambda kk, j, v, tile, group, *_: (tile[v], j)),
        ],
        out_specs=pl.BlockSpec((None, t.block_k, t.block_n), lambda kk, j, v, tile, group, *_: (group[v], kk, j)),
        scratch_shapes=[pltpu.VMEM((t.block_k, t.block_n), jnp.float32)],
    )
    out = _pallas.call(
        functools.partial(_tgmm_kernel, t=t),
        grid_spec=grid_spec,
        out_shape=jax.ShapeDtypeStruct((groups, t.k_pad, t.n_pad), lhs.dtype),
        semantics=(PARALLEL, PARALLEL, ARBITRARY),
        name="tgmm",
    )(tile, group, offsets, count, lhs_p, grad_p)
    # A group no visit reaches (empty, past every row) was never written: its gradient is zero.
    out = jnp.where((group_sizes > 0)[:, None, None], out[:, :k, :n], 0)
    return out.astype(out_dtype)


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
