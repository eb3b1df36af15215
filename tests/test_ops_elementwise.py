"""Pointwise lowerings (arithmetic, math, comparisons, bitwise, activations and
their backward ops) equal CPU: dtypes and promotion, broadcasting,
non-contiguous inputs, in-place and out= variants, errors and gradients."""

from __future__ import annotations

import zlib

import pytest
import torch
import torch.nn.functional as F

import torch_tpu
from tests.helpers import platform_rounding_tol, platform_tol, tol_for
from tests.helpers import same as _same

NAN, INF = float("nan"), float("inf")

# Ops a TPU computes with its transcendental units: float32 results up to ~2.2e-4 relative off CPU's.
TRANSCENDENTAL = {"exp", "log", "log2", "log10", "log1p", "logit", "tanh", "acosh", "asinh", "atanh", "pow", "xlogy"}
TRANSCENDENTAL |= {"expm1", "erfinv"}  # exp's; XLA's erfinv is a polynomial in log(1 - x**2)


def same(fn, *inputs, grad=False, transcendental=False, **tol):
    """tests.helpers.same; without explicit tolerances, bfloat16/float16 inputs get tol_for's.
    transcendental=True (fn's float results come from TRANSCENDENTAL ops): platform_tol widens
    the tolerances on a TPU, and only there."""
    tol = tol or tol_for(*inputs)
    return _same(fn, *inputs, grad=grad, **(platform_tol(tol) if transcendental else tol))


def make(shape, dtype, low=-3.0, high=3.0, nonzero=False):
    g = torch.Generator().manual_seed(zlib.crc32(repr((tuple(shape), dtype, low, high)).encode()))
    if dtype == torch.bool:
        return torch.ones(shape, dtype=torch.bool) if nonzero else torch.rand(shape, generator=g) > 0.5
    x = torch.empty(shape).uniform_(low, high, generator=g)
    if not dtype.is_floating_point:
        x = x.round()
        if nonzero:
            x = torch.where(x == 0, torch.ones_like(x), x)
    return x.to(dtype)


SPECIAL = torch.tensor([0.0, -0.0, 1.5, -2.5, 0.5, -0.5, 2.5, INF, -INF, NAN, 1e-30, 3.0])


# ---- unary ------------------------------------------------------------------

# name -> input range (None: the default range)
UNARY = {
    "abs": None,
    "neg": None,
    "sign": None,
    "sgn": None,
    "exp": None,
    "exp2": None,
    "expm1": None,
    "log": (0.1, 4),
    "log2": (0.1, 4),
    "log10": (0.1, 4),
    "log1p": (-0.9, 4),
    "sqrt": (0, 4),
    "rsqrt": (0.1, 4),
    "reciprocal": (0.5, 3),
    "sin": None,
    "cos": None,
    "tan": (-1.4, 1.4),
    "asin": (-0.99, 0.99),
    "acos": (-0.99, 0.99),
    "atan": None,
    "sinh": None,
    "cosh": None,
    "tanh": None,
    "asinh": None,
    "acosh": (1.01, 4),
    "atanh": (-0.99, 0.99),
    "sigmoid": None,
    "logit": (0.01, 0.99),
    "erf": None,
    "erfc": None,
    "erfinv": (-0.99, 0.99),
    "floor": None,
    "ceil": None,
    "round": None,
    "trunc": None,
    "frac": None,
    "sinc": None,
    "relu": None,
    "square": None,
    "positive": None,
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary_float(name, dtype):
    low, high = UNARY[name] or (-3.0, 3.0)
    same(getattr(torch, name), make((3, 5), dtype, low, high), transcendental=name in TRANSCENDENTAL)


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.uint8, torch.bool])
@pytest.mark.parametrize(
    "name", ["abs", "neg", "sign", "exp", "sqrt", "sin", "sigmoid", "floor", "round", "trunc", "reciprocal", "relu"]
)
def test_unary_integer_and_bool(name, dtype):
    """Integer ops keep their dtype; float functions of integers give the default float dtype."""
    x = make((4, 3), dtype, 0 if dtype == torch.uint8 else -5, 5)
    same(getattr(torch, name), x, transcendental=name in TRANSCENDENTAL)  # exp: a float result


@pytest.mark.parametrize(
    "fn",
    [
        torch.sign,
        torch.abs,
        torch.floor,
        torch.round,
        torch.isnan,
        torch.isinf,
        torch.isfinite,
        torch.isposinf,
        torch.isneginf,
        torch.nan_to_num,
        lambda x: torch.nan_to_num(x, nan=1.0, posinf=2.0, neginf=-2.0),
        torch.relu,
        torch.sigmoid,
        torch.exp,
        torch.sqrt,
        torch.frac,
        torch.trunc,
        torch.signbit,
    ],
)
def test_unary_special_values(fn):
    same(fn, SPECIAL, transcendental=fn is torch.exp)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64])
