"""Bad input raises CPU's exception class on tpu, never a silent result.

A table of deliberately bad eager calls (wrong dtypes, dims and indices out of range, shape
mismatches, bad out= tensors, bad arguments to factories and random ops), across elementwise,
reductions, indexing, shape, linalg, nn ops, losses and random ops. Each case is a function of the
device; the test runs it on CPU first, and the tpu call must raise the same exception class. A case
CPU accepts is no bad input: the table holds none (test_every_case_is_bad_input_on_cpu).
A compiled subset checks the data-dependent ones under torch.compile(backend="tpu").
"""

from __future__ import annotations

import json
import os
import warnings

import pytest
import torch
from torch.nn import functional as F

from tests.helpers import run_python

TPU = "tpu"


def _r(*shape, dtype=torch.float32, dev="cpu", seed=0):
    """A deterministic tensor: normal floats, or integers in [0, 4)."""
    g = torch.Generator().manual_seed(seed)
    if dtype.is_floating_point or dtype.is_complex:
        return torch.randn(shape, generator=g, dtype=dtype).to(dev)
    if dtype == torch.bool:
        return (torch.randint(0, 2, shape, generator=g) > 0).to(dev)
    return torch.randint(0, 4, shape, generator=g, dtype=dtype).to(dev)


def _t(data, dev, dtype=None):
    return torch.tensor(data, dtype=dtype).to(dev)


CASES: dict[str, object] = {}


def case(name: str, fn) -> None:
    assert name not in CASES, name
    CASES[name] = fn


# ---- elementwise -------------------------------------------------------------------------------

_BINARY = {
    "add": torch.add,
    "sub": torch.sub,
    "mul": torch.mul,
    "div": torch.div,
    "maximum": torch.maximum,
    "minimum": torch.minimum,
    "atan2": torch.atan2,
    "pow": torch.pow,
    "fmod": torch.fmod,
    "remainder": torch.remainder,
    "hypot": torch.hypot,
    "logaddexp": torch.logaddexp,
    "copysign": torch.copysign,
    "eq": torch.eq,
    "lt": torch.lt,
    "ge": torch.ge,
    "fmax": torch.fmax,
    "xlogy": torch.xlogy,
    "nextafter": torch.nextafter,
    "ldexp": torch.ldexp,
}
for _n, _f in _BINARY.items():
    case(f"elementwise/{_n}/shape_mismatch", lambda d, f=_f: f(_r(3, dev=d), _r(4, dev=d)))
    case(f"elementwise/{_n}/shape_mismatch_2d", lambda d, f=_f: f(_r(2, 3, dev=d), _r(3, 2, dev=d)))

_INPLACE = ["add_", "sub_", "mul_", "div_", "pow_", "atan2_", "fmod_", "remainder_", "hypot_", "copysign_"]
for _n in _INPLACE:
    case(f"elementwise/{_n}/complex_scalar_into_float", lambda d, n=_n: getattr(_r(3, dev=d), n)(1j))
    case(
        f"elementwise/{_n}/complex_tensor_into_float",
        lambda d, n=_n: getattr(_r(3, dev=d), n)(_r(3, dtype=torch.complex64, dev=d)),
    )
    case(f"elementwise/{_n}/broadcast_self", lambda d, n=_n: getattr(_r(1, dev=d), n)(_r(3, dev=d)))
for _n in ["add_", "sub_", "mul_", "remainder_", "fmod_"]:
    case(f"elementwise/{_n}/float_scalar_into_int", lambda d, n=_n: getattr(_r(3, dtype=torch.int64, dev=d), n)(1.5))
    case(
        f"elementwise/{_n}/float_tensor_into_int",
        lambda d, n=_n: getattr(_r(3, dtype=torch.int64, dev=d), n)(_r(3, dev=d)),
    )
    case(f"elementwise/{_n}/float_into_bool", lambda d, n=_n: getattr(_r(3, dtype=torch.bool, dev=d), n)(_r(3, dev=d)))

for _n in ["bitwise_and", "bitwise_or", "bitwise_xor", "bitwise_left_shift", "bitwise_right_shift", "gcd", "lcm"]:
    case(f"elementwise/{_n}/float_inputs", lambda d, n=_n: getattr(torch, n)(_r(3, dev=d), _r(3, dev=d)))
case("elementwise/bitwise_not/float", lambda d: torch.bitwise_not(_r(3, dev=d)))
case("elementwise/sub/bool", lambda d: torch.sub(_r(3, dtype=torch.bool, dev=d), _r(3, dtype=torch.bool, dev=d)))
case("elementwise/neg/bool", lambda d: torch.neg(_r(3, dtype=torch.bool, dev=d)))
case("elementwise/clamp/complex", lambda d: torch.clamp(_r(3, dtype=torch.complex64, dev=d), 0, 1))
case("elementwise/floor/complex", lambda d: torch.floor(_r(3, dtype=torch.complex64, dev=d)))
case(
    "elementwise/where/shape_mismatch",
    lambda d: torch.where(_r(3, dtype=torch.bool, dev=d), _r(4, dev=d), _r(3, dev=d)),
)
case("elementwise/where/float_condition", lambda d: torch.where(_r(3, dev=d), _r(3, dev=d), _r(3, dev=d)))
case("elementwise/lerp/weight_shape", lambda d: torch.lerp(_r(3, dev=d), _r(3, dev=d), _r(4, dev=d)))
case(
    "elementwise/lerp/int", lambda d: torch.lerp(_r(3, dtype=torch.int64, dev=d), _r(3, dtype=torch.int64, dev=d), 0.5)
)
case("elementwise/addcmul/shape", lambda d: torch.addcmul(_r(3, dev=d), _r(3, dev=d), _r(4, dev=d)))
case("elementwise/addcdiv/int", lambda d: torch.addcdiv(*(_r(3, dtype=torch.int64, dev=d) for _ in range(3))))
case("elementwise/clamp/no_bounds", lambda d: torch.clamp(_r(3, dev=d)))
case("elementwise/clamp/bound_shape", lambda d: torch.clamp(_r(3, dev=d), _r(4, dev=d)))
case("elementwise/polygamma/negative_n", lambda d: torch.polygamma(-1, _r(3, dev=d)))
case("elementwise/div/bad_rounding_mode", lambda d: torch.div(_r(3, dev=d), _r(3, dev=d), rounding_mode="round"))
for _n in ["floor_divide", "remainder", "fmod"]:
    case(f"elementwise/{_n}/int_zero_divisor", lambda d, n=_n: getattr(torch, n)(_t([4, 5], d), _t([2, 0], d)))
    case(f"elementwise/{_n}/int_zero_scalar", lambda d, n=_n: getattr(torch, n)(_t([4, 5], d), 0))
