"""Factory lowerings (fills, full/zeros/ones, arange, eye, linspace, casts,
clone) equal CPU; random lowerings are reproducible from the tpu generator and
follow their distributions (their numbers differ from CPU's)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from tests.helpers import platform_tol
from tests.helpers import same as _same


def same(fn, *inputs, **tol):
    """fn(device, *inputs) on tpu equals it on CPU: tests.helpers.same with device_arg=True."""
    return _same(fn, *inputs, device_arg=True, **tol)


# ---- factories --------------------------------------------------------------

DTYPES = [None, torch.float32, torch.bfloat16, torch.float64, torch.int64, torch.int32, torch.uint8, torch.bool]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_constant_factories(dtype):
    same(lambda d: torch.zeros(2, 3, dtype=dtype, device=d))
    same(lambda d: torch.ones((4,), dtype=dtype, device=d))
    same(lambda d: torch.full((2, 2), 3, dtype=dtype, device=d))
    same(lambda d: torch.zeros((), dtype=dtype, device=d))
    same(lambda d: torch.ones(0, 3, dtype=dtype, device=d))
    same(lambda d: torch.eye(3, dtype=dtype, device=d))
    same(lambda d: torch.eye(2, 4, dtype=dtype, device=d))
    same(lambda d: torch.scalar_tensor(7, dtype=dtype, device=d))


@pytest.mark.parametrize("value", [True, 3, -2.5, 1e10, float("inf"), float("nan")], ids=str)
def test_full_infers_dtype_from_value(value):
    got = same(lambda d: torch.full((2, 3), value, device=d))
    assert got.dtype == torch.full((1,), value).dtype
    same(lambda d: torch.full((2,), value, dtype=torch.float16, device=d))


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool, torch.bfloat16])
def test_like_and_new_factories(dtype):
    x = torch.arange(6.0).reshape(2, 3).to(dtype)
    same(lambda d, x: torch.zeros_like(x), x)
    same(lambda d, x: torch.ones_like(x.t()), x)
    same(lambda d, x: torch.full_like(x, 5), x)
    same(lambda d, x: torch.full_like(x, 2.5, dtype=torch.float32), x)
    same(lambda d, x: torch.empty_like(x).fill_(1).shape and torch.empty_like(x).fill_(1), x)
    same(lambda d, x: x.new_zeros(4), x)
    same(lambda d, x: x.new_ones((2, 1)), x)
    same(lambda d, x: x.new_full((3,), 7), x)
    same(lambda d, x: x.new_tensor([1, 2, 3]), x)
    same(lambda d, x: torch.zeros_like(x, dtype=torch.float64), x)


def test_zeros_like_to_another_device():
    x = torch.ones(2, 3, device="tpu")
    z = torch.zeros_like(x, device="cpu")
    assert z.device.type == "cpu" and torch.equal(z, torch.zeros(2, 3))
    o = torch.ones_like(torch.ones(2), device="tpu")
    assert o.device.type == "tpu" and torch.equal(o.cpu(), torch.ones(2))


@pytest.mark.parametrize("data", [[1, 2, 3], [1.5, -2.0], [[True, False]], 3.25, [[1, 2], [3, 4]]], ids=str)
def test_tensor_constructor(data, no_fallbacks):
    for dtype in (None, torch.float64, torch.int32):
        t = torch.tensor(data, dtype=dtype, device="tpu")
        expected = torch.tensor(data, dtype=dtype)
        assert t.device.type == "tpu" and t.dtype == expected.dtype
        torch.testing.assert_close(t.cpu(), expected)
    assert torch.as_tensor(data, device="tpu").device.type == "tpu"


ARANGES = [
    (5,),
    (0, 5),
    (2, 11, 3),
    (10, 0, -2),
    (0.0, 1.0, 0.1),
    (-1.0, 1.0, 0.3),
    (1, 2.5, 0.5),
    (0, 1, 0.25),
    (-3, 3),
    (0, 0),
    (5, 0),
    (0.5,),
]


@pytest.mark.parametrize("args", ARANGES, ids=str)
@pytest.mark.parametrize("dtype", [None, torch.float32, torch.float64, torch.int64, torch.int32, torch.bfloat16])
def test_arange(args, dtype):
    if dtype == torch.int32 and any(isinstance(a, float) for a in args):
        pytest.skip("meta refuses a float step that truncates to 0 for int32; CPU fills zeros")
    same(lambda d: torch.arange(*args, dtype=dtype, device=d))


def test_arange_errors_and_out():
    same(lambda d: torch.arange(0, 10, 0, device=d))  # step must be nonzero
    same(lambda d: torch.arange(0, 10, -1, device=d))  # upper bound and larger bound inconsistent with step sign

    def out(d):
        o = torch.empty(0, dtype=torch.float64, device=d)
        r = torch.arange(1, 4, 0.5, out=o)
        assert r is o
        return o

    same(out)


@pytest.mark.parametrize("steps", [0, 1, 2, 5, 8])
@pytest.mark.parametrize("dtype", [None, torch.float64, torch.int64, torch.bfloat16])
def test_linspace_logspace(steps, dtype):
    same(lambda d: torch.linspace(-2, 3.5, steps, dtype=dtype, device=d))
    same(lambda d: torch.linspace(10, -10, steps, dtype=dtype, device=d))
    # logspace: powers, on a TPU from its exp and log units
    same(lambda d: torch.logspace(-1, 2, steps, dtype=dtype, device=d), **platform_tol({"rtol": 1e-5, "atol": 1e-5}))
    same(lambda d: torch.logspace(0, 4, steps, base=2, dtype=dtype, device=d), **platform_tol({}))


def test_linspace_tensor_endpoints_and_errors():
    same(lambda d, s, e: torch.linspace(s, e, 5, device=d), torch.tensor(1.0), torch.tensor(3.0))
    same(lambda d, s: torch.linspace(s, 4, 3, device=d), torch.tensor(-1.0))
    same(lambda d: torch.linspace(0, 1, -1, device=d))  # number of steps must be non-negative


def test_default_dtype_is_honoured():
    prev = torch.get_default_dtype()
    same(lambda d: torch.zeros(2, device=d))
    torch.set_default_dtype(torch.float64)
    try:
        for fn in (
            lambda d: torch.zeros(2, device=d),
            lambda d: torch.arange(0.5, 3, device=d),
            lambda d: torch.full((2,), 1.5, device=d),
            lambda d: torch.linspace(0, 1, 3, device=d),
            lambda d: torch.eye(2, device=d),
            lambda d: torch.ones(2, device=d) * 0.1,
        ):
            assert same(fn).dtype == torch.float64
    finally:
        torch.set_default_dtype(prev)


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool, torch.bfloat16, torch.uint8])
def test_fill_and_zero(dtype):
    x = torch.arange(12).reshape(3, 4).to(dtype)

    def run(d, x):
        x = x.clone()
        x[1].fill_(2.7)
        x[:, ::2].fill_(torch.tensor(1))  # a CPU scalar
        x.t()[3].fill_(torch.tensor(0, device=d))
        x[2, 1:].zero_()
        return x

    same(run, x)
    same(lambda d, x: x.clone().fill_(-1.5), x)


def test_fill_errors():
    same(lambda d: torch.zeros(3, device=d).fill_(torch.ones(2, device=d)))  # fill_ only supports 0-dim value


# ---- casts and copies -------------------------------------------------------

CAST_SOURCES = {
    "float": torch.tensor([[-2.7, -0.5, 0.0], [0.5, 1.5, 300.25]]),
    "special": torch.tensor([float("nan"), float("inf"), -float("inf"), -0.0]),
    "int": torch.tensor([[-3, 0, 7], [255, 256, -129]]),
    "bool": torch.tensor([True, False, True]),
    "bf16": torch.tensor([1.5, -2.25, 100.0]).bfloat16(),
}


@pytest.mark.parametrize("source", sorted(CAST_SOURCES))
@pytest.mark.parametrize(
    "dtype",
    [torch.float16, torch.bfloat16, torch.float64, torch.float32, torch.int64, torch.int32, torch.int8, torch.bool],
)
def test_dtype_casts(source, dtype):
    x = CAST_SOURCES[source]
    if source == "special" and not (dtype.is_floating_point or dtype == torch.bool):
        pytest.skip("float -> int of nan/inf is undefined behaviour in C++")
    if source == "float" and dtype == torch.int8:
        x = x.clamp(-100, 100)  # out-of-range float -> int is undefined behaviour
    same(lambda d, x: x.to(dtype), x)
    same(lambda d, x: x.t().to(dtype) if x.dim() == 2 else x[::2].to(dtype), x)


def test_cast_methods(no_fallbacks):
    x = torch.tensor([[1.5, -2.5], [3.0, 0.0]])
    t = x.to("tpu")
    for name in ("double", "float", "half", "bfloat16", "long", "int", "short", "char", "byte", "bool"):
        got = getattr(t, name)()
        assert got.device.type == "tpu"
        torch.testing.assert_close(got.cpu(), getattr(x, name)())
    assert t.to(torch.float16).dtype == torch.float16
    assert t.type(torch.float64).dtype == torch.float64


def test_device_transfers_through_to_copy():
    x = torch.arange(6.0).reshape(2, 3)
    t = x.to("tpu")
    assert t.device.type == "tpu"
    back = t.to("cpu")
    assert back.device.type == "cpu" and torch.equal(back, x)
    assert torch.equal(t.to("cpu", torch.int64), x.long())
    assert torch.equal(x.to("tpu", torch.float16).cpu(), x.half())
    assert torch.equal(t.t().to("cpu"), x.t())
    assert torch.equal(x.t().to("tpu").cpu(), x.t())
    copy = t.to("tpu", copy=True)
    copy.add_(1)
    assert torch.equal(t.cpu(), x)
    assert t.to("tpu") is t
    assert torch.equal(torch.ones(3, device="tpu").to(torch.device("tpu", 0), torch.int32).cpu(), torch.ones(3).int())


def test_clone():
    x = torch.arange(12.0).reshape(3, 4)

    def run(d, x):
        c = x.clone()
        c.add_(1)  # the clone is independent
        return x, c, x.t().clone(), x[:, 1::2].clone(), x.clone(memory_format=torch.contiguous_format)

    same(run, x)
    c4 = torch.randn(2, 3, 4, 5).to("tpu").clone(memory_format=torch.channels_last)
    assert c4.shape == (2, 3, 4, 5)


def test_cast_and_clone_backward():
    x = torch.randn(3, 4)
    for fn in (
        lambda t: (t.double() * 2).sum(),
        lambda t: (t.clone() ** 2).sum(),
        lambda t: t.half().float().sum(),
        lambda t: (t.to("cpu") * 3).sum(),
    ):
        grads = []
        for device in ("cpu", "tpu"):
            leaf = x.detach().to(device).requires_grad_()
            fn(leaf).backward()
            grads.append(leaf.grad.cpu())
        torch.testing.assert_close(grads[1], grads[0])


# ---- random: reproducibility ------------------------------------------------

SAMPLERS = {
    "rand": lambda **kw: torch.rand(64, device="tpu", **kw),
    "randn": lambda **kw: torch.randn(8, 8, device="tpu", **kw),
    "randint": lambda **kw: torch.randint(0, 1000, (64,), device="tpu", **kw),
    "randperm": lambda **kw: torch.randperm(50, device="tpu", **kw),
    "normal": lambda **kw: torch.normal(torch.zeros(32, device="tpu"), 2.0, **kw),
    "bernoulli": lambda **kw: torch.bernoulli(torch.full((64,), 0.5, device="tpu"), **kw),
    "uniform_": lambda **kw: torch.empty(64, device="tpu").uniform_(-2, 2, **kw),
    "exponential_": lambda **kw: torch.empty(64, device="tpu").exponential_(**kw),
    "multinomial": lambda **kw: torch.multinomial(torch.ones(100, device="tpu"), 10, **kw),
}


@pytest.mark.parametrize("name", sorted(SAMPLERS))
def test_same_seed_same_numbers(name, no_fallbacks):
    sample = SAMPLERS[name]
    torch.manual_seed(0)
    a = sample()
    torch.manual_seed(0)
    b = sample()
    c = sample()
    assert torch.equal(a.cpu(), b.cpu())
    assert not torch.equal(b.cpu(), c.cpu())

    g = torch.Generator(device="tpu")
    g.manual_seed(1234)
    d = sample(generator=g)
    e = sample(generator=g)
    g.manual_seed(1234)
    f = sample(generator=g)
    assert torch.equal(d.cpu(), f.cpu())
    assert not torch.equal(d.cpu(), e.cpu())


def test_tpu_manual_seed_and_generator_state():
    torch.tpu.manual_seed(7)
    a = torch.rand(16, device="tpu")
    torch.tpu.manual_seed(7)
    assert torch.equal(torch.rand(16, device="tpu").cpu(), a.cpu())
    g = torch.Generator(device="tpu")
    g.manual_seed(5)
    state = g.get_state()
    x = torch.randn(16, device="tpu", generator=g)
    g.set_state(state)
    assert torch.equal(torch.randn(16, device="tpu", generator=g).cpu(), x.cpu())
    # the CPU generator does not move
    torch.manual_seed(3)
    before = torch.rand(3)
    torch.manual_seed(3)
    torch.rand(100, device="tpu")
    assert torch.equal(torch.rand(3), before)


# ---- random: distributions --------------------------------------------------

N = 10_000


def _moments(x: torch.Tensor) -> tuple[float, float]:
    x = x.cpu().double()
    return x.mean().item(), x.std().item()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
def test_uniform(dtype, no_fallbacks):
    x = torch.rand(N, device="tpu", dtype=dtype)
    assert x.dtype == dtype and x.shape == (N,)
    c = x.cpu().float()
    assert c.min() >= 0 and c.max() <= 1
    mean, std = _moments(x)
    assert abs(mean - 0.5) < 0.02 and abs(std - 1 / math.sqrt(12)) < 0.02
    y = torch.empty(N, device="tpu", dtype=dtype).uniform_(-3, 5)
    c = y.cpu().float()
    assert c.min() >= -3 and c.max() <= 5 and abs(c.mean().item() - 1) < 0.15


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_normal(dtype, no_fallbacks):
    mean, std = _moments(torch.randn(N, device="tpu", dtype=dtype))
    assert abs(mean) < 0.05 and abs(std - 1) < 0.05
    mean, std = _moments(torch.empty(N, device="tpu", dtype=dtype).normal_(3, 0.5))
    assert abs(mean - 3) < 0.05 and abs(std - 0.5) < 0.05


@pytest.mark.parametrize("dtype", [torch.complex64, torch.complex128])
def test_complex_rand_randn(dtype, no_fallbacks):
    """As on CPU: rand draws real and imag parts in [0, 1); randn's variance 1 splits over them."""
    u, n = torch.rand(N, 2, device="tpu", dtype=dtype), torch.randn(N, 2, device="tpu", dtype=dtype)
    for x, cpu in ((u, torch.rand(3, 2, dtype=dtype)), (n, torch.randn(3, 2, dtype=dtype))):
        assert x.dtype == cpu.dtype == dtype and x.shape == (N, 2)
    c = torch.view_as_real(u.cpu())
    assert c.min() >= 0 and c.max() < 1
    for part in (u.real, u.imag):
        mean, std = _moments(part)
        assert abs(mean - 0.5) < 0.02 and abs(std - 1 / math.sqrt(12)) < 0.02
    for part in (n.real, n.imag):
        mean, std = _moments(part)
        assert abs(mean) < 0.05 and abs(std - math.sqrt(0.5)) < 0.05
    assert not torch.equal(n.real.cpu(), n.imag.cpu())


