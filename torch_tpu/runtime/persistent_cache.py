"""The persistent compile cache: entries on disk, shared by processes, checked at every load.

An entry is one file, `<sha256 of its key>.xla`, laid out as
    MAGIC | key length (u32) | key (utf-8) | body length (u64) | body (zlib) | sha256 of all before
and a load checks, in order: the file is a regular file (opened non-blocking,
so a FIFO cannot hang us) owned by this user, its checksum, and that it holds
the key asked for (a file copied over another's name is refused). A refused
entry is warned about (CacheWarning) and treated as a miss: the caller
compiles again and overwrites it.

Writes go to `.<name>.tmp.<host>.<pid>.<n>`, then are renamed into place, so a
reader sees a whole entry or none; temporaries left by killed processes are
removed when the next process opens the cache. The directory is created 0700;
one owned by another user is not used. Past TORCH_TPU_CACHE_MAX_BYTES (default
2 GiB) the least recently used entries are deleted (a load touches its file).
A directory that cannot be created or written (a file, read-only, full disk)
is warned about once, and the process goes on without persistence.

The directory is TORCH_TPU_CACHE_DIR (default ~/.cache/torch_tpu);
TORCH_TPU_PERSISTENT_CACHE=0 turns the cache off. jax's own persistent cache is
turned off: its entries carry no checksum and its key holds the cache path.
"""

from __future__ import annotations

import errno
import hashlib
import itertools
import os
import pathlib
import re
import socket
import stat
import struct
import threading
import time
import warnings
import zlib

import jax

from torch_tpu import metrics
from torch_tpu._units import parse_bytes
from torch_tpu.runtime.cache_dir import cache_dir

MAGIC = b"TORCH_TPU_CACHE\x01"
SUFFIX = ".xla"
DEFAULT_MAX_BYTES = 2 << 30
_STALE_TMP_SECONDS = 3600.0
_MAX_ENTRY_BYTES = 1 << 31
_TMP = re.compile(r"\.(?P<name>[0-9a-f]+\.xla)\.tmp\.(?P<host>[^.]+)\.(?P<pid>\d+)\.\d+")
_HASH = hashlib.sha256().digest_size


class CacheWarning(UserWarning):
    """A persistent-cache entry was refused, or the cache cannot be used: the process goes on."""


def _warn(message: str) -> None:
    warnings.warn(f"torch_tpu persistent cache: {message}", CacheWarning, stacklevel=3)


def encode(key: str, body: bytes) -> bytes:
    """An entry's file contents."""
    key_bytes = key.encode()
    packed = zlib.compress(body, 1)
    head = MAGIC + struct.pack("<I", len(key_bytes)) + key_bytes + struct.pack("<Q", len(packed)) + packed
    return head + hashlib.sha256(head).digest()


def decode(key: str, data: bytes) -> bytes:
    """The body of an entry for `key`; ValueError saying why the file is not one."""
    if not data.startswith(MAGIC):
        raise ValueError("not a torch_tpu cache entry")
    if len(data) < len(MAGIC) + 4 + 8 + _HASH:
        raise ValueError("truncated")
    if hashlib.sha256(data[:-_HASH]).digest() != data[-_HASH:]:
        raise ValueError("checksum mismatch")
    at = len(MAGIC)
    (key_len,) = struct.unpack_from("<I", data, at)
    at += 4
    stored_key = data[at : at + key_len]
    at += key_len
    (body_len,) = struct.unpack_from("<Q", data, at)
    at += 8
    if at + body_len + _HASH != len(data):
        raise ValueError("length mismatch")
    if stored_key != key.encode():
        raise ValueError("it holds another key (a file renamed or copied over this one)")
    return zlib.decompress(data[at : at + body_len])