case("elementwise/div_trunc/int_zero_divisor", lambda d: torch.div(_t([4, 5], d), _t([1, 0], d), rounding_mode="trunc"))
case("elementwise/div_floor/int_zero_divisor", lambda d: torch.div(_t([4, 5], d), _t([1, 0], d), rounding_mode="floor"))
for _n in ["sqrt_", "exp_", "sin_", "sigmoid_", "log_", "tanh_", "reciprocal_", "erf_"]:
    case(f"elementwise/{_n}/int_self", lambda d, n=_n: getattr(_r(3, dtype=torch.int64, dev=d), n)())

# ---- out= -------------------------------------------------------------------------------------

for _n in ["add", "mul", "sub", "div", "atan2", "maximum"]:
    case(
        f"out/{_n}/float_into_int",
        lambda d, n=_n: getattr(torch, n)(_r(3, dev=d), _r(3, dev=d), out=torch.empty(3, dtype=torch.int64, device=d)),
    )
for _n in ["sin", "exp", "sqrt", "neg", "abs"]:
    case(
        f"out/{_n}/float_into_int",
        lambda d, n=_n: getattr(torch, n)(_r(3, dev=d), out=torch.empty(3, dtype=torch.int64, device=d)),
    )
case(
    "out/frexp/mantissa_dtype",
    lambda d: torch.frexp(
        _r(3, dev=d), out=(torch.empty(3, dtype=torch.float64, device=d), torch.empty(3, dtype=torch.int32, device=d))
    ),
)
case(
    "out/frexp/exponent_dtype",
    lambda d: torch.frexp(_r(3, dev=d), out=(torch.empty(3, device=d), torch.empty(3, dtype=torch.int64, device=d))),
)
case(
    "out/mm/dtype",
    lambda d: torch.mm(_r(2, 2, dev=d), _r(2, 2, dev=d), out=torch.empty(2, 2, dtype=torch.int64, device=d)),
)
case(
    "out/cat/float_into_int",
    lambda d: torch.cat([_r(2, dev=d), _r(2, dev=d)], out=torch.empty(4, dtype=torch.int64, device=d)),
)
case(
    "out/add/complex_into_float",
    lambda d: torch.add(_r(3, dtype=torch.complex64, dev=d), 1, out=torch.empty(3, device=d)),
)

# ---- reductions and dims ----------------------------------------------------------------------

_DIM_OPS = {
    "sum": lambda x, k: torch.sum(x, k),
    "mean": lambda x, k: torch.mean(x, k),
    "prod": lambda x, k: torch.prod(x, k),
    "amax": lambda x, k: torch.amax(x, k),
    "amin": lambda x, k: torch.amin(x, k),
    "argmax": lambda x, k: torch.argmax(x, k),
    "argmin": lambda x, k: torch.argmin(x, k),
    "max_dim": lambda x, k: torch.max(x, k),
    "min_dim": lambda x, k: torch.min(x, k),
    "std": lambda x, k: torch.std(x, k),
    "var": lambda x, k: torch.var(x, k),
    "logsumexp": lambda x, k: torch.logsumexp(x, k),
    "cumsum": lambda x, k: torch.cumsum(x, k),
    "cumprod": lambda x, k: torch.cumprod(x, k),
    "cummax": lambda x, k: torch.cummax(x, k),
    "cummin": lambda x, k: torch.cummin(x, k),
    "logcumsumexp": lambda x, k: torch.logcumsumexp(x, k),
    "softmax": lambda x, k: torch.softmax(x, k),
    "log_softmax": lambda x, k: torch.log_softmax(x, k),
    "median": lambda x, k: torch.median(x, k),
    "nanmedian": lambda x, k: torch.nanmedian(x, k),
    "mode": lambda x, k: torch.mode(x, k),
    "kthvalue": lambda x, k: torch.kthvalue(x, 1, k),
    "norm": lambda x, k: torch.norm(x, dim=k),
    "all": lambda x, k: torch.all(x, k),
    "any": lambda x, k: torch.any(x, k),
    "nansum": lambda x, k: torch.nansum(x, k),
    "count_nonzero": lambda x, k: torch.count_nonzero(x, k),
    "sort": lambda x, k: torch.sort(x, k),
    "argsort": lambda x, k: torch.argsort(x, dim=k),
    "topk": lambda x, k: torch.topk(x, 1, k),
    "flip": lambda x, k: torch.flip(x, (k,)),
    "unbind": lambda x, k: torch.unbind(x, k),
    "aminmax": lambda x, k: torch.aminmax(x, dim=k),
    "var_mean": lambda x, k: torch.var_mean(x, k),
    "std_mean": lambda x, k: torch.std_mean(x, k),
    "diff": lambda x, k: torch.diff(x, dim=k),
    "cross": lambda x, k: torch.cross(x, x, dim=k),
    "renorm": lambda x, k: torch.renorm(x, 2, k, 1.0),
    "glu": lambda x, k: F.glu(x, k),
}
for _n, _f in _DIM_OPS.items():
    case(f"reduction/{_n}/dim_too_large", lambda d, f=_f: f(_r(2, 3, dev=d), 2))
    case(f"reduction/{_n}/dim_too_negative", lambda d, f=_f: f(_r(2, 3, dev=d), -3))
case("reduction/sort/1d_dim_1", lambda d: torch.sort(_r(3, dev=d), dim=1))
case("reduction/sort/0d_dim_1", lambda d: torch.sort(_r(dev=d), dim=1))
for _n in ["mean", "std", "var", "nanmean"]:
    case(f"reduction/{_n}/int_input", lambda d, n=_n: getattr(torch, n)(_r(2, 3, dtype=torch.int64, dev=d), 0))
for _n in ["softmax", "log_softmax"]:
    case(f"reduction/{_n}/int_last_dim", lambda d, n=_n: getattr(torch, n)(_r(2, 3, dtype=torch.int64, dev=d), 1))
    case(f"reduction/{_n}/int_first_dim", lambda d, n=_n: getattr(torch, n)(_r(2, 3, dtype=torch.int64, dev=d), 0))
case("reduction/max/empty", lambda d: torch.max(torch.empty(0, device=d)))
case("reduction/unique/dim_out_of_range", lambda d: torch.unique(_t([1, 2, 3], d), dim=3))
case("reduction/unique/0d_dim", lambda d: torch.unique(_t(5, d), dim=0))
case("reduction/unique_consecutive/dim_out_of_range", lambda d: torch.unique_consecutive(_r(2, 2, dev=d), dim=-3))
case("reduction/amax/empty_dim", lambda d: torch.amax(torch.empty(0, 3, device=d), 0))
case("reduction/argmax/empty", lambda d: torch.argmax(torch.empty(0, device=d)))
case("reduction/kthvalue/k_too_large", lambda d: torch.kthvalue(_r(3, dev=d), 4))
case("reduction/topk/k_too_large", lambda d: torch.topk(_r(3, dev=d), 4))
case("reduction/sum/repeated_dim", lambda d: torch.sum(_r(2, 3, dev=d), (0, 0)))
case("reduction/max/complex", lambda d: torch.max(_r(3, dtype=torch.complex64, dev=d)))
case("reduction/sort/complex", lambda d: torch.sort(_r(3, dtype=torch.complex64, dev=d)))
case("reduction/quantile/q_out_of_range", lambda d: torch.quantile(_r(3, dev=d), 1.5))
case("reduction/histc/min_gt_max", lambda d: torch.histc(_r(3, dev=d), min=2, max=1))
case("reduction/bincount/negative", lambda d: torch.bincount(_t([1, -1], d)))
case("reduction/bincount/float", lambda d: torch.bincount(_r(3, dev=d)))

