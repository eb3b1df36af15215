"""The persistent compile cache: a second process loads every executable instead of tracing and
compiling it, and no damage to the cache directory gives a wrong result, a hang or a crash."""

from __future__ import annotations

import json
import os
import pathlib
import random
import select
import shutil
import signal
import struct
import subprocess
import sys
import time
import warnings
import zlib

import pytest
import torch

from torch_tpu.runtime import persistent_cache
from torch_tpu.runtime.persistent_cache import CacheWarning, Store

# Trains a small MLP for 3 steps, compiled and eager, and prints losses, eager values and
# counters as JSON; "cpu" holds the same eager values computed on CPU.
_SCRIPT = r"""
import json, sys
import torch
import torch_tpu
from torch import nn
from torch.nn import functional as F

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 4)).to("tpu")
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

@torch.compile(backend="tpu")
def step(x, y):
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss

g = torch.Generator().manual_seed(1)
losses = []
for _ in range(3):
    x, y = torch.randn(4, 8, generator=g), torch.randint(0, 4, (4,), generator=g)
    losses.append(step(x.to("tpu"), y.to("tpu")).item())

def eager(device):
    x = torch.arange(6.0).to(device).reshape(2, 3)
    return (x.exp() * 3).sum(1).cpu().tolist() + [torch.softmax(torch.ones(15, 4).to(device), -1).sum().item()]

counters = torch_tpu.metrics.counters()
counters["load_seconds"] = torch_tpu.metrics.load_seconds()
print(json.dumps({"losses": losses, "eager": eager("tpu"), "cpu": eager("cpu"), "counters": counters}))
"""
_TIMEOUT = 600


def _env(cache: pathlib.Path, **extra: str) -> dict:
    env = dict(os.environ)
    env["TORCH_TPU_CACHE_DIR"] = str(cache)
    env["TORCH_TPU_PLATFORM"] = "cpu"
    env.pop("TORCH_TPU_DEBUG", None)
    env.update(extra)
    return env


def _start(cache: pathlib.Path, script: str = _SCRIPT, **extra: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", script],
        env=_env(cache, **extra),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group, killed whole on a timeout
    )


