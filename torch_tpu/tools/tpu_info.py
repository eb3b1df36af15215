"""`tpu-info`: devices, platform, memory in use and peak per process, and the compile cache.

Like nvidia-smi: one table of devices (index, kind, platform, bytes in use and peak summed
over the torch_tpu processes it can see, capacity), one of processes, and the persistent
compile cache's directory and size. Other processes are seen through their stats files
(torch_tpu.tools.stats_file). `--json` prints the same as JSON; `--watch [SECONDS]` refreshes
(with --json: one JSON object per line).

Arguments are parsed before the backend starts, so `tpu-info --help` answers at once; the stats
files of other processes are read through stats_file.read_all, which trusts nothing in them.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import sys
import time

from torch_tpu._units import format_bytes
from torch_tpu.tools import stats_file


def cache_summary(directory: pathlib.Path | None = None) -> dict:
    """The persistent compile cache: its directory, file count and total bytes."""
    if directory is None:
        from torch_tpu.runtime.cache_dir import cache_dir

        directory = cache_dir()
    files, size = 0, 0
    for root, _, names in os.walk(directory):
        for name in names:
            try:
                size += os.stat(os.path.join(root, name)).st_size
                files += 1
            except OSError:
                pass
    return {"directory": str(directory), "exists": os.path.isdir(directory), "files": files, "bytes": size}


def collect(include_self: bool = True, stats_dir: pathlib.Path | None = None) -> dict:
    """What tpu-info shows, as a dict: platform, devices, processes and compile_cache."""
    import torch_tpu

    own = stats_file.snapshot()
    processes = stats_file.read_all(stats_dir, skip_pid=os.getpid())
    if include_self:
        processes.insert(0, own)
    devices = {}
    for d in own["devices"]:
        devices[(d["platform"], d["index"])] = {
            "index": d["index"],
            "kind": d["kind"],
            "platform": d["platform"],
            "memory_in_use_bytes": 0,
            "memory_peak_bytes": 0,
            "memory_total_bytes": torch_tpu.device.memory.total_memory(d["index"]),
            "runtime": d["runtime"],
            "pids": [],
        }
    for record in processes:
        for d in record.get("devices", []):
            key = (d["platform"], d["index"])
            entry = devices.setdefault(
                key,
                {
                    "index": d["index"],
                    "kind": d["kind"],
                    "platform": d["platform"],
                    "memory_in_use_bytes": 0,
                    "memory_peak_bytes": 0,
                    "memory_total_bytes": d.get("runtime", {}).get("bytes_limit"),
                    "runtime": d.get("runtime", {}),
                    "pids": [],
                },
            )
            entry["memory_in_use_bytes"] += d["memory_in_use_bytes"]
            entry["memory_peak_bytes"] += d["memory_peak_bytes"]
            if d["memory_in_use_bytes"] or d["memory_peak_bytes"]:
                entry["pids"].append(record["pid"])
    return {
        "time": time.time(),
        "platform": own["platform"],
        "devices": sorted(devices.values(), key=lambda d: (d["platform"] != own["platform"], d["index"])),
        "processes": [
            {
                "pid": r["pid"],
                "self": r["pid"] == os.getpid(),
                "command": " ".join(r.get("argv", [])),
                "platform": r.get("platform"),
                "devices": [
                    {
                        "index": d["index"],
                        "memory_in_use_bytes": d["memory_in_use_bytes"],
                        "memory_peak_bytes": d["memory_peak_bytes"],
                        "memory_limit_bytes": d.get("memory_limit_bytes"),
                    }
                    for d in r.get("devices", [])
                    if d["memory_in_use_bytes"] or d["memory_peak_bytes"]
                ],
            }
            for r in processes
        ],
        "compile_cache": cache_summary(),
    }


def render(info: dict) -> str:
    """The text table tpu-info prints."""
    stamp = datetime.datetime.fromtimestamp(info["time"]).strftime("%Y-%m-%d %H:%M:%S")
    lines = [f"tpu-info   platform: {info['platform']}   {stamp}", ""]
    lines.append(f"{'idx':>3}  {'kind':20s} {'platform':8s} {'in use':>12} {'peak':>12} {'total':>12}  processes")
    for d in info["devices"]:
        total = format_bytes(d["memory_total_bytes"]) if d["memory_total_bytes"] else "-"
        pids = ",".join(str(p) for p in d["pids"]) or "-"
        lines.append(
            f"{d['index']:>3}  {d['kind'][:20]:20s} {d['platform']:8s} {format_bytes(d['memory_in_use_bytes']):>12} "
            f"{format_bytes(d['memory_peak_bytes']):>12} {total:>12}  {pids}"
        )
    lines += ["", f"{'pid':>8}  {'device':>6} {'in use':>12} {'peak':>12}  command"]
    shown = False
    for p in info["processes"]:
        for d in p["devices"]:
            shown = True
            lines.append(
                f"{p['pid']:>8}  {d['index']:>6} {format_bytes(d['memory_in_use_bytes']):>12} "
                f"{format_bytes(d['memory_peak_bytes']):>12}  {p['command'][:60]}"
            )
    if not shown:
        lines.append(f"{'':>8}  no torch_tpu process holds tpu memory")
    cache = info["compile_cache"]
    state = f"{cache['files']} files, {format_bytes(cache['bytes'])}" if cache["exists"] else "not created yet"
    lines += ["", f"compile cache: {cache['directory']}  ({state})"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tpu-info", description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print machine-readable JSON")
    parser.add_argument(
        "--watch",
        nargs="?",
        type=float,
        const=1.0,
        metavar="SECONDS",
        help="refresh every SECONDS (default 1) until interrupted",
    )
    parser.add_argument("--count", type=int, default=0, help="with --watch: stop after this many refreshes")
    args = parser.parse_args(argv)
    # tpu-info itself holds no tpu memory; keep it out of others' views.
    os.environ["TORCH_TPU_STATS"] = "0"
    import torch_tpu

    torch_tpu._load()  # deferred for the tpu-info command (torch_tpu/__init__.py)
    stats_file.stop()
    clear = sys.stdout.isatty() and not args.json
    shown = 0
    try:
        while True:
            info = collect(include_self=False)
            if args.json:
                text = json.dumps(info) if args.watch is not None else json.dumps(info, indent=2)
            else:
                text = render(info)
            if clear and args.watch is not None:
                sys.stdout.write("\x1b[H\x1b[2J")
            print(text, flush=True)
            shown += 1
            if args.watch is None or (args.count and shown >= args.count):
                return 0
            time.sleep(max(args.watch, 0.05))
    except KeyboardInterrupt:
        return 0


if __name__ == "__main__":
    sys.exit(main())
