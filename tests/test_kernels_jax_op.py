"""jax_op: one's own jax or Pallas function as a torch op on tpu tensors, eager and compiled."""

from __future__ import annotations

import jax.numpy as jnp
import pytest
import torch
from jax.experimental import pallas as pl

from tests.helpers import native_only, same
from torch_tpu.kernels import flash_attention, jax_op
from torch_tpu.ops import registry


@jax_op
def sin_plus_twice(x, y):
    return jnp.sin(x) + 2 * y


@jax_op
def doubled_and_column_sums(x):
    return x * 2, x.sum(axis=0)


def _add_one_kernel(x_ref, o_ref):
    o_ref[...] = x_ref[...] + 1


@jax_op
def pallas_add_one(x):
    return pl.pallas_call(_add_one_kernel, out_shape=jax_struct(x), interpret=True)(x)


def jax_struct(x):
    import jax

    return jax.ShapeDtypeStruct(x.shape, x.dtype)


def test_jax_op_eager_one_and_several_results():
    a, b = torch.randn(3, 4), torch.randn(3, 4)
    out = native_only(lambda: sin_plus_twice(a.to("tpu"), b.to("tpu")))
    assert out.device.type == "tpu"
    torch.testing.assert_close(out.cpu(), a.sin() + 2 * b)
    doubled, sums = doubled_and_column_sums(a.to("tpu"))
    torch.testing.assert_close(doubled.cpu(), a * 2)
    torch.testing.assert_close(sums.cpu(), a.sum(0))


def test_jax_op_gradients_through_jax_vjp():
    def both(device, x, y):
        if device == "tpu":
            doubled, sums = doubled_and_column_sums(sin_plus_twice(x, y))
        else:
            z = x.sin() + 2 * y
            doubled, sums = z * 2, z.sum(0)
        return doubled, sums

    same(both, torch.randn(3, 4), torch.randn(3, 4), grad=True, device_arg=True, seed=0)


def test_jax_op_runs_a_pallas_kernel():
    a = torch.randn(8, 16)
    torch.testing.assert_close(pallas_add_one(a.to("tpu")).cpu(), a + 1)


def test_jax_op_is_in_the_lowering_table():
    # torch.compile(backend="tpu") lowers graph nodes through this table.
    assert registry.table()[sin_plus_twice.op].fn.__self__ is sin_plus_twice


def test_jax_op_rejects_non_tensors():
    with pytest.raises(TypeError, match="must be tensors"):
        sin_plus_twice(torch.ones(2).to("tpu"), 3.0)


@pytest.mark.parametrize("backend", ["aot_eager", "tpu"])
def test_kernels_trace_into_one_graph(backend):
    """jax_op and flash attention (with their backward) compile without graph breaks."""
    if backend not in torch._dynamo.list_backends(exclude_tags=()):
        pytest.skip(f"torch.compile backend {backend!r} is not registered")
    torch._dynamo.reset()
    q, k, v = (torch.randn(1, 2, 5, 8).to("tpu").requires_grad_() for _ in range(3))
    x = torch.randn(6, 8).to("tpu").requires_grad_()

    def model(q, k, v, x):
        attn = flash_attention(q, k, v, causal=True)
        doubled, sums = doubled_and_column_sums(sin_plus_twice(x, attn[0, 0, :, :].sum() * x))
        return attn.sum() + doubled.sum() + sums.sum()

    args = (q, k, v, x)
    compiled = torch.compile(model, backend=backend, fullgraph=True)
    got = compiled(*args)
    got.backward()
    grads = [t.grad.cpu() for t in args]
    for t in args:
        t.grad = None
    expected = model(*args)
    expected.backward()
    torch.testing.assert_close(got.cpu(), expected.cpu(), rtol=1e-4, atol=1e-4)
    for g, t in zip(grads, args):
        torch.testing.assert_close(g, t.grad.cpu(), rtol=1e-4, atol=1e-4)