# ---- indexing ---------------------------------------------------------------------------------

_INDEXING = {
    "index_select": lambda x, i, d: torch.index_select(x, 0, i),
    "gather": lambda x, i, d: torch.gather(x, 0, i.reshape(-1, 1).expand(-1, 3)),
    "scatter": lambda x, i, d: x.clone().scatter_(0, i.reshape(-1, 1).expand(-1, 3), 1.0),
    "scatter_add": lambda x, i, d: x.scatter_add(0, i.reshape(-1, 1).expand(-1, 3), torch.ones(len(i), 3, device=d)),
    "scatter_reduce": lambda x, i, d: x.scatter_reduce(
        0, i.reshape(-1, 1).expand(-1, 3), torch.ones(len(i), 3, device=d), "amax"
    ),
    "index_add": lambda x, i, d: x.index_add(0, i, torch.ones(len(i), 3, device=d)),
    "index_copy": lambda x, i, d: x.index_copy(0, i, torch.ones(len(i), 3, device=d)),
    "index_fill": lambda x, i, d: x.index_fill(0, i, 1.0),
    "index_reduce": lambda x, i, d: x.index_reduce(0, i, torch.ones(len(i), 3, device=d), "prod"),
    "take": lambda x, i, d: torch.take(x, i * 3),
    "put": lambda x, i, d: x.clone().put_(i * 3, torch.ones(len(i), device=d)),
    "getitem": lambda x, i, d: x[i],
    "setitem": lambda x, i, d: x.clone().__setitem__(i, 1.0),
    "index_put": lambda x, i, d: x.index_put((i,), torch.tensor(1.0, device=d)),
    "embedding": lambda x, i, d: F.embedding(i, x),
    "embedding_bag": lambda x, i, d: F.embedding_bag(i, x, torch.tensor([0], device=d)),
    "embedding_bag_mean": lambda x, i, d: F.embedding_bag(i, x, torch.tensor([0], device=d), mode="mean"),
    "embedding_bag_max": lambda x, i, d: F.embedding_bag(i, x, torch.tensor([0], device=d), mode="max"),
}
for _n, _f in _INDEXING.items():
    case(f"indexing/{_n}/index_too_large", lambda d, f=_f: f(_r(5, 3, dev=d), _t([1, 9], d), d))
    case(f"indexing/{_n}/index_too_negative", lambda d, f=_f: f(_r(5, 3, dev=d), _t([1, -9], d), d))
for _n in ["index_select", "index_add", "index_copy", "index_fill", "gather"]:
    case(f"indexing/{_n}/float_index", lambda d, n=_n: _INDEXING[n](_r(5, 3, dev=d), _t([1.0, 2.0], d), d))
case(
    "indexing/embedding_bag/offsets_past_input",
    lambda d: F.embedding_bag(_t([0, 1, 2], d), _r(5, 2, dev=d), _t([0, 5], d)),
)
case(
    "indexing/embedding_bag/first_offset_not_zero",
    lambda d: F.embedding_bag(_t([0, 1, 2], d), _r(5, 2, dev=d), _t([1, 2], d)),
)
case(
    "indexing/embedding_bag/last_offset_past_input",
    lambda d: F.embedding_bag(_t([0, 1, 2], d), _r(5, 2, dev=d), _t([0, 4], d), include_last_offset=True),
)
case("indexing/index_select/dim_out_of_range", lambda d: torch.index_select(_r(5, 3, dev=d), 2, _t([0], d)))
case("indexing/index_select/2d_index", lambda d: torch.index_select(_r(5, 3, dev=d), 0, _t([[0]], d)))
case("indexing/gather/index_rank", lambda d: torch.gather(_r(5, 3, dev=d), 0, _t([0], d)))
case("indexing/index_fill/complex_scalar_into_float", lambda d: _r(5, 3, dev=d).index_fill_(1, _t([0], d), 1 + 1j))
case("indexing/index_add/source_shape", lambda d: _r(5, 3, dev=d).index_add(0, _t([0, 1], d), _r(2, 4, dev=d)))
case(
    "indexing/index_copy/source_dtype",
    lambda d: _r(5, 3, dev=d).index_copy(0, _t([0], d), _r(1, 3, dtype=torch.float64, dev=d)),
)
case(
    "indexing/scatter/src_dtype",
    lambda d: _r(5, 3, dev=d).scatter(0, _t([[0, 1, 2]], d), _r(1, 3, dtype=torch.float64, dev=d)),
)
case("indexing/masked_fill/mask_dtype", lambda d: _r(3, dev=d).masked_fill(_t([1, 0, 1], d), 1.0))
case("indexing/masked_fill/mask_shape", lambda d: _r(3, dev=d).masked_fill(_r(4, dtype=torch.bool, dev=d), 1.0))
case("indexing/masked_select/mask_shape", lambda d: torch.masked_select(_r(3, dev=d), _r(4, dtype=torch.bool, dev=d)))
case("indexing/getitem/bool_mask_shape", lambda d: _r(3, dev=d)[_r(4, dtype=torch.bool, dev=d)])
case("indexing/getitem/too_many_indices", lambda d: _r(3, dev=d)[0, 0])
case("indexing/getitem/int_out_of_range", lambda d: _r(3, dev=d)[5])
case("indexing/getitem/float_index", lambda d: _r(3, dev=d)[_t([0.0], d)])
case(
    "indexing/searchsorted/sorter_too_large",
    lambda d: torch.searchsorted(_t([1.0, 2, 3], d), _t([2.0], d), sorter=_t([0, 1, 7], d)),
)
case(
    "indexing/searchsorted/sorter_negative",
    lambda d: torch.searchsorted(_t([1.0, 2, 3], d), _t([2.0], d), sorter=_t([0, 1, -1], d)),
)
case(
    "indexing/searchsorted/sorter_shape",
    lambda d: torch.searchsorted(_t([1.0, 2, 3], d), _t([2.0], d), sorter=_t([0, 1], d)),
)
case("indexing/searchsorted/bad_side", lambda d: torch.searchsorted(_t([1.0, 2, 3], d), _t([2.0], d), side="middle"))
case("indexing/searchsorted/rank_mismatch", lambda d: torch.searchsorted(_r(2, 3, dev=d), _r(3, dev=d)))
case(
    "indexing/take_along_dim/shape",
    lambda d: torch.take_along_dim(_r(5, 3, dev=d), _t([[0, 1]], d).expand(2, 2).T.reshape(2, 2, 1), 0),
)
case("indexing/one_hot/negative", lambda d: F.one_hot(_t([1, -1], d), 3))
case("indexing/one_hot/too_large", lambda d: F.one_hot(_t([1, 3], d), 3))
case("indexing/one_hot/float", lambda d: F.one_hot(_t([1.0], d), 3))
case(
    "indexing/max_unpool2d/index_too_large",
    lambda d: F.max_unpool2d(_r(1, 1, 2, 2, dev=d), _t([[[[0, 1], [2, 99]]]], d), 2),
)
case(
    "indexing/max_unpool2d/index_negative",
    lambda d: F.max_unpool2d(_r(1, 1, 2, 2, dev=d), _t([[[[0, 1], [2, -1]]]], d), 2),
)
case(
    "indexing/max_unpool3d/index_too_large",
    lambda d: F.max_unpool3d(_r(1, 1, 1, 2, 2, dev=d), _t([[[[[0, 1], [2, 99]]]]], d), 2),
)

