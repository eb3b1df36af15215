"""Python scalar values are jit inputs, not part of the executable's key: 20 values, one compile
(and the same numbers as CPU); the in-memory op cache is an LRU."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import torch_tpu
from tests.helpers import platform_rounding_tol, platform_tol
from torch_tpu.runtime.executable_cache import ExecutableCache

# 20 distinct values, none a schema default (alpha=1 keeps its own executable) nor a special exponent.
VALUES = [0.37 + 0.113 * i for i in range(20)]
# pow's special exponents (CPU computes x*x, sqrt, ...): traced, they still match CPU bit for bit.
SPECIAL_EXPONENTS = [2.0, 3.0, 4.0, 0.5, -0.5, -1.0, -2.0, -3.0, -4.0, 0.0, 1.0, 2, -1, 3]

CASES = {
    "full": lambda x, y, m, v: torch.full((5, 3), v, dtype=x.dtype, device=x.device),
    "fill_": lambda x, y, m, v: x.clone().fill_(v),
    "clamp_max": lambda x, y, m, v: x.clamp(max=v),
    "clamp_min_max": lambda x, y, m, v: x.clamp(min=-v, max=v),
    "masked_fill": lambda x, y, m, v: x.masked_fill(m, v),
    "where_scalar": lambda x, y, m, v: torch.where(m, x, v),
    "pow_tensor_scalar": lambda x, y, m, v: y**v,
    "pow_scalar_tensor": lambda x, y, m, v: v**x,
    "lerp_scalar": lambda x, y, m, v: torch.lerp(x, y, v),
    "add_alpha": lambda x, y, m, v: torch.add(x, y, alpha=v),
    "sub_alpha": lambda x, y, m, v: torch.sub(x, y, alpha=v),
    "mul_scalar": lambda x, y, m, v: x * v,
    "div_scalar": lambda x, y, m, v: x / v,
    "add_scalar": lambda x, y, m, v: x + v,
    "gt_scalar": lambda x, y, m, v: x > v,
    "leaky_relu": lambda x, y, m, v: F.leaky_relu(x, v),
    "leaky_relu_": lambda x, y, m, v: F.leaky_relu(x.clone(), v, inplace=True),
    "elu": lambda x, y, m, v: F.elu(x, alpha=v),
    "celu": lambda x, y, m, v: F.celu(x, alpha=v),
    "elu_backward": lambda x, y, m, v: torch.ops.aten.elu_backward(y, v, 1.5, 1 / v, False, x),
    "hardtanh": lambda x, y, m, v: F.hardtanh(x, -v, v),
    "hardtanh_backward": lambda x, y, m, v: torch.ops.aten.hardtanh_backward(y, x, -v, v),
    "softplus_beta": lambda x, y, m, v: F.softplus(x, beta=v),
    "softplus_threshold": lambda x, y, m, v: F.softplus(x, beta=1.5, threshold=4 * v),
    "softplus_backward": lambda x, y, m, v: torch.ops.aten.softplus_backward(y, x, v, 3 * v),
    "threshold": lambda x, y, m, v: F.threshold(x, v, -2 * v),
    "threshold_backward": lambda x, y, m, v: torch.ops.aten.threshold_backward(y, x, v),
    "leaky_relu_backward": lambda x, y, m, v: torch.ops.aten.leaky_relu_backward(y, x, v, False),
    "hardtanh_": lambda x, y, m, v: F.hardtanh(x.clone(), -v, v, inplace=True),
    "threshold_": lambda x, y, m, v: F.threshold(x.clone(), v, -2 * v, inplace=True),
    "index_fill_": lambda x, y, m, v: x.clone().index_fill_(0, torch.tensor([1, 5, 7], device=x.device), v),
    "scatter_value_": lambda x, y, m, v: x.clone().scatter_(0, torch.tensor([3, 0, 9], device=x.device), v),
    "constant_pad_nd": lambda x, y, m, v: F.pad(x, (2, 3), value=v),
    "index_fill": lambda x, y, m, v: x.index_fill(0, torch.tensor([1, 5, 7], device=x.device), v),
    "scatter_value": lambda x, y, m, v: x.scatter(0, torch.tensor([3, 0, 9], device=x.device), v),
    "scatter_value_reduce": lambda x, y, m, v: x.scatter(
        0, torch.tensor([3, 0, 3], device=x.device), v, reduce="multiply"
    ),
    "softshrink": lambda x, y, m, v: F.softshrink(x, v),
    "hardshrink": lambda x, y, m, v: F.hardshrink(x, v),
    "softshrink_backward": lambda x, y, m, v: torch.ops.aten.softshrink_backward(y, x, v),
    "hardshrink_backward": lambda x, y, m, v: torch.ops.aten.hardshrink_backward(y, x, v),
    "index_add_alpha": lambda x, y, m, v: x.index_add(0, torch.tensor([3, 0, 3], device=x.device), y[:3], alpha=v),
    "index_add_alpha_": lambda x, y, m, v: x.clone().index_add_(
        0, torch.tensor([1, 2], device=x.device), y[:2], alpha=v
    ),
    "addr": lambda x, y, m, v: torch.addr(x[:16].view(4, 4), y[:4], x[4:8], beta=v, alpha=2 * v),
    "addmm": lambda x, y, m, v: torch.addmm(x[:16].view(4, 4), y[:16].view(4, 4), x[16:32].view(4, 4), beta=v),
    "addmm_alpha": lambda x, y, m, v: torch.addmm(
        x[:16].view(4, 4), y[:16].view(4, 4), x[16:32].view(4, 4), beta=-v, alpha=v
    ),
    "addmv": lambda x, y, m, v: torch.addmv(x[:4], y[:16].view(4, 4), x[16:20], beta=v, alpha=2 * v),
    "baddbmm": lambda x, y, m, v: torch.baddbmm(
        x[:8].view(2, 2, 2), y[:8].view(2, 2, 2), x[8:16].view(2, 2, 2), beta=v, alpha=v
    ),
    "addbmm": lambda x, y, m, v: torch.addbmm(
        x[:4].view(2, 2), y[:8].view(2, 2, 2), x[8:16].view(2, 2, 2), beta=v, alpha=v
    ),
}

# XLA's CPU client divides by a broadcast scalar through its reciprocal and its pow differs from
# std::pow by an ulp for general exponents (both before scalars were traced): close, not equal.
NEAR = {
    ("div_scalar", torch.float32),
    ("pow_tensor_scalar", torch.float32),
    ("pow_scalar_tensor", torch.float32),
    # XLA's CPU expm1, exp and log1p differ from CPU's by an ulp (traced or not)
    ("elu", torch.float32),
    ("elu_backward", torch.float32),
    ("celu", torch.float32),
    ("softplus_beta", torch.float32),
    ("softplus_threshold", torch.float32),
    ("softplus_backward", torch.float32),
}
# XLA's dots sum in another order than CPU's gemm, and its bf16 scatter-multiply rounds once per
# pair of updates (traced or not): torch's default tolerances.
CLOSE = {"addmm", "addmm_alpha", "addmv", "baddbmm", "addbmm", "scatter_value_reduce"}


# addr runs as torch's composite (outer, mul, add), not CPU's one fused loop: bf16 rounds in
# another order, within a few ulps of the result's scale.
COMPOSITE = {"addr"}
# index 3 takes two updates, each rounded to the dtype: XLA:TPU applies a scatter's duplicate
# updates in its own order (XLA leaves it unspecified), so the sum may differ by a rounding more.
DUPLICATE_INDICES = {"index_add_alpha", "index_add_alpha_"}


def _compiles() -> int:
    return torch_tpu.metrics.counters()["op_compiles"]


def _inputs(dtype, shape=(64,)):
    g = torch.Generator().manual_seed(7)
    x = (torch.randn(shape, generator=g) * 3).to(dtype)
    y = (torch.rand(shape, generator=g) * 2 + 0.1).to(dtype)
    m = torch.rand(shape, generator=g) > 0.5
    return x, y, m


def _exact(got: torch.Tensor, want: torch.Tensor) -> None:
    """Bit for bit on the XLA CPU client; on a TPU within its last-place rounding differences."""
    assert got.dtype == want.dtype
    torch.testing.assert_close(got, want, **platform_rounding_tol(want.dtype), equal_nan=True)


def _run_values(fn, dtype, values, shape=(64,)):
    x, y, m = _inputs(dtype, shape)
    xt, yt, mt = x.to("tpu"), y.to("tpu"), m.to("tpu")
    pairs = [(fn(xt, yt, mt, values[0]).cpu(), fn(x, y, m, values[0]))]  # compiles the op (and clone...)
    before = _compiles()
    pairs += [(fn(xt, yt, mt, v).cpu(), fn(x, y, m, v)) for v in values[1:]]
    return _compiles() - before, pairs


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name", list(CASES))
def test_scalar_values_compile_once(name, dtype):
    recompiles, pairs = _run_values(CASES[name], dtype, VALUES)
    assert recompiles == 0, f"{name}: {recompiles} compiles for {len(VALUES)} new values"
    for got, want in pairs:
        if name in CLOSE:
            torch.testing.assert_close(got, want)
        elif name in COMPOSITE:
            scale = want.abs().max().item()
            torch.testing.assert_close(got, want, rtol=0, atol=4 * torch.finfo(dtype).eps * scale)
        elif (name, dtype) in NEAR:  # pow, exp, log: TPU's transcendental units differ more
            torch.testing.assert_close(got, want, **platform_tol({"rtol": 3e-7, "atol": 0}))
        elif name in DUPLICATE_INDICES:
            torch.testing.assert_close(got, want, **platform_rounding_tol(dtype, roundings=2))
        else:
            _exact(got, want)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_traced_pow_special_exponents_match_cpu(dtype):
    recompiles, pairs = _run_values(CASES["pow_tensor_scalar"], dtype, SPECIAL_EXPONENTS)
    assert recompiles <= 1  # the float exponents compiled with the first; the int ones once
    for e, (got, want) in zip(SPECIAL_EXPONENTS, pairs):
        if e in (2, -1, 0, 1):
            _exact(got, want)
        else:  # XLA's CPU sqrt, rsqrt and integer_pow round differently from CPU's, traced or not
            tol = platform_tol({"rtol": 3e-7 if dtype == torch.float32 else 8e-3, "atol": 0})  # TPU's sqrt, rsqrt
            torch.testing.assert_close(got, want, **tol)


@pytest.mark.parametrize(
    "name,dtype,values",
    [
        ("add_alpha", torch.int32, [2, 3, -5, 7]),
        ("sub_alpha", torch.int64, [2, 3, -5, 7]),
        ("mul_scalar", torch.int32, [0.5, 1.25, -3.5]),  # int tensor * float: the default float dtype
        ("mul_scalar", torch.float16, [0.1, 0.3, 1e-3]),
        ("add_scalar", torch.uint8, [3, 7, 200]),
        ("clamp_max", torch.int32, [2.5, -1.5, 0.25]),
        ("full", torch.int64, [2, 3, -7]),
        ("full", torch.bool, [True, False]),
        ("fill_", torch.int16, [2, 3, -7]),
        ("masked_fill", torch.int64, [2, 3, -7]),
        ("where_scalar", torch.float16, [0.1, 0.3, 1e-3]),
        ("pow_tensor_scalar", torch.int32, [2, 3, 5]),
        ("lerp_scalar", torch.float64, [0.1, 0.7, -0.3]),
        ("gt_scalar", torch.int32, [0.5, 1.5, -2.5]),
        ("addmm", torch.int32, [2.7, -1.5, 0.5, 0.0]),  # integer gemm truncates the scalars
        ("addmm_alpha", torch.int64, [2, 3, -5, 0]),
        ("addmv", torch.int64, [2, 3, -5]),
        ("constant_pad_nd", torch.int64, [2, 3, -7]),
        ("constant_pad_nd", torch.float16, [0.1, 0.3, 1e-3]),
        ("index_fill", torch.int32, [2, 3, -7]),
        ("scatter_value", torch.int16, [2, 3, -7]),
        ("threshold", torch.int32, [2, 3, -7]),
        ("hardtanh", torch.float64, [0.1, 0.7, 2.5]),
        ("leaky_relu", torch.float64, [0.1, 0.7, -0.3]),
        ("index_add_alpha", torch.int32, [2, 3, -7]),
        ("index_add_alpha", torch.int64, [2.5, -1.7, 0.5]),  # CPU truncates a float alpha
        ("index_add_alpha_", torch.int16, [2.5, -1.7, 0.5]),
        ("softshrink", torch.float64, [0.1, 0.7, 2.5]),
        ("hardshrink", torch.float16, [0.1, 0.7, 2.5]),
        ("addr", torch.int64, [2, 3, -5]),
    ],
)
def test_scalar_values_other_dtypes_match_cpu(name, dtype, values):
    recompiles, pairs = _run_values(CASES[name], dtype, values)
    assert recompiles == 0
    for got, want in pairs:
        _exact(got, want)


FOREACH = {
    "add_scalar": lambda xs, ys, zs, v: torch._foreach_add(xs, v),
    "add_scalar_list": lambda xs, ys, zs, v: torch._foreach_add(xs, [v, -v]),
    "sub_scalar_list": lambda xs, ys, zs, v: torch._foreach_sub(xs, [v, 2 * v]),
    "mul_scalar": lambda xs, ys, zs, v: torch._foreach_mul(xs, v),
    "mul_scalar_list": lambda xs, ys, zs, v: torch._foreach_mul(xs, [v, 2 * v]),
    "div_scalar_list": lambda xs, ys, zs, v: torch._foreach_div(xs, [v, 3 * v]),
    "addcmul_value": lambda xs, ys, zs, v: torch._foreach_addcmul(xs, ys, zs, v),
    "addcdiv_scalar_list": lambda xs, ys, zs, v: torch._foreach_addcdiv(xs, ys, zs, [v, -v]),
    "maximum_scalar": lambda xs, ys, zs, v: torch._foreach_maximum(xs, v),
    "clamp_max_scalar_list": lambda xs, ys, zs, v: torch._foreach_clamp_max(xs, [v, 2 * v]),
    "lerp_scalar": lambda xs, ys, zs, v: torch._foreach_lerp(xs, ys, v / 4),
    "lerp_scalar_list": lambda xs, ys, zs, v: torch._foreach_lerp(xs, ys, [v / 4, 1 - v / 4]),
    "lerp_scalar_": lambda xs, ys, zs, v: _inplace(lambda out, w: torch._foreach_lerp_(out, ys, w), xs, v / 4),
    "add_scalar_": lambda xs, ys, zs, v: _inplace(torch._foreach_add_, xs, v),
    "mul_scalar_list_": lambda xs, ys, zs, v: _inplace(torch._foreach_mul_, xs, [v, 2 * v]),
    "sub_scalar_list_": lambda xs, ys, zs, v: _inplace(torch._foreach_sub_, xs, [v, -v]),
    "div_scalar_": lambda xs, ys, zs, v: _inplace(torch._foreach_div_, xs, v),
}


def _inplace(op, xs, scalars):
    out = [x.clone() for x in xs]
    op(out, scalars)
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name", list(FOREACH))
def test_foreach_scalars_compile_once(name, dtype):
    """_foreach_* Scalar and Scalar[] arguments are traced too (CPU's rounding of each kept)."""
    g = torch.Generator().manual_seed(5)
    lists = [[(torch.rand(64, generator=g) * 3 + 0.5).to(dtype), (torch.randn(8, 8, generator=g)).to(dtype)]]
    lists += [[(torch.rand(s, generator=g) + 0.5).to(dtype) for s in ((64,), (8, 8))] for _ in range(2)]
    on_tpu = [[t.to("tpu") for t in ts] for ts in lists]
    fn = FOREACH[name]
    fn(*on_tpu, VALUES[0])
    before = _compiles()
    for v in VALUES[1:]:
        got = [t.cpu() for t in fn(*on_tpu, v)]
        for a, e in zip(got, fn(*lists, v)):
            if name.startswith("div") and dtype == torch.float32:  # XLA divides by a scalar via its reciprocal
                torch.testing.assert_close(a, e, rtol=3e-7, atol=0)
            else:
                _exact(a, e)
    assert _compiles() == before


@pytest.mark.parametrize("op", ["addmm", "addmv", "baddbmm", "addbmm"])
def test_traced_beta_zero_ignores_nan_and_inf_in_self(op):
    betas = [0.5, 0.0, -2.0, 0.0, 1.5]  # one executable: beta == 0 is selected in the graph

    def call(device, beta):
        g = torch.Generator().manual_seed(3)
        a, b = torch.randn(2, 3, 4, generator=g), torch.randn(2, 4, 3, generator=g)
        self = torch.full((3, 3) if op != "addmv" else (3,), float("nan"))
        self[0] = float("inf")
        args = {
            "addmm": (self, a[0], b[0]),
            "addmv": (self, a[0], b[0, :, 0]),
            "baddbmm": (self.expand(2, 3, 3), a, b),
            "addbmm": (self, a, b),
        }[op]
        return getattr(torch, op)(*(t.to(device) for t in args), beta=beta, alpha=0.75).cpu()

    call("tpu", betas[0])
    before = _compiles()
    for beta in betas:
        got, want = call("tpu", beta), call("cpu", beta)
        assert got.isnan().any() == (beta != 0)
        torch.testing.assert_close(got, want, equal_nan=True)
    assert _compiles() == before


def test_python_type_is_in_the_key():
    x = torch.arange(6, dtype=torch.int32)
    xt = x.to("tpu")
    for v in (2, 2.5, True):
        _exact((xt + v).cpu(), x + v)
        _exact(torch.full((3,), v, device="tpu").cpu(), torch.full((3,), v))


def test_fill_overflow_raises_cpu_error():
    for dtype, value in [(torch.int8, 300), (torch.uint8, -300), (torch.float16, 1e6)]:
        with pytest.raises(RuntimeError, match="without overflow"):
            torch.empty(3, dtype=dtype).fill_(value)
        with pytest.raises(RuntimeError, match="without overflow"):
            torch.empty(3, dtype=dtype, device="tpu").fill_(value)
        with pytest.raises(RuntimeError, match="without overflow"):
            torch.full((3,), value, dtype=dtype, device="tpu")


def test_integer_pow_negative_exponent_raises():
    with pytest.raises(RuntimeError, match="Integers to negative integer powers are not allowed"):
        torch.arange(3, device="tpu") ** -2


def _adamw_run(device: str, steps: int):
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 4).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=torch.tensor(1e-3))
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=10)
    x = torch.randn(16, 8).to(device)
    compiles = []
    for _ in range(steps):
        before = _compiles()
        opt.zero_grad()
        model(x).square().mean().backward()
        opt.step()
        sched.step()
        compiles.append(_compiles() - before)
    return [p.detach().cpu() for p in model.parameters()], compiles


