"""The torch-independent C++ core, through torch_tpu._C: the compile-cache index."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from torch_tpu import _C


def test_cache_index_round_trip(tmp_path):
    index = _C.CacheIndex(str(tmp_path / "cache"))
    assert index.get("op-add-f32") is None
    assert "op-add-f32" not in index
    assert index.put("op-add-f32", b"\x00executable\xff")
    assert index.get("op-add-f32") == b"\x00executable\xff"
    assert "op-add-f32" in index
    assert index.summary() == (1, len(b"\x00executable\xff"))
    index.clear()
    assert index.summary() == (0, 0)


def test_cache_index_leaves_no_temporary_files(tmp_path):
    index = _C.CacheIndex(str(tmp_path))
    for i in range(5):
        assert index.put(f"k{i}", os.urandom(1000))
    assert sorted(os.listdir(tmp_path)) == [f"k{i}.xla" for i in range(5)]


@pytest.mark.parametrize("key", ["", "../escape", ".hidden", "a/b", "x" * 201])
def test_cache_index_rejects_unsafe_keys(tmp_path, key):
    index = _C.CacheIndex(str(tmp_path))
    with pytest.raises(ValueError):
        index.put(key, b"v")


_WRITER = """
import sys
from torch_tpu import _C
index = _C.CacheIndex(sys.argv[1])
for _ in range(50):
    assert index.put("shared", bytes([int(sys.argv[2])]) * 200_000)
"""


def test_concurrent_writers_leave_a_whole_entry(tmp_path):
    procs = [subprocess.Popen([sys.executable, "-c", _WRITER, str(tmp_path), str(n)]) for n in (1, 2)]
    assert [p.wait(timeout=120) for p in procs] == [0, 0]
    assert _C.CacheIndex(str(tmp_path)).get("shared") in (bytes([1]) * 200_000, bytes([2]) * 200_000)
    assert os.listdir(tmp_path) == ["shared.xla"]
