"""Per-process memory stats files, so `tpu-info` can see other running torch_tpu processes.

Every torch_tpu process writes `<dir>/<pid>.json` (the devices, and each one's bytes in use,
peak and limit) when it starts and, from a daemon thread, whenever those numbers change
(checked every TORCH_TPU_STATS_INTERVAL seconds, default 1). Writes are atomic (a temporary
file renamed over the old one) and the file is removed at exit. Files of dead processes are
ignored (and removed) by readers. The directory is TORCH_TPU_STATS_DIR, else
$XDG_RUNTIME_DIR/torch_tpu, else /tmp/torch_tpu-<uid>. TORCH_TPU_STATS=0 turns publishing off.

A directory owned by another user, or writable by others, is refused with a warning (neither
written nor read): anyone could plant or swap files there. Readers trust nothing in the files:
only regular files are opened (no FIFOs, devices or symlinks), at most 1 MiB of each is read,
and records are checked field by field (`parse_record`), with control characters in strings
replaced, so a hostile file is skipped or shown harmlessly.
"""

from __future__ import annotations

import atexit
import json
import os
import pathlib
import re
import stat
import sys
import tempfile
import threading
import time
import warnings

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


_MAX_FILE_BYTES = 1 << 20
_MAX_DEVICES = 4096
_MAX_PID = (1 << 31) - 1
_MAX_BYTES = (1 << 63) - 1
# C0 and C1 control characters (terminal escapes start with ESC or CSI) and the bidirectional
# overrides, which reorder what a terminal shows.
_UNSAFE_TEXT = re.compile("[\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
_refused: set[str] = set()


def dir_problem(directory: pathlib.Path) -> str | None:
    """Why `directory` must not hold stats files (another user's, or writable by others), or
    None when it is fine or does not exist yet."""
    try:
        st = os.stat(directory)
    except FileNotFoundError:
        return None
    except OSError as e:
        return f"it cannot be inspected ({e.strerror})"
    if not stat.S_ISDIR(st.st_mode):
        return "it is not a directory"
    if st.st_uid != os.getuid():
        return f"it is owned by uid {st.st_uid}, not by this user (uid {os.getuid()})"
    if st.st_mode & (stat.S_IWOTH | stat.S_IWGRP):
        return f"it is writable by other users (mode {stat.S_IMODE(st.st_mode):o})"
    return None


def _usable_dir(directory: pathlib.Path) -> bool:
    problem = dir_problem(directory)
    if problem is None:
        return True
    if str(directory) not in _refused:
        _refused.add(str(directory))
        warnings.warn(
            f"torch_tpu: not using stats directory {directory}: {problem}. Set TORCH_TPU_STATS_DIR "
            "to a directory of your own (mode 700), or TORCH_TPU_STATS=0.",
            RuntimeWarning,
            stacklevel=3,
        )
    return False


def safe_text(value: object, limit: int = 200) -> str | None:
    """`value` if it is a string, with control characters replaced and cut to `limit`."""
    if not isinstance(value, str):
        return None
    return _UNSAFE_TEXT.sub("?", value[:limit])


def _count(value: object, maximum: int = _MAX_BYTES) -> int | None:
    # bool is an int subclass; JSON true is not a byte count.
    if type(value) is int and 0 <= value <= maximum:
        return value
    return None


def _parse_device(d: object) -> dict | None:
    if not isinstance(d, dict):
        return None
    device = {
        "index": _count(d.get("index"), _MAX_DEVICES),
        "kind": safe_text(d.get("kind"), 60),
        "platform": safe_text(d.get("platform"), 20),
        "memory_in_use_bytes": _count(d.get("memory_in_use_bytes")),
        "memory_peak_bytes": _count(d.get("memory_peak_bytes")),
    }
    if any(v is None for v in device.values()):
        return None
    device["memory_limit_bytes"] = _count(d.get("memory_limit_bytes"))
    runtime = d.get("runtime")
    device["runtime"] = {}
    if isinstance(runtime, dict):
        for key, value in list(runtime.items())[:64]:
            if isinstance(key, str) and _count(value) is not None:
                device["runtime"][safe_text(key, 60)] = value
    return device


def parse_record(data: object) -> dict | None:
    """A stats file's JSON, checked: the record with only well-typed fields, or None."""
    if not isinstance(data, dict):
        return None
    pid = _count(data.get("pid"), _MAX_PID)
    if not pid:
        return None
    argv = data.get("argv")
    devices = data.get("devices")
    updated = data.get("updated")
    return {
        "pid": pid,
        "start_time": _count(data.get("start_time")),
        "argv": [t for t in (safe_text(a) for a in argv[:16]) if t is not None] if isinstance(argv, list) else [],
        "platform": safe_text(data.get("platform"), 20),
        "devices": [d for d in (_parse_device(x) for x in devices[:_MAX_DEVICES]) if d is not None]
        if isinstance(devices, list)
        else [],
        "updated": updated if type(updated) in (int, float) and updated == updated else None,
    }


def _read_small_regular_file(path: pathlib.Path) -> bytes | None:
    """The bytes of `path` if it is a regular file (not a link, FIFO or device) of at most 1 MiB."""
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > _MAX_FILE_BYTES:
            return None
        data = os.read(fd, _MAX_FILE_BYTES + 1)
    except OSError:
        return None
    finally:
        os.close(fd)
    return data if len(data) <= _MAX_FILE_BYTES else None


def read_record(path: pathlib.Path) -> dict | None:
    """The checked record in stats file `path`, or None (unreadable, malformed, hostile)."""
    data = _read_small_regular_file(path)
    if data is None:
        return None
    try:
        return parse_record(json.loads(data.decode("utf-8")))
    except (ValueError, RecursionError):
        return None


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
    if not _usable_dir(path.parent):
        raise PermissionError(f"refusing stats directory {path.parent}")
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
    if not _usable_dir(directory):
        return []
    records = []
    try:
        paths = sorted(directory.glob("*.json"))
    except OSError:
        return []
    for path in paths:
        record = read_record(path)
        if record is None:
            continue  # being replaced, or not ours
        pid = record["pid"]
        if pid == skip_pid:
            continue
        if not is_alive(pid, record["start_time"]):
            try:
                path.unlink()
            except OSError:
                pass
            continue
        records.append(record)
    return records


atexit.register(stop)
os.register_at_fork(after_in_child=_after_fork_in_child)