def test_isnan_family_and_nan_to_num_keep_dtype(dtype):
    x = make((3, 4), dtype)
    for fn in (torch.isnan, torch.isinf, torch.isfinite, torch.nan_to_num):
        same(fn, x)


@pytest.mark.parametrize("decimals", [0, 1, 2, -1])
def test_round_decimals(decimals):
    same(lambda x: torch.round(x, decimals=decimals), make((4, 4), torch.float32, -300, 300))


def test_logit_eps():
    same(lambda x: torch.logit(x, eps=0.1), make((10,), torch.float32, 0, 1), transcendental=True)


def test_unary_non_contiguous():
    base = make((6, 8), torch.float32)
    for view in (lambda x: x.t(), lambda x: x[1:, ::3], lambda x: x[2].expand(3, 8)):
        for fn in (torch.exp, torch.neg, torch.abs, torch.tanh):
            same(lambda x, fn=fn, view=view: fn(view(x)), base, transcendental=fn in (torch.exp, torch.tanh))


# ---- binary -----------------------------------------------------------------

DTYPE_PAIRS = [
    (torch.float32, torch.float32),
    (torch.bfloat16, torch.bfloat16),
    (torch.int64, torch.int64),
    (torch.int64, torch.float32),
    (torch.float16, torch.float32),
    (torch.bool, torch.int64),
    (torch.uint8, torch.int8),
    (torch.bool, torch.bool),
]

ARITHMETIC = {
    "add": torch.add,
    "add_alpha": lambda a, b: torch.add(a, b, alpha=2),
    "sub": torch.sub,
    "sub_alpha": lambda a, b: torch.sub(a, b, alpha=3),
    "rsub": torch.rsub,
    "mul": torch.mul,
    "div": torch.div,
    "div_trunc": lambda a, b: torch.div(a, b, rounding_mode="trunc"),
    "div_floor": lambda a, b: torch.div(a, b, rounding_mode="floor"),
    "floor_divide": torch.floor_divide,
    "remainder": torch.remainder,
    "fmod": torch.fmod,
    "pow": torch.pow,
    "maximum": torch.maximum,
    "minimum": torch.minimum,
    "fmax": torch.fmax,
    "fmin": torch.fmin,
    "atan2": torch.atan2,
    "hypot": torch.hypot,
    "copysign": torch.copysign,
    "xlogy": torch.xlogy,
    "eq": torch.eq,
    "ne": torch.ne,
    "lt": torch.lt,
    "le": torch.le,
    "gt": torch.gt,
    "ge": torch.ge,
    "logical_and": torch.logical_and,
    "logical_or": torch.logical_or,
    "logical_xor": torch.logical_xor,
    "bitwise_and": torch.bitwise_and,
    "bitwise_or": torch.bitwise_or,
    "bitwise_xor": torch.bitwise_xor,
}


def _operands(name, da, db):
    # b broadcasts; integers are nonzero as both are divisors (CPU raises ZeroDivisionError)
    a = make((3, 4), da, -6, 6, nonzero=True)
    b = make((4,), db, -6, 6, nonzero=True)
    if name == "pow":
        a = make((3, 4), da, -3, 3) if not da.is_floating_point else make((3, 4), da, 0.1, 3)
        b = make((4,), db, -2, 3)
    if name in ("xlogy", "hypot") and db.is_floating_point:
        b = b.abs()
    return a, b


@pytest.mark.parametrize("da,db", DTYPE_PAIRS, ids=lambda d: str(d).split(".")[1])
@pytest.mark.parametrize("name", sorted(ARITHMETIC))
def test_binary(name, da, db):
    a, b = _operands(name, da, db)
    # xlogy and float pow: transcendental; pow of integers is exact
    transcendental = name == "xlogy" or (name == "pow" and (da.is_floating_point or db.is_floating_point))
    same(ARITHMETIC[name], a, b, transcendental=transcendental)
    same(ARITHMETIC[name], b, a, transcendental=transcendental)


