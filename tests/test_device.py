"""The native tpu device: tensors, storage aliasing, transfers, errors."""

from __future__ import annotations

import math
import warnings

import pytest
import torch

import torch_tpu
from tests.helpers import platform_rounding_tol, platform_tol


def test_tpu_tensor_is_a_plain_tensor():
    t = torch.ones(2, device="tpu")
    assert type(t) is torch.Tensor
    assert t.device.type == "tpu"
    assert t.is_tpu
    assert torch_tpu.platform() in ("tpu", "cuda", "cpu")


def test_device_module():
    assert torch.tpu.is_available()
    assert torch.tpu.device_count() >= 1
    assert torch.tpu.current_device() == 0
    assert isinstance(torch.tpu.get_device_name(), str)
    assert torch.tpu.get_device_properties(0).name == torch.tpu.get_device_name(0)


@pytest.mark.parametrize(
    "dtype",
    [
        torch.float32,
        torch.float64,
        torch.float16,
        torch.bfloat16,
        torch.int64,
        torch.int32,
        torch.int8,
        torch.uint8,
        torch.bool,
        torch.complex64,
    ],
)
def test_round_trip(dtype):
    cpu = (torch.arange(12) % 5).to(dtype).reshape(3, 4)
    assert torch.equal(cpu.to("tpu").cpu(), cpu)


def test_round_trip_non_contiguous():
    cpu = torch.arange(24.0).reshape(2, 3, 4)
    tpu = cpu.to("tpu")
    for view in (
        lambda x: x.transpose(0, 2),
        lambda x: x[:, 1],
        lambda x: x[..., ::2],
        lambda x: x.permute(2, 0, 1)[1:],
        lambda x: x[0].expand(5, 3, 4),
    ):
        torch.testing.assert_close(view(tpu).cpu(), view(cpu))


def test_view_aliases_base(no_fallbacks):
    base = torch.zeros(4, 4, device="tpu")
    view = base[1:3, ::2]
    view.add_(1)
    expected = torch.zeros(4, 4)
    expected[1:3, ::2] += 1
    torch.testing.assert_close(base.cpu(), expected)
    base.mul_(3).add_(1)
    torch.testing.assert_close(view.cpu(), expected[1:3, ::2] * 3 + 1)


def test_setitem_writes_through_views(no_fallbacks):
    cpu = torch.arange(12.0).reshape(3, 4)
    tpu = cpu.to("tpu")
    for x in (cpu, tpu):
        x[1] = 7.0
        x[:, 2] = torch.tensor([1.0, 2.0, 3.0], device=x.device)
        x.t()[0].fill_(-1)
    torch.testing.assert_close(tpu.cpu(), cpu)


def test_views_share_storage():
    t = torch.arange(6.0, device="tpu")
    v = t.view(2, 3).t()
    assert v.untyped_storage().data_ptr() == t.untyped_storage().data_ptr()
    assert v._base is t


def test_dtype_promotion(no_fallbacks):
    a = torch.arange(6).reshape(2, 3)
    b = torch.linspace(0, 1, 6).reshape(2, 3)
    h = b.half()
    for fn in (
        lambda a, b, h: a + b,
        lambda a, b, h: a * 2.5,
        lambda a, b, h: h + b,
        lambda a, b, h: a / 4,
        lambda a, b, h: (a > 2) + a,
        lambda a, b, h: b + torch.tensor(2),
    ):
        expected = fn(a, b, h)
        got = fn(a.to("tpu"), b.to("tpu"), h.to("tpu"))
        assert got.dtype == expected.dtype
        torch.testing.assert_close(got.cpu(), expected)


def test_shape_mismatch_raises_like_cpu():
    with pytest.raises(RuntimeError, match="must match the size"):
        torch.ones(2, 3) + torch.ones(4)
    with pytest.raises(RuntimeError, match="must match the size"):
        torch.ones(2, 3, device="tpu") + torch.ones(4, device="tpu")
    with pytest.raises(RuntimeError):
        torch.ones(2, 3, device="tpu") @ torch.ones(2, 3, device="tpu")


def test_mixing_devices_raises():
    with pytest.raises(RuntimeError, match="same device"):
        torch.ones(2, device="tpu") + torch.ones(2)


def test_cpu_scalar_tensor_mixes_like_cuda(no_fallbacks):
    got = torch.ones(3, device="tpu") * torch.tensor(2.0)
    torch.testing.assert_close(got.cpu(), torch.full((3,), 2.0))


def test_item_and_printing():
    t = torch.tensor([1.5, -2.0], device="tpu")
    assert t[0].item() == 1.5
    assert "tpu:0" in repr(t)


def test_manual_seed_reproducible(no_fallbacks):
    torch.manual_seed(123)
    a = torch.rand(8, device="tpu").cpu()
    torch.manual_seed(123)
    b = torch.rand(8, device="tpu").cpu()
    c = torch.rand(8, device="tpu").cpu()
    assert torch.equal(a, b)
    assert not torch.equal(b, c)
    g = torch.Generator(device="tpu").manual_seed(5)
    d = torch.randn(4, device="tpu", generator=g).cpu()
    g.manual_seed(5)
    assert torch.equal(torch.randn(4, device="tpu", generator=g).cpu(), d)


