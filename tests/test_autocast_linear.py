"""Autocast's linear on tpu runs as one fused executable forward and one backward
(ops/autocast_linear.py), with the results, dtypes and gradients of PyTorch's autocast on CPU."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import torch_tpu

# CPU's autocast runs the same half-float product (float32 sums, rounded once), so the results
# agree to a rounding of the half float.
TOL = {torch.bfloat16: {"rtol": 1.6e-2, "atol": 1e-2}, torch.float16: {"rtol": 1e-3, "atol": 1e-3}}


def _inputs(shape=(4, 6, 16), out=8, bias=True, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, generator=g)
    w = torch.randn(out, shape[-1], generator=g) / 4
    b = torch.randn(out, generator=g) if bias else None
    return x, w, b


def _run(device, dtype, x, w, b, grads=True, create_graph=False):
    leaves = [t.to(device).requires_grad_(grads) if t is not None else None for t in (x, w, b)]
    with torch.autocast(device, dtype=dtype):
        out = F.linear(*leaves)
    results = [out]
    if grads:
        g = torch.linspace(-1, 1, out.numel()).reshape(out.shape).to(device)
        needed = [t for t in leaves if t is not None]
        results += torch.autograd.grad(out, needed, g.to(out.dtype), create_graph=create_graph)
    return results


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("shape", [(4, 6, 16), (5, 16), (16,)])
def test_matches_cpu_autocast(dtype, bias, shape):
    x, w, b = _inputs(shape, bias=bias)
    got = _run("tpu", dtype, x, w, b)
    expected = _run("cpu", dtype, x, w, b)
    for g, e in zip(got, expected):
        assert g.device.type == "tpu" and g.dtype == e.dtype and g.shape == e.shape
        torch.testing.assert_close(g.cpu(), e, **TOL[dtype])


def test_one_execution_each_way():
    x, w, b = _inputs()
    layer = torch.nn.Linear(16, 8).to("tpu")  # parameters
    with torch.no_grad():
        layer.weight.copy_(w)
        layer.bias.copy_(b)
    x = x.to("tpu")
    torch_tpu.sync()
    torch_tpu.metrics.reset()
    with torch.autocast("tpu", dtype=torch.bfloat16):
        out = layer(x)
    assert torch_tpu.metrics.counters()["executions"] == 1
    seed = torch.ones_like(out)
    torch_tpu.metrics.reset()
    out.backward(seed)
    assert torch_tpu.metrics.counters()["executions"] == 1
    assert layer.weight.grad.dtype == layer.bias.grad.dtype == torch.float32


def test_frozen_weight_and_inference():
    x, w, b = _inputs()
    xt = x.to("tpu").requires_grad_(True)
    with torch.autocast("tpu", dtype=torch.bfloat16):
        (grad_x,) = torch.autograd.grad(F.linear(xt, w.to("tpu"), b.to("tpu")).sum(), [xt])
        with torch.no_grad():
            out = F.linear(x.to("tpu"), w.to("tpu"), b.to("tpu"))
    xc = x.clone().requires_grad_(True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        (expected_x,) = torch.autograd.grad(F.linear(xc, w, b).sum(), [xc])
        expected = F.linear(x, w, b)
    torch.testing.assert_close(grad_x.cpu(), expected_x, **TOL[torch.bfloat16])
    torch.testing.assert_close(out.cpu(), expected, **TOL[torch.bfloat16])


def test_double_backward_matches_cpu():
    """A gradient penalty: its gradient reaches the inputs through the casts."""
    x, w, _ = _inputs((3, 16))
    x_t, w_t = x.to("tpu").requires_grad_(True), w.to("tpu").requires_grad_(True)
    x_c, w_c = x.clone().requires_grad_(True), w.clone().requires_grad_(True)
    results = []
    for device, xi, wi in (("tpu", x_t, w_t), ("cpu", x_c, w_c)):
        with torch.autocast(device, dtype=torch.bfloat16):
            out = F.linear(xi, wi)
        gx, gw = torch.autograd.grad(out.float().pow(2).sum(), [xi, wi], create_graph=True)
        results.append(torch.autograd.grad(gx.pow(2).sum() + gw.pow(2).sum(), [xi, wi]))
    for got, expected in zip(*results):
        torch.testing.assert_close(got.cpu(), expected, rtol=3e-2, atol=3e-2)


def test_float64_keeps_autocast_policy():
    x, w, b = (t.double() for t in _inputs())
    (got,) = _run("tpu", torch.bfloat16, x, w, b, grads=False)
    (expected,) = _run("cpu", torch.bfloat16, x, w, b, grads=False)
    assert got.dtype == expected.dtype == torch.float64
    torch.testing.assert_close(got.cpu(), expected)


def test_compiled_matches_eager(fresh_dynamo):
    x, w, b = (t.to("tpu") for t in _inputs())

    def fn(x, w, b):
        with torch.autocast("tpu", dtype=torch.bfloat16):
            return F.linear(x, w, b).float().sin()

    compiled = torch.compile(fn, backend="tpu")
    torch.testing.assert_close(compiled(x, w, b).cpu(), fn(x, w, b).cpu(), rtol=1e-2, atol=1e-2)
