"""Lowerings with a TPU form (jax's rules registered for TPU in platforms/tpu/x64_types.py),
checked without a chip: lowered for TPU here, the module holds none of what
XLA:TPU cannot compile; the TPU forms' arithmetic runs on the CPU client; and the ops on the tpu
device match CPU (on a TPU in the lane)."""

from __future__ import annotations

import itertools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

import torch_tpu  # noqa: F401
from tests.helpers import platform_rounding_tol
from torch_tpu.ops.lowerings import factories, grouped_mm, histogram, linalg
from torch_tpu.platforms.tpu import x64_types


def _lowered(fn, *avals, platform: str) -> str:
    return jax.jit(fn).trace(*avals).lower(lowering_platforms=(platform,)).as_text()


def test_int64_matmul_has_no_dot_on_tpu():
    a, b = jax.ShapeDtypeStruct((4, 5), jnp.int64), jax.ShapeDtypeStruct((5, 3), jnp.int64)
    assert "dot_general" not in _lowered(linalg.matmul, a, b, platform="tpu")
    assert "dot_general" in _lowered(linalg.matmul, a, b, platform="cpu")
    small = jax.ShapeDtypeStruct((4, 5), jnp.int32)
    assert "dot_general" in _lowered(linalg.matmul, small, jax.ShapeDtypeStruct((5, 3), jnp.int32), platform="tpu")


def test_float64_lu_has_no_xla_lu_on_tpu():
    a64, a32 = jax.ShapeDtypeStruct((2, 3, 3), jnp.float64), jax.ShapeDtypeStruct((2, 3, 3), jnp.float32)
    assert "LuDecomposition" not in _lowered(linalg._lu, a64, platform="tpu")
    assert "LuDecomposition" in _lowered(linalg._lu, a32, platform="tpu")  # XLA:TPU's own, where it has one


@pytest.mark.parametrize(
    "a,b", [((16, 32), (4, 32, 16)), ((4, 8, 32), (32, 16)), ((8, 16), (16, 24)), ((4, 8, 32), (4, 32, 16))]
)
def test_half_precision_grouped_mm_asks_no_highest_precision(a, b):
    """XLA:TPU's ragged_dot kernel rejects HIGHEST on bfloat16 operands (Mosaic "Bad lhs type" on the
    chip, 7b3f6d2); float32 keeps it (CPU's kernel is exact)."""
    offs = jax.ShapeDtypeStruct((4,), jnp.int32) if len(a) + len(b) < 6 else None
    for dtype, highest in ((jnp.bfloat16, False), (jnp.float16, False), (jnp.float32, True)):
        avals = [jax.ShapeDtypeStruct(a, dtype), jax.ShapeDtypeStruct(b, dtype)]
        text = _lowered(lambda x, y, o: grouped_mm._grouped_mm(x, y, o), *avals, offs, platform="tpu")
        assert ("HIGHEST" in text) == highest, (dtype, text[-600:])


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
def test_half_precision_steps_round_explicitly(dtype):
    """histc's bins and linspace round after every step as c10's half types do, by reduce_precision:
    XLA:TPU folds a convert pair away (histc's bfloat16 bins differed from CPU's on the chip)."""
    x = jax.ShapeDtypeStruct((500,), dtype)
    lo, hi = jnp.float32(-1), jnp.float32(1)
    bins = _lowered(lambda v: histogram._bin_float(v, lo, hi, 7)[0], x, platform="tpu")
    assert bins.count("reduce_precision") >= 4
    steps = _lowered(lambda: factories._linspace_values(-1.0, 2.0, 9, np.dtype(dtype)), platform="tpu")
    assert "reduce_precision" in steps


@pytest.mark.parametrize("shape", [(4, 4), (2, 5, 3), (3, 2, 4)])
def test_lu_by_rows_is_laxs(shape):
    a = jnp.asarray(np.random.default_rng(1).standard_normal(shape))
    for got, want in zip(x64_types.lu_by_rows(a), jax.lax.linalg.lu(a)):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-12, atol=1e-12)


