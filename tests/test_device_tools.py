"""Device tools: torch.tpu (torch.cuda's API), memory accounting and OOM, streams and events,
tpu-info, metrics.report(), TORCH_TPU_DEBUG output and the profiler."""

from __future__ import annotations

import gzip
import json
import os
import shutil
import subprocess
import sys
import textwrap
import time

import jax
import pytest
import torch

import torch_tpu
from torch_tpu.device import memory
from torch_tpu.runtime import client
from torch_tpu.tools import stats_file, tpu_info

MiB = 1 << 20

# torch.tpu's contract (DESIGN.md) and the torch.cuda mirrors users call.
DESIGN_API = (
    "is_available device_count current_device set_device synchronize manual_seed memory_allocated "
    "max_memory_allocated reset_peak_memory_stats memory_stats get_device_name get_device_properties"
).split()
CUDA_MIRRORS = (
    "Stream Event current_stream default_stream stream device manual_seed_all seed initial_seed "
    "get_rng_state set_rng_state empty_cache memory_reserved max_memory_reserved mem_get_info "
    "set_per_process_memory_fraction is_initialized init"
).split()


def _subprocess_env(**extra: str) -> dict:
    env = dict(os.environ)
    root = os.path.dirname(os.path.dirname(torch_tpu.__file__))
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    env.update(extra)
    return env


def _unlowered_unary_op() -> torch._ops.OpOverloadPacket:
    """An aten op with no tpu lowering (checked, since lowerings keep being added)."""
    for name in (
        "special_airy_ai",
        "special_scaled_modified_bessel_k1",
        "special_spherical_bessel_j0",
        "special_bessel_y1",
        "special_modified_bessel_k0",
        "special_bessel_j1",
    ):
        packet = getattr(torch.ops.aten, name)
        if not any(
            torch._C._dispatch_has_kernel_for_dispatch_key(getattr(packet, o).name(), "PrivateUse1")
            for o in packet.overloads()
        ):
            return packet
    pytest.skip("every candidate op has a tpu lowering now; add a new candidate")


# ---- torch.tpu --------------------------------------------------------------------------


def test_torch_tpu_has_the_design_api_and_cuda_mirrors():
    for name in DESIGN_API + CUDA_MIRRORS:
        assert callable(getattr(torch.tpu, name)), name
    assert torch.tpu.is_available() and torch.tpu.is_initialized()
    torch.tpu.init()
    props = torch.tpu.get_device_properties("tpu:0")
    assert props.name == torch.tpu.get_device_name(torch.device("tpu", 0)) == torch.tpu.get_device_name()
    assert props.platform == torch_tpu.platform()
    assert props.total_memory > 0


@pytest.mark.parametrize(
    "wait",
    [torch.tpu.synchronize, torch_tpu.sync, torch.accelerator.synchronize, lambda: torch.tpu.Event(True).record()],
    ids=["torch.tpu.synchronize", "torch_tpu.sync", "torch.accelerator.synchronize", "timing-event"],
)
def test_synchronize_waits_on_a_fence_queued_on_every_device(monkeypatch, wait):
    # Work whose outputs were freed is not among jax's live arrays: a device runs its computations
    # in order, so a synchronize waits on a tiny computation queued behind them on each device.
    # (On TPU the lane times it: 10 dropped 8192² matmuls take as long as 10 kept ones.)
    queued, waited = [], []
    real_fences, real_wait = client.fences, jax.block_until_ready
    monkeypatch.setattr(client, "fences", lambda: queued.append(real_fences()) or queued[-1])
    monkeypatch.setattr(jax, "block_until_ready", lambda x: waited.append(x) or real_wait(x))
    x = torch.ones(256, 256, device="tpu")
    for _ in range(3):
        x @ x  # dropped at once
    wait()
    assert queued and all(any(f is w for w in waited) for f in queued), "each fence list is waited on"
    for fences in queued:
        assert sorted(d.id for a in fences for d in a.devices()) == sorted(d.id for d in client.devices())
        assert all(int(a) == 1 for a in fences)


def test_torch_accelerator_reports_tpu():
    assert torch.accelerator.is_available()
    assert torch.accelerator.current_accelerator() == torch.device("tpu")
    assert torch.accelerator.device_count() == torch.tpu.device_count()
    assert torch.accelerator.current_device_index() == torch.tpu.current_device() == 0
    x = torch.ones(64, 64, device="tpu")
    y = x @ x
    torch.accelerator.synchronize()
    torch.tpu.synchronize("tpu:0")
    assert y[0, 0].item() == 64
    # torch.accelerator's memory API reads the same registry (the allocator is a DeviceAllocator).
    assert torch.accelerator.memory_allocated() == torch.tpu.memory_allocated()
    assert torch.accelerator.memory_reserved() == torch.tpu.memory_reserved()
    assert torch.accelerator.memory_stats()["allocated_bytes.all.current"] == torch.tpu.memory_allocated()
    free, total = torch.accelerator.get_memory_info()
    assert 0 <= free <= total
    torch.accelerator.reset_peak_memory_stats()
    assert torch.accelerator.max_memory_allocated() == torch.tpu.memory_allocated()
    torch.accelerator.empty_cache()


