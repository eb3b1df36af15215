"""Multi-controller SPMD: 2 processes x 4 virtual CPU devices joined into one 8-device mesh.

The test functions start two workers (`python this.py SCENARIO RANK ...`) with subprocess on
free 127.0.0.1 ports, each in its own process group, bounded by a timeout after which the
whole group is killed. Each worker checks its own results and exits non-zero on a mismatch.
"""

from __future__ import annotations

import json
import os
import pathlib
import signal
import socket
import subprocess
import sys
import time

import pytest

EXAMPLES = pathlib.Path(__file__).resolve().parents[1] / "examples" / "distributed"
STEPS = 5


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(devices: int) -> dict:
    env = dict(os.environ, TORCH_TPU_NUM_CPU_DEVICES=str(devices), TORCH_TPU_PLATFORM="cpu", OMP_NUM_THREADS="1")
    # the example's modules; torch_tpu comes from wherever this process found it (the wheel in CI)
    env["PYTHONPATH"] = os.pathsep.join([str(EXAMPLES), env.get("PYTHONPATH", "")])
    launcher = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "JAX_COORDINATOR_ADDRESS")
    for key in ("XLA_FLAGS", *launcher):
        env.pop(key, None)
    return env


def _kill(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    for p in procs:
        p.wait()


def _launch(scenario: str, timeout: float = 150, torchrun_env: bool = False) -> list[tuple[int, str]]:
    """Runs two workers of `scenario`; returns (exit code, output) per rank."""
    master, coordinator = _free_port(), _free_port()
    procs = []
    try:
        for rank in range(2):
            env = _env(4)
            if torchrun_env:  # what torchrun sets, plus the coordinator's port
                env.update(
                    MASTER_ADDR="127.0.0.1",
                    MASTER_PORT=str(master),
                    RANK=str(rank),
                    LOCAL_RANK=str(rank),
                    WORLD_SIZE="2",
                    TORCH_TPU_COORDINATOR_PORT=str(coordinator),
                )
            cmd = [sys.executable, __file__, scenario, str(rank), str(coordinator)]
            procs.append(
                subprocess.Popen(
                    cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
                )
            )
        deadline = time.monotonic() + timeout
        results = []
        for p in procs:
            try:
                out, _ = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _kill(procs)
                outs = "\n".join((q.stdout.read() if q.stdout else "")[-3000:] for q in procs)
                pytest.fail(f"{scenario} workers still running after {timeout}s (killed):\n{outs}")
            results.append((p.returncode, out))
        return results
    finally:
        _kill(procs)


def _ok(results: list[tuple[int, str]], marker: str) -> list[str]:
    for rank, (rc, out) in enumerate(results):
        assert rc == 0 and marker in out, f"rank {rank} failed (rc={rc}):\n{out[-6000:]}"
    return [out for _, out in results]


def _losses(out: str) -> list[float]:
    line = next(line for line in out.splitlines() if line.startswith("LOSSES "))
    return json.loads(line[len("LOSSES ") :])


def test_two_processes_run_one_eight_device_spmd_program():
    outs = _ok(_launch("spmd", timeout=300), "spmd ok")
    multi = [_losses(o) for o in outs]
    assert multi[0] == multi[1]  # one SPMD program: both processes read the same loss
    reference = subprocess.run(
        [sys.executable, __file__, "reference"], env=_env(8), capture_output=True, text=True, timeout=300
    )
    assert reference.returncode == 0, reference.stdout[-3000:] + reference.stderr[-3000:]
    lines = [line for line in reference.stdout.splitlines() if line.startswith("LOSSES ")]
    one_process, one_device = (json.loads(line[len("LOSSES ") :]) for line in lines)
    assert len(multi[0]) == STEPS and multi[0][-1] < multi[0][0]
    for a, b, c in zip(multi[0], one_process, one_device):
        assert abs(a - b) <= 1e-5 and abs(a - c) <= 1e-5, (multi[0], one_process, one_device)


def test_c10d_device_collectives_point_to_point_and_barriers():
    _ok(_launch("c10d", torchrun_env=True), "c10d ok")


def test_a_process_dying_mid_collective_makes_the_other_raise():
    results = _launch("die", timeout=120, torchrun_env=True)
    rc, out = results[0]
    expected = "clear error: DistBackendError: tpu device collective allreduce failed"
    assert rc == 3 and expected in out, f"rank 0 (rc={rc}):\n{out[-4000:]}"
    assert results[1][0] == 17


def test_topology_aware_mesh_orders_devices_by_physical_place():
    from types import SimpleNamespace

    import torch

    import torch_tpu.distributed as td
    from torch_tpu.distributed.mesh import _physical_key

    n = torch.tpu.device_count()
    mesh = td.topology_aware_mesh((1, n), ("data", "model"))
    assert mesh.device_ids == tuple(sorted(mesh.device_ids)) and mesh.size("model") == n
    chips = [
        SimpleNamespace(id=i, process_index=0, coords=c, core_on_chip=core)
        for i, (c, core) in enumerate([((1, 0, 0), 0), ((0, 1, 0), 0), ((0, 0, 0), 1), ((0, 0, 0), 0)])
    ]
    # x runs fastest, then y, then z; the cores of one chip stay together
    assert [d.id for d in sorted(chips, key=_physical_key)] == [3, 2, 0, 1]
    hosts = [SimpleNamespace(id=i, process_index=p, coords=None) for i, p in [(5, 1), (1, 0), (4, 1), (0, 0)]]
    assert [d.id for d in sorted(hosts, key=_physical_key)] == [0, 1, 4, 5]
    # a Mesh takes jax devices too
    assert td.Mesh((n,), ("x",), list(mesh.jax_mesh.devices.flat)[::-1]).device_ids == tuple(reversed(mesh.device_ids))


def test_initialize_needs_its_peers_and_no_live_tensors(monkeypatch):
    import torch

    import torch_tpu.distributed as td

    for key in ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES"):
        monkeypatch.delenv(key, raising=False)
    with pytest.raises(ValueError, match="coordinator_address, num_processes, process_id not given"):
        td.initialize()
    alive = torch.ones(2, device="tpu")
    with pytest.raises(RuntimeError, match="must run before any tpu tensor exists"):
        td.initialize("127.0.0.1:1", 2, 0)
    assert not td.is_initialized() and alive.sum().item() == 2


def test_a_process_dying_mid_spmd_program_stops_the_other_with_a_clear_error():
    # Rank 0 raises Gloo's error when its collective reads the dead peer's closed socket. Under a
    # loaded CI machine it has also been seen to wait in the collective until jax's coordination
    # service (in rank 0's process) missed rank 1's heartbeats and ended the process with its
    # fatal message (SIGABRT). Either way it stops, and says why, instead of hanging.
    started = time.monotonic()
    results = _launch("die_spmd", timeout=120)
    rc, out = results[0]
    raised = rc == 3 and "clear error: JaxRuntimeError" in out and "Gloo" in out
    ended = rc == -signal.SIGABRT and "the JAX distributed service detected fatal errors" in out
    assert raised or ended, f"rank 0 (rc={rc}):\n{out[-4000:]}"
    assert results[1][0] == 17 and time.monotonic() - started < 110


# ---- the workers ----------------------------------------------------------------


def _train(mesh, steps: int) -> list[float]:
    import torch
    from llama import Llama, LlamaConfig
    from train import train

    torch.manual_seed(0)
    return train(Llama(LlamaConfig()), steps, 4, mesh)


def _close(a, b, what: str, atol: float = 1e-5) -> None:
    import torch

    torch.testing.assert_close(a.cpu(), b.cpu(), rtol=0, atol=atol, msg=lambda m: f"{what}: {m}")


def _spmd(rank: int, port: int) -> None:
    import torch

    import torch_tpu
    import torch_tpu.distributed as td

    td.initialize(f"127.0.0.1:{port}", 2, rank)
    assert td.process_count() == 2 and td.process_index() == rank and torch.tpu.device_count() == 4
    mesh = td.Mesh((2, 4), ("data", "model"))
    assert mesh.size() == 8 and len({d.process_index for d in mesh.jax_mesh.devices.flat}) == 2
    torch.manual_seed(0)
    a, b = torch.randn(8, 16), torch.randn(16, 8)
    x, w = td.mark_sharding(a.to("tpu"), mesh, ("data", None)), td.mark_sharding(b.to("tpu"), mesh, (None, "model"))
    local = td.multihost.local_shards(x)
    assert len(local) == 4 and all(s.shape == (4, 16) for _, s in local)
    for index, shard in local:
        _close(shard, a[index], "a local shard")
    y = x @ w
    assert td.sharding_spec(y) == ("data", "model")
    _close(y, a @ b, "eager sharded matmul")
    compiled = torch.compile(lambda x, w: torch.relu(x @ w).sum(0), backend="tpu")
    for _ in range(2):  # back to back: the second graph runs after the first on every process
        _close(compiled(x, w), torch.relu(a @ b).sum(0), "compiled sharded matmul")
    losses = _train(td.Mesh((2, 4), ("data", "model")), STEPS)
    assert not torch_tpu.metrics.counters()["cpu_fallback_ops"]
    print("LOSSES " + json.dumps(losses), flush=True)
    print(f"rank {rank}: spmd ok", flush=True)


def _reference() -> None:
    import torch_tpu.distributed as td

    print("LOSSES " + json.dumps(_train(td.Mesh((2, 4), ("data", "model")), STEPS)), flush=True)
    print("LOSSES " + json.dumps(_train(None, STEPS)), flush=True)


def _c10d(rank: int) -> None:
    import torch
    import torch.distributed as dist

    import torch_tpu
    import torch_tpu.distributed as td

    td.initialize()  # from torchrun's variables
    dist.init_process_group("tpu")
    world = dist.get_world_size()
    dev = td.c10d.local_device()
    assert dev == torch.device("tpu", rank)

    def both(fn, *shapes_and_values):
        """`fn` on tpu tensors (the device path) and on CPU tensors (gloo), results compared."""
        tpu = [v.to(dev) for v in shapes_and_values]
        cpu = [v.clone() for v in shapes_and_values]
        before = torch_tpu.metrics.counters()
        fn(*tpu)
        after = torch_tpu.metrics.counters()
        assert after.get("c10d_device_collectives", 0) > before.get("c10d_device_collectives", 0), (fn, after)
        assert after.get("c10d_host_collectives", 0) == before.get("c10d_host_collectives", 0), fn
        fn(*cpu)
        for t, c in zip(tpu, cpu):
            _close(t, c, str(fn))

    g = torch.Generator().manual_seed(rank)
    for op in (dist.ReduceOp.SUM, dist.ReduceOp.MAX, dist.ReduceOp.MIN):
        both(lambda t, op=op: dist.all_reduce(t, op=op), torch.randn(3, 5, generator=g))
    both(lambda t: dist.all_reduce(t), torch.arange(6, dtype=torch.int64) * (rank + 1))
    both(lambda t: dist.all_reduce(t, op=dist.ReduceOp.AVG), torch.randn(4, generator=g))
    both(lambda o, i: dist.all_gather_into_tensor(o, i), torch.zeros(2 * world, 3), torch.randn(2, 3, generator=g))
    both(lambda a, b, i: dist.all_gather([a, b], i), torch.zeros(4), torch.zeros(4), torch.randn(4, generator=g))
    both(lambda o, i: dist.reduce_scatter_tensor(o, i), torch.zeros(3), torch.randn(3 * world, generator=g))
    both(
        lambda o, i: dist.reduce_scatter_tensor(o, i, op=dist.ReduceOp.MAX),
        torch.zeros(2, 2),
        torch.randn(2 * world, 2, generator=g),
    )
    both(lambda t: dist.broadcast(t, src=1), torch.randn(5, generator=g))
    both(lambda o, i: dist.all_to_all_single(o, i), torch.zeros(4, 2), torch.randn(4, 2, generator=g))
    host_before = torch_tpu.metrics.counters().get("c10d_host_collectives", 0)
    flags = torch.tensor([rank == 0, True], device=dev)  # bool: the host-staged fallback
    dist.all_reduce(flags, op=dist.ReduceOp.MAX)
    assert flags.cpu().tolist() == [True, True]
    assert torch_tpu.metrics.counters()["c10d_host_collectives"] == host_before + 1

    # point to point: 3 dtypes there and back, then a batch of isend/irecv in both directions
    peer = 1 - rank
    for dtype in (torch.float32, torch.int64, torch.bfloat16):
        sent = (torch.arange(6) * 3 + 1).reshape(2, 3).to(dtype)
        box = torch.zeros(2, 3, dtype=dtype, device=dev)
        if rank == 0:
            dist.send(sent.to(dev), dst=1)
            dist.recv(box, src=1)
            _close(box, sent * 2, f"send/recv {dtype} round trip")
        else:
            dist.recv(box, src=0)
            _close(box, sent, f"recv {dtype}")
            dist.send(box * 2, dst=0)
    out, into = torch.full((4,), float(rank), device=dev), torch.zeros(4, device=dev)
    works = dist.batch_isend_irecv([dist.P2POp(dist.isend, out, peer), dist.P2POp(dist.irecv, into, peer)])
    for work in works:
        work.wait()
    _close(into, torch.full((4,), float(peer)), "batch_isend_irecv")
    dist.barrier()
    td.c10d.monitored_barrier(timeout=__import__("datetime").timedelta(seconds=30))
    dist.destroy_process_group()
    print(f"rank {rank}: c10d ok", flush=True)


def _die(rank: int) -> None:
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    import torch_tpu.distributed as td

    td.initialize(heartbeat_timeout_s=40)
    dist.init_process_group("tpu", timeout=timedelta(seconds=20))
    t = torch.ones(4, device=td.c10d.local_device())
    dist.all_reduce(t)  # both ranks agree on the device path, and it runs once
    if rank == 1:
        os._exit(17)  # dies before the next collective, which rank 0 enters alone
    try:
        for _ in range(3):
            dist.all_reduce(t)
            t.cpu()
    except Exception as error:  # the test reads the message
        print(f"rank 0: clear error: {type(error).__name__}: {error}", flush=True)
        os._exit(3)
    print("rank 0: no error", flush=True)
    os._exit(0)


def _die_spmd(rank: int, port: int) -> None:
    import torch

    import torch_tpu.distributed as td

    # Rank 0 must reach the collective before the coordination service (in rank 0's process)
    # misses rank 1's heartbeats and ends the process itself. So the program it runs alone is
    # compiled and its communicators connected while both live, and the timeout leaves room
    # for a loaded CI machine.
    td.initialize(f"127.0.0.1:{port}", 2, rank, heartbeat_timeout_s=40)
    mesh = td.Mesh((2, 4), ("data", "model"))
    x = td.mark_sharding(torch.randn(8, 16).to("tpu"), mesh, ("data", None))
    w = td.mark_sharding(torch.randn(16, 8).to("tpu"), mesh, (None, "model"))
    (x @ w * 2).sum().item()
    if rank == 1:
        os._exit(17)  # the other process runs the next programs alone
    try:
        for _ in range(3):
            (x @ w * 2).sum().item()
    except Exception as error:  # the test reads the message
        print(f"rank 0: clear error: {type(error).__name__}: {error}", flush=True)
        os._exit(3)  # (jax's coordination service would end this process too, after its heartbeat timeout)
    print("rank 0: no error", flush=True)
    os._exit(0)


if __name__ == "__main__":
    scenario = sys.argv[1]
    if scenario == "reference":
        _reference()
    elif scenario == "spmd":
        _spmd(int(sys.argv[2]), int(sys.argv[3]))
    elif scenario == "c10d":
        _c10d(int(sys.argv[2]))
    elif scenario == "die":
        _die(int(sys.argv[2]))
    elif scenario == "die_spmd":
        _die_spmd(int(sys.argv[2]), int(sys.argv[3]))
    else:
        sys.exit(f"unknown scenario {scenario}")
