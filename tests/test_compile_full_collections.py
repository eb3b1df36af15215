"""Full garbage collections wait while a graph compiles (compile/full_collections.py), and the
collector's thresholds are the process's own again afterwards."""

from __future__ import annotations

import gc

import torch

import torch_tpu  # noqa: F401
from torch_tpu.compile import full_collections


def test_a_window_defers_full_collections_and_restores_the_thresholds():
    before = gc.get_threshold()
    with full_collections.window():
        assert gc.get_threshold() == (before[0], before[1], full_collections._DEFERRED)
        with full_collections.window():  # nested: the outer one restores
            pass
        assert gc.get_threshold()[2] == full_collections._DEFERRED
    assert gc.get_threshold() == before


def test_an_end_without_a_start_opens_nothing():
    """Callbacks installed during a compile see its end only."""
    full_collections._on_end(None)
    with full_collections.window():
        assert gc.get_threshold()[2] == full_collections._DEFERRED


def test_thresholds_set_inside_a_window_are_kept():
    before = gc.get_threshold()
    try:
        with full_collections.window():
            gc.set_threshold(500, 5, 5)
        assert gc.get_threshold() == (500, 5, 5)
    finally:
        gc.set_threshold(*before)


def test_dynamo_and_the_graphs_compile_inside_a_window(fresh_dynamo, monkeypatch):
    from torch_tpu.compile.graph import Segment

    seen = []
    compile_graph = Segment._compile

    def recording(self, *args):
        seen.append(("graph", gc.get_threshold()[2]))
        return compile_graph(self, *args)

    monkeypatch.setattr(Segment, "_compile", recording)
    on_start = lambda args: seen.append(("dynamo", gc.get_threshold()[2]))  # runs after ours
    before = gc.get_threshold()
    x = torch.randn(8)
    try:
        # the first compile after a reset (which drops dynamo's callbacks): the backend's window
        torch.compile(lambda x: (x * 2).sin().sum(), backend="tpu")(x.to("tpu"))
        torch._dynamo.callback.on_compile_start(on_start)
        fn = torch.compile(lambda x: (x * 3).cos().sum(), backend="tpu")  # then dynamo's too
        torch.testing.assert_close(fn(x.to("tpu")).cpu(), (x * 3).cos().sum())
    finally:
        torch._dynamo.callback.callback_handler.remove_start_callback(on_start)
    deferred = full_collections._DEFERRED
    assert seen == [("graph", deferred), ("dynamo", deferred), ("graph", deferred)], seen
    assert gc.get_threshold() == before