# ---- shape ------------------------------------------------------------------------------------

_SHAPE = {
    "reshape_numel": lambda x: x.reshape(4, 2),
    "reshape_two_minus_one": lambda x: x.reshape(-1, -1),
    "view_numel": lambda x: x.view(7),
    "view_non_contiguous": lambda x: x.t().view(6),
    "expand_bad": lambda x: x.expand(3, 3),
    "expand_fewer_dims": lambda x: x.expand(3),
    "permute_repeat": lambda x: x.permute(0, 0),
    "permute_count": lambda x: x.permute(0),
    "transpose_dim": lambda x: x.transpose(0, 2),
    "squeeze_dim": lambda x: x.squeeze(3),
    "unsqueeze_dim": lambda x: x.unsqueeze(4),
    "narrow_range": lambda x: x.narrow(1, 2, 2),
    "narrow_dim": lambda x: x.narrow(2, 0, 1),
    "select_range": lambda x: x.select(0, 2),
    "select_dim": lambda x: x.select(2, 0),
    "split_dim": lambda x: x.split(1, 2),
    "chunk_zero": lambda x: x.chunk(0),
    "repeat_fewer": lambda x: x.repeat(2),
    "flatten_order": lambda x: x.flatten(1, 0),
    "movedim_repeat": lambda x: torch.movedim(x, (0, 1), (0, 0)),
    "roll_dims_mismatch": lambda x: torch.roll(x, (1, 2), (0,)),
    "diagonal_same_dims": lambda x: torch.diagonal(x, 0, 0, 0),
    "tril_1d": lambda x: torch.tril(x[0]),
    "triu_1d": lambda x: torch.triu(x[0]),
    "unfold_size": lambda x: x.unfold(1, 4, 1),
    "unfold_step": lambda x: x.unfold(1, 2, 0),
    "tensor_split_dim": lambda x: torch.tensor_split(x, 2, 2),
    "unflatten_sizes": lambda x: x.unflatten(1, (2, 2)),
    "t_3d": lambda x: x.reshape(1, 2, 3).t(),
    "diag_3d": lambda x: torch.diag(x.reshape(1, 2, 3)),
    "diag_embed_dims": lambda x: torch.diag_embed(x, 0, 0, 0),
    "tile_negative": lambda x: x.tile(-1),
    "repeat_interleave_dim": lambda x: x.repeat_interleave(2, 3),
    "swapaxes_dim": lambda x: x.swapaxes(0, 5),
    "split_sizes_sum": lambda x: x.split([1, 1], 1),
    "view_dtype_size": lambda x: x[:, :1].view(torch.float64),
    "as_strided_negative": lambda x: x.as_strided((2,), (-1,)),
    "index_dim": lambda x: x.index_select(-3, torch.zeros(1, dtype=torch.long, device=x.device)),
}
for _n, _f in _SHAPE.items():
    case(f"shape/{_n}", lambda d, f=_f: f(_r(2, 3, dev=d)))
case("shape/cat/mismatch", lambda d: torch.cat([_r(2, 3, dev=d), _r(2, 4, dev=d)]))
case("shape/cat/rank_mismatch", lambda d: torch.cat([_r(2, 3, dev=d), _r(3, dev=d)]))
case("shape/cat/dim", lambda d: torch.cat([_r(2, 3, dev=d), _r(2, 3, dev=d)], 2))
case("shape/cat/empty_list", lambda d: torch.cat([]))
case("shape/stack/mismatch", lambda d: torch.stack([_r(2, dev=d), _r(3, dev=d)]))
case("shape/stack/dim", lambda d: torch.stack([_r(2, dev=d), _r(2, dev=d)], 3))
case("shape/hstack/mismatch", lambda d: torch.hstack([_r(2, 3, dev=d), _r(3, 3, dev=d)]))
case("shape/broadcast_to/bad", lambda d: torch.broadcast_to(_r(3, dev=d), (2, 4)))
case("shape/broadcast_tensors/bad", lambda d: torch.broadcast_tensors(_r(3, dev=d), _r(4, dev=d)))
case("shape/pad/reflect_too_big", lambda d: F.pad(_r(1, 2, 3, dev=d), (3, 3), mode="reflect"))
case("shape/pad/odd_length", lambda d: F.pad(_r(1, 2, 3, dev=d), (1,)))
case("shape/pixel_shuffle/channels", lambda d: F.pixel_shuffle(_r(1, 3, 2, 2, dev=d), 2))
case("shape/pixel_unshuffle/size", lambda d: F.pixel_unshuffle(_r(1, 1, 3, 3, dev=d), 2))
case("shape/copy_/shape", lambda d: _r(3, dev=d).copy_(_r(4, dev=d)))
case("shape/resize_as_/negative", lambda d: _r(3, dev=d).resize_(-1))
case("shape/meshgrid/2d", lambda d: torch.meshgrid(_r(2, 2, dev=d), indexing="ij"))

# ---- linalg -----------------------------------------------------------------------------------

