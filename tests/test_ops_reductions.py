"""Reduction and scan lowerings (sum, mean, max, var, norms, cumsum, median, ...) equal CPU."""

from __future__ import annotations

import math

import pytest
import torch

from tests.helpers import data, platform_tol, same_error, tol_for
from tests.helpers import same as _same

NAN = float("nan")


FLOATS = [torch.float32, torch.bfloat16]
ALL = [torch.float32, torch.bfloat16, torch.int64, torch.int32, torch.bool]


def same(fn, *inputs, grad=False, transcendental=False, **tol):
    """tests.helpers.same. transcendental=True (fn's float results go through exp, log, sqrt or a
    float power: logsumexp, std, norms): platform_tol widens the tolerances on a TPU, and only there."""
    return _same(fn, *inputs, grad=grad, **(platform_tol(tol) if transcendental else tol))


# ---- sum / mean / prod / nansum ------------------------------------------------------


@pytest.mark.parametrize("dtype", ALL)
def test_sum_dtype_rules(dtype):
    x = data(dtype)
    out = same(lambda x: x.sum(), x, **tol_for(dtype))
    assert out.dtype == torch.sum(x).dtype
    same(lambda x: x.sum(1), x, **tol_for(dtype))
    same(lambda x: x.sum((0, 1), keepdim=True), x, **tol_for(dtype))
    same(lambda x: x.sum(-1, dtype=torch.float64), x)


@pytest.mark.parametrize(
    "args",
    [
        {"dim": 0},
        {"dim": -1, "keepdim": True},
        {"dim": (0, 2)},
        {"dim": []},
        {"dim": None},
        {"dim": (-3, -1), "keepdim": True},
    ],
)
def test_sum_dims(args):
    x = torch.randn(2, 3, 4)
    same(lambda x: torch.sum(x, **args), x)
    same(lambda x: torch.mean(x, **args), x)


def test_sum_noncontiguous_and_empty():
    x = torch.randn(4, 6)
    same(lambda x: x.t().sum(0), x)
    same(lambda x: x[:, ::2].sum(1), x)
    same(lambda x: x.t()[1:].mean(-1, keepdim=True), x)
    same(lambda x: x[:0].sum(), x)
    same(lambda x: x[:0].sum(0), x)
    same(lambda x: x[:0].prod(0), x)
    same(lambda x: x[:0].mean(0), x)
    same(lambda x: x.sum(0).sum(), torch.tensor(3.0))  # 0-dim
    same(lambda x: x.sum(0).sum(-1), torch.tensor([2.0]))


def test_sum_out_and_grad():
    x = torch.randn(3, 4)
    out = torch.empty(4, device="tpu")
    torch.sum(x.to("tpu"), 0, out=out)
    torch.testing.assert_close(out.cpu(), x.sum(0))
    same(lambda x: x.sum(1), x, grad=True)
    same(lambda x: x.mean((0, 1)), x, grad=True)
    same(lambda x: x.t().sum(0, keepdim=True), x, grad=True)


def test_mean_of_int_raises_like_cpu():
    same_error(lambda x: x.mean(), torch.arange(4))
    same(lambda x: x.mean(dtype=torch.float32), torch.arange(4))


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool])
def test_prod(dtype):
    x = data(dtype, (3, 3))
    same(lambda x: x.prod(), x)
    same(lambda x: x.prod(1), x)
    same(lambda x: x.prod(-2, keepdim=True), x)
    same(lambda x: x.prod(0, dtype=torch.float64), x)


def test_prod_grad():
    same(lambda x: x.prod(1), torch.rand(3, 4) + 0.5, grad=True)


def test_nansum():
    x = torch.tensor([[1.0, NAN, 2.0], [NAN, NAN, 3.0]])
    same(lambda x: x.nansum(), x)
    same(lambda x: x.nansum(1), x)
    same(lambda x: x.nansum(0, keepdim=True), x)
    same(lambda x: x.nansum(), torch.arange(5))


def test_bfloat16_sum_accumulates_in_float32():
    x = torch.full((4096,), 0.01, dtype=torch.bfloat16)
    same(lambda x: x.sum(), x, rtol=1e-2, atol=1e-2)