def test_device_arguments_and_errors_follow_torch_cuda():
    n = torch.tpu.device_count()
    # torch.cuda raises RuntimeError for a bad index in the memory API, AssertionError in
    # get_device_properties, an AcceleratorError (a RuntimeError) from set_device.
    with pytest.raises(RuntimeError, match="Invalid device argument"):
        torch.tpu.memory_allocated(n)
    with pytest.raises(RuntimeError, match="Invalid device argument"):
        torch.tpu.memory_stats(f"tpu:{n}")
    with pytest.raises(AssertionError, match="Invalid device id"):
        torch.tpu.get_device_properties(n)
    with pytest.raises(RuntimeError, match="invalid device ordinal"):
        torch.tpu.set_device(n)
    with pytest.raises(ValueError, match="Expected a tpu device"):
        torch.tpu.memory_allocated("cpu")
    torch.tpu.set_device(-1)  # negative: no change, as torch.cuda.set_device
    assert torch.tpu.current_device() == 0
    if n < 2:
        pytest.skip("needs two tpu devices")
    with torch.tpu.device("tpu:1"):
        assert torch.tpu.current_device() == 1
        assert torch.empty(1, device="tpu").device == torch.device("tpu:1")
    assert torch.tpu.current_device() == 0
    with torch.tpu.device(None):
        assert torch.tpu.current_device() == 0
    torch.tpu.set_device(torch.device("tpu:1"))
    try:
        assert torch.tpu.current_device() == 1
    finally:
        torch.tpu.set_device(0)


def test_rng_state_api():
    torch.tpu.manual_seed_all(7)
    assert torch.tpu.initial_seed() == 7
    state = torch.tpu.get_rng_state()
    a = torch.rand(5, device="tpu").cpu()
    torch.tpu.set_rng_state(state)
    assert torch.equal(torch.rand(5, device="tpu").cpu(), a)
    torch.tpu.seed()
    assert torch.tpu.initial_seed() != 7


# ---- streams and events ------------------------------------------------------------------


def test_streams_are_ordering_points():
    s = torch.tpu.Stream()
    assert isinstance(s, torch.Stream) and s.device == torch.device("tpu:0")
    assert s == torch.tpu.current_stream() == torch.tpu.default_stream(0)
    assert s.query()
    s.synchronize()
    other = torch.tpu.Stream(priority=-1)
    other.wait_stream(s)
    event = s.record_event()
    other.wait_event(event)
    assert event.query()
    with torch.tpu.stream(s):
        y = torch.ones(8, device="tpu") * 3
    with torch.tpu.stream(None):
        pass
    assert y.sum().item() == 24
    if torch.tpu.device_count() > 1:
        s1 = torch.tpu.Stream("tpu:1")
        assert s1.device_index == 1
        with torch.tpu.stream(s1):
            assert torch.tpu.current_device() == 1
        assert torch.tpu.current_device() == 0


def test_event_elapsed_time_is_wall_time():
    start, end = torch.tpu.Event(enable_timing=True), torch.tpu.Event(enable_timing=True)
    x = torch.randn(128, 128, device="tpu")
    start.record()
    for _ in range(4):
        x = x @ x / 128
    time.sleep(0.05)
    end.record()
    end.synchronize()
    assert start.query() and end.query()
    assert 45 <= start.elapsed_time(end) < 30_000
    plain = torch.tpu.Event()
    plain.record()
    plain.wait()
    with pytest.raises(RuntimeError, match="enable_timing"):
        plain.elapsed_time(end)
    generic = torch.Event(device="tpu", enable_timing=True)
    generic.record()
    assert start.elapsed_time(generic) >= start.elapsed_time(end)


# ---- memory ------------------------------------------------------------------------------