_LINALG = {
    "mm/shape": lambda d: torch.mm(_r(2, 3, dev=d), _r(2, 3, dev=d)),
    "mm/int_float": lambda d: torch.mm(_r(2, 2, dtype=torch.int64, dev=d), _r(2, 2, dev=d)),
    "mm/float_double": lambda d: torch.mm(_r(2, 2, dev=d), _r(2, 2, dtype=torch.float64, dev=d)),
    "mm/1d": lambda d: torch.mm(_r(2, dev=d), _r(2, 2, dev=d)),
    "bmm/2d": lambda d: torch.bmm(_r(2, 2, dev=d), _r(2, 2, dev=d)),
    "bmm/batch": lambda d: torch.bmm(_r(2, 2, 2, dev=d), _r(3, 2, 2, dev=d)),
    "bmm/int_float": lambda d: torch.bmm(_r(1, 2, 2, dtype=torch.int64, dev=d), _r(1, 2, 2, dev=d)),
    "addmm/shape": lambda d: torch.addmm(_r(3, 3, dev=d), _r(2, 2, dev=d), _r(2, 2, dev=d)),
    "addmm/self_dtype": lambda d: torch.addmm(_r(2, 2, dtype=torch.float64, dev=d), _r(2, 2, dev=d), _r(2, 2, dev=d)),
    "addmm/mat_dtype": lambda d: torch.addmm(_r(2, 2, dev=d), _r(2, 2, dtype=torch.float64, dev=d), _r(2, 2, dev=d)),
    "baddbmm/shape": lambda d: torch.baddbmm(_r(1, 2, 2, dev=d), _r(1, 2, 3, dev=d), _r(1, 2, 2, dev=d)),
    "matmul/shape": lambda d: torch.matmul(_r(2, 3, dev=d), _r(2, 3, dev=d)),
    "matmul/0d": lambda d: torch.matmul(_r(dev=d), _r(2, dev=d)),
    "matmul/int_float": lambda d: torch.matmul(_r(2, 2, dtype=torch.int64, dev=d), _r(2, 2, dev=d)),
    "matmul/batched_int_float": lambda d: torch.matmul(_r(2, 2, 2, dtype=torch.int64, dev=d), _r(2, 2, dev=d)),
    "dot/length": lambda d: torch.dot(_r(2, dev=d), _r(3, dev=d)),
    "dot/dtype": lambda d: torch.dot(_r(2, dev=d), _r(2, dtype=torch.float64, dev=d)),
    "dot/2d": lambda d: torch.dot(_r(2, 2, dev=d), _r(2, 2, dev=d)),
    "mv/shape": lambda d: torch.mv(_r(2, 3, dev=d), _r(2, dev=d)),
    "vdot/length": lambda d: torch.vdot(_r(2, dev=d), _r(3, dev=d)),
    "inverse/non_square": lambda d: torch.linalg.inv(_r(2, 3, dev=d)),
    "det/non_square": lambda d: torch.linalg.det(_r(2, 3, dev=d)),
    "cholesky/non_square": lambda d: torch.linalg.cholesky(_r(2, 3, dev=d)),
    "solve/shape": lambda d: torch.linalg.solve(_r(2, 2, dev=d), _r(3, dev=d)),
    "inv/int": lambda d: torch.linalg.inv(_r(2, 2, dtype=torch.int64, dev=d)),
    "cross/size_2": lambda d: torch.linalg.cross(_r(2, dev=d), _r(2, dev=d)),
    "cross/shape": lambda d: torch.linalg.cross(_r(3, dev=d), _r(2, 3, dev=d)[:, :2]),
    "norm/bad_ord": lambda d: torch.linalg.matrix_norm(_r(2, 2, dev=d), ord=3),
    "vector_norm/int": lambda d: torch.linalg.vector_norm(_r(3, dtype=torch.int64, dev=d)),
    "qr/bad_mode": lambda d: torch.linalg.qr(_r(2, 2, dev=d), mode="bad"),
    "outer/2d": lambda d: torch.outer(_r(2, 2, dev=d), _r(2, dev=d)),
    "einsum/bad_equation": lambda d: torch.einsum("ij,jk->ik", _r(2, 3, dev=d), _r(2, 3, dev=d)),
    "tensordot/dims": lambda d: torch.tensordot(_r(2, 3, dev=d), _r(2, 3, dev=d), dims=([1], [1, 0])),
    "trace/1d": lambda d: torch.trace(_r(3, dev=d)),
    "kron/none": lambda d: torch.kron(_r(2, dev=d), None),
    "linear/shape": lambda d: F.linear(_r(2, 3, dev=d), _r(4, 2, dev=d)),
    "linear/bias_shape": lambda d: F.linear(_r(2, 3, dev=d), _r(4, 3, dev=d), _r(5, dev=d)),
    "linear/dtype": lambda d: F.linear(_r(2, 3, dev=d), _r(4, 3, dtype=torch.float64, dev=d)),
}
for _n, _f in _LINALG.items():
    case(f"linalg/{_n}", _f)

# ---- nn ops -----------------------------------------------------------------------------------