# ---- max / min / argmax / amax -------------------------------------------------------


@pytest.mark.parametrize("dtype", ALL)
def test_max_min(dtype):
    x = data(dtype)
    same(lambda x: x.max(), x)
    same(lambda x: x.min(), x)
    same(lambda x: x.amax(1), x)
    same(lambda x: x.amin((0, 1)), x)
    same(lambda x: x.amax(), x)
    same(lambda x: tuple(x.max(1)), x)
    same(lambda x: tuple(x.min(0, keepdim=True)), x)
    same(lambda x: tuple(x.aminmax()), x)
    same(lambda x: tuple(x.aminmax(dim=-1, keepdim=True)), x)
    if dtype != torch.bool:
        same(lambda x: x.argmax(), x)
        same(lambda x: x.argmin(1), x)
        same(lambda x: x.argmax(-1, keepdim=True), x)
        same(lambda x: x.argmax(None, keepdim=True), x)


def test_argmax_ties_pick_first_and_nan_propagates():
    x = torch.tensor([[1.0, 3.0, 3.0, 0.0], [2.0, NAN, 5.0, NAN], [-1.0, -1.0, -1.0, -1.0]])
    same(lambda x: tuple(x.max(1)), x)
    same(lambda x: tuple(x.min(1)), x)
    same(lambda x: x.argmax(1), x)
    same(lambda x: x.argmin(1), x)
    same(lambda x: x.argmax(), x)
    same(lambda x: x.max(), x)
    same(lambda x: x.amax(1), x)
    same(lambda x: x.amin(0), x)
    same(lambda x: tuple(x.aminmax(dim=1)), x)


def test_max_noncontiguous_and_grad():
    x = torch.randn(4, 5)
    same(lambda x: tuple(x.t().max(1)), x)
    same(lambda x: x[::2, 1:].argmax(0), x)
    same(lambda x: x.max(1).values, x, grad=True)
    same(lambda x: x.amax(0), x, grad=True)
    same(lambda x: x.max(), x, grad=True)
    same(lambda x: x.t().min(0).values, x, grad=True)


def test_max_out():
    x = torch.randn(3, 4)
    v, i = torch.empty(3, device="tpu"), torch.empty(3, dtype=torch.long, device="tpu")
    torch.max(x.to("tpu"), 1, out=(v, i))
    torch.testing.assert_close(v.cpu(), x.max(1).values)
    torch.testing.assert_close(i.cpu(), x.max(1).indices)


def test_empty_reductions_raise_like_cpu():
    same_error(lambda x: x.max(), torch.empty(0), match=True)
    same_error(lambda x: x.min(), torch.empty(0))
    same_error(lambda x: x.max(0), torch.empty(0, 3), match=True)
    same_error(lambda x: x.median(0), torch.empty(0, 3))
    same(lambda x: tuple(x.max(1)), torch.empty(0, 3))
    same(lambda x: x.amax(1), torch.empty(0, 3))
    same(lambda x: x.median(), torch.empty(0))


def test_zero_dim():
    x = torch.tensor(2.5)
    same(lambda x: tuple(x.max(0)), x)
    same(lambda x: x.argmax(0), x)
    same(lambda x: x.amax(), x)
    same(lambda x: x.cumsum(0), x)
    same(lambda x: tuple(x.cummax(0)), x)
    same(lambda x: x.var(correction=0), x)


# ---- var / std -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "kw",
    [{}, {"dim": 1}, {"dim": 0, "unbiased": False}, {"dim": (0, 1), "keepdim": True}, {"dim": -1, "correction": 2}],
)
def test_var_std(kw):
    x = torch.randn(4, 5)
    same(lambda x: x.var(**kw), x)
    same(lambda x: x.std(**kw), x, transcendental=True)  # sqrt
    same(lambda x: tuple(torch.var_mean(x, **kw)), x)
    same(lambda x: tuple(torch.std_mean(x, **kw)), x, transcendental=True)