def test_int64_products_and_float64_det_on_the_device(no_fallbacks):
    x, y = torch.randint(-1000, 1000, (6, 7)), torch.randint(-1000, 1000, (7, 5))
    c = torch.randint(-9, 9, (6, 5))
    for fn in (
        torch.mm,
        lambda a, b: torch.addmm(c.to(a.device), a, b, beta=2, alpha=3),
        lambda a, b: torch.addbmm(c.to(a.device), a.expand(2, 6, 7), b.expand(2, 7, 5)),
        lambda a, b: a[0] @ b,
    ):
        assert torch.equal(fn(x.to("tpu"), y.to("tpu")).cpu(), fn(x, y))
    m = torch.randn(3, 4, 4, dtype=torch.float64)
    torch.testing.assert_close(torch.linalg.det(m.to("tpu")).cpu(), torch.linalg.det(m), rtol=1e-12, atol=1e-12)


def _operand_types(module: str, op: str) -> str:
    """The `(operand types) -> result` signature of the first `op` in `module`'s text."""
    rest = module[module.index(f'"stablehlo.{op}"') :]
    signature = rest[rest.index(" : (") :]
    return signature[: signature.index("\n")]


def test_gathers_and_scatters_take_int32_indices():
    """TPUs have no 64-bit integer units: torch's int64 indices become int32 (after their int64
    range check) for embedding's gather (index_select), its backward's scatter, gather, scatter,
    advanced indexing and index_put."""
    from torch_tpu.ops.lowerings import embedding, indexing

    table, grads = jax.ShapeDtypeStruct((50, 16), jnp.float32), jax.ShapeDtypeStruct((4, 8, 16), jnp.float32)
    index = jax.ShapeDtypeStruct((4, 8), jnp.int64)
    forward = _lowered(lambda x, i: indexing.index_select(x, 0, i), table, index, platform="tpu")
    backward = _lowered(
        lambda g, i: embedding.embedding_dense_backward(g, i, 50, -1, False), grads, index, platform="tpu"
    )
    dim_gather = _lowered(lambda x, i: indexing.gather(x, 1, i), table, index, platform="tpu")
    dim_scatter = _lowered(lambda x, i: indexing.scatter_add(x, 1, i, x[:4, :8]), table, index, platform="tpu")
    advanced = _lowered(lambda x, i: indexing._index(x, [i]), table, index, platform="tpu")
    put = _lowered(lambda x, i: indexing.put_values(x, [i], 1.0, accumulate=True), table, index, platform="tpu")
    for signature in (
        _operand_types(forward, "gather"),
        _operand_types(backward, "scatter"),
        _operand_types(dim_gather, "gather"),
        _operand_types(dim_scatter, "scatter"),
        _operand_types(advanced, "gather"),
        _operand_types(put, "scatter"),
    ):
        assert "xi32>" in signature and "xi64>" not in signature, signature
    assert "stablehlo.select" not in forward  # no out-of-bounds fill over the result


def test_embedding_forward_and_backward_on_the_device(no_fallbacks):
    table = torch.randn(50, 16, requires_grad=True)
    index = torch.randint(0, 50, (4, 8))
    expected = torch.nn.functional.embedding(index, table)
    expected.square().sum().backward()
    tpu_table = table.detach().to("tpu").requires_grad_()
    got = torch.nn.functional.embedding(index.to("tpu"), tpu_table)
    got.square().sum().backward()
    assert torch.equal(got.detach().cpu(), expected.detach())
    torch.testing.assert_close(tpu_table.grad.cpu(), table.grad)


