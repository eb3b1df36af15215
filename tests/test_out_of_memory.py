"""torch.OutOfMemoryError wherever tpu memory runs out, as on CUDA: an allocation, a host to
device transfer, an eager op, a compiled graph (at compile and at run), a lazy graph. Each error
names the bytes asked for (where known), what tpu tensors hold and the limit or capacity, and
the process goes on. Also the platform's memory numbers: the device's name and capacity,
mem_get_info and memory_stats from PJRT (TPU, GPU) and from the host (the CPU client)."""

from __future__ import annotations

import jax
import pytest
import torch

import torch_tpu
from torch_tpu import _C
from torch_tpu._units import format_bytes
from torch_tpu.compile import lazy
from torch_tpu.compile import options as compile_options
from torch_tpu.device import memory
from torch_tpu.ops import tensors
from torch_tpu.runtime import client

MiB = 1 << 20
GiB = 1 << 30

# What XLA says on a TPU v5e when a graph's temporaries exceed HBM, and when a buffer does not fit.
XLA_COMPILE_OOM = (
    "RESOURCE_EXHAUSTED: XLA:TPU compile permanent error. Ran out of memory in memory space hbm. Used 19.80G "
    "of 15.75G hbm. Exceeded hbm capacity by 4.05G.\n\nTotal hbm usage >= 20.05G:\n    reserved 530.00M"
)
XLA_RUN_OOM = (
    "RESOURCE_EXHAUSTED: Error allocating device buffer: Attempting to allocate 19.80G. That was not "
    "possible. There are 15.48G free.; (0x0x0_HBM0)"
)


@pytest.fixture
def limit():
    """A limit on tpu:0 of 64 MiB above what tpu tensors hold now; no limit after the test."""
    cap = torch.tpu.memory_allocated(0) + 64 * MiB
    memory.set_limit(0, cap)
    yield cap
    memory.set_limit(0, None)


def _assert_names(error: torch.OutOfMemoryError, nbytes: int | None, bound: int) -> None:
    text = str(error)
    assert text.startswith("tpu:0 out of memory"), text
    if nbytes is not None:
        assert f"Tried to allocate {format_bytes(nbytes)} ({nbytes} bytes)" in text, text
    assert "already allocated by tpu tensors" in text, text
    assert f"({bound} bytes)" in text, text


def _assert_goes_on() -> None:
    """After an out-of-memory error the next allocation and op work and give CPU's results."""
    cpu = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    t = cpu.to("tpu")
    torch.testing.assert_close((t @ t.T + 1).cpu(), cpu @ cpu.T + 1)
    more = torch.ones(8 * MiB, dtype=torch.uint8, device="tpu")
    assert more.sum().item() == 8 * MiB


def test_allocation_over_the_limit(limit):
    before = torch.tpu.memory_allocated(0)
    with pytest.raises(torch.OutOfMemoryError) as caught:
        torch.empty(128 * MiB, dtype=torch.uint8, device="tpu")
    _assert_names(caught.value, 128 * MiB, limit)
    assert torch.tpu.memory_allocated(0) == before  # nothing was counted
    _assert_goes_on()


def test_transfer_over_the_limit(limit):
    host = torch.ones(32 * MiB)  # 128 MiB of float32
    with pytest.raises(torch.OutOfMemoryError) as caught:
        host.to("tpu")
    _assert_names(caught.value, 128 * MiB, limit)
    _assert_goes_on()
    torch.testing.assert_close(host[:1000].to("tpu").cpu(), host[:1000])


def test_eager_op_result_over_the_limit(limit):
    x = torch.ones(8 * MiB, device="tpu")  # 32 MiB
    with pytest.raises(torch.OutOfMemoryError) as caught:
        torch.cat([x, x])  # 64 MiB more
    _assert_names(caught.value, 64 * MiB, limit)
    assert x.sum().item() == 8 * MiB  # the input is intact
    _assert_goes_on()


def test_compiled_graph_output_over_the_limit(limit, fresh_dynamo):
    f = torch.compile(lambda x: torch.cat([x, x, x]) * 2, backend="tpu", dynamic=False)
    with pytest.raises(torch.OutOfMemoryError) as caught:
        f(torch.ones(8 * MiB, device="tpu"))  # 32 MiB in, 96 MiB out
    _assert_names(caught.value, 96 * MiB, limit)
    _assert_goes_on()
    small = torch.arange(6.0)
    torch.testing.assert_close(f(small.to("tpu")).cpu(), torch.cat([small, small, small]) * 2)


