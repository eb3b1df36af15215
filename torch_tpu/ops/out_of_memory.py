"""XLA's out-of-memory errors as torch.OutOfMemoryError, whichever status XLA gives them: TPU and
GPU clients report RESOURCE_EXHAUSTED; the CPU client reports a failed allocation of an output
when the value is awaited ("INTERNAL: Error dispatching computation: Out of memory allocating
N bytes")."""

from __future__ import annotations

import torch

from torch_tpu.device import memory


def raise_typed(error: Exception, device: int, what: str = "") -> None:
    """Raises torch.OutOfMemoryError (from `error`) if `error` is XLA's out of memory; else returns."""
    text = str(error)
    memory.raise_if_out_of_memory(error, device, what)  # RESOURCE_EXHAUSTED, with the memory stats
    if "out of memory" in text.lower():
        running = f" running {what}" if what else ""
        raise torch.OutOfMemoryError(f"tpu:{device} out of memory{running}. XLA: {text.strip()}") from error