def test_var_grad_noncontiguous_bf16_and_int():
    x = torch.randn(4, 5)
    same(lambda x: x.t().var(1), x, grad=True)
    same(lambda x: x.std(0, keepdim=True), x, grad=True, transcendental=True)
    same(lambda x: x.var(1), x.bfloat16(), **tol_for(torch.bfloat16))
    same(lambda x: x.var(), torch.tensor([1.0]))  # dof <= 0 gives nan, as on CPU
    same_error(lambda x: x.var(), torch.arange(4))
    same_error(lambda x: x.std(), torch.arange(4))


# ---- any / all / count_nonzero -----------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.bool, torch.float32, torch.int64, torch.uint8])
def test_any_all(dtype):
    x = data(torch.bool if dtype == torch.uint8 else dtype, (3, 4)).to(dtype)
    x[0] = 1
    for fn in (torch.any, torch.all):
        out = same(fn, x)
        assert out.dtype == fn(x).dtype
        same(lambda x, fn=fn: fn(x, 1), x)
        same(lambda x, fn=fn: fn(x, 0, keepdim=True), x)
        same(lambda x, fn=fn: fn(x, dim=(0, 1)), x)
        same(lambda x, fn=fn: fn(x.t(), dim=0), x)
    same(lambda x: x.count_nonzero(), x)
    same(lambda x: x.count_nonzero(1), x)
    same(lambda x: x.count_nonzero((0, 1)), x)


def test_any_all_nan_and_empty():
    x = torch.tensor([NAN, 0.0])
    same(lambda x: x.any(), x)
    same(lambda x: x.all(), x)
    same(lambda x: x[:0].all(), x)
    same(lambda x: x[:0].any(), x)


# ---- logsumexp / norms ------------------------------------------------------------------


def test_logsumexp():
    x = torch.randn(3, 4) * 10
    same(lambda x: x.logsumexp(1), x, transcendental=True)
    same(lambda x: x.logsumexp((0, 1), keepdim=True), x, transcendental=True)
    same(lambda x: x.logsumexp(0), torch.tensor([[-math.inf, 1.0], [-math.inf, math.inf]]), transcendental=True)
    same(lambda x: x.logsumexp(1), torch.arange(6).reshape(2, 3), transcendental=True)
    same(lambda x: x.logsumexp(1), x, grad=True, transcendental=True)


@pytest.mark.parametrize("ord", [2, 1, 3, 0.5, 0, math.inf, -math.inf])
def test_vector_norm(ord):
    x = torch.randn(3, 4)
    root = ord not in (1, 0, math.inf, -math.inf)  # sqrt or a float power
    same(lambda x: torch.linalg.vector_norm(x, ord), x, transcendental=root)
    same(lambda x: torch.linalg.vector_norm(x, ord, dim=1, keepdim=True), x, transcendental=root)
    same(lambda x: torch.linalg.vector_norm(x.t(), ord, dim=(0,)), x, transcendental=root)


def test_norm_variants_and_grad():
    x = torch.randn(3, 4)
    same(lambda x: x.norm(), x, transcendental=True)
    same(lambda x: x.norm(p=1, dim=1), x)
    same(lambda x: torch.linalg.vector_norm(x, dtype=torch.float64), x)
    same(lambda x: x.norm(dim=0), x.bfloat16(), **tol_for(torch.bfloat16))
    same(lambda x: x.norm(dim=1), x, grad=True, transcendental=True)
    same_error(lambda x: x.norm(), torch.arange(3))


# ---- scans -------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool, torch.int32])
def test_cumsum_cumprod(dtype):
    x = data(dtype, (3, 4))
    out = same(lambda x: x.cumsum(1), x)
    assert out.dtype == x.cumsum(1).dtype
    same(lambda x: x.cumsum(0), x)
    same(lambda x: x.cumprod(-1), x)
    same(lambda x: x.t().cumsum(-1), x)
    same(lambda x: x.cumsum(1, dtype=torch.float64), x)


def test_cumsum_grad_and_inplace():
    same(lambda x: x.cumsum(1), torch.randn(3, 4), grad=True)
    same(lambda x: x.cumprod(1), torch.rand(3, 4) + 0.5, grad=True)
    x = torch.randn(3, 4)
    t = x.to("tpu")
    t.cumsum_(0)
    torch.testing.assert_close(t.cpu(), x.cumsum(0))


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64])
def test_cummax_cummin(dtype):
    x = torch.tensor([[1, 3, 3, 1, 2, 3, 1], [5, 4, 4, 6, 0, 6, 6]]).to(dtype)
    same(lambda x: tuple(x.cummax(1)), x)
    same(lambda x: tuple(x.cummin(1)), x)
    same(lambda x: tuple(x.cummax(0)), x)
    same(lambda x: tuple(x.t().cummin(0)), x)