def test_xla_out_of_memory_in_a_compiled_graph(monkeypatch, fresh_dynamo):
    """XLA's RESOURCE_EXHAUSTED at the graph's compile (temporaries over HBM) and at its run.
    The CPU client allocates host memory and never refuses these, so the error is simulated: the
    compile, then the executable, raises jax's JaxRuntimeError with XLA:TPU's text."""
    real_compile = compile_options.compile_lowered
    out_of_memory = [True]

    def compile_fails(lowered, options):
        raise jax.errors.JaxRuntimeError(XLA_COMPILE_OOM)

    def run_fails(lowered, options):
        compiled = real_compile(lowered, options)

        def run(*args):
            if out_of_memory[0]:
                raise jax.errors.JaxRuntimeError(XLA_RUN_OOM)
            return compiled(*args)

        return run

    f = torch.compile(lambda x: (x.unsqueeze(0) * x.unsqueeze(1)).sum(0) + 3, backend="tpu")
    x = torch.arange(5.0)
    for fails, what, quoted in ((compile_fails, "compiling", "Ran out of memory"), (run_fails, "running", "19.80G")):
        monkeypatch.setattr(compile_options, "compile_lowered", fails)
        with pytest.raises(torch.OutOfMemoryError) as caught:
            f(x.to("tpu"))
        text = str(caught.value)
        assert text.startswith(f"tpu:0 out of memory {what} the") and "graph" in text, text
        assert quoted in text and "already allocated by tpu tensors" in text, text
        assert "Total hbm usage" not in text  # XLA's first line only; the whole error is the cause
        assert isinstance(caught.value.__cause__, jax.errors.JaxRuntimeError)
        monkeypatch.undo()
    _assert_goes_on()
    out_of_memory[0] = False  # memory was freed: the same executable runs
    torch.testing.assert_close(f(x.to("tpu")).cpu(), (x.unsqueeze(0) * x.unsqueeze(1)).sum(0) + 3)


def test_lazy_graph_out_of_memory(limit, monkeypatch):
    """At record time the limit refuses a pending result, as eager does. At the trace's run,
    XLA's RESOURCE_EXHAUSTED is simulated (see test_xla_out_of_memory_in_a_compiled_graph)."""
    x = torch.ones(8 * MiB, device="tpu")  # 32 MiB
    with torch_tpu.eager_mode(False):
        with pytest.raises(torch.OutOfMemoryError) as caught:
            torch.cat([x, x])
        small = x[:4] * 3
    _assert_names(caught.value, 64 * MiB, limit)
    assert small.cpu().tolist() == [3.0] * 4

    def compile_fails(lowered, options):
        raise jax.errors.JaxRuntimeError(XLA_COMPILE_OOM)

    monkeypatch.setattr(compile_options, "compile_lowered", compile_fails)
    with pytest.raises(torch.OutOfMemoryError) as caught:
        with torch_tpu.eager_mode(False):
            y = x[:7] * 5 - 1
        # leaving lazy mode runs the trace
    assert str(caught.value).startswith("tpu:0 out of memory compiling the lazy graph of")
    assert isinstance(caught.value.__cause__, jax.errors.JaxRuntimeError)
    monkeypatch.undo()
    assert torch_tpu.is_eager_mode() and not lazy.enabled()  # the mode was restored
    with pytest.raises(RuntimeError, match="failed to run"):
        y.cpu()  # that trace's results do not exist
    _assert_goes_on()
    with torch_tpu.eager_mode(False):
        z = x[:3] + 1
    assert z.cpu().tolist() == [2.0] * 3


def test_never_written_storage_out_of_memory(monkeypatch):
    """A storage never written becomes zeros on the device at its first read; on a TPU a 64 GiB
    one raises XLA's RESOURCE_EXHAUSTED there (simulated: the CPU client would allocate it)."""
    t = torch.empty(4 * MiB, dtype=torch.uint8, device="tpu")

    def zeros_fail(n, dtype, device):
        def make():
            raise jax.errors.JaxRuntimeError(f"RESOURCE_EXHAUSTED: Out of memory allocating {n} bytes.")

        return make

    monkeypatch.setattr(tensors, "_zeros_fn", zeros_fail)
    with pytest.raises(torch.OutOfMemoryError) as caught:
        t.add_(1)
    assert f"Tried to allocate 4.00 MiB ({4 * MiB} bytes)" in str(caught.value)
    assert "never-written" in str(caught.value)
    monkeypatch.undo()
    assert t.add_(1).sum().item() == 4 * MiB  # zeros, plus one
    _assert_goes_on()


