"""The platform boundary (torch_tpu/platforms/): only that package decides by the client, and a
lowering that differs by platform is a rule for that platform beside the portable one, picked
where the lowering is looked up (the eager dispatcher per call, graph mode per node)."""

from __future__ import annotations

import pathlib
import re

import jax
import pytest
import torch

import torch_tpu
from torch_tpu import platforms
from torch_tpu.ops import dispatcher, registry
from torch_tpu.ops.registry import aten, lower

PACKAGE = pathlib.Path(torch_tpu.__file__).parent
# A test of which client runs: client.platform() compared, or asked at all in the layers that
# must ask torch_tpu.platforms instead.
_COMPARED = re.compile(r"platform\(\)\s*(==|!=|in\b|not in\b)|default_backend\(")


def _sources(*layers: str) -> list[pathlib.Path]:
    return sorted(path for layer in layers for path in (PACKAGE / layer).rglob("*.py"))


def test_ops_compile_and_kernels_never_ask_the_client():
    found = [
        f"{path.relative_to(PACKAGE)}:{number}"
        for path in _sources("ops", "compile", "kernels")
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if "client.platform()" in line or "platforms.name()" in line or _COMPARED.search(line)
    ]
    assert not found, f"ask torch_tpu.platforms instead: {found}"


def test_only_the_platforms_package_tests_the_client_below_the_device_module():
    allowed = {PACKAGE / "runtime" / "client.py"}
    found = [
        f"{path.relative_to(PACKAGE)}:{number}"
        for path in _sources("ops", "compile", "kernels", "runtime", "distributed")
        if path not in allowed
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if _COMPARED.search(line)
    ]
    assert not found, f"a platform decision outside torch_tpu/platforms/: {found}"


def test_the_interface_on_this_client():
    name = platforms.name()
    assert name == torch_tpu.platform() in registry.PLATFORMS
    assert platforms.host_memory_buffers() == (name == "cpu")
    assert platforms.kernels_compile() == (name == "tpu")
    assert (platforms.op_compile_options() is not None) == (name in ("cpu", "tpu"))
    assert platforms.autotune_flags() == ({"xla_gpu_autotune_level": 4} if name == "cuda" else {})


def test_pallas_on_cpu_gives_a_client_without_mosaic_tpus_rules(monkeypatch):
    monkeypatch.delenv("TORCH_TPU_PALLAS_ON_CPU", raising=False)
    assert platforms.lowering_platform() == platforms.name()
    monkeypatch.setenv("TORCH_TPU_PALLAS_ON_CPU", "1")
    assert platforms.lowering_platform() == "tpu"


def test_sdpa_registers_tpus_flash_rule_beside_the_portable_xla_attention():
    fused = aten._scaled_dot_product_fused_attention_overrideable.default
    portable, tpu = registry.lowering(fused, None), registry.lowering(fused, "tpu")
    assert registry.platform_rules(fused) == {"tpu": tpu}
    assert tpu is not portable and tpu.eager and portable.eager
    assert tpu.graph is not None and portable.graph is None  # compiled graphs hold the kernel on TPU only
    assert registry.lowering(fused, "cpu") is portable and registry.lowering(fused, "cuda") is portable


# An op whose rules differ on purpose, so that the value tells which rule ran.
_lib = torch.library.Library("torch_tpu_test_platforms", "DEF")
_lib.define("shift(Tensor x) -> Tensor")
SHIFT = torch.ops.torch_tpu_test_platforms.shift.default
torch.library.register_fake(SHIFT, lambda x: torch.empty_like(x), lib=_lib)


@lower(SHIFT)
def _shift_portable(x):
    return x + 1


@lower(SHIFT, platform="cpu")
def _shift_cpu(x):
    return x + 2


dispatcher.register_kernel(
    _lib, SHIFT, registry.lowering(SHIFT, None), False, "PrivateUse1", registry.platform_rules(SHIFT)
)


