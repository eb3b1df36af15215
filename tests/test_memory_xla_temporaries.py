"""An executable's XLA temporaries are no tpu storage, and TPU's PJRT stats do not count them:
torch.tpu.memory_stats() reports the largest of a compiled graph or lazy trace run since the
last reset ("xla_temp_bytes.all.peak"), from XLA's memory analysis of that executable, taken
when it compiles (and kept with it in the persistent cache: a loaded one need not say)."""

from __future__ import annotations

import torch

import torch_tpu
from tests.helpers import graph_runners
from torch_tpu.compile import graph, lazy
from torch_tpu.device import memory

N = 512
KEY = "xla_temp_bytes.all.peak"
COUNTERS = ("graph_compiles", "graph_cache_hits", "persistent_cache_hits", "executions", "lazy_runs")


def _two_matmuls(a, b, c):
    # (a @ b) is an [N, N] float32 intermediate between two dots: XLA keeps it in temporaries
    return ((a @ b).softmax(-1) @ c).sum()


def _inputs():
    g = torch.Generator().manual_seed(0)
    return [torch.randn(N, N, generator=g).to("tpu") for _ in range(3)]


def _graph_executables(runners) -> list:
    return [exe for r in runners for s in r.steps if isinstance(s, graph.Segment) for exe in s.executables.values()]


def _analysis(compiled) -> str:
    try:
        return str(compiled.memory_analysis())
    except Exception as error:  # what temp_bytes_of turned into 0
        return f"no memory analysis ({type(error).__name__}: {error})"


def _diagnosis(executables: list[tuple]) -> str:
    """For a failure's message: the platform, which paths ran (torch_tpu's counters) and, for each
    (compiled, the temp bytes torch_tpu noted for it), XLA's memory analysis."""
    counters = torch_tpu.metrics.counters()
    ran = ", ".join(f"{name} {counters.get(name, 0)}" for name in COUNTERS)
    analyses = "; ".join(f"noted {noted}: {_analysis(compiled)}" for compiled, noted in executables)
    return f"platform {torch_tpu.platform()}; {ran}; {analyses or 'no executable'}"


def test_a_compiled_graph_reports_its_temporaries(fresh_dynamo, monkeypatch):
    runners = graph_runners(monkeypatch)
    a, b, c = _inputs()
    compiled = torch.compile(_two_matmuls, backend="tpu")
    torch.tpu.reset_peak_memory_stats()
    torch_tpu.metrics.reset()
    out = compiled(a, b, c)
    peak = torch.tpu.memory_stats()[KEY]
    executables = [(exe.compiled, exe.temp_bytes) for exe in _graph_executables(runners)]
    noted = max((t for _, t in executables), default=None)  # what the graph's executables noted
    assert peak >= N * N * 4 and peak == noted, (peak, _diagnosis(executables))
    torch.testing.assert_close(out.cpu(), _two_matmuls(a.cpu(), b.cpu(), c.cpu()), rtol=1e-4, atol=1e-2)
    torch.tpu.reset_peak_memory_stats()
    assert torch.tpu.memory_stats()[KEY] == 0
    compiled(a, b, c)  # a cached executable counts again when it runs
    assert torch.tpu.memory_stats()[KEY] == peak, (peak, _diagnosis(executables))


def _last_lazy_executable() -> list[tuple]:
    return list(lazy._executables.values())[-1:]


def test_a_lazy_trace_reports_its_temporaries():
    a, b, c = _inputs()
    torch.tpu.reset_peak_memory_stats()
    torch_tpu.metrics.reset()
    with torch_tpu.eager_mode(False):
        out = _two_matmuls(a, b, c)
        torch_tpu.sync()
    peak = torch.tpu.memory_stats()[KEY]
    assert peak >= N * N * 4, (peak, _diagnosis(_last_lazy_executable()))
    torch.testing.assert_close(out.cpu(), _two_matmuls(a.cpu(), b.cpu(), c.cpu()), rtol=1e-4, atol=1e-2)


def test_eager_ops_alone_report_none():
    a, b, c = _inputs()
    torch.tpu.reset_peak_memory_stats()
    _two_matmuls(a, b, c).cpu()
    assert torch.tpu.memory_stats()[KEY] == 0


def _unanalysed(monkeypatch) -> None:
    """From now on, an executable's memory analysis says no temporaries (as a loaded one may)."""
    monkeypatch.setattr(memory, "temp_bytes_of", lambda compiled: 0)


def test_a_graph_loaded_from_the_persistent_cache_reports_the_compiled_ones_temporaries(fresh_dynamo, monkeypatch):
    a, b, c = _inputs()
    torch.compile(_two_matmuls, backend="tpu")(a, b, c)
    compiled_peak = torch.tpu.memory_stats()[KEY]
    assert compiled_peak >= N * N * 4, compiled_peak
    torch._dynamo.reset()  # a new graph: its executable comes from the persistent cache
    _unanalysed(monkeypatch)
    torch_tpu.metrics.reset()
    torch.tpu.reset_peak_memory_stats()
    torch.compile(_two_matmuls, backend="tpu")(a, b, c)
    counters = torch_tpu.metrics.counters()
    assert counters["persistent_cache_hits"] >= 1 and counters["graph_compiles"] == 0, counters
    assert torch.tpu.memory_stats()[KEY] == compiled_peak


def test_a_lazy_trace_loaded_from_the_persistent_cache_reports_the_compiled_ones_temporaries(monkeypatch):
    a, b, c = _inputs()

    def run() -> int:
        torch.tpu.reset_peak_memory_stats()
        with torch_tpu.eager_mode(False):
            out = _two_matmuls(a, b, c)  # a trace runs for the values still held
            torch_tpu.sync()
        del out
        return torch.tpu.memory_stats()[KEY]

    compiled_peak = run()
    assert compiled_peak >= N * N * 4, compiled_peak
    monkeypatch.setattr(lazy, "_executables", {})  # forgotten in memory: loaded from the persistent cache
    _unanalysed(monkeypatch)
    torch_tpu.metrics.reset()
    assert run() == compiled_peak
    assert torch_tpu.metrics.counters()["persistent_cache_hits"] >= 1
