"""compile/graph_record.py: an aot_autograd ATen graph as plain data (what the backend's cache
entries store) and back, the same graph; graphs it cannot say as plain data give None."""

from __future__ import annotations

import pickle

import pytest
import torch
from torch._functorch.aot_autograd import aot_function
from torch.fx import GraphModule

from torch_tpu.compile import graph_record


def _aot_graphs(fn, *args) -> list[GraphModule]:
    """The ATen graphs aot_autograd hands a backend for `fn` (forward, and backward if any)."""
    graphs = []

    def keep(gm, example_inputs):
        graphs.append(gm)
        return gm

    out = aot_function(fn, fw_compiler=keep, bw_compiler=keep)(*args)
    if isinstance(out, torch.Tensor) and out.requires_grad:
        out.backward()  # the backward graph is handed over at its first call
    return graphs


def _optimizer_like(a, b, c, step):
    # foreach ops over a list (their results read back by getitem), scalar and keyword arguments
    # of several types, an in-place update kept as copy_ (a functionalized input mutation)
    summed = torch._foreach_add([a, b], [c, c], alpha=0.5)
    powered = torch._foreach_pow(0.9, [step, step])
    filled = torch.full_like(a, 2.0, dtype=torch.float32, device="cpu", memory_format=torch.preserve_format)
    a.mul_(powered[0])
    return summed[0] * filled, summed[1].sum(dim=[0], keepdim=True), powered[1]


def _inputs():
    torch.manual_seed(0)
    return [torch.randn(3, 4), torch.randn(3, 4), torch.randn(3, 4), torch.tensor(2.0)]


def test_round_trip_keeps_the_graph():
    (gm,) = _aot_graphs(_optimizer_like, *_inputs())
    record = graph_record.encode(gm)
    assert record is not None
    assert any(target == ("op", "aten", "_foreach_pow", "ScalarAndTensor") for _, _, target, _, _ in record)
    again = graph_record.decode(pickle.loads(pickle.dumps(record)))
    assert [n.name for n in again.graph.nodes] == [n.name for n in gm.graph.nodes]
    assert again.code == gm.code
    expected, got = gm(*_inputs()), again(*_inputs())
    for e, g in zip(expected, got, strict=True):
        torch.testing.assert_close(g, e, rtol=0, atol=0)


def test_training_graphs_round_trip():
    def loss(w, x):
        return torch.nn.functional.gelu(x @ w.t()).sum(dtype=torch.float32)

    w = torch.randn(4, 3, requires_grad=True)
    graphs = _aot_graphs(loss, w, torch.randn(2, 3))
    assert len(graphs) == 2  # forward and backward
    for gm in graphs:
        again = graph_record.decode(pickle.loads(pickle.dumps(graph_record.encode(gm))))
        assert again.code == gm.code


class _WithConstant(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("scale", torch.ones(2))

    def forward(self, x):
        return x * self.scale


@pytest.mark.parametrize(
    "make",
    [
        lambda: torch.fx.symbolic_trace(_WithConstant()),  # a get_attr constant
        lambda: torch.fx.symbolic_trace(lambda x: x.relu()),  # a method call
    ],
    ids=["constant", "method"],
)
def test_graphs_beyond_plain_data_give_none(make):
    gm = make()
    assert graph_record.encode(gm) is None


def test_unimportable_function_or_other_argument_gives_none():
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    graph.output(graph.call_function(lambda v: v, (x,)))
    assert graph_record.encode(GraphModule(torch.nn.Module(), graph)) is None  # a lambda: no name to import

    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    graph.output(graph.call_function(torch.ops.aten.add.Tensor, (x, slice(1, 2))))
    assert graph_record.encode(GraphModule(torch.nn.Module(), graph)) is None  # an argument of another type
