"""A compiled forward returns what only its backward reads in the layout XLA picks
(compile/saved_layouts.py; on by default on TPU, TORCH_TPU_SAVED_LAYOUTS=1 here), and the
backward reads those arrays as they are: the gradients stay CPU's."""

from __future__ import annotations

import jax
import pytest
import torch

import torch_tpu  # noqa: F401
from tests.helpers import graph_runners
from torch_tpu import platforms
from torch_tpu.compile import saved_layouts


@pytest.fixture
def layouts_on(monkeypatch):
    monkeypatch.setenv("TORCH_TPU_SAVED_LAYOUTS", "1")
    monkeypatch.setattr(platforms, "shaped_buffers", lambda: True)  # TORCH_TPU_SHAPED_BUFFERS=1, for this test
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _model_and_step():
    torch.manual_seed(0)
    x, w = torch.randn(8, 16), torch.randn(16, 32)

    def fn(x, w):
        t = (x @ w).t().contiguous()  # exp(t) is saved: a transpose, which XLA lays out as it likes
        return t.exp().sum() + (t * t).sum()

    return x, w, fn


def _free_formats(runners) -> list:
    (forward,) = [r for r in runners if r.name.startswith("forward")]
    formats = []
    for segment in forward.steps:
        for exe in getattr(segment, "executables", {}).values():
            assert exe.split is not None, "no output left in XLA's layout"
            formats.extend(exe.compiled.output_formats[1])
    return formats


def test_forward_saves_in_xla_layouts_and_backward_matches_cpu(layouts_on, monkeypatch):
    runners = graph_runners(monkeypatch)
    x, w, fn = _model_and_step()
    expected_w = w.clone().requires_grad_()
    fn(x, expected_w).backward()
    tpu_w = w.to("tpu").requires_grad_()
    for _ in range(2):  # the second step runs the cached executables on the same layouts
        tpu_w.grad = None
        torch.compile(fn, backend="tpu")(x.to("tpu"), tpu_w).backward()
    formats = _free_formats(runners)
    assert formats, "the forward saved nothing in XLA's layout"
    assert any(f.layout.major_to_minor != tuple(range(len(f.layout.major_to_minor))) for f in formats), formats
    torch.testing.assert_close(tpu_w.grad.cpu(), expected_w.grad)


def test_off_saves_in_the_default_layout(monkeypatch):
    monkeypatch.setenv("TORCH_TPU_SAVED_LAYOUTS", "0")
    torch._dynamo.reset()
    runners = graph_runners(monkeypatch)
    x, w, fn = _model_and_step()
    torch.compile(fn, backend="tpu")(x.to("tpu"), w.to("tpu").requires_grad_()).backward()
    (forward,) = [r for r in runners if r.name.startswith("forward")]
    assert all(exe.split is None for s in forward.steps for exe in getattr(s, "executables", {}).values())
    torch._dynamo.reset()


def test_to_default_copies_an_array_in_another_layout():
    from jax.experimental.layout import Format, Layout

    device = jax.devices()[0]
    transposed = jax.jit(lambda a: a.T, out_shardings=Format(Layout.AUTO, jax.sharding.SingleDeviceSharding(device)))(
        jax.numpy.arange(8 * 128.0).reshape(8, 128)
    )
    assert not saved_layouts.is_default(transposed)
    plain = saved_layouts.to_default(transposed)
    assert saved_layouts.is_default(plain)
    assert (jax.numpy.asarray(plain) == jax.numpy.arange(8 * 128.0).reshape(8, 128).T).all()
    assert saved_layouts.to_default(plain) is plain