def _finish(proc: subprocess.Popen) -> tuple[str, str]:
    try:
        out, err = proc.communicate(timeout=_TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise
    assert proc.returncode == 0, err[-4000:]
    return out, err


def _result(proc: subprocess.Popen) -> dict:
    out, err = _finish(proc)
    result = json.loads(out.strip().splitlines()[-1])
    result["stderr"] = err
    return result


def _run(cache: pathlib.Path) -> dict:
    return _result(_start(cache))


def _entries(cache: pathlib.Path) -> list[pathlib.Path]:
    return sorted(cache.glob("*" + persistent_cache.SUFFIX))


def _key_of(path: pathlib.Path) -> str:
    data = path.read_bytes()
    at = len(persistent_cache.MAGIC)
    (n,) = struct.unpack_from("<I", data, at)
    return data[at + 4 : at + 4 + n].decode()


def _assert_right(result: dict, reference: dict) -> None:
    assert result["losses"] == pytest.approx(reference["losses"], rel=1e-5)
    assert result["eager"] == pytest.approx(result["cpu"], rel=1e-6)


@pytest.fixture(scope="module")
def warm_cache(tmp_path_factory):
    """A cache directory filled by one process, and that process's result."""
    cache = tmp_path_factory.mktemp("cache") / "torch_tpu"
    return cache, _run(cache)


def test_first_process_compiles_and_fills_the_cache(warm_cache):
    cache, first = warm_cache
    counters = first["counters"]
    assert counters["graph_compiles"] >= 3  # forward, backward, optimizer step
    assert counters["persistent_cache_hits"] == 0 and counters["load_seconds"] == 0
    assert counters["traces"] >= counters["graph_compiles"] + counters["op_compiles"]
    assert counters["xla_compiles"] == counters["traces"]
    kinds = {_key_of(p).split("\n", 1)[0] for p in _entries(cache)}
    assert kinds == {"op", "graph", "jit"}
    assert cache.stat().st_mode & 0o777 == 0o700
    assert all(p.stat().st_mode & 0o077 == 0 for p in _entries(cache))


def test_second_process_from_a_moved_cache_traces_and_compiles_nothing(tmp_path, warm_cache):
    cache, first = warm_cache
    moved = tmp_path / "elsewhere"
    shutil.copytree(cache, moved)  # the key holds no path: a moved or copied cache still hits
    second = _run(moved)
    counters = second["counters"]
    assert counters["traces"] == 0, counters
    assert counters["xla_compiles"] == 0
    assert counters["graph_compiles"] == 0
    assert counters["op_compiles"] == 0
    assert counters["persistent_cache_hits"] >= first["counters"]["graph_compiles"] + 1
    assert counters["load_seconds"] > 0  # timed (torch_tpu.metrics.report() shows it)
    assert second["losses"] == first["losses"]
    assert second["eager"] == first["eager"]
    assert "CacheWarning" not in second["stderr"]


def test_four_processes_sharing_an_empty_cache_all_run_right(tmp_path, warm_cache):
    _, reference = warm_cache
    procs = [_start(tmp_path) for _ in range(4)]
    for result in [_result(p) for p in procs]:
        _assert_right(result, reference)
        assert "CacheWarning" not in result["stderr"]
    assert not list(tmp_path.glob(".*.tmp.*"))  # no partial files left behind


def _flip(path: pathlib.Path, rng: random.Random, recompress: bool) -> None:
    """One byte changed: anywhere in the file, or inside the executable with the body
    re-compressed (so it still decompresses) and the old checksum kept."""
    data = bytearray(path.read_bytes())
    if not recompress:
        i = rng.randrange(len(data))
        data[i] ^= 1 << rng.randrange(8)
        path.write_bytes(bytes(data))
        return
    at = len(persistent_cache.MAGIC)
    (n,) = struct.unpack_from("<I", data, at)
    at += 4 + n
    (body_len,) = struct.unpack_from("<Q", data, at)
    body = bytearray(zlib.decompress(data[at + 8 : at + 8 + body_len]))
    body[len(body) // 2] ^= 0x40
    packed = zlib.compress(bytes(body))
    checksum = bytes(data[-32:])
    path.write_bytes(bytes(data[:at]) + struct.pack("<Q", len(packed)) + packed + checksum)


def test_a_flipped_byte_in_every_entry_is_refused_and_recompiled(tmp_path, warm_cache):
    cache, reference = warm_cache
    damaged = tmp_path / "cache"
    shutil.copytree(cache, damaged)
    rng = random.Random(0)
    entries = _entries(damaged)
    for i, entry in enumerate(entries):
        _flip(entry, rng, recompress=i % 2 == 0)
    result = _run(damaged)
    _assert_right(result, reference)
    counters = result["counters"]
    assert counters["persistent_cache_hits"] == 0
    assert counters["graph_compiles"] >= 3
    assert result["stderr"].count("CacheWarning") >= len(entries) // 2
    assert all(_key_of(p).split("\n", 1)[0] in ("op", "graph", "jit") for p in _entries(damaged))


def test_swapped_entries_and_a_fifo_are_refused(tmp_path, warm_cache):
    cache, reference = warm_cache
    damaged = tmp_path / "cache"
    shutil.copytree(cache, damaged)
    by_kind: dict[str, list[pathlib.Path]] = {}
    for p in _entries(damaged):
        by_kind.setdefault(_key_of(p).split("\n", 1)[0], []).append(p)
    assert len(by_kind["op"]) >= 3 and len(by_kind["graph"]) >= 2
    for paths in by_kind.values():  # swap the first two entries of each kind that has two
        if len(paths) < 2:
            continue
        a, b = paths[0], paths[1]
        tmp = a.with_suffix(".swap")
        a.rename(tmp)
        b.rename(a)
        tmp.rename(b)
    fifo = by_kind["op"][2]
    fifo.unlink()
    os.mkfifo(fifo)  # an open() without O_NONBLOCK would wait for a writer forever
    result = _run(damaged)
    _assert_right(result, reference)
    assert "holds another key" in result["stderr"]
    assert "not a regular file" in result["stderr"]
    assert result["counters"]["graph_compiles"] >= 1


_SMALL = r"""
import torch, torch_tpu
x = torch.arange(4.0).to("tpu")
assert (x * 2).cpu().tolist() == [0.0, 2.0, 4.0, 6.0]
print(torch_tpu.runtime.persistent_cache.directory())
"""


def test_an_unusable_cache_dir_warns_and_import_torch_still_works(tmp_path):
    a_file = tmp_path / "a_file"
    a_file.write_text("")
    procs = [
        _start(a_file, "import torch\n" + _SMALL),  # TORCH_TPU_CACHE_DIR is a file
        _start(a_file / "sub", "import torch\n" + _SMALL),  # cannot be created
    ]
    for proc in procs:
        out, err = _finish(proc)
        assert out.strip().splitlines()[-1] == "None"
        assert "CacheWarning" in err and "going on without persistence" in err


# ---- the store itself, in this process --------------------------------------------------


def test_store_round_trip_and_entry_layout(tmp_path):
    store = Store(tmp_path / "c")
    assert store.get("k") is None
    store.put("k", b"\x00executable\xff" * 100)
    assert store.get("k") == b"\x00executable\xff" * 100
    assert (tmp_path / "c").stat().st_mode & 0o777 == 0o700
    (entry,) = _entries(tmp_path / "c")
    assert _key_of(entry) == "k"
    assert entry.stat().st_mode & 0o777 == 0o600


def test_store_refuses_every_single_byte_flip(tmp_path):
    store = Store(tmp_path)
    store.put("key", os.urandom(300))
    (entry,) = _entries(tmp_path)
    good = entry.read_bytes()
    for i in range(len(good)):
        bad = bytearray(good)
        bad[i] ^= 0x01
        entry.write_bytes(bytes(bad))
        with pytest.warns(CacheWarning):
            assert store.get("key") is None
    entry.write_bytes(good)
    assert store.get("key") is not None


def test_store_refuses_truncated_and_foreign_files(tmp_path):
    store = Store(tmp_path)
    store.put("key", os.urandom(3000))
    (entry,) = _entries(tmp_path)
    good = entry.read_bytes()
    for bad in (good[: len(good) // 3], good[:10], b"", b"not an executable", good + b"\0"):
        entry.write_bytes(bad)
        with pytest.warns(CacheWarning, match="refused"):
            assert store.get("key") is None
    entry.unlink()
    entry.symlink_to(tmp_path / "elsewhere")
    with pytest.warns(CacheWarning, match="refused"):
        assert store.get("key") is None


def _give_to_another_user(path) -> None:
    if os.geteuid() != 0:
        pytest.skip("changing an owner needs root")
    try:
        os.chown(path, 12345, -1)
    except OSError as error:  # a user-namespace sandbox (Bazel's) maps no other uid
        pytest.skip(f"this sandbox cannot change owners: {error}")


def test_store_refuses_entries_of_another_user(tmp_path):
    store = Store(tmp_path)
    store.put("key", b"value")
    (entry,) = _entries(tmp_path)
    _give_to_another_user(entry)
    with pytest.warns(CacheWarning, match="not this user"):
        assert store.get("key") is None


def test_store_refuses_a_directory_of_another_user(tmp_path):
    _give_to_another_user(tmp_path)
    with pytest.raises(PermissionError):
        Store(tmp_path)


def test_store_cleans_temporaries_of_dead_writers(tmp_path):
    store = Store(tmp_path)
    host = store._host
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = tmp_path / f".{'a' * 48}.xla.tmp.{host}.{dead.pid}.0"
    live = tmp_path / f".{'b' * 48}.xla.tmp.{host}.{os.getpid()}.0"
    old = tmp_path / f".{'c' * 48}.xla.tmp.otherhost.1.0"
    for p in (stale, live, old):
        p.write_bytes(b"partial")
    os.utime(old, (time.time() - 7200, time.time() - 7200))
    Store(tmp_path)
    assert not stale.exists() and not old.exists()
    assert live.exists()  # a writer still running


def test_store_evicts_least_recently_used_past_its_cap(tmp_path):
    store = Store(tmp_path, max_bytes=50_000)

    def path(key):
        return tmp_path / persistent_cache.file_name(key)

    for i in range(4):
        store.put(f"k{i}", os.urandom(10_000))
        os.utime(path(f"k{i}"), (1000 + i, 1000 + i))
    assert store.get("k0") is not None
    assert path("k0").stat().st_mtime > 1003  # touched: now the most recently used
    # Times set by hand from here: files written within one tick of the file system's clock would
    # tie, and eviction (down to 80% of the cap) would pick among them by name.
    os.utime(path("k0"), (3000, 3000))
    for i in range(4, 7):
        store.put(f"k{i}", os.urandom(10_000))
        os.utime(path(f"k{i}"), (2000 + i, 2000 + i))
    assert store.summary()[1] <= 50_000
    assert store.get("k0") is not None
    assert store.get("k1") is None


def test_store_that_cannot_write_warns_once_and_goes_on(tmp_path):
    directory = tmp_path / "c"
    store = Store(directory)
    directory.chmod(0o500)
    try:
        probe = directory / "probe"
        try:
            probe.write_bytes(b"")  # root ignores the mode: take the directory away instead
            probe.unlink()
            directory.chmod(0o700)
            shutil.rmtree(directory)
        except PermissionError:
            pass
        with pytest.warns(CacheWarning, match="going on without persistence"):
            store.put("a", b"1")
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            store.put("b", b"2")  # no second warning
        assert not store.writable
    finally:
        if directory.exists():
            directory.chmod(0o700)


def test_store_fifo_entry_does_not_hang(tmp_path):
    store = Store(tmp_path)
    os.mkfifo(tmp_path / persistent_cache.file_name("k"))
    start = time.monotonic()
    with pytest.warns(CacheWarning, match="not a regular file"):
        assert store.get("k") is None
    assert time.monotonic() - start < 5


_KILL_ROUNDS = 20


def test_kill_9_while_writing_never_corrupts(tmp_path):
    """20 writers killed at random points while writing entries: every entry left is whole,
    and the next process removes their temporaries."""
    rng = random.Random(0)
    values = {f"k{i}": os.urandom(256 << 10) for i in range(8)}
    torn = 0  # rounds whose writer died mid-write (its temporary left behind)
    for _ in range(_KILL_ROUNDS):
        ready_r, ready_w = os.pipe()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # jax's fork warning: the child uses no jax
            pid = os.fork()
        if pid == 0:  # the writer: no jax, no torch, only the store's file writes
            try:
                store = Store(tmp_path, max_bytes=1 << 40)
                first = True
                while True:
                    for k, v in values.items():
                        store.put(k, v)
                        if first:
                            os.write(ready_w, b"1")  # writing: the parent may kill from now on
                            first = False
            finally:
                os._exit(1)
        os.close(ready_w)
        try:
            select.select([ready_r], [], [], 120)
            time.sleep(rng.uniform(0.0, 0.05))
        finally:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            os.close(ready_r)
        torn += bool(list(tmp_path.glob(".*.tmp.*")))
    print(f"{torn} of {_KILL_ROUNDS} writers killed mid-write")
    store = Store(tmp_path)
    assert not list(tmp_path.glob(".*.tmp.*"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        found = {k: store.get(k) for k in values}
    assert any(v is not None for v in found.values())
    assert all(v is None or v == values[k] for k, v in found.items())


def test_cache_dir_env_is_read_at_import(tmp_path):
    assert persistent_cache.directory() == pathlib.Path(os.environ["TORCH_TPU_CACHE_DIR"]).expanduser()
    assert torch.__version__  # torch imported with the cache installed