@pytest.fixture
def rules_of(monkeypatch):
    """Sets the platform whose lowering rules apply."""

    def set_platform(platform: str) -> None:
        monkeypatch.setattr(platforms, "lowering_platform", lambda: platform)

    return set_platform


def test_the_dispatcher_runs_the_platforms_rule_per_call(rules_of):
    x = torch.arange(4.0)
    rules_of("cpu")
    torch.testing.assert_close(SHIFT(x.to("tpu")).cpu(), x + 2)
    rules_of("tpu")  # no TPU rule: the portable one, its executable cached apart from the CPU rule's
    torch.testing.assert_close(SHIFT(x.to("tpu")).cpu(), x + 1)
    rules_of("cpu")
    torch.testing.assert_close(SHIFT(x.to("tpu")).cpu(), x + 2)


@pytest.mark.usefixtures("fresh_dynamo")
def test_graph_mode_lowers_the_platforms_rule(rules_of):
    x = torch.arange(4.0)
    for platform, expected in (("cpu", x * 3 + 2), ("tpu", x * 3 + 1)):
        rules_of(platform)
        torch._dynamo.reset()
        compiled = torch.compile(lambda t: SHIFT(t * 3), backend="tpu")
        torch.testing.assert_close(compiled(x.to("tpu")).cpu(), expected)
    assert torch_tpu.metrics.counters()["graph_compiles"] >= 2


def test_bad_platform_rules_raise(monkeypatch):
    # (the rules registered here go to copies of the tables)
    monkeypatch.setattr(registry, "_TABLES", {key: dict(table) for key, table in registry._TABLES.items()})
    rules = {
        key: {op: dict(by_platform) for op, by_platform in ops.items()} for key, ops in registry._PLATFORM_RULES.items()
    }
    monkeypatch.setattr(registry, "_PLATFORM_RULES", rules)
    with pytest.raises(ValueError, match="not one of"):
        lower(SHIFT, platform="gpu")
    with pytest.raises(ValueError, match="lowered twice for cpu"):
        lower(SHIFT, platform="cpu")(lambda x: x)
    _lib.define("lonely(Tensor x) -> Tensor")
    lonely = torch.ops.torch_tpu_test_platforms.lonely.default
    lower(lonely, platform="tpu")(lambda x: x)
    with pytest.raises(ValueError, match="no portable rule"):
        registry.platform_rules(lonely)
    _lib.define("mixed(Tensor x) -> Tensor")
    mixed = torch.ops.torch_tpu_test_platforms.mixed.default
    lower(mixed)(lambda x: x)
    lower(mixed, platform="cpu", eager=True)(lambda x: x)
    with pytest.raises(ValueError, match="different kinds"):
        registry.platform_rules(mixed)


def test_tpu_op_compiles_take_xlas_lowest_effort(monkeypatch):
    """XLA:TPU compiled a convolution op ~12x faster at effort -1 (benchmarks/op_compile_effort.py)."""
    from torch_tpu.platforms.tpu import compile_options

    monkeypatch.delenv("TORCH_TPU_OP_COMPILE_EFFORT", raising=False)
    options = compile_options.op_compile_options()
    assert options == {"exec_time_optimization_effort": -1.0}
    x = jax.numpy.arange(6.0)
    compiled = jax.jit(lambda v: v * 2 + 1).lower(x).compile(compiler_options=options)  # jax takes it
    assert compiled(x).tolist() == [1.0, 3.0, 5.0, 7.0, 9.0, 11.0]
    monkeypatch.setenv("TORCH_TPU_OP_COMPILE_EFFORT", "0.5")
    assert compile_options.op_compile_options() == {"exec_time_optimization_effort": 0.5}
    monkeypatch.setenv("TORCH_TPU_OP_COMPILE_EFFORT", "default")
    assert compile_options.op_compile_options() is None
    monkeypatch.setenv("TORCH_TPU_OP_COMPILE_EFFORT", "2")
    with pytest.raises(ValueError, match="in \\[-1, 1\\]"):
        compile_options.op_compile_options()