def test_floor_and_trunc_division_and_modulo_signs():
    a = torch.tensor([7, -7, 7, -7, 0, 5, -5, 6])
    b = torch.tensor([2, 2, -2, -2, 3, 5, 3, -4])
    for fn in (
        torch.floor_divide,
        torch.remainder,
        torch.fmod,
        lambda x, y: torch.div(x, y, rounding_mode="trunc"),
        lambda x, y: torch.div(x, y, rounding_mode="floor"),
        torch.div,
    ):
        same(fn, a, b)
        same(fn, a.double(), b.double())
    same(torch.floor_divide, torch.tensor([1.0, -1.0, 0.0, -0.0, 5.0]), torch.tensor([0.0, 0.0, 3.0, 2.0, -0.0]))
    same(torch.remainder, torch.tensor([1.0, -1.0, 5.5, -5.5, INF]), torch.tensor([0.0, 2.0, -2.0, 2.0, 1.0]))


def test_integer_pow():
    base = torch.tensor([2, -2, 3, 1, -1, 0, 7, -1, 5])
    exp = torch.tensor([3, 3, 40, -5, -3, 0, 63, -4, -1])
    same(torch.pow, base, exp)
    same(lambda b: b**3, base)
    same(lambda e: 2**e, exp.clamp(min=0))
    same(lambda b: b**-1, base)  # CPU: "Integers to negative integer powers are not allowed."
    small = torch.tensor([3, -3, 7, 2, 5], dtype=torch.int16)
    same(torch.pow, small, torch.tensor([200, 201, 1000, 15, 16], dtype=torch.int16))  # wraps like C
    same(torch.pow, small.to(torch.uint8), torch.tensor([9, 8, 77, 7, 3], dtype=torch.uint8))


@pytest.mark.parametrize("exponent", [0, 1, 2, 3, -1, -2, 0.5, -0.5, 1.7, -2.3])
def test_pow_scalar_exponents(exponent):
    same(lambda x: x**exponent, make((3, 4), torch.float32, 0.1, 3), transcendental=isinstance(exponent, float))
    same(lambda x: torch.pow(2.5, x), make((3, 4), torch.float32), transcendental=True)  # float exponents


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.uint8, torch.int8])
def test_shifts(dtype):
    a = make((3, 6), dtype, 0 if dtype == torch.uint8 else -50, 100)
    s = torch.tensor([0, 1, 3, 7, 8, 33]).to(dtype)
    for fn in (torch.bitwise_left_shift, torch.bitwise_right_shift, lambda x, y: x << y, lambda x, y: x >> y):
        same(fn, a, s)
    same(lambda x: x << 2, a)
    same(lambda x: x >> 1, a)
    same(lambda x: torch.bitwise_right_shift(64, x), s)


@pytest.mark.parametrize("dtype", [torch.int64, torch.uint8, torch.bool])
def test_bitwise_not_and_scalar_bitwise(dtype):
    x = make((3, 4), dtype, 0, 100)
    same(torch.bitwise_not, x)
    same(lambda x: x & 6, x)
    same(lambda x: x | 1, x)
    same(lambda x: x ^ 3, x)


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool])
def test_logical_not(dtype):
    same(torch.logical_not, make((3, 4), dtype))


def test_nan_semantics_of_min_max_and_clamp():
    a = torch.tensor([NAN, 1.0, NAN, -INF, 2.0])
    b = torch.tensor([1.0, NAN, NAN, 0.0, INF])
    for fn in (torch.maximum, torch.minimum, torch.fmax, torch.fmin, torch.eq, torch.lt, torch.ne):
        same(fn, a, b)
    same(lambda x: torch.clamp(x, -1, 1), a)
    same(lambda x: torch.clamp(x, min=NAN), b)
    same(lambda x, lo, hi: torch.clamp(x, lo, hi), a, b, torch.tensor([2.0, 2.0, 2.0, 2.0, NAN]))


# ---- scalars, promotion -----------------------------------------------------


def _two_to_the(x):
    return 2**x  # float x: pow, TRANSCENDENTAL


SCALAR_FNS = [
    lambda x: x + 2,
    lambda x: x + 2.5,
    lambda x: 2 - x,
    lambda x: x - True,
    lambda x: x * 3,
    lambda x: x * 0.5,
    lambda x: x / 3,
    lambda x: 1 / (x + 10),
    lambda x: x // 2,
    lambda x: x % 3,
    lambda x: x % -2.5,
    lambda x: x**2,
    _two_to_the,
    lambda x: x < 1.5,
    lambda x: x == 2,
    lambda x: x >= -1,
    lambda x: torch.add(x, 3, alpha=2),
    lambda x: torch.sub(x, 1.5, alpha=2),
    lambda x: torch.rsub(x, 2),
    lambda x: torch.maximum(x, torch.tensor(1)),
    lambda x: torch.fmod(x, 2),
    lambda x: torch.remainder(5, x + 10),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64, torch.int32, torch.uint8, torch.bool])
