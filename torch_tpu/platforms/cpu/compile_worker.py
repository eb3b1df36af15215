"""The compile worker: a child process that compiles executables for background_compile.py.

Tracing and lowering are Python and hold the GIL for long stretches; on a thread of the user's
process they would slow every op the program runs meanwhile (torch releases the GIL around each
op and must win it back). The worker has its own interpreter: it rebuilds the executable from a
picklable request, compiles it, stores it in the persistent cache and sends it back serialized.
Like inductor's compile workers, it starts with the first request, shares the parent's
environment, and exits when the parent closes its pipe (or dies).

A request is (kind, spec); a module registers the compile of a kind with `@handler(kind)`,
returning executable_cache.to_bytes's bytes. Messages are length-prefixed pickles on the
worker's stdin and stdout.

Used on the CPU client (another process cannot share a TPU); TORCH_TPU_ASYNC_COMPILE=thread
keeps compiles on a thread instead.
"""

from __future__ import annotations

import os
import pickle
import struct
import subprocess
import sys
import tempfile
from collections.abc import Callable
from typing import Any, BinaryIO

_handlers: dict[str, Callable[[Any], bytes]] = {}
NICENESS = 10  # the worker's scheduling priority, below the parent's
_HEADER = struct.Struct("<Q")


def handler(kind: str) -> Callable:
    """Registers `fn(spec) -> bytes` as the worker's compile of requests of `kind`."""

    def register(fn: Callable[[Any], bytes]) -> Callable[[Any], bytes]:
        _handlers[kind] = fn
        return fn

    return register


class _Array:
    """A jax.ShapeDtypeStruct on one device, as a request carries it (devices do not pickle)."""

    __slots__ = ("device", "dtype", "shape", "weak_type")

    def __init__(self, value) -> None:
        self.shape, self.dtype, self.weak_type = value.shape, value.dtype, value.weak_type
        (device,) = value.sharding.device_set
        self.device = device.id

    def restore(self):
        import jax

        from torch_tpu.runtime import client

        device = next(d for d in client.devices() if d.id == self.device)
        sharding = jax.sharding.SingleDeviceSharding(device)
        return jax.ShapeDtypeStruct(self.shape, self.dtype, sharding=sharding, weak_type=self.weak_type)


def _map_leaves(tree, leaf):
    """`tree` (lists, tuples, dicts) with each other value `v` replaced by `leaf(v)`."""
    if isinstance(tree, (list, tuple)):
        return type(tree)(_map_leaves(v, leaf) for v in tree)
    if isinstance(tree, dict):
        return {k: _map_leaves(v, leaf) for k, v in tree.items()}
    return leaf(tree)


def portable(tree):
    """`tree` (lists, tuples, dicts) with each single-device jax.ShapeDtypeStruct made picklable."""
    import jax

    return _map_leaves(tree, lambda v: _Array(v) if isinstance(v, jax.ShapeDtypeStruct) else v)


def restored(tree):
    """`portable`'s inverse, in the worker."""
    return _map_leaves(tree, lambda v: v.restore() if isinstance(v, _Array) else v)


class WorkerError(RuntimeError):
    """The worker could not compile a request (its error), or is gone."""


def _send(stream: BinaryIO, message: Any) -> None:
    body = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(_HEADER.pack(len(body)) + body)
    stream.flush()


def _receive(stream: BinaryIO) -> Any:
    header = stream.read(_HEADER.size)
    if len(header) < _HEADER.size:
        raise EOFError
    (size,) = _HEADER.unpack(header)
    body = stream.read(size)
    if len(body) < size:
        raise EOFError
    return pickle.loads(body)


class Worker:
    """The parent's handle on one worker process (started by the constructor; `wait_ready`
    before the first `compile`). Its calls block without the GIL (pipe I/O)."""

    def __init__(self) -> None:
        import torch_tpu

        env = dict(os.environ)
        env["TORCH_TPU_ASYNC_COMPILE"] = "0"  # the worker compiles what it is asked, at once
        env["TORCH_TPU_COMPILE_WORKER"] = "1"
        from torch_tpu.runtime import client

        env["TORCH_TPU_PLATFORM"] = client.platform()
        package_root = os.path.dirname(os.path.dirname(torch_tpu.__file__))  # this torch_tpu, from any cwd
        env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "torch_tpu.platforms.cpu.compile_worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=env,
            cwd=tempfile.gettempdir(),  # never a source tree that would shadow the installed package
        )
        self.ready = False  # its start completed (wait_ready)

    def wait_ready(self) -> None:
        """Waits for the worker's start (its imports); raises WorkerError if it did not start."""
        try:
            ready = _receive(self._proc.stdout)
        except (EOFError, OSError):
            ready = None
        if ready != "ready":
            self.close()
            raise WorkerError("the compile worker did not start")
        self.ready = True

    def compile(self, request: tuple) -> bytes:
        """The serialized executable for `request` (see executable_cache.from_bytes)."""
        kind, spec = request
        body = pickle.dumps((kind, portable(spec)), protocol=pickle.HIGHEST_PROTOCOL)  # raises if it cannot go
        try:
            self._proc.stdin.write(_HEADER.pack(len(body)) + body)
            self._proc.stdin.flush()
            status, value = _receive(self._proc.stdout)
        except (EOFError, OSError, pickle.PickleError) as e:
            self.close()
            raise WorkerError(f"the compile worker exited ({type(e).__name__})") from None
        if status != "ok":
            raise WorkerError(value)
        return value

    def alive(self) -> bool:
        return self._proc.poll() is None

    def kill(self) -> None:
        """Ends the worker without waiting; the thread reading its pipe sees it gone."""
        if self._proc.poll() is None:
            self._proc.kill()

    def close(self) -> None:
        """Ends the worker now (a compile it is running is lost)."""
        if self._proc.poll() is None:
            self._proc.kill()
        self._proc.wait()
        for stream in (self._proc.stdin, self._proc.stdout):
            try:
                stream.close()
            except OSError:
                pass


def _serve() -> None:
    requests, replies = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr  # nothing else may write to the reply stream
    try:
        os.nice(NICENESS)  # background work: the program's own processes come first
    except OSError:
        pass
    import torch_tpu  # noqa: F401  (registers the lowerings and the handlers)
    from torch_tpu.platforms.cpu.compile_worker import _handlers as handlers  # (this file ran as __main__)

    _send(replies, "ready")
    while True:
        try:
            kind, spec = _receive(requests)
        except EOFError:
            return
        try:
            _send(replies, ("ok", handlers[kind](restored(spec))))
        except Exception as e:
            _send(replies, ("error", f"{type(e).__name__}: {e}"))


if __name__ == "__main__":
    _serve()
