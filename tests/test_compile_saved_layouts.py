"""A compiled forward returns what only its backward reads in the layout XLA picks
(compile/saved_layouts.py; on by default on TPU, TORCH_TPU_SAVED_LAYOUTS=1 here), and the
backward reads those arrays as they are: the gradients stay CPU's."""

from __future__ import annotations

import jax
import pytest
import torch

import torch_tpu  # noqa: F401
from tests.helpers import graph_runners, platform_tol
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


# Inductor's partition, which keeps t and exp(t) rather than the matmul's output that the
# backward would otherwise recompute them from (compile/backend.py: PARTITIONER_DEFAULTS).
KEEP_TRANSPOSES = {"partitioner": {"ban_recompute_materialized_backward": True}}


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
        torch.compile(fn, backend="tpu", options=KEEP_TRANSPOSES)(x.to("tpu"), tpu_w).backward()
    formats = _free_formats(runners)
    assert formats, "the forward saved nothing in XLA's layout"
    assert any(f.layout.major_to_minor != tuple(range(len(f.layout.major_to_minor))) for f in formats), formats
    torch.testing.assert_close(tpu_w.grad.cpu(), expected_w.grad, **platform_tol({}))  # exp on TPU's units


def test_off_saves_in_the_default_layout(monkeypatch):
    monkeypatch.setenv("TORCH_TPU_SAVED_LAYOUTS", "0")
    torch._dynamo.reset()
    runners = graph_runners(monkeypatch)
    x, w, fn = _model_and_step()
    torch.compile(fn, backend="tpu")(x.to("tpu"), w.to("tpu").requires_grad_()).backward()
    (forward,) = [r for r in runners if r.name.startswith("forward")]
    assert all(exe.split is None for s in forward.steps for exe in getattr(s, "executables", {}).values())
    torch._dynamo.reset()


def _in_xla_layouts():
    """(array, its values) pairs from executables whose outputs XLA lays out as it likes (the CPU
    client transposes a transpose's output; XLA:TPU kept both of these row-major on a v5e), and
    from ones asked for a layout that is not row-major (column-major, channels minor)."""
    from jax.experimental.layout import Format, Layout

    device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    auto = Format(Layout.AUTO, device)
    x = jax.numpy.arange(8 * 128.0).reshape(8, 128)
    images = jax.random.normal(jax.random.key(0), (8, 16, 8, 8))
    kernels = jax.random.normal(jax.random.key(1), (32, 16, 3, 3))

    def conv(a, k):
        return jax.lax.conv_general_dilated(a, k, (1, 1), "VALID")

    for fn, args in ((lambda a: a.T, (x,)), (conv, (images, kernels))):
        yield jax.jit(fn, out_shardings=auto)(*args), jax.jit(fn)(*args)
    for fn, args, major_to_minor in ((lambda a: a * 2, (x,), (1, 0)), (conv, (images, kernels), (0, 2, 3, 1))):
        asked = Format(Layout(major_to_minor=major_to_minor), device)
        yield jax.jit(fn, out_shardings=asked)(*args), jax.jit(fn)(*args)


def test_to_default_copies_an_array_in_another_layout():
    found = [(array, values) for array, values in _in_xla_layouts() if not saved_layouts.is_default(array)]
    assert len(found) >= 2, "XLA laid out an output asked for in another layout in the default one"
    for array, values in found:
        plain = saved_layouts.to_default(array)
        assert saved_layouts.is_default(plain)
        assert (jax.numpy.asarray(plain) == values).all()
        assert saved_layouts.to_default(plain) is plain
