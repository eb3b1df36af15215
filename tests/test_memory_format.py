"""Memory formats: tpu results have CPU's strides (channels_last, preserved transposes) and values."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

import torch_tpu
from tests.helpers import platform_tol

TPU = "tpu"
CL = torch.channels_last
CL3D = torch.channels_last_3d


def _same(got: torch.Tensor, want: torch.Tensor, values: bool = True, transcendental: bool = False) -> None:
    """Strides and values as CPU's; transcendental=True (exp, sigmoid, batch norm's rsqrt): the
    values within platform_tol (TPU's units differ from CPU's)."""
    assert got.device.type == TPU
    assert got.shape == want.shape
    assert got.stride() == want.stride(), f"strides {got.stride()} != CPU's {want.stride()}"
    assert got.is_contiguous() == want.is_contiguous()
    assert got.is_contiguous(memory_format=CL) == want.is_contiguous(memory_format=CL)
    if values:
        tol = {"atol": 1e-4, "rtol": 1e-4}
        torch.testing.assert_close(got.cpu(), want, **(platform_tol(tol) if transcendental else tol))


def _nchw() -> torch.Tensor:
    return torch.randn(2, 3, 4, 5)


_WEIGHT = torch.randn(4, 3, 3, 3, generator=torch.Generator().manual_seed(0))


def _weight() -> torch.Tensor:
    return _WEIGHT.clone()


CASES = {
    "contiguous_cl": lambda x: x.contiguous(memory_format=CL),
    "to_cl": lambda x: x.to(memory_format=CL),
    "to_cl_dtype": lambda x: x.to(torch.float64, memory_format=CL),
    "clone_cl": lambda x: x.clone(memory_format=CL),
    "clone_preserve_cl": lambda x: x.contiguous(memory_format=CL).clone(),
    "back_to_contiguous": lambda x: x.contiguous(memory_format=CL).contiguous(),
    "clone_contiguous_format": lambda x: x.contiguous(memory_format=CL).clone(memory_format=torch.contiguous_format),
    "add_scalar_cl": lambda x: x.contiguous(memory_format=CL) + 1,
    "mul_cl_cl": lambda x: x.contiguous(memory_format=CL) * x.contiguous(memory_format=CL),
    "add_cl_nchw": lambda x: x.contiguous(memory_format=CL) + x,
    "relu_cl": lambda x: torch.relu(x.contiguous(memory_format=CL)),
    "sigmoid_cl": lambda x: torch.sigmoid(x.contiguous(memory_format=CL)),
    "where_cl": lambda x: torch.where(x.contiguous(memory_format=CL) > 0, x.contiguous(memory_format=CL), 0.0),
    "sum_dim_cl": lambda x: x.contiguous(memory_format=CL).sum(1),
    "conv2d_cl": lambda x: F.conv2d(x.contiguous(memory_format=CL), _weight().to(x.device), padding=1),
    "conv2d_cl_weight": lambda x: F.conv2d(x, _weight().to(x.device).contiguous(memory_format=CL)),
    "conv2d_nchw": lambda x: F.conv2d(x, _weight().to(x.device)),
    "batch_norm_cl": lambda x: F.batch_norm(x.contiguous(memory_format=CL), None, None, training=True),
    "max_pool_cl": lambda x: F.max_pool2d(x.contiguous(memory_format=CL), 2),
    "transpose_clone": lambda x: x[0, 0].t().clone(),
    "transpose_add": lambda x: x[0, 0].t() + 1,
    "permute_exp": lambda x: x.permute(0, 2, 3, 1).exp(),
    "expanded_add": lambda x: x[:, :1].expand(2, 3, 4, 5) + 0,
    "slice_clone": lambda x: x[:, :, ::2].clone(),
}
TRANSCENDENTAL = {"sigmoid_cl", "batch_norm_cl", "permute_exp"}


@pytest.mark.parametrize("name", list(CASES))
def test_strides_and_values_match_cpu(name):
    fn = CASES[name]
    x = _nchw()
    want = fn(x)
    got = fn(x.to(TPU))
    _same(got, want, transcendental=name in TRANSCENDENTAL)


def test_channels_last_3d():
    x = torch.randn(2, 3, 2, 3, 4)
    _same(x.to(TPU).contiguous(memory_format=CL3D), x.contiguous(memory_format=CL3D))


def test_conv1d_on_transposed_input():
    x = torch.randn(2, 8, 3).transpose(1, 2)
    w = torch.randn(4, 3, 3)
    _same(F.conv1d(x.to(TPU), w.to(TPU)), F.conv1d(x, w))


def test_conv2d_backward_channels_last():
    x = torch.randn(2, 3, 6, 6).contiguous(memory_format=CL)
    w = _weight()
    grads = []
    for dev in ("cpu", TPU):
        xi = x.detach().to(dev).requires_grad_()
        wi = w.detach().to(dev).requires_grad_()
        out = F.conv2d(xi, wi)
        out.sum().backward()
        grads.append((out, xi.grad, wi.grad))
    for got, want in zip(grads[1], grads[0]):
        _same(got, want.detach())


def test_empty_like_keeps_channels_last():
    x = _nchw().contiguous(memory_format=CL)
    _same(torch.empty_like(x.to(TPU)), torch.empty_like(x), values=False)
    _same(torch.zeros_like(x.to(TPU)), torch.zeros_like(x))


def test_factories_with_memory_format():
    _same(torch.empty(2, 3, 4, 5, device=TPU, memory_format=CL), torch.empty(2, 3, 4, 5, memory_format=CL), False)
    _same(torch.empty_strided((2, 3), (1, 2), device=TPU), torch.empty_strided((2, 3), (1, 2)), values=False)


def test_resize_with_memory_format():
    flat = torch.randn(2 * 3 * 4 * 5)
    got = flat.to(TPU)
    got.resize_((2, 3, 4, 5), memory_format=CL)
    assert got.stride() == flat.clone().resize_((2, 3, 4, 5), memory_format=CL).stride()


def test_view_of_transposed_clone_raises_as_cpu():
    x = torch.arange(6.0).view(2, 3)
    with pytest.raises(RuntimeError, match="view size is not compatible"):
        x.t().clone().view(-1)
    with pytest.raises(RuntimeError, match="view size is not compatible"):
        x.to(TPU).t().clone().view(-1)
    torch.testing.assert_close(x.to(TPU).t().clone().reshape(-1).cpu(), x.t().reshape(-1))


def test_channels_last_result_is_not_a_view():
    x = _nchw()
    y = x.to(TPU).contiguous(memory_format=CL)
    assert y._base is None
    y.add_(1)  # in place on a channels_last result
    _same(y, x.contiguous(memory_format=CL).add_(1))


def test_in_place_on_channels_last_matches_cpu():
    x = _nchw().contiguous(memory_format=CL)
    got = x.to(TPU)
    got.mul_(2).add_(x.to(TPU).transpose(2, 3).transpose(2, 3))
    want = x.clone().mul_(2).add_(x)
    _same(got, want)


def test_copy_into_channels_last():
    x = _nchw()
    got = torch.empty(2, 3, 4, 5, device=TPU, memory_format=CL).copy_(x.to(TPU))
    _same(got, torch.empty(2, 3, 4, 5, memory_format=CL).copy_(x))
    _same(got, x.contiguous(memory_format=CL))


def test_to_cpu_keeps_values_of_channels_last():
    x = _nchw()
    got = x.to(TPU).contiguous(memory_format=CL).cpu()
    torch.testing.assert_close(got, x)


def test_channels_last_module_forward():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.ReLU())
    x = _nchw()
    want = model(x.contiguous(memory_format=CL))
    model.to(TPU)
    got = model(x.to(TPU).contiguous(memory_format=CL))
    _same(got, want.detach(), transcendental=True)  # batch norm


# Prints strides and values of channels_last and transposed results, and the counters, as JSON.
_PERSIST_SCRIPT = r"""
import json
import torch
import torch_tpu
import torch.nn.functional as F

