"""Lowerings with a TPU form (lax.platform_dependent), checked without a chip: lowered for TPU
here, the module holds none of what XLA:TPU cannot compile; the TPU forms' arithmetic runs on
the CPU client; and the ops on the tpu device match CPU (on a TPU in the lane)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

import torch_tpu  # noqa: F401
from torch_tpu.ops.lowerings import linalg


def _lowered(fn, *avals, platform: str) -> str:
    return jax.jit(fn).trace(*avals).lower(lowering_platforms=(platform,)).as_text()


def test_int64_matmul_has_no_dot_on_tpu():
    a, b = jax.ShapeDtypeStruct((4, 5), jnp.int64), jax.ShapeDtypeStruct((5, 3), jnp.int64)
    assert "dot_general" not in _lowered(linalg.matmul, a, b, platform="tpu")
    assert "dot_general" in _lowered(linalg.matmul, a, b, platform="cpu")
    small = jax.ShapeDtypeStruct((4, 5), jnp.int32)
    assert "dot_general" in _lowered(linalg.matmul, small, jax.ShapeDtypeStruct((5, 3), jnp.int32), platform="tpu")


@pytest.mark.parametrize("at_once", [True, False])
@pytest.mark.parametrize(
    "shapes", [((3, 4, 5), (5, 2)), ((5,), (5,)), ((3, 4, 5), (5,)), ((5,), (2, 5, 3)), ((2, 1, 3, 4), (5, 4, 2))]
)
def test_matmul_by_sums_is_numpys(shapes, at_once, monkeypatch):
    if not at_once:
        monkeypatch.setattr(linalg, "_SUMS_AT_ONCE", 1)  # one step of k at a time
    rng = np.random.default_rng(0)
    x, y = (rng.integers(-(2**40), 2**40, s) for s in shapes)  # products wrap around, as CPU's
    got = np.asarray(linalg.matmul_by_sums(jnp.asarray(x), jnp.asarray(y)))
    assert got.dtype == np.int64
    np.testing.assert_array_equal(got, np.matmul(x, y))


def test_float64_lu_has_no_xla_lu_on_tpu():
    a64, a32 = jax.ShapeDtypeStruct((2, 3, 3), jnp.float64), jax.ShapeDtypeStruct((2, 3, 3), jnp.float32)
    assert "LuDecomposition" not in _lowered(linalg._lu, a64, platform="tpu")
    assert "LuDecomposition" in _lowered(linalg._lu, a32, platform="tpu")  # XLA:TPU's own, where it has one


@pytest.mark.parametrize("shape", [(4, 4), (2, 5, 3), (3, 2, 4)])
def test_lu_by_rows_is_laxs(shape):
    a = jnp.asarray(np.random.default_rng(1).standard_normal(shape))
    for got, want in zip(linalg.lu_by_rows(a), jax.lax.linalg.lu(a)):
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