@pytest.mark.parametrize("fn", SCALAR_FNS)
def test_python_scalar_operands(fn, dtype):
    same(fn, make((2, 3), dtype, 0, 6), transcendental=fn is _two_to_the and dtype.is_floating_point)


def test_wrapped_integer_overflow_wraps_like_cpu():
    x = torch.tensor([1, 200, 255], dtype=torch.uint8)
    same(lambda t: t + 300, x)
    same(lambda t: t * 3, x)
    same(lambda t: torch.add(t, 300), x)


@pytest.mark.parametrize(
    "a,b",
    [
        (torch.float16, torch.float32),
        (torch.bfloat16, torch.float32),
        (torch.bfloat16, torch.float16),
        (torch.int64, torch.float32),
        (torch.int32, torch.float64),
        (torch.bool, torch.int64),
        (torch.bool, torch.float32),
        (torch.uint8, torch.int8),
        (torch.int8, torch.int64),
    ],
)
def test_promotion_result_dtype(a, b):
    x, y = make((2, 3), a, 0, 5), make((2, 3), b, 1, 5)
    fns = [torch.add, torch.mul, torch.div, torch.maximum, torch.eq, lambda p, q: torch.where(p > 2, p, q)]
    if torch.bool not in (a, b):
        fns.append(torch.sub)
    for fn in fns:
        assert same(fn, x, y).dtype == fn(x, y).dtype
        assert same(fn, y, x).dtype == fn(y, x).dtype


def test_cpu_zero_dim_operands():
    x = make((3,), torch.float32)
    i = make((3,), torch.int64)
    for scalar in (torch.tensor(2.5), torch.tensor(3), torch.tensor(2.5, dtype=torch.float64), torch.tensor(True)):
        for t in (x, i):
            got = same(lambda t, s=scalar: t + s, t)  # the CPU scalar stays on CPU
            assert got.dtype == (t + scalar).dtype
            same(lambda t, s=scalar: torch.mul(s, t), t)
            same(lambda t, s=scalar: torch.where(t > 0, t, s), t)


def test_tpu_zero_dim_operands():
    x = make((3,), torch.int32)
    same(lambda t, s: t + s, x, torch.tensor(2.5, dtype=torch.float64))
    same(lambda t, s: t * s, x, torch.tensor(7, dtype=torch.int64))
    same(lambda t, s: t + s, make((3,), torch.float16), torch.tensor(2.5, dtype=torch.float64))


def test_true_division_of_integers_uses_default_dtype():
    a, b = torch.tensor([7, -7, 1]), torch.tensor([2, 2, 3])
    assert same(torch.div, a, b).dtype == torch.float32
    prev = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        assert same(torch.div, a, b).dtype == torch.float64
        assert same(lambda t: t * 0.5, a).dtype == torch.float64
    finally:
        torch.set_default_dtype(prev)


# ---- ternary and selection --------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_lerp_addcmul_addcdiv(dtype):
    a, b = make((3, 4), dtype), make((4,), dtype)
    w = make((3, 1), dtype, 0, 1)
    same(torch.lerp, a, b, w, grad=dtype == torch.float32)
    same(lambda p, q: torch.lerp(p, q, 0.3), a, b)
    same(lambda p, q: torch.lerp(p, q, 0.8), a, b)
    c = make((3, 4), dtype, 1, 3)
    same(lambda x, y, z: torch.addcmul(x, y, z, value=0.5), a, b, c, grad=dtype == torch.float32)
    same(lambda x, y, z: torch.addcdiv(x, y, z, value=-2), a, b, c, grad=dtype == torch.float32)


def test_division_of_bools():
    a, b = make((3, 4), torch.bool), make((4,), torch.bool)
    same(torch.div, a, b)
    same(torch.div, b, a)


def test_addcmul_integers_and_addcdiv_error():
    a, b, c = make((3,), torch.int64), make((3,), torch.int64), make((3,), torch.int64, 1, 4)
    same(lambda x, y, z: torch.addcmul(x, y, z, value=2), a, b, c)
    same(torch.addcdiv, a, b, c)  # CPU: integer division with addcdiv is no longer supported


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool, torch.bfloat16])
def test_where_and_masked_fill(dtype):
    cond = make((3, 4), torch.bool)
    x, y = make((3, 4), dtype), make((4,), dtype)
    same(torch.where, cond, x, y)
    same(lambda c, p: torch.where(c, p, 0), cond, x)
    same(lambda c, p: torch.where(c, 1.5, p), cond, x)
    same(lambda p, c: p.masked_fill(c, 7), x, cond)
    same(lambda p, c: p.masked_fill(c, 2.75), x, cond)
    same(lambda p, c: p.masked_fill(c, torch.tensor(3)), x, cond)
    same(lambda p, c, v: p.masked_fill(c, v), x, cond, torch.tensor(5).to(dtype))
    same(lambda p, c: p.masked_fill(c[0], -1), x, cond)  # broadcast mask


