"""tpu-info against hostile stats files and unsafe stats directories: it never crashes, hangs or
prints a terminal escape, and it refuses directories other users can write."""

import json
import os
import shutil
import subprocess
import sys
import warnings

import pytest

import torch_tpu  # noqa: F401  (registers the backend for collect())
from torch_tpu.tools import stats_file, tpu_info

# A live process that is not this one: records naming it are shown, not dropped as dead.
LIVE_PID = os.getppid()
ESCAPES = "\x1b[2J\x1b]0;owned\x07\x9b31m\u202e"

DEVICE = {"index": 0, "kind": "cpu", "platform": "cpu", "memory_in_use_bytes": 1, "memory_peak_bytes": 2}

# Malformed JSON, wrong types, out-of-range numbers and escapes: 26 contents.
HOSTILE_CONTENTS = {
    "empty": "",
    "truncated": '{"pid": 1, "devices": [',
    "not_json": "\x00\xff garbage",
    "not_utf8": b"\xff\xfe\xfa",
    "list": "[1, 2, 3]",
    "string": '"pid"',
    "null": "null",
    "deep": "[" * 100000,
    "pid_string": json.dumps({"pid": "1"}),
    "pid_bool": json.dumps({"pid": True}),
    "pid_huge": json.dumps({"pid": 10**30}),
    "pid_negative": json.dumps({"pid": -1}),
    "pid_float_nan": '{"pid": NaN}',
    "empty_device": json.dumps({"pid": LIVE_PID, "devices": [{}]}),
    "devices_dict": json.dumps({"pid": LIVE_PID, "devices": {"0": DEVICE}}),
    "device_strings": json.dumps({"pid": LIVE_PID, "devices": [{**DEVICE, "memory_in_use_bytes": "1"}]}),
    "device_index_list": json.dumps({"pid": LIVE_PID, "devices": [{**DEVICE, "index": [0]}]}),
    "device_bytes_huge": json.dumps({"pid": LIVE_PID, "devices": [{**DEVICE, "memory_peak_bytes": 10**400}]}),
    "device_bytes_inf": json.dumps({"pid": LIVE_PID, "devices": [{**DEVICE, "memory_in_use_bytes": "INF"}]}).replace(
        '"INF"', "Infinity"
    ),
    "runtime_not_dict": json.dumps({"pid": LIVE_PID, "devices": [{**DEVICE, "runtime": [1, 2]}]}),
    "argv_not_list": json.dumps({"pid": LIVE_PID, "argv": 5, "devices": [DEVICE]}),
    "argv_objects": json.dumps({"pid": LIVE_PID, "argv": [{"a": 1}, None, 3], "devices": [DEVICE]}),
    "start_time_string": json.dumps({"pid": LIVE_PID, "start_time": "x", "devices": [DEVICE]}),
    "escapes": json.dumps(
        {
            "pid": LIVE_PID,
            "argv": [ESCAPES, "python"],
            "platform": ESCAPES,
            "devices": [{**DEVICE, "kind": ESCAPES, "platform": "cpu" + ESCAPES}],
        }
    ),
    "many_devices": json.dumps({"pid": LIVE_PID, "devices": [DEVICE] * 100000}),
    "too_big": json.dumps({"pid": LIVE_PID, "pad": "x" * (2 << 20), "devices": [DEVICE]}),
}


def _write_hostile(directory, name, content):
    path = directory / f"{name}.json"
    path.write_bytes(content if isinstance(content, bytes) else content.encode("utf-8", "surrogatepass"))
    return path


def _make_special_files(directory):
    """FIFOs, links to endless or blocking files, a directory and a dangling link."""
    os.mkfifo(directory / "fifo.json")
    os.symlink("/dev/zero", directory / "zero.json")
    os.symlink("/dev/urandom", directory / "urandom.json")
    os.symlink(directory / "fifo.json", directory / "link_to_fifo.json")
    os.symlink(directory / "missing", directory / "dangling.json")
    (directory / "dir.json").mkdir()


def _assert_clean(text):
    for bad in ("\x1b", "\x07", "\x9b", "\u202e"):
        assert bad not in text


