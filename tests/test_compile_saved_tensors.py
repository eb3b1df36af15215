"""What a compiled forward keeps in HBM for its backward: no value the backward reads only the
shape of (the float32 log-probs an autocast cross_entropy hands nll_loss are vocabulary x tokens
x 4 bytes, 0.8 GB for a GPT-2 batch of 4 x 1024), and no max pool indices (int64: a pair of u32
words on TPU), which the backward finds again from the pool's input."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import torch_tpu  # noqa: F401
from tests.helpers import graph_runners, platform_tol


def test_autocast_cross_entropy_keeps_no_float32_log_probs(monkeypatch):
    runners = graph_runners(monkeypatch)
    torch.manual_seed(0)
    eager = torch.nn.Linear(16, 96).to("tpu")
    tpu = torch.nn.Linear(16, 96).to("tpu")
    tpu.load_state_dict(eager.state_dict())
    x, y = torch.randn(8, 16), torch.randint(0, 96, (8,))

    def loss_of(model):
        def fn(x, y):
            with torch.autocast("tpu", dtype=torch.bfloat16):
                return F.cross_entropy(model(x), y)

        return fn

    x, y = x.to("tpu"), y.to("tpu")
    loss = torch.compile(loss_of(tpu), backend="tpu")(x, y)
    loss.backward()
    expected = loss_of(eager)(x, y)  # the same autocast policy, op by op
    expected.backward()

    (forward,) = [r for r in runners if r.name.startswith("forward")]
    saved = [n.meta.get("val") for n in forward.gm.graph.output_node().args[0] if isinstance(n, torch.fx.Node)]
    logits_sized = [v for v in saved if isinstance(v, torch.Tensor) and tuple(v.shape) == (8, 96)]
    assert logits_sized and all(v.dtype == torch.bfloat16 for v in logits_sized), [v.dtype for v in logits_sized]
    tol = platform_tol({})  # on a TPU the compiled and the eager bf16 cross entropy (exp, log) differ
    torch.testing.assert_close(loss.cpu(), expected.cpu(), **tol)
    torch.testing.assert_close(tpu.weight.grad.cpu(), eager.weight.grad.cpu(), **tol)
    torch.testing.assert_close(tpu.bias.grad.cpu(), eager.bias.grad.cpu(), **tol)


def _saved(runners) -> list:
    (forward,) = [r for r in runners if r.name.startswith("forward")]
    return [n.meta.get("val") for n in forward.gm.graph.output_node().args[0] if isinstance(n, torch.fx.Node)]


@pytest.mark.parametrize(
    "nd,k,stride,padding,dilation,ceil_mode",
    [
        (2, 3, 2, 1, 1, False),  # ResNet's stem pool: overlapping windows, stride 2
        (2, [3], [1], [1], [1], False),  # one size for both dims; every input in several windows
        (2, 2, 3, 0, 1, True),  # gaps between windows; a last window past the input
        (3, (2, 3, 2), (1, 2, 2), (1, 1, 0), (2, 1, 1), True),
    ],
)
@pytest.mark.parametrize("nan_and_inf", [False, True], ids=["finite", "nan_and_inf"])
def test_compiled_max_pool_keeps_no_indices_and_matches_cpu(
    monkeypatch, nd, k, stride, padding, dilation, ceil_mode, nan_and_inf
):
    """Finite inputs take XLA's select-and-scatter; a nan or -inf, the taps (CPU's last nan)."""
    torch._dynamo.reset()  # the same code with other inputs: compiled again, graphs captured
    runners = graph_runners(monkeypatch)
    pool = torch.nn.functional.max_pool2d if nd == 2 else torch.nn.functional.max_pool3d
    x = torch.randint(0, 3, (2, 3, *[9] * nd)).float()  # ties in most windows
    if nan_and_inf:
        x.view(-1)[7] = float("nan")
        x.view(-1)[[12, 40]] = -float("inf")
        x.view(-1)[13] = float("nan")  # two nans in one window
    weights = torch.randn(pool(x, k, stride, padding, dilation, ceil_mode).shape)

    def fn(x, weights):
        return (pool(x, k, stride, padding, dilation, ceil_mode) * weights).sum()

    expected = x.clone().requires_grad_()
    fn(expected, weights).backward()
    tpu = x.to("tpu").requires_grad_()
    torch.compile(fn, backend="tpu")(tpu, weights.to("tpu")).backward()

    assert not [v for v in _saved(runners) if isinstance(v, torch.Tensor) and v.dtype == torch.int64]
    (backward,) = [r for r in runners if r.name.startswith("backward")]
    targets = {str(n.target) for n in backward.gm.graph.nodes if n.op == "call_function"}
    assert "tpu_kernels.max_pool_backward_from_input.default" in targets, targets
    torch.testing.assert_close(tpu.grad.cpu(), expected.grad, equal_nan=True)