x = torch.arange(120.0).reshape(2, 3, 4, 5) / 7
w = torch.arange(108.0).reshape(4, 3, 3, 3) / 50
out = []
for dev in ("cpu", "tpu"):
    xd = x.to(dev)
    ys = [xd.contiguous(memory_format=torch.channels_last), xd[0, 0].t().clone(),
          F.conv2d(xd.contiguous(memory_format=torch.channels_last), w.to(dev))]
    out.append([[list(y.stride()), y.cpu().tolist()] for y in ys])
print(json.dumps({"cpu": out[0], "tpu": out[1], "counters": torch_tpu.metrics.counters()}))
"""


def test_persisted_entries_keep_strides(tmp_path):
    """A second process loads the op executables from disk and still gets CPU's strides."""
    env = dict(os.environ, TORCH_TPU_CACHE_DIR=str(tmp_path), TORCH_TPU_PLATFORM="cpu")
    env.pop("TORCH_TPU_DEBUG", None)
    runs = []
    for _ in range(2):
        done = subprocess.run(
            [sys.executable, "-c", _PERSIST_SCRIPT], env=env, capture_output=True, text=True, timeout=600
        )
        assert done.returncode == 0, done.stderr[-4000:]
        runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
    second = runs[1]
    assert second["counters"]["op_compiles"] == 0 and second["counters"]["persistent_cache_hits"] > 0
    for run in runs:
        for (got_strides, got), (want_strides, want) in zip(run["tpu"], run["cpu"]):
            assert got_strides == want_strides
            torch.testing.assert_close(torch.tensor(got), torch.tensor(want))


def test_lazy_mode_keeps_strides():
    x = _nchw()
    want = torch.relu(x.contiguous(memory_format=CL) * 2).transpose(1, 3)
    with torch_tpu.eager_mode(False):
        got = torch.relu(x.to(TPU).contiguous(memory_format=CL) * 2).transpose(1, 3)
        assert got.stride() == want.stride()
        values = got.cpu()
    torch.testing.assert_close(values, want)
    clone = x[0, 0].t()
    with torch_tpu.eager_mode(False):
        lazy_clone = x[0, 0].to(TPU).t().clone() + 1
        _same(lazy_clone, clone.clone() + 1)
