"""Device time of tpu ops in torch.profiler (csrc/device_trace.cc): key_averages() and the Chrome
trace show tpu activity linked to the op that launched it; CPU ops and CPU-only profiles get none."""

from __future__ import annotations

import itertools
import json

import pytest
import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

import torch_tpu
from torch_tpu.tools.profiler import trace_files

BOTH = [ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]


def _rows(prof) -> dict:
    return {row.key: row for row in prof.key_averages()}


def _start(event) -> float:
    return event.time_range.start


def _caller(event) -> str | None:
    return event.cpu_parent.name if event.cpu_parent is not None else None


def _calls(caller, event) -> bool:
    while event.cpu_parent is not None:
        event = event.cpu_parent
        if event is caller:
            return True
    return False


def _tpu_events(prof) -> list:
    return [e for e in prof.events() if e.device_type == DeviceType.PrivateUse1]


def test_tpu_ops_have_device_time_in_key_averages():
    x = torch.randn(64, 64, device="tpu")
    w = torch.randn(64, 64, device="tpu")
    expected = (x.cpu() @ w.cpu()).relu()
    torch_tpu.sync()
    with profile(activities=BOTH) as prof:
        y = (x @ w).relu()
    torch.testing.assert_close(y.cpu(), expected, rtol=1e-5, atol=1e-5)  # profiling changes no result
    rows = _rows(prof)
    for op in ("aten::mm", "aten::relu"):
        assert rows[op].device_time_total > 0, op
        assert rows[op].self_device_time_total > 0, op
        assert rows[f"{op} (tpu)"].device_type == DeviceType.PrivateUse1
    assert "Self TPU" in prof.key_averages().table()
    events = _tpu_events(prof)
    assert {e.name for e in events} >= {"aten::mm (tpu)", "aten::relu (tpu)"}
    assert all(e.device_index == 0 and e.time_range.elapsed_us() > 0 for e in events)


def test_device_time_is_counted_once():
    """aten::linear calls aten::t and aten::mm: each activity is an op's span less the tpu ops it
    called, so activities never overlap, and linear's total holds its callees' time."""
    x = torch.randn(8, 16, device="tpu")
    w = torch.randn(4, 16, device="tpu", requires_grad=True)
    torch_tpu.sync()
    with profile(activities=BOTH) as prof:
        torch.nn.functional.linear(x, w).sum().backward()
    linear = next(e for e in prof.events() if e.name == "aten::linear")
    mm = next(e for e in prof.events() if e.name == "aten::mm" and _calls(linear, e))
    assert linear.device_time_total >= mm.device_time_total > 0
    spans = sorted((e.time_range.start, e.time_range.end) for e in _tpu_events(prof))
    assert all(end <= next_start for (_, end), (next_start, _) in itertools.pairwise(spans))
    total = sum(end - start for start, end in spans)
    assert sum(row.self_device_time_total for row in prof.key_averages() if row.key.endswith(" (tpu)")) == (
        pytest.approx(total, rel=1e-6)
    )


def test_cpu_ops_and_backward_on_the_autograd_thread():
    a = torch.randn(16, 16)
    w = torch.randn(16, 16, device="tpu", requires_grad=True)
    torch_tpu.sync()
    with profile(activities=BOTH) as prof:
        torch.mm(a, a)  # a CPU op: no tpu activity
        (w @ w).sum().backward()
    rows = _rows(prof)
    assert "aten::mm (tpu)" in rows
    top = sorted((e for e in prof.events() if e.cpu_parent is None and e.device_type == DeviceType.CPU), key=_start)
    assert [e.name for e in top[:2]] == ["aten::mm", "aten::matmul"]
    assert top[0].device_time_total == 0  # the CPU mm
    assert top[1].device_time_total > 0  # w @ w
    backward_mms = [e for e in prof.events() if e.name == "aten::mm" and _caller(e) == "MmBackward0"]
    assert len(backward_mms) == 2 and all(e.device_time_total > 0 for e in backward_mms)
    assert {e.thread for e in backward_mms} != {top[1].thread}  # autograd's device thread
    assert w.grad is not None


def test_cpu_only_profile_records_no_device_activity():
    x = torch.randn(8, 8, device="tpu")
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        x @ x
    assert not _tpu_events(prof)
    assert all(row.device_time_total == 0 for row in prof.key_averages())


def test_chrome_trace_has_a_tpu_row(tmp_path):
    x = torch.randn(8, 8, device="tpu")
    torch_tpu.sync()
    with profile(activities=BOTH) as prof:
        x @ x
    path = tmp_path / "trace.json"
    prof.export_chrome_trace(str(path))
    events = json.loads(path.read_text())["traceEvents"]
    kernels = [e for e in events if e.get("name") == "aten::mm (tpu)"]
    assert len(kernels) == 1
    kernel = kernels[0]
    assert kernel["ph"] == "X" and kernel["dur"] > 0
    assert kernel["args"]["device"] == "tpu:0"
    assert kernel["args"]["measured"] == "dispatch to outputs ready"
    ops = [e for e in events if e.get("name") == "aten::mm" and e.get("cat") == "cpu_op"]
    assert ops and ops[0]["ts"] <= kernel["ts"] + 1  # the op starts its device activity


def test_tools_profile_still_records_xla_trace(tmp_path):
    x = torch.randn(8, 8, device="tpu")
    with profile(activities=BOTH) as prof, torch_tpu.tools.profile(tmp_path, create_perfetto_trace=False):
        x @ x
    assert trace_files(tmp_path)
    assert "aten::mm (tpu)" in _rows(prof)