def test_where_and_masked_fill_grad():
    cond = make((3, 4), torch.bool)
    same(
        lambda x, y: torch.where(cond.to(x.device), x, y),
        make((3, 4), torch.float32),
        make((3, 4), torch.float32),
        grad=True,
    )
    same(lambda x: x.masked_fill(cond.to(x.device), 0.0), make((3, 4), torch.float32), grad=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bfloat16])
def test_clamp_variants(dtype):
    x = make((3, 4), dtype, -5, 5)
    same(lambda t: torch.clamp(t, -1, 2), x)
    same(lambda t: torch.clamp(t, min=0), x)
    same(lambda t: torch.clamp(t, max=1), x)
    same(lambda t: torch.clamp(t, 2, -1), x)  # min > max gives max
    same(lambda t: torch.clamp(t, -1.5, 2.5), x)  # float bounds promote integer tensors
    same(lambda t: t.clamp_min(1), x)
    same(lambda t: t.clamp_max(-1), x)
    lo, hi = make((4,), dtype, -4, 0), make((3, 1), dtype, 0, 4)
    same(torch.clamp, x, lo, hi)
    same(lambda t, m: torch.clamp(t, min=m), x, lo)
    same(lambda t, m: torch.clamp(t, max=m), x, hi)
    same(torch.clamp_min, x, lo)
    same(torch.clamp_max, x, hi)


def test_heaviside_nan_to_num_sinc_copysign():
    x = torch.tensor([-1.5, 0.0, 2.0, NAN, -0.0])
    same(torch.heaviside, x, torch.tensor([0.5]))
    same(torch.heaviside, torch.tensor([-2, 0, 3]), torch.tensor([7, 7, 7]))
    same(torch.copysign, x, torch.tensor([-1.0, -0.0, 1.0, -1.0, 1.0]))
    same(lambda t: torch.copysign(t, -1), torch.tensor([1, -2, 3]))
    same(torch.xlogy, torch.tensor([0.0, 0.0, 2.0, 1.0]), torch.tensor([0.0, NAN, 3.0, 0.0]), transcendental=True)
    same(lambda t: torch.xlogy(2.0, t), torch.tensor([1.0, 2.0]), transcendental=True)
    same(lambda t: torch.xlogy(t, 3), torch.tensor([1.0, 2.0]), transcendental=True)


# ---- in-place and out= ------------------------------------------------------


def test_inplace_on_view_changes_base():
    cpu = make((4, 6), torch.float32)
    y = make((3,), torch.float32)

    def run(base, y):
        base = base.clone()
        view = base[1:, ::2]
        view.add_(y)
        view.mul_(2).sub_(1)
        base[0].clamp_(-0.5, 0.5)
        base.t()[::2].exp_()
        return base

    same(run, cpu, y, transcendental=True)  # exp_


@pytest.mark.parametrize(
    "method",
    [
        "add_",
        "sub_",
        "mul_",
        "div_",
        "pow_",
        "remainder_",
        "fmod_",
        "maximum",
        "clamp_",
        "copysign_",
        "atan2_",
        "hypot_",
        "lerp_",
        "eq_",
        "lt_",
        "logical_and_",
        "floor_divide_",
    ],
)
def test_inplace_methods(method):
    def run(x, y):
        x = x.clone()
        if method == "lerp_":
            r = x.lerp_(y, 0.25)
        elif method == "clamp_":
            r = x.clamp_(-1, 1)
        else:
            r = getattr(x, method)(y)
        return x, r

    x, y = make((3, 4), torch.float32, 0.5, 3), make((4,), torch.float32, 0.5, 3)
    same(run, x, y, transcendental=method.rstrip("_") in TRANSCENDENTAL)


@pytest.mark.parametrize(
    "method", ["exp_", "neg_", "abs_", "sigmoid_", "tanh_", "relu_", "sqrt_", "floor_", "round_", "zero_", "sign_"]
)
def test_unary_inplace_on_non_contiguous_view(method):
    def run(x):
        x = x.clone()
        getattr(x.t()[1:], method)()
        return x

    same(run, make((4, 3), torch.float32, 0.1, 3), transcendental=method.rstrip("_") in TRANSCENDENTAL)


