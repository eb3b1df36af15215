"""Per-process memory stats files, so `tpu-info` can see other running torch_tpu processes.

Every torch_tpu process writes `<dir>/<pid>.json` (the devices, and each one's bytes in use,
peak and limit) when it starts and, from a daemon thread, whenever those numbers change
(checked every TORCH_TPU_STATS_INTERVAL seconds, default 1). Writes are atomic (a temporary
file renamed over the old one) and the file is removed at exit. Files of dead processes are
ignored (and removed) by readers. The directory is TORCH_TPU_STATS_DIR, else
$XDG_RUNTIME_DIR/torch_tpu, else /tmp/torch_tpu-<uid>. TORCH_TPU_STATS=0 turns publishing off.
"""

from __future__ import annotations

import atexit
import json
import os
import pathlib
import sys
import tempfile
import threading
import time

_lock = threading.Lock()
_state: dict = {"thread": None, "stop": None, "path": None, "last": None}


def stats_dir() -> pathlib.Path:
    configured = os.environ.get("TORCH_TPU_STATS_DIR")
    if configured:
        return pathlib.Path(configured).expanduser()
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and os.access(runtime, os.W_OK):
        return pathlib.Path(runtime) / "torch_tpu"
    return pathlib.Path(tempfile.gettempdir()) / f"torch_tpu-{os.getuid()}"


def process_start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (/proc), to tell a reused pid apart."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        return int(fields[19])
    except (OSError, IndexError, ValueError):
        return None


def is_alive(pid: int, start_time: int | None) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    if start_time is not None:
        current = process_start_time(pid)
        return current is None or current == start_time
    return True


def snapshot() -> dict:
    """This process's stats, as written to its file."""
    from torch_tpu import _C
    from torch_tpu.device import memory
    from torch_tpu.runtime import client

    devices = []
    for index in range(_C._device_count()):
        _, kind, device_platform, _ = _C._device_info(index)
        stats = _C._memory_stats(index)
        devices.append(
            {
                "index": index,
                "kind": kind,
                "platform": device_platform,
                "memory_in_use_bytes": stats["allocated_bytes.all.current"],
                "memory_peak_bytes": stats["allocated_bytes.all.peak"],
                "memory_limit_bytes": memory.limit(index),
                "runtime": memory.runtime_stats(index),
            }
        )
    return {
        "pid": os.getpid(),
        "start_time": process_start_time(os.getpid()),
        "argv": [os.path.basename(sys.executable), *sys.argv[:8]],
        "platform": client.platform(),
        "devices": devices,
    }


def _write(path: pathlib.Path, record: dict) -> None:
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{threading.get_ident()}.tmp")
    tmp.write_text(json.dumps(record))
    os.replace(tmp, path)


def publish() -> None:
    """Writes this process's file now if its numbers changed since the last write."""
    path = _state["path"]
    if path is None or _state.get("pid") != os.getpid():
        return
    record = snapshot()
    key = json.dumps(record["devices"], sort_keys=True)
    with _lock:
        if key == _state["last"]:
            return
        record["updated"] = time.time()
        try:
            _write(path, record)
        except OSError:
            _state["path"] = None  # an unwritable directory: stop trying
            return
        _state["last"] = key


def _loop(stop: threading.Event, interval: float) -> None:
    while not stop.wait(interval):
        try:
            publish()
        except Exception:  # interpreter shutdown, or a device gone: never disturb the program
            return


def start() -> None:
    """Starts publishing this process's stats (no-op with TORCH_TPU_STATS=0 or if started)."""
    if os.environ.get("TORCH_TPU_STATS", "1") in ("0", "") or _state["thread"] is not None:
        return
    interval = float(os.environ.get("TORCH_TPU_STATS_INTERVAL", "1") or 1)
    _state.update(path=stats_dir() / f"{os.getpid()}.json", pid=os.getpid(), last=None)
    publish()
    if _state["path"] is None:
        return
    stop = threading.Event()
    thread = threading.Thread(target=_loop, args=(stop, interval), name="torch_tpu-stats", daemon=True)
    _state.update(thread=thread, stop=stop)
    thread.start()


def stop() -> None:
    """Stops publishing and removes this process's file."""
    if _state["stop"] is not None:
        _state["stop"].set()
    path = _state["path"]
    if path is not None and _state.get("pid") == os.getpid():
        try:
            path.unlink()
        except OSError:
            pass
    _state.update(thread=None, stop=None, path=None, last=None)


def _after_fork_in_child() -> None:
    # The child has no publisher thread and must not remove its parent's file.
    _state.update(thread=None, stop=None, path=None, last=None, pid=None)


def read_all(directory: pathlib.Path | None = None, skip_pid: int | None = None) -> list[dict]:
    """The records of live processes in `directory`; files of dead ones are removed."""
    directory = stats_dir() if directory is None else pathlib.Path(directory)
    records = []
    try:
        paths = sorted(directory.glob("*.json"))
    except OSError:
        return []
    for path in paths:
        try:
            record = json.loads(path.read_text())
            pid = int(record["pid"])
        except (OSError, ValueError, KeyError, TypeError):
            continue  # being replaced, or not ours
        if pid == skip_pid:
            continue
        if not is_alive(pid, record.get("start_time")):
            try:
                path.unlink()
            except OSError:
                pass
            continue
        records.append(record)
    return records


atexit.register(stop)
os.register_at_fork(after_in_child=_after_fork_in_child)