@pytest.mark.parametrize("dtype", [torch.complex64, torch.complex128])
def test_complex_fills_draw_both_parts_as_cpu_does(dtype, no_fallbacks):
    """CPU fills a complex tensor through its real view: normal_'s mean goes to both parts, each
    with half the variance; uniform_'s bounds hold for both. Also a strided tensor (a transpose)
    and one whose storage is longer than it."""
    base = torch.empty(N // 50, 100, device="tpu", dtype=dtype)
    for x in (base, base.t(), base[:, 10:60]):
        x.normal_(2.0, 3.0)
        for part in (x.real, x.imag):
            mean, std = _moments(part)
            assert abs(mean - 2) < 0.15 and abs(std - 3 / math.sqrt(2)) < 0.15
        x.uniform_(-3, 5)
        parts = torch.view_as_real(x.cpu())
        assert parts.min() >= -3 and parts.max() < 5
        for part in (x.real, x.imag):
            assert abs(_moments(part)[0] - 1) < 0.15
    assert torch.view_as_real(base.cpu())[:, :10].abs().max() < 5  # outside the slice: the transpose's draw


def test_normal_tensor_overloads(no_fallbacks):
    m = torch.full((N,), 4.0, device="tpu")
    s = torch.full((N,), 0.25, device="tpu")
    for x, (em, es) in (
        (torch.normal(m, 2.0), (4, 2)),
        (torch.normal(-1.0, s), (-1, 0.25)),
        (torch.normal(m, s), (4, 0.25)),
    ):
        mean, std = _moments(x)
        assert x.shape == (N,) and abs(mean - em) < 0.06 * max(es, 1) and abs(std - es) < 0.05 * es
    assert torch.normal(0.0, 1.0, (3, 4), device="tpu").shape == (3, 4)


def test_other_distributions(no_fallbacks):
    x = torch.empty(N, device="tpu").exponential_(2.0).cpu()
    assert x.min() >= 0 and abs(x.mean().item() - 0.5) < 0.03
    x = torch.empty(N, device="tpu").geometric_(0.25).cpu()
    assert x.min() >= 1 and torch.equal(x, x.round()) and abs(x.mean().item() - 4) < 0.2
    x = torch.empty(N, device="tpu").log_normal_(0.0, 0.5).cpu()
    assert x.min() > 0 and abs(x.log().mean().item()) < 0.03 and abs(x.log().std().item() - 0.5) < 0.03
    x = torch.empty(N, device="tpu").cauchy_(2.0, 1.0).cpu()
    assert abs(x.median().item() - 2) < 0.1
    assert abs(((x > 1) & (x < 3)).float().mean().item() - 0.5) < 0.03  # half the mass within one sigma


@pytest.mark.parametrize("p", [0.0, 0.2, 0.5, 1.0])
def test_bernoulli(p, no_fallbacks):
    probs = torch.full((N,), p, device="tpu")
    for x in (
        torch.bernoulli(probs),
        torch.bernoulli(probs, p=p),
        torch.empty(N, device="tpu").bernoulli_(p),
        torch.zeros(N, dtype=torch.int64, device="tpu").bernoulli_(probs),
    ):
        c = x.cpu()
        assert set(c.unique().tolist()) <= {0, 1}
        assert abs(c.double().mean().item() - p) < 0.02
    varying = torch.bernoulli(torch.tensor([0.0, 1.0], device="tpu").repeat(N // 2)).cpu().view(-1, 2)
    assert varying[:, 0].sum() == 0 and varying[:, 1].sum() == N // 2


@pytest.mark.parametrize(
    "dtype", [torch.int64, torch.int32, torch.uint8, torch.int8, torch.float32, torch.bfloat16, torch.bool]
)
def test_random_integers(dtype, no_fallbacks):
    x = torch.randint(
        -3 if dtype not in (torch.uint8, torch.bool) else 0,
        2 if dtype == torch.bool else 7,
        (N,),
        device="tpu",
        dtype=dtype,
    ).cpu()
    assert x.dtype == dtype
    low = -3 if dtype not in (torch.uint8, torch.bool) else 0
    high = 2 if dtype == torch.bool else 7
    assert set(x.long().unique().tolist()) == set(range(low, high))
    y = torch.empty(N, dtype=dtype, device="tpu").random_(3 if dtype != torch.bool else 1).cpu()
    assert set(y.long().unique().tolist()) <= set(range(3))
    z = torch.empty(N, dtype=dtype, device="tpu").random_().cpu().double()
    top = {
        torch.int64: 2**63 - 1,
        torch.int32: 2**31 - 1,
        torch.uint8: 255,
        torch.int8: 127,
        torch.float32: 2**24,
        torch.bfloat16: 2**8,
        torch.bool: 1,
    }[dtype]
    assert z.min() >= 0 and z.max() <= top and z.max() > top / 2
    w = torch.empty(N, dtype=dtype, device="tpu").random_(1, None).cpu().double() if dtype != torch.bool else None
    if w is not None:
        assert w.min() >= 1
    same_range = torch.randint_like(torch.zeros(N, device="tpu"), 10).cpu()
    assert same_range.dtype == torch.float32 and set(same_range.unique().tolist()) == set(map(float, range(10)))


def test_randint_full_int64_range(no_fallbacks):
    x = torch.randint(-(2**63), 2**63 - 1, (N,), device="tpu").cpu()
    assert (x < 0).any() and (x > 0).any() and x.unique().numel() == N


@pytest.mark.parametrize("n", [1, 7, 100])
def test_randperm(n, no_fallbacks):
    for dtype in (torch.int64, torch.int32, torch.float32):
        p = torch.randperm(n, device="tpu", dtype=dtype)
        assert p.dtype == dtype
        assert torch.equal(p.cpu().sort().values.long(), torch.arange(n))


def test_multinomial(no_fallbacks):
    probs = torch.tensor([0.1, 0.0, 0.6, 0.3], device="tpu")
    draws = torch.multinomial(probs, N, replacement=True).cpu()
    assert draws.dtype == torch.int64 and draws.shape == (N,)
    freq = torch.bincount(draws, minlength=4).double() / N
    torch.testing.assert_close(freq, probs.cpu().double(), atol=0.02, rtol=0)
    picks = torch.multinomial(probs, 3).cpu()
    assert sorted(picks.tolist()) == [0, 2, 3]
    batch = torch.multinomial(torch.tensor([[1.0, 0, 0], [0, 0, 1.0]], device="tpu"), 4, replacement=True).cpu()
    assert torch.equal(batch, torch.tensor([[0] * 4, [2] * 4]))
    first = torch.stack([torch.multinomial(probs, 1) for _ in range(300)]).cpu()
    assert (first == 2).float().mean() > 0.45  # without replacement the first draw follows probs too


@pytest.mark.parametrize("p", [0.1, 0.5, 0.8])
def test_dropout(p, no_fallbacks):
    x = torch.ones(N, device="tpu")
    y = F.dropout(x, p, training=True).cpu()
    kept = y != 0
    assert abs(1 - kept.double().mean().item() - p) < 0.02
    torch.testing.assert_close(y[kept], torch.full((int(kept.sum()),), 1 / (1 - p)))
    assert torch.equal(F.dropout(x, p, training=False).cpu(), x.cpu())

    out, mask = torch.ops.aten.native_dropout(x, p, True)
    assert mask.dtype == torch.bool
    torch.testing.assert_close(out.cpu(), mask.cpu().float() / (1 - p))
    out, mask = torch.ops.aten.native_dropout(x, p, False)
    assert mask.cpu().all() and torch.equal(out.cpu(), x.cpu())


def test_dropout_backward(no_fallbacks):
    x = torch.randn(64, 32, device="tpu", requires_grad=True)
    y = F.dropout(x, 0.3, training=True)
    g = torch.randn(64, 32, device="tpu")
    y.backward(g)
    mask = (y != 0).cpu()
    torch.testing.assert_close(x.grad.cpu(), g.cpu() * mask / 0.7)
    grad = torch.ops.aten.native_dropout_backward(g, mask.to("tpu"), 2.0)
    torch.testing.assert_close(grad.cpu(), g.cpu() * mask * 2.0)


def test_dropout_modules_and_half_precision(no_fallbacks):
    m = torch.nn.Dropout(0.5).to("tpu")
    x = torch.ones(8, 128, device="tpu", dtype=torch.bfloat16)
    y = m(x)
    assert y.dtype == torch.bfloat16 and set(y.cpu().float().unique().tolist()) <= {0.0, 2.0}
    m.eval()
    assert torch.equal(m(x).cpu(), x.cpu())


RANDOM_DTYPE_ERRORS = [
    lambda x: x.uniform_(),
    lambda x: x.normal_(),
    lambda x: x.exponential_(),
    lambda x: x.log_normal_(),
    lambda x: x.cauchy_(),
    lambda x: torch.bernoulli(x),
    lambda x: torch.multinomial(x, 1),
    lambda x: torch.normal(x, 1.0),
    lambda x: torch.randperm(3, dtype=torch.bool, device=x.device),
]


@pytest.mark.parametrize("fn", RANDOM_DTYPE_ERRORS)
def test_random_dtype_errors(fn):
    """Integer inputs raise CPU's errors (and leave CPU's generator alone)."""
    x = torch.zeros(3, dtype=torch.int64)
    with pytest.raises(Exception) as cpu:
        fn(x)
    state = torch.get_rng_state()
    with pytest.raises(cpu.type):
        fn(x.to("tpu"))
    assert torch.equal(torch.get_rng_state(), state)


def test_like_samplers(no_fallbacks):
    x = torch.zeros(3, 5, device="tpu", dtype=torch.float64)
    for fn in (torch.rand_like, torch.randn_like, lambda t: torch.randint_like(t, 3, 9)):
        y = fn(x)
        assert y.shape == x.shape and y.dtype == x.dtype and y.device.type == "tpu"


def test_random_fills_of_new_shapes_compile_once_per_bucket():
    """torch.rand/randn/randint and in-place fills of small contiguous tensors draw into a buffer
    of the next power-of-two length (ops/random_fills.py): one executable per bucket, not per
    shape; the tensor keeps its exact shape and storage, and the same seed gives the same numbers."""
    import torch_tpu

    torch.manual_seed(0)
    first = torch.randn(5, 7, device="tpu")
    torch.manual_seed(0)
    again = torch.randn(5, 7, device="tpu")
    assert torch.equal(first.cpu(), again.cpu())
    assert first.untyped_storage().nbytes() == 35 * 4 and first.stride() == (7, 1)
    torch.testing.assert_close((first * 2 + 1).cpu(), first.cpu() * 2 + 1)

    before = torch_tpu.metrics.counters()
    drawn = []
    for n in range(33, 64):  # one bucket (64 elements) for each fill
        drawn.append(
            (
                torch.rand(n, device="tpu"),
                torch.randint(-3, 3, (n,), device="tpu", dtype=torch.int16),
                torch.empty(n, dtype=torch.bfloat16, device="tpu").uniform_(-2.0, 2.0),
            )
        )
    after = torch_tpu.metrics.counters()
    assert after["bucketed_random_fills"] - before.get("bucketed_random_fills", 0) == 3 * 31
    assert after["xla_compiles"] - before["xla_compiles"] <= 3  # one per fill, not one per shape
    for x, y, z in drawn:
        x, y, z = x.cpu(), y.cpu(), z.cpu()
        assert 0 <= x.min().item() and x.max().item() < 1
        assert -3 <= y.min().item() and y.max().item() < 3 and y.dtype == torch.int16
        assert z.abs().max().item() <= 2
    assert len({x[0].item() for x, _, _ in drawn}) > 1  # fresh numbers at each draw


def test_random_bounds_errors_and_warnings_as_cpu():
    def outcome(fn, device):
        import warnings

        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                fn(device)
            except Exception as e:
                return type(e), str(e)
        return [str(w.message).split(" (Triggered")[0] for w in caught if w.category is UserWarning]

    calls = [
        lambda d: torch.empty(4, dtype=torch.int8, device=d).random_(-300, 5),
        lambda d: torch.empty(4, dtype=torch.int16, device=d).random_(0, 2**40),
        lambda d: torch.empty(4, dtype=torch.int8, device=d).random_(300),
        lambda d: torch.empty(4, dtype=torch.float16, device=d).random_(5000, None),
        lambda d: torch.empty(4, dtype=torch.float32, device=d).random_(-(2**40), 5),
        lambda d: torch.empty(4, dtype=torch.complex64, device=d).random_(0, 5),
        lambda d: torch.empty(4, dtype=torch.float32, device=d).uniform_(2.0, 1.0),
        lambda d: torch.empty(4, dtype=torch.float32, device=d).uniform_(-3e38, 3e38),
        lambda d: torch.empty(4, dtype=torch.bfloat16, device=d).uniform_(-3.4e38, 0.0),
    ]
    for fn in calls:
        assert outcome(fn, "tpu") == outcome(fn, "cpu")


def test_random_fill_then_channels_last_copy():
    # Was: "required rank 4 tensor to use channels_last format" (test_nn test_upsamplingBiMode2d_consistency):
    # the clone of a tensor over a longer buffer ran over the flat buffer with the memory format.
    x = torch.randint(0, 256, (1, 3, 10, 10), dtype=torch.uint8, device="tpu")
    cl = x.contiguous(memory_format=torch.channels_last)
    want = x.cpu().contiguous(memory_format=torch.channels_last)
    assert cl.stride() == want.stride() and torch.equal(cl.cpu(), want)
    assert torch.equal(x.clone(memory_format=torch.contiguous_format).cpu(), x.cpu())