def test_inplace_integer_ops():
    def run(x):
        x = x.clone()
        x.add_(3).mul_(2).floor_divide_(3).remainder_(5).bitwise_xor_(1).__ilshift__(1)
        return x

    same(run, make((3, 4), torch.int64, -9, 9))


def test_inplace_type_errors():
    same(lambda x: x.add_(1.5), make((3,), torch.int64))  # result type Float can't be cast to Long
    same(lambda x, y: x.mul_(y), make((3,), torch.int64), make((3,), torch.float32))
    same(lambda x, y: x.add_(y), make((3,), torch.float32), make((2, 3), torch.float32))  # not broadcastable back
    same(lambda x: x.div_(2), make((3,), torch.int64))
    same(lambda x: x.exp_(), make((3,), torch.int64))
    same(lambda x, y, z: x.addcmul_(y, z), make((3,), torch.int64), make((3,), torch.float32), make((3,), torch.int64))
    same(lambda x: x.mul_(2.5), make((3,), torch.int64))


def test_inplace_promotes_within_category():
    def run(x, y):
        x = x.clone()
        x.add_(y).mul_(1.5)  # float32 += float64, bf16 operands are cast to self's dtype
        return x

    same(run, make((3,), torch.float32), make((3,), torch.float64))
    same(run, make((3,), torch.bfloat16), make((3,), torch.float32))


def test_out_variants():
    a, b = make((3, 4), torch.float32), make((4,), torch.float32, 0.5, 2)

    def run(a, b, out_dtype=torch.float32, shape=(3, 4)):
        out = torch.empty(shape, dtype=out_dtype, device=a.device)
        r = torch.add(a, b, alpha=2, out=out)
        assert r is out
        return out

    same(run, a, b)
    same(lambda a, b: run(a, b, torch.float64), a, b)  # computed in float32, written as float64
    same(lambda a, b: run(a, b, torch.int64), a, b)  # CPU: result type Float can't be cast to Long
    same(lambda a, b: run(a, b, shape=(0,)), a, b)  # an empty out is resized

    def cmp(a, b):
        out = torch.empty(3, 4, dtype=torch.float32, device=a.device)
        torch.lt(a, b, out=out)
        o3 = torch.empty(3, 4, dtype=torch.int64, device=a.device)
        torch.floor_divide(a.long(), 2, out=o3)
        return out, o3

    def exp(a):
        out = torch.empty(3, 4, device=a.device)
        torch.exp(a, out=out)
        return out

    same(cmp, a, b)
    same(exp, a, transcendental=True)


def test_out_into_a_view():
    def run(a, b):
        base = torch.zeros(4, 8, device=a.device)
        torch.mul(a, b, out=base[:3, ::2])
        torch.sigmoid(a, out=base[3:].view(2, 4))
        return base

    same(run, make((3, 4), torch.float32), make((4,), torch.float32))


def test_shape_and_device_errors():
    same(torch.add, make((3, 4), torch.float32), make((3, 5), torch.float32))
    same(torch.mul, make((2, 3), torch.float32), make((4, 1, 2), torch.float32))
    same(lambda x, y: x - y, make((3,), torch.bool), make((3,), torch.bool))  # bool subtraction
    same(lambda x: -x, make((3,), torch.bool))
    same(lambda x, y: torch.bitwise_and(x, y), make((3,), torch.float32), make((3,), torch.float32))
    same(lambda x: x << 1, make((3,), torch.float32))
    with pytest.raises(RuntimeError):
        torch.ones(3, device="tpu") + torch.ones(3)  # cpu tensor with dims


# ---- activations and their backward ops -------------------------------------

ACTIVATIONS = {
    "relu": F.relu,
    "relu6": F.relu6,
    "threshold": lambda x: F.threshold(x, 0.5, -2.0),
    "leaky_relu": lambda x: F.leaky_relu(x, 0.1),
    "elu": F.elu,
    "elu_alpha": lambda x: F.elu(x, alpha=0.7),
    "selu": F.selu,
    "celu": lambda x: F.celu(x, alpha=1.3),
    "hardtanh": lambda x: F.hardtanh(x, -0.5, 1.5),
    "hardsigmoid": F.hardsigmoid,
    "hardswish": F.hardswish,
    "softplus": F.softplus,
    "softplus_beta": lambda x: F.softplus(x, beta=2.0, threshold=3.0),
    "mish": F.mish,
    "gelu": F.gelu,
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "silu": F.silu,
    "sigmoid": torch.sigmoid,
    "tanh": torch.tanh,
    "logit": lambda x: torch.logit(x.sigmoid()),
    "logit_eps": lambda x: torch.logit(x.sigmoid(), eps=0.2),
    "softsign": F.softsign,
    "tanhshrink": F.tanhshrink,
}