_NN = {
    "conv2d/channels": lambda d: F.conv2d(_r(1, 3, 5, 5, dev=d), _r(2, 4, 3, 3, dev=d)),
    "conv2d/weight_rank": lambda d: F.conv2d(_r(1, 3, 5, 5, dev=d), _r(2, 3, 3, dev=d)),
    "conv2d/kernel_too_big": lambda d: F.conv2d(_r(1, 1, 2, 2, dev=d), _r(1, 1, 3, 3, dev=d)),
    "conv2d/groups": lambda d: F.conv2d(_r(1, 3, 5, 5, dev=d), _r(2, 1, 3, 3, dev=d), groups=2),
    "conv2d/stride_zero": lambda d: F.conv2d(_r(1, 1, 5, 5, dev=d), _r(1, 1, 3, 3, dev=d), stride=0),
    "conv2d/dtype": lambda d: F.conv2d(_r(1, 1, 5, 5, dev=d), _r(1, 1, 3, 3, dtype=torch.float64, dev=d)),
    "conv2d/bias_shape": lambda d: F.conv2d(_r(1, 1, 5, 5, dev=d), _r(2, 1, 3, 3, dev=d), _r(3, dev=d)),
    "conv1d/channels": lambda d: F.conv1d(_r(1, 3, 5, dev=d), _r(2, 4, 3, dev=d)),
    "conv_transpose2d/channels": lambda d: F.conv_transpose2d(_r(1, 3, 5, 5, dev=d), _r(4, 2, 3, 3, dev=d)),
    "layer_norm/shape": lambda d: F.layer_norm(_r(2, 3, dev=d), (4,)),
    "layer_norm/weight_shape": lambda d: F.layer_norm(_r(2, 3, dev=d), (3,), _r(4, dev=d)),
    "group_norm/groups": lambda d: F.group_norm(_r(2, 6, 3, dev=d), 4),
    "batch_norm/running_size": lambda d: F.batch_norm(_r(2, 3, dev=d), _r(4, dev=d), _r(4, dev=d).abs()),
    "batch_norm/one_value_train": lambda d: F.batch_norm(_r(1, 3, dev=d), None, None, training=True),
    "instance_norm/running": lambda d: F.instance_norm(_r(2, 3, 4, dev=d), _r(4, dev=d), _r(4, dev=d).abs()),
    "max_pool2d/kernel_too_big": lambda d: F.max_pool2d(_r(1, 1, 2, 2, dev=d), 3),
    "max_pool2d/pad_too_big": lambda d: F.max_pool2d(_r(1, 1, 4, 4, dev=d), 2, padding=2),
    "max_pool2d/stride_zero": lambda d: F.max_pool2d(_r(1, 1, 4, 4, dev=d), 2, stride=0),
    "avg_pool2d/pad_too_big": lambda d: F.avg_pool2d(_r(1, 1, 4, 4, dev=d), 2, padding=2),
    "avg_pool2d/kernel_too_big": lambda d: F.avg_pool2d(_r(1, 1, 2, 2, dev=d), 3),
    "max_pool1d/2d_input_kernel": lambda d: F.max_pool1d(_r(1, 1, 2, dev=d), 3),
    "adaptive_avg_pool2d/rank": lambda d: F.adaptive_avg_pool2d(_r(3, dev=d), 2),
    "interpolate/both_size_scale": lambda d: F.interpolate(_r(1, 1, 4, dev=d), size=2, scale_factor=2.0),
    "interpolate/bad_mode_rank": lambda d: F.interpolate(_r(1, 1, 4, dev=d), size=2, mode="bilinear"),
    "dropout/p": lambda d: F.dropout(_r(3, dev=d), p=1.5),
    "embedding/float_indices": lambda d: F.embedding(_t([0.0], d), _r(3, 2, dev=d)),
    "softmax/int": lambda d: F.softmax(_r(3, dtype=torch.int64, dev=d), 0),
    "gelu/bad_approximate": lambda d: F.gelu(_r(3, dev=d), approximate="bad"),
    "prelu/weight_size": lambda d: F.prelu(_r(1, 3, 2, dev=d), _r(2, dev=d)),
    "grid_sample/rank": lambda d: F.grid_sample(_r(1, 1, 4, 4, dev=d), _r(1, 2, 2, 3, dev=d), align_corners=False),
    "unfold/rank": lambda d: F.unfold(_r(2, 3, dev=d), 2),
    "sdpa/shape": lambda d: F.scaled_dot_product_attention(_r(1, 2, 4, dev=d), _r(1, 2, 5, dev=d), _r(1, 2, 5, dev=d)),
    "sdpa/dtype": lambda d: F.scaled_dot_product_attention(
        _r(1, 2, 4, dev=d), _r(1, 2, 4, dtype=torch.float64, dev=d), _r(1, 2, 4, dev=d)
    ),
    "cosine_similarity/shape": lambda d: F.cosine_similarity(_r(2, 3, dev=d), _r(2, 4, dev=d)),
    "pairwise_distance/shape": lambda d: F.pairwise_distance(_r(2, 3, dev=d), _r(2, 4, dev=d)),
    "normalize/dim": lambda d: F.normalize(_r(2, 3, dev=d), dim=3),
    "threshold/complex": lambda d: F.threshold(_r(3, dtype=torch.complex64, dev=d), 0.0, 0.0),
    "relu/bool": lambda d: F.relu(_r(3, dtype=torch.bool, dev=d)),
    "hardtanh/min_gt_max": lambda d: F.hardtanh(_r(3, dev=d), 1.0, -1.0),
    "rrelu/bad_bounds": lambda d: F.rrelu(_r(3, dev=d), 0.5, 0.1, training=True),
}
for _n, _f in _NN.items():
    case(f"nn/{_n}", _f)

# ---- losses -----------------------------------------------------------------------------------

_LOSSES = {
    "cross_entropy/target_too_large": lambda d: F.cross_entropy(_r(4, 5, dev=d), _t([0, 5, 2, 1], d)),
    "cross_entropy/target_negative": lambda d: F.cross_entropy(_r(4, 5, dev=d), _t([0, -2, 2, 1], d)),
    "cross_entropy/target_shape": lambda d: F.cross_entropy(_r(4, 5, dev=d), _t([0, 1], d)),
    "cross_entropy/target_float_shape": lambda d: F.cross_entropy(_r(4, 5, dev=d), _r(4, 4, dev=d)),
    "cross_entropy/weight_size": lambda d: F.cross_entropy(_r(4, 5, dev=d), _t([0, 1, 2, 1], d), weight=_r(4, dev=d)),
    "cross_entropy/2d_target_too_large": lambda d: F.cross_entropy(_r(1, 3, 2, 2, dev=d), _t([[[0, 3], [1, 2]]], d)),
    "nll_loss/target_too_large": lambda d: F.nll_loss(_r(4, 5, dev=d), _t([0, 5, 2, 1], d)),
    "nll_loss/target_negative": lambda d: F.nll_loss(_r(4, 5, dev=d), _t([0, -2, 2, 1], d)),
    "nll_loss/target_float": lambda d: F.nll_loss(_r(4, 5, dev=d), _r(4, dev=d)),
    "nll_loss/target_shape": lambda d: F.nll_loss(_r(4, 5, dev=d), _t([0, 1], d)),
    "nll_loss2d/target_too_large": lambda d: F.nll_loss(_r(1, 3, 2, 2, dev=d), _t([[[0, 3], [1, 2]]], d)),
    "cross_entropy/target_int32": lambda d: F.cross_entropy(torch.ones(3, 5).to(d), _t([0, 1, 2], d, torch.int32)),
    "nll_loss2d/target_int32": lambda d: F.nll_loss(_r(1, 3, 2, 2, dev=d), _t([[[0, 1], [1, 2]]], d, torch.int32)),
    "nll_loss2d/target_uint8": lambda d: F.nll_loss(_r(1, 3, 2, 2, dev=d), _t([[[0, 1], [1, 2]]], d, torch.uint8)),
    "binary_cross_entropy/input_above_one": lambda d: F.binary_cross_entropy(_t([0.5, 1.5], d), _t([0.0, 1.0], d)),
    "binary_cross_entropy/input_negative": lambda d: F.binary_cross_entropy(_t([-0.5, 0.5], d), _t([0.0, 1.0], d)),
    "binary_cross_entropy/input_nan": lambda d: F.binary_cross_entropy(_t([0.5, float("nan")], d), _t([0.0, 1.0], d)),
    "binary_cross_entropy/target_above_one": lambda d: F.binary_cross_entropy(_t([0.5, 0.5], d), _t([0.0, 2.0], d)),
    "binary_cross_entropy/target_shape": lambda d: F.binary_cross_entropy(torch.rand(3).to(d), torch.rand(4).to(d)),
    "binary_cross_entropy/bad_reduction": lambda d: F.binary_cross_entropy(
        torch.rand(3).to(d), torch.rand(3).to(d), reduction="bad"
    ),
    "bce_with_logits/shape": lambda d: F.binary_cross_entropy_with_logits(_r(3, dev=d), _r(4, dev=d)),
    "mse_loss/bad_reduction": lambda d: F.mse_loss(_r(3, dev=d), _r(3, dev=d), reduction="bad"),
    "l1_loss/shape": lambda d: F.l1_loss(_r(3, dev=d), _r(2, 3, dev=d)[:, :2]),
    "smooth_l1/negative_beta": lambda d: F.smooth_l1_loss(_r(3, dev=d), _r(3, dev=d), beta=-1.0),
    "huber/negative_delta": lambda d: F.huber_loss(_r(3, dev=d), _r(3, dev=d), delta=-1.0),
    "kl_div/shape": lambda d: F.kl_div(_r(3, dev=d), _r(4, dev=d)),
    "margin_ranking/shape": lambda d: F.margin_ranking_loss(_r(3, dev=d), _r(4, dev=d), _r(3, dev=d)),
    "multi_margin/target_too_large": lambda d: F.multi_margin_loss(_r(2, 3, dev=d), _t([0, 3], d)),
    "multilabel_margin/shape": lambda d: F.multilabel_margin_loss(_r(2, 3, dev=d), _t([[0, 1]], d)),
    "cosine_embedding/shape": lambda d: F.cosine_embedding_loss(_r(2, 3, dev=d), _r(2, 4, dev=d), _t([1, -1], d)),
    "poisson_nll/bad_reduction": lambda d: F.poisson_nll_loss(_r(3, dev=d), _r(3, dev=d), reduction="bad"),
    "gaussian_nll/var_shape": lambda d: F.gaussian_nll_loss(_r(2, 3, dev=d), _r(2, 3, dev=d), _r(3, 2, dev=d).abs()),
    "gaussian_nll/negative_var": lambda d: F.gaussian_nll_loss(_r(3, dev=d), _r(3, dev=d), -torch.ones(3).to(d)),
    "triplet_margin/shape": lambda d: F.triplet_margin_loss(_r(2, 3, dev=d), _r(2, 3, dev=d), _r(2, 4, dev=d)),
}
for _n, _f in _LOSSES.items():
    case(f"loss/{_n}", _f)

