"""Tensor.record_stream: a no-op with CUDA's contract.

On CUDA it tells the caching allocator not to reuse the tensor's memory until the work queued on
the stream so far is done. A tpu buffer is a refcounted jax array that PJRT keeps alive while any
queued computation uses it, so there is nothing to record; as on CUDA, the stream must be one of
the tensor's device type.
"""

from __future__ import annotations

import torch

from torch_tpu.ops.registry import aten, lower


@lower(aten.record_stream.default, eager=True)
def record_stream(self: torch.Tensor, s: torch.Stream) -> None:
    if s.device.type != self.device.type:
        raise RuntimeError(f"record_stream: expected a {self.device.type} stream, got one on {s.device}")