# Built on tanh, log or log1p (TRANSCENDENTAL; 1 + tanh and x - tanh(x) cancel its leading bits).
# The ones built on exp (elu, selu, celu, silu, sigmoid, gelu) give factors below 1, whose TPU
# last-bit differences stay within the default tolerances.
TANH_OR_LOG = {"gelu_tanh", "logit", "logit_eps", "mish", "softplus", "softplus_beta", "tanh", "tanhshrink"}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name", sorted(ACTIVATIONS))
def test_activation_forward_backward(name, dtype):
    x = make((4, 5), dtype, -4, 4)
    transcendental = name in TANH_OR_LOG
    same(ACTIVATIONS[name], x, grad=dtype == torch.float32, transcendental=transcendental)
    same(ACTIVATIONS[name], x.t(), transcendental=transcendental)


@pytest.mark.parametrize(
    "name", ["relu", "leaky_relu", "elu", "hardtanh", "hardsigmoid", "hardswish", "silu", "mish", "gelu", "threshold"]
)
def test_activation_inplace(name):
    fns = {
        "relu": F.relu_,
        "leaky_relu": lambda x: F.leaky_relu_(x, 0.2),
        "elu": lambda x: F.elu_(x),
        "hardtanh": lambda x: F.hardtanh_(x),
        "hardsigmoid": lambda x: F.hardsigmoid(x, inplace=True),
        "hardswish": lambda x: F.hardswish(x, inplace=True),
        "silu": lambda x: F.silu(x, inplace=True),
        "mish": lambda x: F.mish(x, inplace=True),
        "gelu": lambda x: x.copy_(F.gelu(x)),
        "threshold": lambda x: F.threshold_(x, 0.1, 9.0),
    }

    def run(x):
        x = x.clone()
        fns[name](x[1:])
        return x

    same(run, make((4, 5), torch.float32, -4, 4), transcendental=name in TANH_OR_LOG)


UNARY_GRAD = [
    "exp",
    "exp2",
    "expm1",
    "sin",
    "cos",
    "tan",
    "atan",
    "sinh",
    "cosh",
    "tanh",
    "asinh",
    "sigmoid",
    "erf",
    "erfc",
    "abs",
    "neg",
    "sign",
    "sgn",
    "floor",
    "round",
    "trunc",
    "frac",
    "sinc",
    "square",
    "relu",
]


@pytest.mark.parametrize("name", UNARY_GRAD)
def test_unary_backward(name):
    same(getattr(torch, name), make((3, 4), torch.float32), grad=True, transcendental=name in TRANSCENDENTAL)


@pytest.mark.parametrize(
    "name,low,high",
    [
        ("log", 0.1, 3),
        ("log2", 0.1, 3),
        ("log10", 0.1, 3),
        ("log1p", -0.5, 3),
        ("sqrt", 0.1, 3),
        ("rsqrt", 0.1, 3),
        ("reciprocal", 0.5, 3),
        ("asin", -0.9, 0.9),
        ("acos", -0.9, 0.9),
        ("acosh", 1.1, 3),
        ("atanh", -0.9, 0.9),
        ("erfinv", -0.9, 0.9),
        ("logit", 0.1, 0.9),
    ],
)
def test_unary_backward_domain(name, low, high):
    x = make((3, 4), torch.float32, low, high)
    same(getattr(torch, name), x, grad=True, transcendental=name in TRANSCENDENTAL)


@pytest.mark.parametrize(
    "name",
    [
        "add",
        "sub",
        "mul",
        "div",
        "pow",
        "maximum",
        "minimum",
        "atan2",
        "hypot",
        "remainder",
        "fmod",
        "copysign",
        "xlogy",
        "fmax",
        "fmin",
    ],
)
def test_binary_backward(name):
    a, b = make((3, 4), torch.float32, 0.5, 3), make((3, 4), torch.float32, 0.5, 3)
    same(getattr(torch, name), a, b, grad=True, transcendental=name in TRANSCENDENTAL)
    same(getattr(torch, name), a.t(), b, grad=True, transcendental=name in TRANSCENDENTAL)


def test_broadcast_backward():
    same(lambda a, b: a * b + a / b - b, make((3, 4), torch.float32), make((4,), torch.float32, 0.5, 2), grad=True)


def test_scalar_op_backward():
    same(
        lambda x: (x * 3 + 2) ** 2 / 4 - torch.clamp(x, -1, 1) + x.clamp(min=0.5),
        make((3, 4), torch.float32),
        grad=True,
    )
    same(lambda x: torch.pow(2.0, x) + x**0.5 + torch.rsub(x, 1.0), make((5,), torch.float32, 0.2, 2), grad=True)