@pytest.mark.parametrize("name", sorted(HOSTILE_CONTENTS))
def test_hostile_file_is_skipped_or_shown_safely(tmp_path, name):
    _write_hostile(tmp_path, name, HOSTILE_CONTENTS[name])
    info = tpu_info.collect(include_self=False, stats_dir=tmp_path)
    text = tpu_info.render(info)
    _assert_clean(text)
    _assert_clean(json.dumps(info, ensure_ascii=False))
    for record in stats_file.read_all(tmp_path):
        assert type(record["pid"]) is int and record["pid"] > 0
        for d in record["devices"]:
            assert type(d["memory_in_use_bytes"]) is int and type(d["memory_peak_bytes"]) is int


def test_bad_fields_drop_the_device_but_keep_good_ones(tmp_path):
    record = {"pid": LIVE_PID, "devices": [{}, {**DEVICE, "index": "0"}, DEVICE]}
    _write_hostile(tmp_path, "mixed", json.dumps(record))
    (parsed,) = stats_file.read_all(tmp_path)
    assert [d["index"] for d in parsed["devices"]] == [0]
    assert parsed["devices"][0]["memory_peak_bytes"] == 2


def test_escapes_are_replaced_not_printed(tmp_path):
    _write_hostile(tmp_path, "escapes", HOSTILE_CONTENTS["escapes"])
    (parsed,) = stats_file.read_all(tmp_path)
    assert parsed["argv"][0] == "?[2J?]0;owned??31m?"
    assert parsed["devices"][0]["kind"].startswith("?[2J")


def test_fifos_devices_and_links_are_not_opened(tmp_path):
    _make_special_files(tmp_path)
    assert stats_file.read_all(tmp_path) == []  # returns at once: nothing blocks or reads forever


def _tpu_info_command():
    script = shutil.which("tpu-info")
    if script:
        return [script]
    return [sys.executable, "-c", "import sys; from torch_tpu.tools.tpu_info import main; sys.exit(main())"]


@pytest.mark.parametrize("mode", [["--json"], []])
def test_tpu_info_command_survives_all_of_them_at_once(tmp_path, mode):
    for name, content in HOSTILE_CONTENTS.items():
        _write_hostile(tmp_path, name, content)
    _make_special_files(tmp_path)
    env = dict(os.environ, TORCH_TPU_STATS_DIR=str(tmp_path), TORCH_TPU_PLATFORM="cpu")
    done = subprocess.run(_tpu_info_command() + mode, env=env, capture_output=True, timeout=300)
    assert done.returncode == 0, done.stderr.decode(errors="replace")[-3000:]
    out = done.stdout.decode("utf-8")
    _assert_clean(out)
    if mode:
        info = json.loads(out)
        assert any(p["pid"] == LIVE_PID for p in info["processes"])


def test_world_writable_stats_dir_is_refused_with_a_warning(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    _write_hostile(shared, "good", json.dumps({"pid": LIVE_PID, "devices": [DEVICE]}))
    with pytest.warns(RuntimeWarning, match="writable by other users"):
        assert stats_file.read_all(shared) == []
    with pytest.raises(PermissionError), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        stats_file._write(shared / "me.json", {"pid": os.getpid()})
    assert not (shared / "me.json").exists()
    os.chmod(shared, 0o700)
    assert len(stats_file.read_all(shared)) == 1


def test_stats_dir_of_another_user_is_refused(tmp_path, monkeypatch):
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o700)
    _write_hostile(theirs, "good", json.dumps({"pid": LIVE_PID, "devices": [DEVICE]}))
    # Seen from another uid, this directory belongs to someone else (chown needs privileges
    # that test sandboxes lack).
    me = os.getuid()
    monkeypatch.setattr(stats_file.os, "getuid", lambda: me + 1)
    with pytest.warns(RuntimeWarning, match=f"owned by uid {me}, not by this user"):
        assert stats_file.read_all(theirs) == []
    with pytest.raises(PermissionError), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        stats_file._write(theirs / "me.json", {"pid": os.getpid()})


def test_tpu_info_help_starts_no_backend():
    # What the tpu-info console script does, then a look at what got imported.
    code = (
        "import sys\n"
        "sys.argv = ['tpu-info', '--help']\n"
        "from torch_tpu.tools.tpu_info import main\n"
        "try:\n    main()\nexcept SystemExit as e:\n    code = e.code\n"
        "print('IMPORTED', 'torch' in sys.modules, 'jax' in sys.modules, code)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "usage: tpu-info" in done.stdout
    assert "IMPORTED False False 0" in done.stdout
    assert done.stderr == ""