def test_memory_allocated_tracks_storages():
    torch_tpu.sync()
    before = torch.tpu.memory_allocated()
    t = torch.empty(1024, 256, device="tpu")
    assert torch.tpu.memory_allocated() == before + t.numel() * 4
    assert torch.tpu.max_memory_allocated() >= before + t.numel() * 4
    del t
    assert torch.tpu.memory_allocated() == before
    torch.tpu.reset_peak_memory_stats()
    assert torch.tpu.max_memory_allocated() == before


@torch.library.custom_op("tpu_test::cpu_only_twice", mutates_args=(), device_types="cpu")
def _cpu_only_twice(x: torch.Tensor) -> torch.Tensor:
    return x * 2


def test_cpu_fallback_is_counted_and_warned_once():
    # An op with only a CPU kernel stands for any op without a tpu lowering.
    torch_tpu.metrics.reset()
    x = torch.linspace(0.5, 3.0, 5)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = _cpu_only_twice(x.to("tpu"))
        _cpu_only_twice(x.to("tpu"))
    assert got.device.type == "tpu"
    torch.testing.assert_close(got.cpu(), x * 2)
    counters = torch_tpu.metrics.counters()
    assert counters["cpu_fallbacks"] == 2
    assert counters["cpu_fallback_ops"] == {"tpu_test.cpu_only_twice.default": 2}
    assert sum("cpu_only_twice" in str(w.message) for w in caught) == 1
    assert "cpu_only_twice" in torch_tpu.metrics.report()


def test_resize_and_out_variants(no_fallbacks):
    out = torch.empty(0, device="tpu")
    torch.add(torch.ones(2, 2, device="tpu"), 1, out=out)
    torch.testing.assert_close(out.cpu(), torch.full((2, 2), 2.0))


def test_eager_ops_are_cached():
    x = torch.ones(8, device="tpu")
    x + x
    torch_tpu.metrics.reset()
    for _ in range(3):
        x + x
    counters = torch_tpu.metrics.counters()
    assert counters["op_compiles"] == 0
    assert counters["op_cache_hits"] == 3


def test_multiple_devices():
    if torch.tpu.device_count() < 2:
        pytest.skip("needs two tpu devices")
    a = torch.arange(4.0, device="tpu:1")
    assert a.device == torch.device("tpu:1")
    torch.testing.assert_close((a * 2).cpu(), torch.arange(4.0) * 2)
    b = a.to("tpu:0")
    assert b.device.index == 0
    with pytest.raises(RuntimeError, match="same device"):
        a + b
    with torch.tpu.device(1):
        assert torch.empty(1, device="tpu").device.index == 1


def test_compile_for_cpu_tensors_still_works():
    # Renaming PrivateUse1 must not break torch.compile for other devices.
    fn = torch.compile(lambda x: torch.sin(x) * 2 + 1, backend="inductor")
    x = torch.randn(16)
    torch.testing.assert_close(fn(x), torch.sin(x) * 2 + 1)


def test_sync_waits():
    t = torch.ones(256, 256, device="tpu")
    for _ in range(3):
        t = t @ t / 256
    torch_tpu.sync()
    torch.testing.assert_close(t.cpu(), torch.ones(256, 256))


def test_float64_keeps_its_precision_through_arithmetic(no_fallbacks):
    """float64 past float32's 24 bits, through an op (XLA:TPU emulates float64 with float32 pairs,
    which keep 48 bits or more: exact here, as on a v5e)."""
    x = torch.tensor([1.0 + 2.0**-52, math.pi, 1 / 3, -(2.0**-30) - 2.0**-70, 12345.678901234567], dtype=torch.float64)
    got = (x.to("tpu") * 3.0 - x.to("tpu")).cpu()
    torch.testing.assert_close(got, x * 3.0 - x, rtol=1e-14, atol=0)


@pytest.mark.xfail(
    torch_tpu.platform() == "tpu",
    reason="XLA:TPU emulates float64 with float32 pairs, which keep float32's exponent range: 1e300 "
    "becomes inf and 1e-300 zero (measured on a v5e); docs/architecture.md, TPU arithmetic",
    strict=True,
)
def test_float64_keeps_its_range_through_arithmetic(no_fallbacks):
    x = torch.tensor([1e300, -1e-300, 3.0e38 * 16, 2.0**-140], dtype=torch.float64)
    got = (x.to("tpu") * 3.0 - x.to("tpu")).cpu()
    torch.testing.assert_close(got, x * 3.0 - x, rtol=1e-14, atol=0)


