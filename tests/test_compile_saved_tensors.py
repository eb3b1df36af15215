"""What a compiled forward keeps in HBM for its backward: no value the backward reads only the
shape of (the float32 log-probs an autocast cross_entropy hands nll_loss are vocabulary x tokens
x 4 bytes, 0.8 GB for a GPT-2 batch of 4 x 1024)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

import torch_tpu  # noqa: F401
from tests.helpers import graph_runners


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
    torch.testing.assert_close(loss.cpu(), expected.cpu())
    torch.testing.assert_close(tpu.weight.grad.cpu(), eager.weight.grad.cpu())
    torch.testing.assert_close(tpu.bias.grad.cpu(), eager.bias.grad.cpu())