def test_cummax_nan_and_grad():
    x = torch.tensor([1.0, NAN, 3.0, NAN, 1.0])
    same(lambda x: tuple(x.cummax(0)), x)
    same(lambda x: tuple(x.cummin(0)), x)
    same(lambda x: x.cummax(1).values, torch.randn(3, 5), grad=True)


# ---- median / nanmedian / mode -------------------------------------------------------------


def test_median():
    x = torch.tensor([[3.0, NAN, 1.0, NAN, 2.0], [5.0, 1.0, 2.0, 4.0, 3.0], [NAN] * 5, [2.0, 2.0, 1.0, 2.0, 9.0]])
    same(lambda x: x.median(), x)
    same(lambda x: x.nanmedian(), x)
    same(lambda x: x[1].median(), x)
    same(lambda x: x[1:2].median(), x)
    same(lambda x: tuple(x.median(1)), x)
    same(lambda x: tuple(x.nanmedian(1)), x)
    same(lambda x: tuple(x.median(1, keepdim=True)), x)
    same(lambda x: tuple(x[1:].median(0)), torch.randn(4, 3))
    same(lambda x: tuple(x.median(-1)), torch.tensor([5, 2, 2, 2, 1]))
    same(lambda x: x.median(), torch.arange(6))


def test_median_grad():
    same(lambda x: x.median(1).values, torch.randn(3, 5), grad=True)
    same(lambda x: x.median(), torch.randn(3, 5), grad=True)


def test_mode():
    x = torch.tensor([[1, 3, 3], [2, 2, 1], [4, 5, 6]])
    same(lambda x: tuple(x.mode(1)), x)
    same(lambda x: tuple(x.mode(0)), x)
    same(lambda x: tuple(x.mode()), torch.tensor([1, 2, 2, 3, 3, 1, 5]))
    same(lambda x: tuple(x.mode(keepdim=True)), x)
    same(lambda x: tuple(x.mode(1)), torch.tensor([[3.0, NAN, 1.0, NAN, 2.0], [NAN] * 5]))


def test_norm_overloads_and_logcumsumexp():
    x = torch.randn(3, 4)
    same(lambda x: torch.ops.aten.norm.Scalar(x, 3), x, transcendental=True)
    same(lambda x: torch.ops.aten.norm.ScalarOpt_dim(x, None, [1], True), x, transcendental=True)
    same(lambda x: torch.ops.aten.norm.ScalarOpt_dim_dtype(x, 1, [0], False, dtype=torch.float64), x)
    same(lambda x: torch.ops.aten.norm.ScalarOpt_dtype(x, 2, dtype=torch.float64), x)
    same(lambda x, y: torch.dist(x, y), x, torch.randn(3, 4), transcendental=True)
    same(lambda x: torch.logcumsumexp(x, 1), x, transcendental=True)
    same(lambda x: torch.logcumsumexp(x.t(), 0), x, grad=True, transcendental=True)
    same(lambda x: torch.logcumsumexp(x, 0), torch.tensor([-math.inf, 0.0, math.inf]), transcendental=True)


def test_bincount():
    x = torch.tensor([0, 2, 2, 5, 1])
    same(lambda x: torch.bincount(x), x)
    same(lambda x: torch.bincount(x, minlength=8), x)
    same(lambda x, w: torch.bincount(x, w), x, torch.rand(5))
    same(lambda x, w: torch.bincount(x, w), x, torch.arange(5))
    same(lambda x: torch.bincount(x[:0]), x)
    same_error(lambda x: torch.bincount(x), torch.tensor([1, -1]), match=True)
    same_error(lambda x: torch.bincount(x[None]), x, match=True)
    same_error(lambda x: torch.bincount(x, minlength=-1), x, match=True)
    same_error(lambda x: torch.bincount(x.float()), x)
