"""No abort after an out-of-memory error, on any path: the op raises torch.OutOfMemoryError, and the
next allocation and op work. Each case runs in a fresh process (an abort ends it)."""

from __future__ import annotations

import os

import pytest

from tests.helpers import run_python

# An OOM against the memory limit (the sort), then a tensor far larger than the host's memory
# whose value the CPU client fails to allocate when it computes it: its first op used to read
# the failed array through DLPack on the host tier, and XLA aborted the process
# (raw_buffer.h: Check failed: buffer_.IsConcrete()).
_SCRIPT = r"""
import resource
# 64 GiB of address space: the 512 GiB allocation below fails even where the kernel overcommits
# memory without bound (vm.overcommit_memory=1), instead of touching pages until killed.
resource.setrlimit(resource.RLIMIT_AS, (64 << 30, 64 << 30))
import torch, torch_tpu
from torch_tpu.device import memory

b = torch.ones(4000, 4000, device="tpu")
try:
    torch.sort(b.expand(3, 4000, 4000), -1)
    raise SystemExit("the sort past the limit ran")
except torch.OutOfMemoryError:
    pass
memory.set_limit(0, None)
g = torch.empty(1 << 37, device="tpu")  # 512 GiB
try:
    g.fill_(1)  # its failure may also surface only where g is read
except torch.OutOfMemoryError:
    pass
try:
    g[:3].sum().item()
except torch.OutOfMemoryError:
    pass
del g
x = torch.arange(1000.0, device="tpu") * 2
assert torch.equal(x.cpu(), torch.arange(1000.0) * 2)
assert torch.equal(b.sum(0).cpu(), torch.full((4000,), 4000.0))
print("alive")
"""


@pytest.mark.parametrize("async_compile", [None, "0"], ids=["default", "compile_first"])
def test_oom_then_allocate_does_not_abort(tmp_path, async_compile):
    env = {k: v for k, v in os.environ.items() if k != "TORCH_TPU_ASYNC_COMPILE"}
    if async_compile is not None:
        env["TORCH_TPU_ASYNC_COMPILE"] = async_compile
    env.update(
        TORCH_TPU_MEMORY_LIMIT="256M",
        TORCH_TPU_CACHE_DIR=str(tmp_path),
        TORCH_TPU_EXIT_COMPILE_WAIT="0",
        TORCH_TPU_PLATFORM="cpu",
    )
    result = run_python(["-c", _SCRIPT], env, cwd=str(tmp_path))
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().splitlines()[-1] == "alive"