def test_backward_ops_directly():
    g, x = make((3, 4), torch.float32), make((3, 4), torch.float32, -4, 4)
    a = torch.ops.aten
    same(lambda g, x: a.threshold_backward(g, x, 0.5), g, x)
    same(lambda g, x: a.gelu_backward(g, x), g, x)
    same(lambda g, x: a.gelu_backward(g, x, approximate="tanh"), g, x, transcendental=True)  # tanh
    same(lambda g, y: a.sigmoid_backward(g, y), g, x.sigmoid())
    same(lambda g, y: a.tanh_backward(g, y), g, x.tanh())
    same(lambda g, x: a.leaky_relu_backward(g, x, 0.1, False), g, x)
    same(lambda g, x: a.elu_backward(g, 1.0, 1.0, 1.0, False, x), g, x)
    same(lambda g, y: a.elu_backward(g, 0.5, 1.2, 1.0, True, y), g, F.elu(x, 0.5) * 1.2)
    same(lambda g, x: a.hardtanh_backward(g, x, -1.0, 1.0), g, x)
    same(lambda g, x: a.softplus_backward(g, x, 1.0, 20.0), g, x)
    same(lambda g, x: a.hardsigmoid_backward(g, x), g, x)
    same(lambda g, x: a.hardswish_backward(g, x), g, x)
    same(lambda g, x: a.logit_backward(g, x), g, x.sigmoid())
    same(lambda g, x: a.logit_backward(g, x, 0.3), g, x.sigmoid())
    same(lambda g, x: a.silu_backward(g, x), g, x)
    same(lambda g, x: a.mish_backward(g, x), g, x, transcendental=True)  # tanh, log1p


def test_compiles_once_per_signature():
    x = torch.randn(3, 4, device="tpu")
    torch.add(x, x)
    torch_tpu.metrics.reset()
    for _ in range(3):
        torch.add(x, x)
        x + 2.5  # wrapped numbers are traced, not baked in
        x + 3.5
    counters = torch_tpu.metrics.counters()
    assert counters["op_compiles"] <= 1
    assert counters["op_cache_hits"] >= 5


@pytest.mark.parametrize(
    "fn",
    [
        lambda a, b: a // b,
        lambda a, b: a % b,
        lambda a, b: torch.fmod(a, b),
        lambda a, b: torch.div(a, b, rounding_mode="trunc"),
        lambda a, b: a // 0,
        lambda a, b: 7 % b,
    ],
)
def test_integer_division_by_zero_raises_like_cpu(fn):
    a, b = torch.tensor([5, -7, 9]), torch.tensor([2, 0, 3])
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        fn(a, b)
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        fn(a.to("tpu"), b.to("tpu"))


def test_integer_division_by_nonzero_matches_cpu():
    a, b = torch.tensor([5, -7, 9]), torch.tensor([2, -3, 4])
    for fn in (lambda a, b: a // b, lambda a, b: a % b, lambda a, b: torch.fmod(a, b)):
        torch.testing.assert_close(fn(a.to("tpu"), b.to("tpu")).cpu(), fn(a, b))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_division_by_a_scalar_or_broadcast_rounds_as_cpu(dtype):
    """XLA would divide by a broadcast divisor as a product by its reciprocal (an ulp off for
    about one element in five): every quotient must be CPU's, bit for bit. Except on a TPU, whose
    own division is not correctly rounded (XLA:TPU refines a reciprocal: t / 3.3 differed from
    CPU's on a v5e), and whose float64 is float32 pairs (48 bits: 3.3 is rounded once more)."""
    x = (torch.randn(20000, generator=torch.Generator().manual_seed(0)) * 10).to(dtype)
    row = torch.arange(1, 101, dtype=dtype)
    cases = {
        "python scalar": lambda t, r: t / 3.3,
        "0-dim tensor": lambda t, r: t / torch.tensor(3.3, dtype=dtype, device=t.device),
        "row broadcast": lambda t, r: t.reshape(200, 100) / r,
        "in place": lambda t, r: t.clone().div_(3.3),
        "foreach": lambda t, r: torch._foreach_div([t], 3.3)[0],
    }
    tol = platform_rounding_tol(dtype, roundings=2 if dtype == torch.float64 else 1)
    for name, fn in cases.items():
        torch.testing.assert_close(fn(x.to("tpu"), row.to("tpu")).cpu(), fn(x, row), **tol, msg=name)