# ---- the platform's numbers ------------------------------------------------------------


TPU_STATS = {"bytes_limit": 16_909_336_576, "bytes_in_use": 1 * GiB, "peak_bytes_in_use": 2 * GiB, "num_allocs": 7}


class _FakeTpu:
    """A jax device as a TPU v5e's PJRT client shows it."""

    platform = "tpu"
    device_kind = "TPU v5 lite"

    def memory_stats(self) -> dict:
        return dict(TPU_STATS)


@pytest.fixture
def fake_tpu(monkeypatch):
    """tpu:0 reads as a TPU v5e (name, PJRT stats) in torch.tpu's memory and property functions;
    restored, with the registry's capacity, after the test."""
    real_device, real_info = client.jax_device, _C._device_info
    monkeypatch.setattr(client, "jax_device", lambda i: _FakeTpu() if i == 0 else real_device(i))
    monkeypatch.setattr(_C, "_device_info", lambda i: (0, "TPU v5 lite", "tpu", [0, 0, 0]) if i == 0 else real_info(i))
    yield TPU_STATS
    monkeypatch.undo()
    _C._set_memory_capacity(0, -1)


def test_properties_and_memory_info_read_pjrt_on_tpu(fake_tpu):
    props = torch.tpu.get_device_properties(0)
    assert props.name == torch.tpu.get_device_name(0) == "TPU v5 lite"
    assert props.total_memory == fake_tpu["bytes_limit"]
    assert torch.tpu.get_device_capability(0) == (5, 0)
    assert torch.tpu.mem_get_info(0) == (fake_tpu["bytes_limit"] - GiB, fake_tpu["bytes_limit"])
    stats = torch.tpu.memory_stats(0)
    for key, value in fake_tpu.items():
        assert stats[f"device.{key}"] == value
    assert stats["allocated_bytes.all.current"] == torch.tpu.memory_allocated(0)  # tpu tensors' own count


def test_reported_capacity_refuses_what_can_never_fit(fake_tpu, monkeypatch):
    memory.apply_limits()  # as at import on a TPU
    capacity = fake_tpu["bytes_limit"]
    assert memory.capacity(0) == capacity and memory.limit(0) is None
    with pytest.raises(torch.OutOfMemoryError) as caught:
        torch.empty(64 * GiB, dtype=torch.uint8, device="tpu")  # refused at once, as CUDA does
    _assert_names(caught.value, 64 * GiB, capacity)
    assert f"tpu:0 has a total capacity of {format_bytes(capacity)}" in str(caught.value)
    # an XLA error's message names PJRT's numbers too
    text = memory.out_of_memory_message(0, "running x", 3 * GiB, "RESOURCE_EXHAUSTED: ...")
    assert f"has a total capacity of {format_bytes(capacity)} ({capacity} bytes), of which 1.00 GiB" in text
    assert text.startswith("tpu:0 out of memory running x. Tried to allocate 3.00 GiB")
    monkeypatch.undo()  # the CPU client's device again (ops run on it); the capacity stays
    assert torch.empty(MiB, dtype=torch.uint8, device="tpu").zero_().sum().item() == 0
    with pytest.raises(torch.OutOfMemoryError, match="has a total capacity"):
        torch.empty(16 * GiB, dtype=torch.uint8, device="tpu")


@pytest.mark.cpu_client
def test_cpu_client_numbers():
    assert memory.runtime_stats(0) == {} and memory.capacity(0) is None  # no capacity: no refusal
    props = torch.tpu.get_device_properties(0)
    assert props.name == "cpu" and props.total_memory == memory.host_memory_bytes()
    free, total = torch.tpu.mem_get_info(0)
    assert total == memory.host_memory_bytes() and 0 < free <= total
    assert not any(key.startswith("device.") for key in torch.tpu.memory_stats(0))