def test_memory_rises_and_falls_with_tensors():
    base = torch.tpu.memory_allocated()
    a = torch.empty(256, 1024, device="tpu")  # 1 MiB
    assert torch.tpu.memory_allocated() == base + MiB
    b = torch.ones(256, 1024, device="tpu") + a  # a temporary, then the result
    assert torch.tpu.memory_allocated() == base + 2 * MiB
    assert torch.tpu.max_memory_allocated() >= base + 3 * MiB
    view = b[::2].t()  # views share the storage
    assert torch.tpu.memory_allocated() == base + 2 * MiB
    b.add_(1).mul_(2)  # in place: the storage swaps buffers, its size stays
    view.zero_()
    assert torch.tpu.memory_allocated() == base + 2 * MiB
    del b
    assert torch.tpu.memory_allocated() == base + 2 * MiB  # the view keeps the storage alive
    del view
    assert torch.tpu.memory_allocated() == base + MiB
    out = torch.empty(0, device="tpu")
    torch.add(a, 1, out=out)  # out= resized to the result
    assert torch.tpu.memory_allocated() == base + 2 * MiB
    torch.mul(a, 2, out=out)  # right size already: reused
    assert torch.tpu.memory_allocated() == base + 2 * MiB
    out.resize_(512, 1024)
    assert torch.tpu.memory_allocated() == base + 3 * MiB
    del a, out
    assert torch.tpu.memory_allocated() == base
    torch.tpu.reset_peak_memory_stats()
    assert torch.tpu.max_memory_allocated() == base
    assert torch.tpu.memory_reserved() == base


def test_memory_is_per_device_and_stats_use_cuda_keys():
    if torch.tpu.device_count() < 2:
        pytest.skip("needs two tpu devices")
    before0, before1 = torch.tpu.memory_allocated(0), torch.tpu.memory_allocated("tpu:1")
    stats_before = torch.tpu.memory_stats(1)
    t = torch.zeros(MiB, dtype=torch.uint8, device="tpu:1")
    assert torch.tpu.memory_allocated(0) == before0
    assert torch.tpu.memory_allocated(torch.device("tpu:1")) == before1 + MiB
    stats = torch.tpu.memory_stats(1)
    assert stats["allocated_bytes.all.current"] == before1 + MiB
    assert stats["allocated_bytes.all.peak"] >= before1 + MiB
    assert stats["allocated_bytes.all.allocated"] == stats_before["allocated_bytes.all.allocated"] + MiB
    assert stats["allocation.all.allocated"] == stats_before["allocation.all.allocated"] + 1
    assert stats["active.all.current"] == stats_before["active.all.current"] + 1
    for key in ("reserved_bytes.all.current", "active_bytes.all.peak", "num_ooms", "num_alloc_retries"):
        assert key in stats
    runtime = torch_tpu.device.memory.runtime_stats(1)
    if runtime:  # a client with device memory stats (TPU, GPU): reported as device.<name>
        assert all(f"device.{k}" in stats for k in runtime)
    del t
    assert torch.tpu.memory_stats(1)["allocated_bytes.all.freed"] == stats["allocated_bytes.all.freed"] + MiB
    free, total = torch.tpu.mem_get_info(1)
    assert 0 <= free <= total


@pytest.fixture
def memory_limit():
    """Restores "no limit" on tpu:0 after the test."""
    yield
    torch_tpu.device.memory.set_limit(0, None)


def test_out_of_memory_at_the_limit_and_recovery(memory_limit):
    total = torch.tpu.get_device_properties(0).total_memory
    with pytest.raises(TypeError):
        torch.tpu.set_per_process_memory_fraction(1)
    with pytest.raises(ValueError):
        torch.tpu.set_per_process_memory_fraction(1.5)
    base = torch.tpu.memory_allocated(0)
    torch.tpu.set_per_process_memory_fraction((base + 4 * MiB) / total, 0)
    limit = torch.tpu.memory_stats(0)["limit_bytes"]
    assert abs(limit - (base + 4 * MiB)) < 1024
    # CUDA's total: the device's own where the client reports it (TPU), else the cap
    assert torch.tpu.mem_get_info(0)[1] == (memory.runtime_stats(0).get("bytes_limit") or limit)
    keep = torch.empty(3 * MiB, dtype=torch.uint8, device="tpu")
    with pytest.raises(torch.OutOfMemoryError) as caught:
        torch.empty(2 * MiB, dtype=torch.uint8, device="tpu")
    message = str(caught.value)
    assert f"{2 * MiB} bytes" in message and f"{base + 3 * MiB} bytes" in message and f"{limit} bytes" in message
    with pytest.raises(torch.OutOfMemoryError):
        keep.float()  # an op's result is refused the same way
    assert torch.tpu.memory_allocated(0) == base + 3 * MiB
    assert torch.tpu.memory_stats(0)["num_ooms"] >= 2
    keep.add_(1)  # in place needs no new storage
    small = torch.ones(1024, device="tpu") * 2  # the process stays usable
    assert small.sum().item() == 2048
    del keep
    again = torch.ones(2 * MiB, dtype=torch.uint8, device="tpu")
    assert again.sum().item() == 2 * MiB