# What XLA:TPU aborts the process compiling: a convert to or from complex128, a complex128 abs.
_COMPLEX128_CONVERT_OR_ABS = re.compile(r"stablehlo\.(convert|abs)\b.*complex<f64>")
_CONVERSIONS = [
    (jnp.complex64, jnp.complex128),
    (jnp.complex128, jnp.complex64),
    *((source, jnp.complex128) for source in (jnp.float32, jnp.float64, jnp.int32, jnp.int64, jnp.bool_)),
    *((jnp.complex128, target) for target in (jnp.float32, jnp.float64, jnp.int64, jnp.bool_)),
]


@pytest.mark.filterwarnings("ignore:Casting complex values to real")  # jax's ComplexWarning
@pytest.mark.parametrize("source, target", _CONVERSIONS)
def test_complex128_conversions_lower_for_tpu_from_float64_parts(source, target):
    operand = jax.ShapeDtypeStruct((2, 3), source)
    convert = lambda x: jax.lax.convert_element_type(x, target)
    tpu = _lowered(convert, operand, platform="tpu")
    assert not _COMPLEX128_CONVERT_OR_ABS.search(tpu), tpu
    if jnp.issubdtype(target, jnp.complexfloating):  # jax's own convert, on the CPU client
        assert _COMPLEX128_CONVERT_OR_ABS.search(_lowered(convert, operand, platform="cpu"))


def test_complex128_abs_lowers_for_tpu_from_float64_parts():
    operand = jax.ShapeDtypeStruct((2, 3), jnp.complex128)
    assert not _COMPLEX128_CONVERT_OR_ABS.search(_lowered(jnp.abs, operand, platform="tpu"))
    assert _COMPLEX128_CONVERT_OR_ABS.search(_lowered(jnp.abs, operand, platform="cpu"))


def test_other_dtypes_keep_jaxs_rules_on_tpu():
    complex64 = jax.ShapeDtypeStruct((2, 3), jnp.complex64)
    assert "stablehlo.abs %arg0 : (tensor<2x3xcomplex<f32>>)" in _lowered(jnp.abs, complex64, platform="tpu")
    widen = _lowered(lambda x: x.astype(jnp.complex64), jax.ShapeDtypeStruct((2, 3), jnp.float32), platform="tpu")
    assert "stablehlo.convert %arg0 : (tensor<2x3xf32>) -> tensor<2x3xcomplex<f32>>" in widen


_INF, _NAN = np.inf, np.nan
_PARTS = [0.0, -0.0, 1.5, -2.25, 3.0e38, -1.0e-300, 1.0e300, _INF, -_INF, _NAN]
_VALUES = {
    jnp.complex64: np.array([complex(a, b) for a, b in itertools.product(_PARTS[:5] + _PARTS[7:], repeat=2)]),
    jnp.complex128: np.array([complex(a, b) for a, b in itertools.product(_PARTS, repeat=2)]),
    jnp.float32: np.array(_PARTS[:5] + _PARTS[7:], np.float32),
    jnp.float64: np.array(_PARTS),
    jnp.int32: np.array([0, -1, 7, 2**31 - 1, -(2**31)], np.int32),
    jnp.int64: np.array([0, -1, 7, 2**62 + 1, -(2**63)], np.int64),
    jnp.bool_: np.array([True, False]),
}


def _on_cpu(fn, value):
    """`fn(value)` compiled for and run on the CPU client (in the TPU lane too)."""
    return np.asarray(jax.jit(fn)(jax.device_put(value, jax.devices("cpu")[0])))


def _assert_same_numbers(got, want):
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)
    if got.dtype.kind in "fc":  # -0.0 kept
        assert np.array_equal(np.signbit(got.real), np.signbit(want.real))
        assert np.array_equal(np.signbit(got.imag), np.signbit(want.imag))


@pytest.mark.filterwarnings("ignore:Casting complex values to real")  # jax's ComplexWarning
@pytest.mark.parametrize("source, target", _CONVERSIONS)
def test_complex128_conversions_from_parts_are_jaxs(source, target):
    value = _VALUES[source].astype(source)
    with np.errstate(all="ignore"):
        got = _on_cpu(lambda x: x64_types.converted(x, target), value)
        want = _on_cpu(lambda x: jax.lax.convert_element_type(x, target), value)
    _assert_same_numbers(got, want)


