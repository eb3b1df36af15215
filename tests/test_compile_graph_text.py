"""aot_autograd's graph text (compile/graph_text.py): the backend's compiles skip torch's
`print_readable` strings while no log reads them, write them when one does, and compute the same
results either way."""

from __future__ import annotations

import pytest
import torch
import torch._dynamo

from torch_tpu.compile import graph_text


@pytest.fixture
def text_calls(monkeypatch):
    """print_readable(print_output=False) calls that wrote graph text."""
    calls = []
    graph_text.install()
    original = graph_text._original

    def spy(self, print_output=True, *args, **kwargs):
        if not print_output:
            calls.append(type(self).__name__)
        return original(self, print_output, *args, **kwargs)

    monkeypatch.setattr(graph_text, "_original", spy)
    return calls


def _compiled_step(width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A forward and backward compiled fresh (dynamo reset; `width` keeps torch's cache cold)."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    w = torch.randn(width, 3, requires_grad=True)
    x = torch.randn(5, width)
    wt = w.detach().to("tpu").requires_grad_()
    loss = torch.compile(lambda x, w: (x @ w).tanh().sum(), backend="tpu")(x.to("tpu"), wt)
    loss.backward()
    expected = (x @ w).tanh().sum()
    expected.backward()
    torch.testing.assert_close(loss.cpu(), expected)
    torch.testing.assert_close(wt.grad.cpu(), w.grad)
    return loss.cpu(), wt.grad.cpu()


def test_no_graph_text_while_logs_are_off(text_calls, monkeypatch):
    from torch._logging._internal import trace_log

    monkeypatch.setattr(trace_log, "handlers", [])  # pytest's log capture may hold torch's trace
    _compiled_step(11)
    assert text_calls == []


def test_graph_text_written_while_aot_graphs_are_logged(text_calls):
    torch._logging.set_logs(aot_graphs=True)
    try:
        _compiled_step(13)
    finally:
        torch._logging.set_logs()
    assert text_calls  # the joint, forward and backward graphs


def test_other_callers_get_the_text():
    gm = torch.fx.symbolic_trace(lambda x: x + 1)
    with graph_text.skipped_while_unlogged():
        assert graph_text._logged() or gm.print_readable(print_output=False) == graph_text.NOTE
    assert "add" in gm.print_readable(print_output=False)