def test_xla_resource_exhausted_becomes_out_of_memory_error():
    # 2**61 bytes: no allocator can provide that, so XLA itself reports RESOURCE_EXHAUSTED.
    with pytest.raises(torch.OutOfMemoryError, match="RESOURCE_EXHAUSTED") as caught:
        torch.ones(2**61, dtype=torch.uint8, device="tpu")
    assert isinstance(caught.value.__cause__, jax.errors.JaxRuntimeError)
    assert "already allocated" in str(caught.value)
    assert (torch.arange(4, device="tpu") * 2).cpu().tolist() == [0, 2, 4, 6]


# ---- tpu-info ----------------------------------------------------------------------------

_HOLDER = """
import sys, time, torch, torch_tpu
held = torch.ones(16 << 20, dtype=torch.uint8, device="tpu:{device}")
time.sleep(0.5)  # > two publish intervals
print("ready", flush=True)
sys.stdin.read()
"""


def test_tpu_info_json_sees_another_process(tmp_path):
    if torch_tpu.platform() == "tpu":
        pytest.skip("this test's process holds the chip: a second process cannot open it")
    device = 1 if torch.tpu.device_count() > 1 else 0
    cache = tmp_path / "cache"
    (cache / "sub").mkdir(parents=True)
    (cache / "sub" / "entry.bin").write_bytes(b"x" * 1234)
    env = _subprocess_env(
        TORCH_TPU_STATS_DIR=str(tmp_path / "stats"),
        TORCH_TPU_STATS_INTERVAL="0.05",
        TORCH_TPU_CACHE_DIR=str(cache),
        TORCH_TPU_PERSISTENT_CACHE="0",  # so the cache holds only the file made here
    )
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLDER.format(device=device)],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "ready"
        done = subprocess.run(
            [sys.executable, "-m", "torch_tpu.tools.tpu_info", "--json"],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, done.stderr
        info = json.loads(done.stdout)
        # The wheel's console script where it is installed (Bazel puts it on PATH).
        script = shutil.which("tpu-info") or None
        command = [script] if script else [sys.executable, "-m", "torch_tpu.tools.tpu_info"]
        watch = subprocess.run(
            [*command, "--json", "--watch", "0.1", "--count", "2"],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert watch.returncode == 0, watch.stderr
    finally:
        holder.stdin.close()
        holder.wait(timeout=60)
    assert info["platform"] == torch_tpu.platform()
    assert len(info["devices"]) == torch.tpu.device_count()
    for d in info["devices"]:
        assert {"index", "kind", "platform", "memory_in_use_bytes", "memory_peak_bytes"} <= d.keys()
    assert info["devices"][device]["memory_in_use_bytes"] >= 16 * MiB
    assert info["devices"][device]["memory_peak_bytes"] >= 16 * MiB
    (proc,) = [p for p in info["processes"] if p["pid"] == holder.pid]
    assert [d["index"] for d in proc["devices"]] == [device]
    assert proc["devices"][0]["memory_in_use_bytes"] == 16 * MiB
    assert info["compile_cache"] == {"directory": str(cache), "exists": True, "files": 1, "bytes": 1234}
    lines = watch.stdout.strip().splitlines()
    assert len(lines) == 2
    assert all(holder.pid in json.loads(line)["devices"][device]["pids"] for line in lines)
    assert not (tmp_path / "stats" / f"{holder.pid}.json").exists()  # removed at exit


def test_tpu_info_sees_its_own_process_and_ignores_dead_ones(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = tmp_path / f"{dead.pid}.json"
    stale.write_text(json.dumps({"pid": dead.pid, "devices": [{"index": 0, "memory_in_use_bytes": 1}]}))
    held = torch.zeros(MiB, dtype=torch.uint8, device="tpu")
    info = tpu_info.collect(stats_dir=tmp_path)
    (me,) = info["processes"]
    assert me["pid"] == os.getpid() and me["self"]
    assert me["devices"][0]["memory_in_use_bytes"] >= MiB
    assert info["devices"][0]["memory_in_use_bytes"] >= MiB
    assert not stale.exists()
    text = tpu_info.render(info)
    assert "compile cache:" in text and str(os.getpid()) in text
    del held


def test_stats_file_is_written_atomically(tmp_path, monkeypatch):
    monkeypatch.setitem(stats_file._state, "path", tmp_path / "me.json")
    monkeypatch.setitem(stats_file._state, "pid", os.getpid())
    monkeypatch.setitem(stats_file._state, "last", None)
    stats_file.publish()
    record = json.loads((tmp_path / "me.json").read_text())
    assert record["pid"] == os.getpid() and len(record["devices"]) == torch.tpu.device_count()
    with stats_file._lock:  # the publisher thread may be writing
        assert [p.name for p in tmp_path.iterdir()] == ["me.json"]  # no temporary left behind


# ---- metrics and debug output -----------------------------------------------------------


@pytest.mark.filterwarnings("ignore:torch_tpu.*no tpu lowering")
def test_report_lists_a_cpu_fallback_and_compiles():
    op = _unlowered_unary_op()
    torch_tpu.metrics.reset()
    x = torch.linspace(0.1, 2.0, 7)
    got = op.default(x.to("tpu"))
    torch.testing.assert_close(got.cpu(), op.default(x))
    y = torch.ones(3, 5, 7, device="tpu")  # a shape no other test compiles
    y * 3 - 1
    y * 3 - 1
    counters = torch_tpu.metrics.counters()
    assert counters["cpu_fallbacks"] >= 1 and counters["op_compiles"] >= 2
    report = torch_tpu.metrics.report()
    name = op._qualified_op_name.split("::")[1]
    (line,) = [ln for ln in report.splitlines() if f"aten.{name}." in ln]
    assert line.split()[-1] == "1"
    assert "CPU fallbacks: 1 calls of 1 ops" in report
    assert "op executables" in report and "% of" in report
    assert "compile time" in report and " ms each" in report


def test_fresh_process_debug_output_cpu_message_and_env_memory_limit():
    # One subprocess (they are slow to start) for what only a fresh process shows.
    op = _unlowered_unary_op()
    script = textwrap.dedent(
        f"""
        import torch, torch_tpu
        import torch_tpu  # a second import says nothing more
        x = torch.ones(2, 3, device="tpu")
        (x + x).cpu()
        torch.ops.aten.{op._qualified_op_name.split("::")[1]}.default(x)
        print(torch.tpu.is_available(), torch.tpu.device_count(), torch.accelerator.current_accelerator())
        print(torch_tpu.platform(), torch.tpu.memory_stats(0)["limit_bytes"])
        try:
            torch.empty(3 << 20, dtype=torch.uint8, device="tpu")
        except torch.OutOfMemoryError as e:
            print("OOM", e)
        """
    )
    env = _subprocess_env(TORCH_TPU_DEBUG="1", TORCH_TPU_STATS="0", TORCH_TPU_MEMORY_LIMIT="2M")
    env.pop("TORCH_TPU_PLATFORM", None)  # let it look for accelerators
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    available, count, accelerator = lines[0].split()
    platform, limit = lines[1].split()
    assert available == "True" and int(count) >= 1 and accelerator == "tpu"
    assert int(limit) == 2 << 20
    assert lines[2].startswith("OOM tpu:0 out of memory. Tried to allocate 3.00 MiB")
    assert "[torch_tpu] compile: aten.add.Tensor" in done.stderr
    assert f"[torch_tpu] fallback: aten.{op._qualified_op_name.split('::')[1]}" in done.stderr
    assert "unknown device" not in done.stderr.lower()
    if platform == "cpu":
        assert done.stderr.count("tpu tensors run on the XLA CPU client") == 1


# ---- profiler ----------------------------------------------------------------------------


def test_profile_writes_a_trace_with_torch_regions(tmp_path):
    x = torch.randn(32, 32, device="tpu")
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        with torch_tpu.tools.profile(tmp_path / "trace") as trace_dir:
            with torch.profiler.record_function("tpu_test_region"):
                y = (x @ x).relu().sum()
            y.item()
    assert trace_dir == tmp_path / "trace"
    files = torch_tpu.tools.profiler.trace_files(trace_dir)
    assert any(f.name.endswith(".xplane.pb") for f in files)  # TensorBoard's profile plugin
    (perfetto,) = [f for f in files if f.name == "perfetto_trace.json.gz"]
    events = json.loads(gzip.decompress(perfetto.read_bytes()))
    names = {e.get("name") for e in (events["traceEvents"] if isinstance(events, dict) else events)}
    assert "tpu_test_region" in names and "aten::mm" in names
    assert "tpu_test_region" in {e.key for e in prof.key_averages()}  # torch's own profile too
    with torch_tpu.tools.profile(tmp_path / "again", annotate_ops=False, create_perfetto_trace=False):
        (x + 1).cpu()
    assert torch_tpu.tools.profiler.trace_files(tmp_path / "again")
