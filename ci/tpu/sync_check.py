"""Does torch.tpu.synchronize() wait for work whose outputs were freed? Times 10 8192² bf16
matmuls whose results are dropped against 10 kept ones, each followed by synchronize();
prints the ratio (>= 0.8 means the dropped work was waited for)."""

from __future__ import annotations

import json
import sys
import time

import torch

import torch_tpu

SIZE = 8192 if torch_tpu.platform() == "tpu" else 512  # (the CPU client: a quick dry run)


def _timed(keep: bool, n: int = 10) -> float:
    a = torch.randn(SIZE, SIZE, dtype=torch.bfloat16, device="tpu")
    torch.tpu.synchronize()
    kept = []
    start = time.perf_counter()
    for _ in range(n):
        y = a @ a
        if keep:
            kept.append(y)
        del y
    torch.tpu.synchronize()
    return time.perf_counter() - start


def main() -> int:
    _timed(True, 2)  # compile
    dropped = min(_timed(False) for _ in range(3))
    kept = min(_timed(True) for _ in range(3))
    flops = 10 * 2 * SIZE**3
    result = {
        "platform": torch_tpu.platform(),
        "dropped_ms": dropped * 1e3,
        "kept_ms": kept * 1e3,
        "dropped_over_kept": dropped / kept,
        "kept_tflops": flops / kept / 1e12,
    }
    print(json.dumps(result))
    return 0 if result["dropped_over_kept"] >= 0.8 else 1


if __name__ == "__main__":
    sys.exit(main())