def test_adamw_tensor_lr_under_cosine_schedule_does_not_recompile():
    got, compiles = _adamw_run("tpu", 8)
    want, _ = _adamw_run("cpu", 8)
    assert compiles[2:] == [0] * 6, compiles
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-6, atol=1e-7)  # the matmul gradients differ by an ulp


def test_lru_cache_evicts_least_recent():
    before = torch_tpu.metrics.counters()["op_cache_evictions"]
    cache = ExecutableCache(size=2)
    cache.put("a", 1)
    cache.put("b", 2)
    assert cache.get("a") == 1  # "b" is now the least recently used
    cache.put("c", 3)
    assert cache.get("b") is None and cache.get("a") == 1 and cache.get("c") == 3
    assert len(cache) == 2
    assert torch_tpu.metrics.counters()["op_cache_evictions"] == before + 1


def test_op_cache_size_env_bounds_the_dispatcher_cache(monkeypatch):
    monkeypatch.setenv("TORCH_TPU_OP_CACHE_SIZE", "3")
    before = torch_tpu.metrics.counters()["op_cache_evictions"]
    for n in range(200, 206):  # six new shapes: six new executables
        x = torch.arange(n, dtype=torch.float32)
        _exact((x.to("tpu") * 2.5).cpu(), x * 2.5)
    from torch_tpu.ops import dispatcher

    assert len(dispatcher._cache) <= 3
    assert torch_tpu.metrics.counters()["op_cache_evictions"] > before


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_graph_mode_python_float_is_a_graph_input(dtype):
    """Dynamo turns a changing Python float into a graph input (a CPU scalar tensor cast with
    prims.convert_element_type): one graph for every later value, no op left to run eagerly."""
    torch._dynamo.reset()

    def f(x, v):
        return x * v + v - x / v

    compiled = torch.compile(f, backend="tpu")
    x = (torch.randn(64, generator=torch.Generator().manual_seed(2)) * 3).to(dtype)
    xt = x.to("tpu")
    compiled(xt, VALUES[0])  # dynamo specializes the first value, then marks it dynamic
    compiled(xt, VALUES[1])
    before = torch_tpu.metrics.counters()
    for v in VALUES[2:]:
        got, want = compiled(xt, v).cpu(), f(x, v)
        assert got.dtype == want.dtype
        if torch_tpu.platform() == "tpu" and dtype == torch.bfloat16:
            # XLA:TPU keeps the fused bf16 graph's intermediates in float32 (excess precision) where
            # eager CPU rounds each op's result, and x*v - x/v cancels: one bf16 ulp of each of those.
            xf = x.float()
            rounded = (xf * v).abs() + (xf * v + v).abs() + (xf / v).abs()
            err = (got.float() - want.float()).abs()
            assert (err <= 1.6e-2 * want.float().abs() + 2**-7 * rounded).all(), (v, err.max())
        else:
            torch.testing.assert_close(got, want)
    after = torch_tpu.metrics.counters()
    assert after["graph_compiles"] == before["graph_compiles"]
    assert after.get("graph_eager_ops", 0) == before.get("graph_eager_ops", 0)
