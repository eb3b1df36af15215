"""An executable's XLA temporaries are no tpu storage, and TPU's PJRT stats do not count them:
torch.tpu.memory_stats() reports the largest of a compiled graph or lazy trace run since the
last reset ("xla_temp_bytes.all.peak"), from XLA's memory analysis of that executable."""

from __future__ import annotations

import torch

import torch_tpu

N = 512
KEY = "xla_temp_bytes.all.peak"


def _two_matmuls(a, b, c):
    # (a @ b) is an [N, N] float32 intermediate between two dots: XLA keeps it in temporaries
    return ((a @ b).softmax(-1) @ c).sum()


def _inputs():
    g = torch.Generator().manual_seed(0)
    return [torch.randn(N, N, generator=g).to("tpu") for _ in range(3)]


def test_a_compiled_graph_reports_its_temporaries(fresh_dynamo):
    a, b, c = _inputs()
    compiled = torch.compile(_two_matmuls, backend="tpu")
    torch.testing.assert_close(compiled(a, b, c).cpu(), _two_matmuls(a.cpu(), b.cpu(), c.cpu()), rtol=1e-4, atol=1e-2)
    peak = torch.tpu.memory_stats()[KEY]
    assert peak >= N * N * 4, peak
    torch.tpu.reset_peak_memory_stats()
    assert torch.tpu.memory_stats()[KEY] == 0
    compiled(a, b, c)  # a cached executable counts again when it runs
    assert torch.tpu.memory_stats()[KEY] == peak


def test_a_lazy_trace_reports_its_temporaries():
    a, b, c = _inputs()
    torch.tpu.reset_peak_memory_stats()
    with torch_tpu.eager_mode(False):
        out = _two_matmuls(a, b, c)
        torch_tpu.sync()
    assert torch.tpu.memory_stats()[KEY] >= N * N * 4
    torch.testing.assert_close(out.cpu(), _two_matmuls(a.cpu(), b.cpu(), c.cpu()), rtol=1e-4, atol=1e-2)


def test_eager_ops_alone_report_none():
    a, b, c = _inputs()
    torch.tpu.reset_peak_memory_stats()
    _two_matmuls(a, b, c).cpu()
    assert torch.tpu.memory_stats()[KEY] == 0