# ---- factories and random ops -----------------------------------------------------------------

_RANDOM = {
    "randint/low_equals_high": lambda d: torch.randint(5, 5, (3,), device=d),
    "randint/low_above_high": lambda d: torch.randint(5, 2, (3,), device=d),
    "randint/high_zero": lambda d: torch.randint(0, (3,), device=d),
    "random_/from_equals_to": lambda d: torch.zeros(3, dtype=torch.int64, device=d).random_(5, 5),
    "random_/to_zero": lambda d: torch.zeros(3, device=d).random_(0),
    "random_/from_above_to": lambda d: torch.zeros(3, device=d).random_(5, 2),
    "multinomial/nan": lambda d: torch.multinomial(_t([0.5, float("nan")], d), 1),
    "multinomial/inf": lambda d: torch.multinomial(_t([0.5, float("inf")], d), 1),
    "multinomial/negative": lambda d: torch.multinomial(_t([0.5, -1.0], d), 1),
    "multinomial/all_zero": lambda d: torch.multinomial(_t([0.0, 0.0], d), 1),
    "multinomial/row_all_zero": lambda d: torch.multinomial(_t([[0.5, 1.0], [0.0, 0.0]], d), 1),
    "multinomial/negative_replacement": lambda d: torch.multinomial(_t([0.5, -1.0], d), 2, replacement=True),
    "multinomial/too_many_samples": lambda d: torch.multinomial(_t([0.5, 0.5], d), 3),
    "multinomial/int": lambda d: torch.multinomial(_t([1, 2], d), 1),
    "multinomial/3d": lambda d: torch.multinomial(_r(2, 2, 2, dev=d).abs(), 1),
    "multinomial/zero_samples_ok_negative": lambda d: torch.multinomial(_t([0.5, 0.5], d), -1),
    # valid probabilities: the argument checks must not depend on the data checks
    "multinomial/zero_samples": lambda d: torch.multinomial(_t([0.5, 0.5], d), 0),
    "multinomial/float_out": lambda d: torch.multinomial(
        _t([0.5, 0.5], d), 1, out=torch.empty(1, dtype=torch.float64, device=d)
    ),
    "bernoulli/p_above_one": lambda d: torch.bernoulli(torch.zeros(3, device=d), p=1.5),
    "bernoulli/p_negative": lambda d: torch.bernoulli(torch.zeros(3, device=d), p=-0.5),
    "bernoulli/tensor_p": lambda d: torch.bernoulli(_t([1.5, 0.5], d)),
    "bernoulli/tensor_p_negative": lambda d: torch.bernoulli(_t([-0.5, 0.5], d)),
    "bernoulli_/tensor_p": lambda d: torch.zeros(2, device=d).bernoulli_(_t([1.5, 0.5], d)),
    "bernoulli_/float_p": lambda d: torch.zeros(2, device=d).bernoulli_(2.0),
    "normal/negative_std": lambda d: torch.normal(torch.zeros(3, device=d), -1.0),
    "normal/negative_std_tensor": lambda d: torch.normal(torch.zeros(3, device=d), _t([-1.0, 1, 1], d)),
    "normal/float_mean_std_tensor": lambda d: torch.normal(0.0, _t([-1.0, 1, 1], d)),
    "normal_/negative_std": lambda d: torch.zeros(3, device=d).normal_(0, -1),
    "normal/size_negative_std": lambda d: torch.normal(0.0, -1.0, (3,), device=d),
    "uniform_/from_above_to": lambda d: torch.zeros(3, device=d).uniform_(5, 2),
    "uniform_/int": lambda d: torch.zeros(3, dtype=torch.int64, device=d).uniform_(),
    "exponential_/negative": lambda d: torch.zeros(3, device=d).exponential_(-1.0),
    "geometric_/p_zero": lambda d: torch.zeros(3, device=d).geometric_(0.0),
    "geometric_/p_above_one": lambda d: torch.zeros(3, device=d).geometric_(1.5),
    "log_normal_/negative_std": lambda d: torch.zeros(3, device=d).log_normal_(0.0, -1.0),
    "cauchy_/negative_sigma": lambda d: torch.zeros(3, device=d).cauchy_(0.0, -1.0),
    "randperm/negative": lambda d: torch.randperm(-1, device=d),
    "randperm/bool": lambda d: torch.randperm(3, dtype=torch.bool, device=d),
    "rand/int_dtype": lambda d: torch.rand(3, dtype=torch.int64, device=d),
    "randn/int_dtype": lambda d: torch.randn(3, dtype=torch.int64, device=d),
    "rand/negative_size": lambda d: torch.rand(-1, device=d),
    "randint_like/low_above_high": lambda d: torch.randint_like(torch.zeros(3, device=d), 5, 2),
    "empty/negative": lambda d: torch.empty(-1, device=d),
    "zeros/negative": lambda d: torch.zeros(2, -1, device=d),
    "ones/negative": lambda d: torch.ones(-2, device=d),
    "full/negative": lambda d: torch.full((-1,), 1.0, device=d),
    "full/complex_into_float": lambda d: torch.full((2,), 1j, dtype=torch.float32, device=d),
    "arange/wrong_sign_step": lambda d: torch.arange(0, 10, -1, device=d),
    "arange/zero_step": lambda d: torch.arange(0, 10, 0, device=d),
    "arange/nan": lambda d: torch.arange(0, float("nan"), device=d),
    "linspace/negative_steps": lambda d: torch.linspace(0, 1, -1, device=d),
    "logspace/negative_steps": lambda d: torch.logspace(0, 1, -1, device=d),
    "eye/negative": lambda d: torch.eye(-1, device=d),
    "eye/negative_m": lambda d: torch.eye(2, -1, device=d),
    "tril_indices/negative": lambda d: torch.tril_indices(-1, 2, device=d),
    "zeros_like/bad_memory_format": lambda d: torch.empty_like(_r(3, dev=d), memory_format=torch.channels_last),
    "poisson/int": lambda d: torch.poisson(_t([1, 2], d)),
    "dropout/negative_p": lambda d: torch.dropout(_r(3, dev=d), -0.5, True),
}
for _n, _f in _RANDOM.items():
    case(f"random/{_n}", _f)