def test_complex128_abs_from_parts_is_hypot():
    value = _VALUES[jnp.complex128]
    got = _on_cpu(x64_types.magnitude, value)
    finite = np.isfinite(value)
    _assert_same_numbers(got[finite], _on_cpu(jnp.abs, value)[finite])  # as XLA's complex abs
    # CPU's torch.abs (C's hypot): inf where a part is inf, with a NaN in the other too
    _assert_same_numbers(got[~finite], torch.abs(torch.from_numpy(value[~finite])).numpy())
    assert got[value == complex(-1e-300, 1e300)][0] == 1e300  # no overflow, no underflow
    np.testing.assert_allclose(got[value == complex(1e300, -1e300)], np.hypot(1e300, 1e300), rtol=1e-15)


_COMPLEX128_DOT = re.compile(r"stablehlo\.dot_general\b.*complex<f64>")
_PRODUCTS = {  # name: (lhs shape, rhs shape, dimension numbers)
    "matmul": ((3, 4), (4, 5), (([1], [0]), ([], []))),
    "rhs_transposed": ((3, 4), (5, 4), (([1], [1]), ([], []))),
    "lhs_transposed": ((4, 3), (4, 5), (([0], [0]), ([], []))),
    "batched": ((2, 3, 4), (2, 5, 4), (([2], [2]), ([0], [0]))),
    "vector": ((4,), (4,), (([0], [0]), ([], []))),
}


@pytest.mark.parametrize("name", list(_PRODUCTS))
def test_complex128_products_lower_for_tpu_as_float64_dots(name):
    """XLA:TPU drops a transpose folded into a complex128 dot (`a @ b.mH` came out `a @ b.conj()`
    on a v5e): its TPU module holds float64 dots of the parts."""
    lhs, rhs, dims = _PRODUCTS[name]
    avals = (jax.ShapeDtypeStruct(lhs, jnp.complex128), jax.ShapeDtypeStruct(rhs, jnp.complex128))
    dot = lambda a, b: jax.lax.dot_general(a, b, dims, precision=jax.lax.Precision.HIGHEST)
    assert not _COMPLEX128_DOT.search(_lowered(dot, *avals, platform="tpu"))
    assert _COMPLEX128_DOT.search(_lowered(dot, *avals, platform="cpu"))
    mH = lambda a: jnp.conj(jnp.swapaxes(a, -1, -2)) if a.ndim > 1 else jnp.conj(a)
    assert not _COMPLEX128_DOT.search(_lowered(lambda a: a @ mH(a), avals[0], platform="tpu"))


_COMPLEX128_TRANSPOSE = re.compile(r"stablehlo\.transpose\b.*complex<f64>")


@pytest.mark.parametrize("permutation", [(1, 0), (0, 2, 1), (2, 0, 1)])
def test_complex128_transposes_lower_for_tpu_from_float64_parts_and_are_jaxs(permutation):
    """XLA:TPU dropped a complex128 transpose before the dot of `a @ b.mH` on a v5e: its TPU
    module transposes the float64 parts, and the result is jax's transpose."""
    shape = (2, 3, 4)[: len(permutation)]
    operand = jax.ShapeDtypeStruct(shape, jnp.complex128)
    transpose = lambda x: jax.lax.transpose(x, permutation)
    assert not _COMPLEX128_TRANSPOSE.search(_lowered(transpose, operand, platform="tpu"))
    assert _COMPLEX128_TRANSPOSE.search(_lowered(transpose, operand, platform="cpu"))
    mH = lambda a: a @ jnp.conj(jnp.swapaxes(a, -1, -2))
    assert not _COMPLEX128_TRANSPOSE.search(_lowered(mH, jax.ShapeDtypeStruct((3, 3), jnp.complex128), platform="tpu"))
    value = _VALUES[jnp.complex128][: np.prod(shape)].reshape(shape)
    _assert_same_numbers(_on_cpu(lambda x: x64_types.transposed(x, permutation), value), _on_cpu(transpose, value))
    complex64 = jax.ShapeDtypeStruct(shape, jnp.complex64)  # jax's own transpose for other dtypes
    assert re.search(r"stablehlo\.transpose\b.*complex<f32>", _lowered(transpose, complex64, platform="tpu"))