def file_name(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()[:48] + SUFFIX


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class Store:
    """Checked entries in one directory (see the module docstring)."""

    def __init__(self, directory: pathlib.Path, max_bytes: int = DEFAULT_MAX_BYTES):
        self.directory = directory
        self.max_bytes = max_bytes
        self.writable = True
        self._lock = threading.Lock()
        self._host = re.sub(r"[^A-Za-z0-9_-]", "_", socket.gethostname()) or "host"
        self._counter = itertools.count()
        self._uid = os.geteuid()
        self._bytes = 0
        self._prepare()

    def _prepare(self) -> None:
        """Creates the directory (0700), checks its owner, removes stale temporaries and sums entry sizes.
        OSError if the directory cannot be used."""
        d = self.directory
        if not d.is_dir():
            if d.exists() or d.is_symlink():
                raise NotADirectoryError(errno.ENOTDIR, "not a directory", str(d))
            d.mkdir(mode=0o700, parents=True, exist_ok=True)
        st = d.stat()
        if st.st_uid != self._uid:
            raise PermissionError(errno.EPERM, f"owned by uid {st.st_uid}, not this user ({self._uid})", str(d))
        now = time.time()
        total = 0
        with os.scandir(d) as entries:
            for e in entries:
                try:
                    if e.name.endswith(SUFFIX):
                        total += e.stat(follow_symlinks=False).st_size
                        continue
                    m = _TMP.fullmatch(e.name)
                    if m is None:
                        continue
                    mine = m["host"] == self._host
                    age = now - e.stat(follow_symlinks=False).st_mtime
                    if (mine and not _pid_alive(int(m["pid"]))) or age > _STALE_TMP_SECONDS:
                        os.unlink(e.path)
                except OSError:
                    pass
        self._bytes = total

    def _path(self, key: str) -> str:
        return os.path.join(self.directory, file_name(key))

    def get(self, key: str) -> bytes | None:
        """The body stored under `key`, or None (a miss; a refused entry also warns)."""
        path = self._path(key)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            return None
        except OSError as error:
            _warn(f"entry {path} refused ({error.strerror}); compiling again")
            return None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                _warn(f"entry {path} refused (not a regular file); compiling again")
                return None
            if st.st_uid != self._uid:
                _warn(f"entry {path} refused (owned by uid {st.st_uid}, not this user); compiling again")
                return None
            if st.st_size > _MAX_ENTRY_BYTES:
                _warn(f"entry {path} refused ({st.st_size} bytes); compiling again")
                return None
            chunks = []
            left = st.st_size
            while left > 0:
                chunk = os.read(fd, left)
                if not chunk:
                    break
                chunks.append(chunk)
                left -= len(chunk)
            data = b"".join(chunks)
            try:
                body = decode(key, data)
            except (ValueError, struct.error, zlib.error) as error:
                _warn(f"entry {path} refused ({error}); compiling again")
                return None
            try:
                os.utime(fd)  # least recently used goes first
            except OSError:
                pass
            return body
        except OSError as error:
            _warn(f"entry {path} unreadable ({error.strerror}); compiling again")
            return None
        finally:
            os.close(fd)

    def put(self, key: str, body: bytes) -> None:
        """Stores `body` under `key` (best effort: a failure warns once and stops writes)."""
        if not self.writable:
            return
        data = encode(key, body)
        final = self._path(key)
        name = os.path.basename(final)
        tmp = os.path.join(self.directory, f".{name}.tmp.{self._host}.{os.getpid()}.{next(self._counter)}")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
            finally:
                os.close(fd)
            os.replace(tmp, final)
        except OSError as error:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            self.writable = False
            _warn(f"cannot write to {self.directory} ({error.strerror}); going on without persistence")
            return
        with self._lock:
            self._bytes += len(data)
            over = self._bytes > self.max_bytes > 0
        if over:
            self.evict()

    def evict(self) -> None:
        """Deletes least recently used entries until the cache is under 80% of its cap."""
        entries = []
        with os.scandir(self.directory) as it:
            for e in it:
                if e.name.endswith(SUFFIX):
                    try:
                        st = e.stat(follow_symlinks=False)
                    except OSError:
                        continue
                    entries.append((st.st_mtime_ns, st.st_size, e.path))
        entries.sort()
        total = sum(size for _, size, _ in entries)
        target = int(self.max_bytes * 0.8)
        for _, size, path in entries:
            if total <= target:
                break
            try:
                os.unlink(path)
                total -= size
                metrics.bump("persistent_cache_evictions")
            except OSError:
                pass
        with self._lock:
            self._bytes = total

    def summary(self) -> tuple[int, int]:
        """(entries, bytes) on disk."""
        count = size = 0
        with os.scandir(self.directory) as it:
            for e in it:
                if e.name.endswith(SUFFIX):
                    count += 1
                    size += e.stat(follow_symlinks=False).st_size
        return count, size

    def clear(self) -> None:
        with os.scandir(self.directory) as it:
            for e in it:
                if e.name.endswith(SUFFIX):
                    os.unlink(e.path)
        self._bytes = 0


_store: Store | None = None
_installed = False
_TRACE_EVENT = "/jax/core/compile/jaxpr_to_mlir_module_duration"
_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
_JAX_HIT_EVENT = "/jax/compilation_cache/cache_hits"


def _count_duration(event: str, duration: float, **kwargs) -> None:
    if event == _TRACE_EVENT:
        metrics.bump("traces")
    elif event == _COMPILE_EVENT:
        metrics.bump("xla_compiles")


def _count_event(event: str, **kwargs) -> None:
    if event == _JAX_HIT_EVENT:  # jax's own cache, if a user turned it back on: a load, not a compile
        metrics.bump("xla_compiles", -1)


def enabled() -> bool:
    return os.environ.get("TORCH_TPU_PERSISTENT_CACHE", "1") not in ("0", "")


def max_bytes() -> int:
    text = os.environ.get("TORCH_TPU_CACHE_MAX_BYTES", "").strip()
    if not text:
        return DEFAULT_MAX_BYTES
    try:
        return parse_bytes(text)
    except ValueError:
        _warn(f"TORCH_TPU_CACHE_MAX_BYTES={text!r} is not a byte count; using {DEFAULT_MAX_BYTES}")
        return DEFAULT_MAX_BYTES


def install() -> pathlib.Path | None:
    """Opens the cache directory and counts traces and XLA compiles; idempotent, never raises.
    Returns the cache directory, or None when the cache is off or unusable."""
    global _store, _installed
    if _installed:
        return directory()
    _installed = True
    jax.config.update("jax_enable_compilation_cache", False)
    jax.monitoring.register_event_duration_secs_listener(_count_duration)
    jax.monitoring.register_event_listener(_count_event)
    if not enabled():
        return None
    try:
        path = cache_dir()
        _store = Store(path, max_bytes())
    except (OSError, RuntimeError, ValueError) as error:
        reason = getattr(error, "strerror", None) or str(error)
        _warn(
            f"cannot use {os.environ.get('TORCH_TPU_CACHE_DIR') or '~/.cache/torch_tpu'} ({reason}); "
            "going on without persistence"
        )
        _store = None
    return directory()


def store() -> Store | None:
    """The open cache, or None when the cache is off or unusable."""
    return _store


def directory() -> pathlib.Path | None:
    """The cache directory in use, or None when the cache is off."""
    return _store.directory if _store is not None else None
