"""Pinned host memory, the host cache and record_stream on tpu, with CUDA's contracts."""

from __future__ import annotations

import torch
from torch.utils.data import DataLoader, TensorDataset

import torch_tpu  # noqa: F401


def test_pin_memory_is_pinned():
    pinned = torch.arange(6.0).pin_memory()
    assert pinned.is_pinned() and pinned[2:].is_pinned()
    assert pinned.device.type == "cpu"
    assert torch.equal(pinned, torch.arange(6.0))
    assert not torch.arange(6.0).is_pinned()
    assert torch.empty(4, pin_memory=True).is_pinned()
    assert not torch.ones(2, device="tpu").is_pinned()


def test_non_blocking_copy_from_pinned_memory_reads_it_at_the_copy():
    pinned = torch.ones(4).pin_memory()
    on_tpu = pinned.to("tpu", non_blocking=True)
    pinned.fill_(7.0)
    assert on_tpu.cpu().tolist() == [1.0] * 4


def test_dataloader_pin_memory():
    loader = DataLoader(TensorDataset(torch.arange(8.0)), batch_size=4, pin_memory=True)
    for (batch,) in loader:
        assert batch.is_pinned()
        assert batch.to("tpu", non_blocking=True).device.type == "tpu"


def test_empty_host_cache_after_a_tpu_tensor():
    """It segfaulted once a tpu tensor existed: no host allocator was registered for the device."""
    torch.ones(2, device="tpu")
    pinned = torch.ones(3).pin_memory()
    torch.accelerator.empty_host_cache()
    assert pinned.is_pinned() and pinned.tolist() == [1.0] * 3


def test_record_stream_is_a_no_op():
    t = torch.ones(4, device="tpu")
    stream = torch.tpu.Stream()
    with torch.tpu.stream(stream):
        y = t * 2
    assert y.record_stream(torch.tpu.current_stream()) is None
    y.record_stream(stream)
    del t
    assert y.cpu().tolist() == [2.0] * 4
    try:
        y.record_stream(torch.Stream("cpu"))
    except RuntimeError as error:
        assert "stream" in str(error)
    else:
        raise AssertionError("a cpu stream was accepted")
