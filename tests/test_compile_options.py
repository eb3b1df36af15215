"""torch.compile(backend="tpu", mode=..., options=...): validation, round-trip and the debug dump."""

from __future__ import annotations

import copy
import os

import pytest
import torch
from torch import nn

import torch_tpu
from torch_tpu import platforms
from torch_tpu.compile import options as compile_options

# Each test starts with dynamo's caches and the counters cleared (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("fresh_dynamo")


ALL = {
    "dynamic_buckets": [8, 16, 32],
    "donate_buffers": True,
    "matmul_precision": "highest",
    "xla_flags": {"xla_cpu_enable_fast_math": False},
    "async_compile": False,
    "dump_dir": None,
    "partitioner": {"ban_recompute_used_far_apart": False},
}


def test_options_round_trip():
    parsed = compile_options.parse("default", ALL)
    assert parsed.as_dict() == ALL
    assert compile_options.parse("default", parsed.as_dict()) == parsed


def test_string_xla_flags_parse_like_the_command_line():
    parsed = compile_options.parse(None, {"xla_flags": "--xla_b=1 --xla_a=true"})
    assert parsed.as_dict()["xla_flags"] == {"xla_a": "true", "xla_b": "1"}


@pytest.mark.parametrize(
    "options, error, match",
    [
        ({"no_such_option": 1}, ValueError, "unknown option.*no_such_option.*donate_buffers"),
        ({"donate_buffers": "yes"}, TypeError, "donate_buffers"),
        ({"dynamic_buckets": [16, 8]}, ValueError, "increasing"),
        ({"dynamic_buckets": [0, 8]}, ValueError, "positive"),
        ({"matmul_precision": "fast"}, ValueError, "matmul_precision"),
        ({"xla_flags": {"--not a flag": 1}}, ValueError, "XLA flag name"),
        ({"xla_flags": {"xla_ok": [1]}}, TypeError, "xla_ok"),
        ({"async_compile": 1}, TypeError, "async_compile"),
        ({"partitioner": {"no_such_setting": 1}}, ValueError, "no_such_setting"),
        ({"partitioner": {"ban_recompute_reductions": [1]}}, TypeError, "ban_recompute_reductions"),
        ({"partitioner": "ban_recompute_reductions"}, TypeError, "partitioner"),
    ],
)
def test_bad_options_raise(options, error, match):
    with pytest.raises(error, match=match):
        compile_options.parse(None, options)


def test_unknown_mode_raises():
    with pytest.raises(ValueError, match="unknown mode 'fastest'"):
        compile_options.parse("fastest", None)


def test_modes_map_to_xla_meanings():
    # default: donation where buffers are device memory (TPU; the CPU client's shaped layout)
    assert compile_options.parse("default").donate_buffers is platforms.donates_buffers()
    assert compile_options.parse("default", {"donate_buffers": False}).donate_buffers is False
    assert compile_options.parse("reduce-overhead").donate_buffers is True
    assert compile_options.parse("max-autotune").donate_buffers is True
    # Explicit options win over the mode's defaults.
    assert compile_options.parse("reduce-overhead", {"donate_buffers": False}).donate_buffers is False


def test_unknown_option_through_torch_compile_raises():
    model = torch.compile(nn.Linear(3, 2).to("tpu"), backend="tpu", options={"bogus": 1})
    with pytest.raises(Exception, match=r"unknown option.*bogus"):
        model(torch.randn(2, 3, device="tpu"))


def test_unknown_xla_flag_is_rejected_at_compile():
    model = torch.compile(nn.Linear(3, 2).to("tpu"), backend="tpu", options={"xla_flags": {"xla_zz_no_such": 1}})
    with pytest.raises(ValueError, match="xla_zz_no_such"):
        model(torch.randn(2, 3, device="tpu"))


@pytest.mark.parametrize("mode", ["default", "reduce-overhead", "max-autotune"])
def test_modes_and_options_compile_and_match_cpu(mode):
    model = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 2))
    x = torch.randn(4, 6)
    # torch.compile takes mode= or options=, not both.
    if mode == "default":
        how = {"options": {"matmul_precision": "highest", "xla_flags": {"xla_cpu_enable_fast_math": False}}}
    else:
        how = {"mode": mode}
    compiled = torch.compile(copy.deepcopy(model).to("tpu"), backend="tpu", **how)
    torch.testing.assert_close(compiled(x.to("tpu")).cpu(), model(x), atol=1e-6, rtol=1e-6)


def test_dump_dir_holds_stablehlo_and_hlo_of_every_graph(tmp_path):
    model = nn.Sequential(nn.Linear(4, 4), nn.Tanh()).to("tpu")
    compiled = torch.compile(model, backend="tpu", options={"dump_dir": str(tmp_path)})
    compiled(torch.randn(2, 4, device="tpu")).sum().backward()  # a forward and a backward graph
    compiled(torch.randn(3, 4, device="tpu"))  # a new input shape: another executable
    names = sorted(os.listdir(tmp_path))
    stablehlo = [n for n in names if n.endswith(".stablehlo.mlir")]
    hlo = [n for n in names if n.endswith(".hlo.txt")]
    assert len(stablehlo) == len(hlo) == torch_tpu.metrics.counters()["graph_compiles"] >= 3
    assert any(n.startswith("backward") for n in stablehlo)
    for name in stablehlo:
        assert "func.func public @main" in (tmp_path / name).read_text()
    for name in hlo:
        assert "HloModule" in (tmp_path / name).read_text()


def test_async_compile_runs_eagerly_until_the_executable_is_ready():
    from torch_tpu.compile import async_compile

    model = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 2))
    x = torch.randn(4, 6)
    compiled = torch.compile(copy.deepcopy(model).to("tpu"), backend="tpu", options={"async_compile": True})
    torch.testing.assert_close(compiled(x.to("tpu")).cpu(), model(x), atol=1e-6, rtol=1e-6)
    assert torch_tpu.metrics.counters()["async_eager_runs"] >= 1
    async_compile.wait_all()
    eager_runs = torch_tpu.metrics.counters()["async_eager_runs"]
    torch.testing.assert_close(compiled(x.to("tpu")).cpu(), model(x), atol=1e-6, rtol=1e-6)
    compiled(x.to("tpu"))
    assert torch_tpu.metrics.counters()["async_eager_runs"] == eager_runs
    assert torch_tpu.metrics.counters()["graph_cache_hits"] >= 1  # the compiled executable ran


def test_async_compile_applies_input_mutations_while_pending():
    from torch_tpu.compile import async_compile

    def bump(t):
        t.add_(1)
        return t * 2

    x = torch.zeros(3).to("tpu")
    compiled = torch.compile(bump, backend="tpu", options={"async_compile": True})
    outs = [compiled(x).cpu() for _ in range(3)]
    async_compile.wait_all()
    outs.append(compiled(x).cpu())
    torch.testing.assert_close(x.cpu(), torch.full((3,), 4.0))
    torch.testing.assert_close(torch.stack(outs), torch.tensor([[2.0] * 3, [4.0] * 3, [6.0] * 3, [8.0] * 3]))