@pytest.mark.parametrize("at_once", [True, False])
@pytest.mark.parametrize("name", list(_PRODUCTS))
def test_int64_products_lower_for_tpu_as_sums_and_are_jaxs(name, at_once, monkeypatch):
    """XLA:TPU has no 64-bit integer dot: products summed over the contracting dims (all at once,
    or one step of k at a time), wrapping around as CPU's gemm does."""
    if not at_once:
        monkeypatch.setattr(x64_types, "_SUMS_AT_ONCE", 1)
    lhs, rhs, dims = _PRODUCTS[name]
    avals = (jax.ShapeDtypeStruct(lhs, jnp.int64), jax.ShapeDtypeStruct(rhs, jnp.int64))
    dot = lambda a, b: jax.lax.dot_general(a, b, dims)
    assert "dot_general" not in _lowered(dot, *avals, platform="tpu")
    assert "dot_general" in _lowered(dot, *avals, platform="cpu")
    rng = np.random.default_rng(0)
    x, y = rng.integers(-(2**40), 2**40, lhs), rng.integers(-(2**40), 2**40, rhs)
    got = _on_cpu(lambda p: x64_types.product_by_sums(p[0], p[1], dimension_numbers=dims, dtype=jnp.int64), (x, y))
    _assert_same_numbers(got, _on_cpu(lambda p: dot(*p), (x, y)))


@pytest.mark.parametrize("name", list(_PRODUCTS))
def test_complex128_products_from_parts_are_jaxs(name):
    """Integer-valued parts: every sum exact, so the two must agree bit for bit."""
    lhs, rhs, dims = _PRODUCTS[name]
    rng = np.random.default_rng(0)
    a, b = (rng.integers(-9, 10, (2, *shape)).astype(np.float64) for shape in (lhs, rhs))
    a, b = a[0] + 1j * a[1], b[0] + 1j * b[1]
    for x, y in ((a, b), (a, b.real), (a.real, b)):
        got = _on_cpu(lambda p: x64_types.product(p[0], p[1], dimension_numbers=dims), (x, y))
        want = _on_cpu(lambda p: jax.lax.dot_general(p[0], p[1], dims, preferred_element_type=jnp.complex128), (x, y))
        _assert_same_numbers(got, want)


def test_complex128_conversions_and_abs_on_the_device(no_fallbacks):
    exact = {"rtol": 0, "atol": 0, "equal_nan": True}
    c = torch.tensor([1.5 - 2j, complex(_INF, _NAN), -0.0 + 3e30j])
    torch.testing.assert_close(c.to("tpu").conj().to(torch.complex128).cpu(), c.conj().to(torch.complex128), **exact)
    wide = c.to(torch.complex128) / 3
    torch.testing.assert_close(
        wide.to("tpu").to(torch.complex64).cpu(),
        wide.to(torch.complex64),
        equal_nan=True,
        **platform_rounding_tol(torch.complex64),
    )
    # parts 2**100 times 3 and 4: squares past float32's range, which is XLA:TPU's float64 range too
    m = torch.tensor(
        [3 + 4j, complex(-3 * 2.0**100, 4 * 2.0**100), complex(_INF, 1), -0.0j, 1.5 - 2j], dtype=torch.complex128
    )
    torch.testing.assert_close(torch.abs(m.to("tpu")).cpu(), torch.abs(m), **platform_rounding_tol(torch.float64))
    ints = torch.arange(-2, 3)
    assert torch.equal(ints.to("tpu").to(torch.complex128).cpu(), ints.to(torch.complex128))