def test_dtype_views_reinterpret_bits(no_fallbacks):
    x = torch.randn(4, 6)
    t = x.to("tpu")
    assert torch.equal(t.view(torch.int32).cpu(), x.view(torch.int32))
    assert torch.equal(t.view(torch.uint8)[1:3].cpu(), x.view(torch.uint8)[1:3])
    # XLA:TPU computes float64 as float32 pairs: the reinterpreted bits keep ~48 of float64's 53
    torch.testing.assert_close(
        t.view(torch.float64).cpu(), x.view(torch.float64), **platform_rounding_tol(torch.float64), equal_nan=True
    )
    y, u = x.clone(), t.clone()
    y.view(torch.int32).bitwise_xor_(1)
    u.view(torch.int32).bitwise_xor_(1)
    assert torch.equal(u.cpu(), y)


def test_complex_real_views_alias(no_fallbacks):
    z = torch.randn(2, 3, 2)
    c, ct = torch.view_as_complex(z), torch.view_as_complex(z.to("tpu"))
    assert torch.equal(ct.cpu(), c)
    assert torch.equal(torch.view_as_real(ct).cpu(), z)
    assert torch.equal(ct.view(torch.float32).cpu(), c.view(torch.float32))
    torch.view_as_real(ct).mul_(2)
    assert torch.equal(ct.cpu(), c * 2)


def test_storage_resize_and_set(no_fallbacks):
    x = torch.randn(4, 6)
    t = x.to("tpu")
    grown = t.clone()
    grown.resize_(30)
    assert torch.equal(grown[:24].cpu(), x.reshape(-1))
    view = torch.empty(0, device="tpu")
    view.set_(t.untyped_storage(), 2, (2, 3), (3, 1))
    assert torch.equal(view.cpu(), torch.empty(0).set_(x.untyped_storage(), 2, (2, 3), (3, 1)))
    view.fill_(7)
    expected = x.clone().reshape(-1)
    expected[2:8] = 7
    assert torch.equal(t.reshape(-1).cpu(), expected)


def test_overlapping_inplace_write_raises_like_cpu():
    for device in ("cpu", "tpu"):
        x = torch.zeros(1, 6, device=device)
        with pytest.raises(RuntimeError, match="more than one element of the written-to tensor"):
            x.expand(4, 6).add_(1)


def test_copy_into_expanded_tensor_raises_like_cpu():
    for device in ("cpu", "tpu"):
        x = torch.zeros(1, 6, device=device)
        with pytest.raises(RuntimeError, match="more than one element of the written-to tensor"):
            x.expand(4, 6).copy_(torch.ones(4, 6, device=device))


def _tied_lm() -> torch.nn.ModuleDict:
    embed = torch.nn.Embedding(10, 4)
    head = torch.nn.Linear(4, 10, bias=False)
    head.weight = embed.weight  # tied, as in GPT-2 and small Qwen2 models
    return torch.nn.ModuleDict({"embed": embed, "head": head})


def test_module_to_keeps_parameters_and_tied_weights(no_fallbacks):
    # Module.to() moves each Parameter in place (`param.data = moved`), as for CUDA: shared
    # weights stay shared, and an optimizer made before the move keeps updating the model.
    cpu_model = _tied_lm()
    model = _tied_lm()
    model.load_state_dict(cpu_model.state_dict())
    params = list(model.parameters())
    optimizers = [torch.optim.SGD(m.parameters(), lr=0.5) for m in (cpu_model, model)]
    model.to("tpu")
    moved = list(model.parameters())
    assert len(moved) == len(params) == 1 and moved[0] is params[0]
    assert model["head"].weight is model["embed"].weight and params[0].device.type == "tpu"
    idx = torch.tensor([[1, 2, 3], [3, 2, 9]])
    for m, opt, device in ((cpu_model, optimizers[0], "cpu"), (model, optimizers[1], "tpu")):
        for _ in range(2):
            loss = torch.nn.functional.cross_entropy(
                m["head"](m["embed"](idx.to(device))).flatten(0, 1), idx.flatten().to(device)
            )
            opt.zero_grad()
            loss.backward()
            opt.step()
    # cross entropy's log and exp: TPU's units differ from CPU's (platform_tol)
    torch.testing.assert_close(params[0].cpu(), cpu_model["embed"].weight, **platform_tol({}))
    model.to("cpu", torch.float64)
    assert params[0].device.type == "cpu" and params[0].dtype == torch.float64 and model["head"].weight is params[0]


@pytest.mark.parametrize(
    "make",
    [
        lambda: torch.zeros(3, dtype=torch.chalf, device="tpu"),
        lambda: torch.zeros(3, dtype=torch.chalf).to("tpu"),
        lambda: torch.empty(3, dtype=torch.chalf, device="tpu").cpu(),
    ],
)
def test_complex32_is_refused_with_one_clear_error(make):
    """XLA has no complex32: every way in gives the same TypeError (not a KeyError or numpy's)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's "ComplexHalf support is experimental"
        with pytest.raises(TypeError, match=r"tpu tensors do not support dtype torch\.complex32"):
            make()