# ---- the sweep --------------------------------------------------------------------------------


def _error(fn, device) -> Exception | None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            fn(device)
            if device != "cpu":
                torch.tpu.synchronize()  # where index checks are deferred (TPU), they report here
        except Exception as error:
            return error
    return None


def test_table_size():
    assert len(CASES) >= 300


@pytest.mark.parametrize("name", sorted(CASES))
def test_bad_input_raises_cpu_class(name):
    cpu = _error(CASES[name], "cpu")
    assert cpu is not None, f"CPU accepts {name}: not bad input, drop it from the table"
    tpu = _error(CASES[name], TPU)
    assert tpu is not None, f"tpu returned where CPU raised {type(cpu).__name__}: {cpu}"
    assert type(tpu) is type(cpu), f"tpu raised {type(tpu).__name__}: {tpu}\nCPU raised {type(cpu).__name__}: {cpu}"


_REPEATED = [
    "random/randint/low_equals_high",
    "linalg/mm/int_float",
    "elementwise/add_/complex_scalar_into_float",
    "random/multinomial/nan",
    "indexing/embedding_bag/index_too_large",
    "reduction/sort/1d_dim_1",
]


@pytest.mark.parametrize("name", _REPEATED)
def test_bad_input_raises_again(name):
    # The second call of a signature finds its executable cached: it still raises.
    for _ in range(2):
        assert isinstance(_error(CASES[name], TPU), type(_error(CASES[name], "cpu")))


# Bad inputs that gave an answer where CPU raises, on the lowered path and on the host tier.
_ONCE_ANSWERED = [
    "reduction/unique/dim_out_of_range",
    "indexing/embedding_bag/offsets_past_input",
    "loss/cross_entropy/target_int32",
    "loss/binary_cross_entropy/input_above_one",
    "loss/binary_cross_entropy/input_negative",
]

_DEFAULT_MODE_SCRIPT = r"""
import importlib.util, json, sys
spec = importlib.util.spec_from_file_location("bad_inputs", sys.argv[1])
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
found = {}
for name in sys.argv[2:]:
    cpu = module._error(module.CASES[name], "cpu")
    found[name] = [type(cpu).__name__] + [type(module._error(module.CASES[name], "tpu")).__name__ for _ in range(3)]
print(json.dumps(found))
"""


def test_bad_inputs_raise_cpu_class_with_the_default_async_compile(tmp_path):
    """The same calls with the default asynchronous compile (first calls on the host tier while
    they compile), in a fresh process: each raises CPU's class on every call."""
    env = {k: v for k, v in os.environ.items() if k != "TORCH_TPU_ASYNC_COMPILE"}
    env.update(TORCH_TPU_CACHE_DIR=str(tmp_path), TORCH_TPU_EXIT_COMPILE_WAIT="0", TORCH_TPU_PLATFORM="cpu")
    result = run_python(["-c", _DEFAULT_MODE_SCRIPT, __file__, *_ONCE_ANSWERED], env, cwd=str(tmp_path))
    assert result.returncode == 0, result.stderr[-3000:]
    for name, (cpu, *tpu) in json.loads(result.stdout.strip().splitlines()[-1]).items():
        assert cpu != "NoneType", name
        assert tpu == [cpu] * 3, (name, cpu, tpu)


# ---- compiled: the data-dependent checks ------------------------------------------------------

_COMPILED = {
    "floor_divide_zero": (lambda a, b: a // b, lambda: (_t([4, 5], "cpu"), _t([2, 0], "cpu"))),
    "remainder_zero": (lambda a, b: a % b, lambda: (_t([4, 5], "cpu"), _t([2, 0], "cpu"))),
    "cross_entropy_target": (F.cross_entropy, lambda: (_r(4, 5), _t([0, 5, 2, 1], "cpu"))),
    "nll_loss_target": (F.nll_loss, lambda: (_r(4, 5), _t([0, -2, 2, 1], "cpu"))),
    "index_select": (lambda x, i: torch.index_select(x, 0, i), lambda: (_r(5, 3), _t([1, 9], "cpu"))),
    "gather": (lambda x, i: torch.gather(x, 0, i), lambda: (_r(5, 3), _t([[0, 1, 7]], "cpu"))),
    "embedding_bag": (
        lambda w, i: F.embedding_bag(i, w, torch.zeros(1, dtype=torch.long, device=w.device)),
        lambda: (_r(5, 3), _t([1, 9], "cpu")),
    ),
    "searchsorted_sorter": (
        lambda s, o: torch.searchsorted(s, s[:1], sorter=o),
        lambda: (_t([1.0, 2, 3], "cpu"), _t([0, 1, 7], "cpu")),
    ),
}


@pytest.mark.usefixtures("fresh_dynamo")
@pytest.mark.parametrize("name", sorted(_COMPILED))
def test_compiled_bad_input_raises_cpu_class(name):
    fn, make = _COMPILED[name]
    cpu = _error(lambda d: fn(*make()), "cpu")
    assert cpu is not None
    compiled = torch.compile(fn, backend="tpu")
    tpu = _error(lambda d: compiled(*(a.to(TPU) for a in make())), TPU)
    assert tpu is not None, f"compiled tpu returned where CPU raised {type(cpu).__name__}: {cpu}"
    assert type(tpu) is type(cpu), f"tpu raised {type(tpu).__name__}: {tpu}\nCPU raised {type(cpu).__name__}: {cpu}"
