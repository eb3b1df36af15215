"""`tpu-info`: devices, platform, memory and compile cache, like nvidia-smi."""

from __future__ import annotations

import argparse
import json
import sys


def collect() -> dict:
    import torch

    import torch_tpu

    devices = []
    for i in range(torch.tpu.device_count()):
        props = torch.tpu.get_device_properties(i)
        devices.append(
            {
                "index": i,
                "kind": props.name,
                "platform": props.platform,
                "memory_in_use_bytes": torch.tpu.memory_allocated(i),
                "memory_peak_bytes": torch.tpu.max_memory_allocated(i),
            }
        )
    return {"platform": torch_tpu.platform(), "devices": devices}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tpu-info", description=__doc__)
    parser.add_argument("--json", action="store_true", help="print machine-readable JSON")
    args = parser.parse_args(argv)
    info = collect()
    if args.json:
        json.dump(info, sys.stdout, indent=2)
        print()
        return 0
    print(f"platform: {info['platform']}")
    print(f"{'idx':>3}  {'kind':24s} {'in use':>12} {'peak':>12}")
    for d in info["devices"]:
        print(f"{d['index']:>3}  {d['kind']:24s} {d['memory_in_use_bytes']:>12} {d['memory_peak_bytes']:>12}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
