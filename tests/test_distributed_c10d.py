"""The c10d backend "tpu" under torchrun: two processes, one tpu device each.

The test functions launch `python -m torch.distributed.run --standalone --nproc-per-node=2`
on this very file; run as a script, it is the worker (`python this.py SCENARIO`), which checks
its results itself and exits non-zero on a mismatch.
"""

from __future__ import annotations

import copy
import os
import socket
import subprocess
import sys

import pytest
import torch
from torch import nn


def _has_tcp() -> bool:
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", 0))
        return True
    except OSError:
        return False


# torchrun's rendezvous store is TCP: a sandbox without sockets (the TPU lane's host) cannot run it.
pytestmark = pytest.mark.skipif(not _has_tcp(), reason="this host cannot open a TCP socket (torchrun's store)")


def _launch(scenario: str, timeout: float = 300) -> str:
    env = dict(os.environ, TORCH_TPU_NUM_CPU_DEVICES="1", TORCH_TPU_PLATFORM="cpu", OMP_NUM_THREADS="1")
    env.pop("XLA_FLAGS", None)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", __file__, scenario]
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"torchrun {scenario} timed out after {timeout}s:\n{e.stdout}\n{e.stderr}")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"torchrun {scenario} failed (rc={proc.returncode}):\n{out[-6000:]}"
    return out


def test_collectives_and_ddp_under_torchrun():
    out = _launch("collectives_ddp")
    assert out.count("collectives ok") == 2 and out.count("ddp ok") == 2, out[-3000:]


def test_parallelize_module_on_a_tpu_device_mesh():
    out = _launch("tensor_parallel")
    assert out.count("tensor parallel ok") == 2, out[-3000:]


# ---- the worker ---------------------------------------------------------------


def _close(a: torch.Tensor, b: torch.Tensor, what: str) -> None:
    torch.testing.assert_close(a.cpu(), b.cpu(), rtol=0, atol=1e-5, msg=lambda m: f"{what}: {m}")


def _collectives(rank: int, world: int, dev: torch.device) -> None:
    import torch.distributed as dist
    import torch.distributed._functional_collectives as funcol

    import torch_tpu

    torch_tpu.metrics.reset()
    t = torch.full((4,), float(rank + 1), device=dev)
    dist.all_reduce(t)
    _close(t, torch.full((4,), 3.0), "all_reduce")
    m = torch.tensor([1.0, 5.0], device=dev) * (rank + 1)
    dist.all_reduce(m, op=dist.ReduceOp.MAX)
    _close(m, torch.tensor([2.0, 10.0]), "all_reduce max")
    a = torch.full((2,), float(rank), device=dev)
    dist.all_reduce(a, op=dist.ReduceOp.AVG)
    _close(a, torch.full((2,), (world - 1) / 2), "all_reduce avg")

    outs = [torch.empty(3, device=dev) for _ in range(world)]
    dist.all_gather(outs, torch.arange(3.0, device=dev) + 10 * rank)
    _close(torch.stack(outs), torch.stack([torch.arange(3.0) + 10 * r for r in range(world)]), "all_gather")

    big = torch.empty(2 * world, 3, device=dev)
    dist.all_gather_into_tensor(big, torch.ones(2, 3, device=dev) * rank)
    _close(big, torch.cat([torch.ones(2, 3) * r for r in range(world)]), "all_gather_into_tensor")

    full = torch.arange(2.0 * world, device=dev).reshape(world, 2) * (rank + 1)
    part = torch.empty(2, device=dev)
    dist.reduce_scatter_tensor(part, full.reshape(-1))
    expected = sum(torch.arange(2.0 * world).reshape(world, 2) * (r + 1) for r in range(world))
    _close(part, expected[rank], "reduce_scatter_tensor")

    one = torch.empty(2, device=dev)
    dist.reduce_scatter(one, list(full.unbind(0)))
    _close(one, expected[rank], "reduce_scatter")

    b = torch.full((3,), float(rank), device=dev)
    dist.broadcast(b, src=1)
    _close(b, torch.full((3,), 1.0), "broadcast")
    dist.barrier()

    # DTensor's path: the functional collectives, by group name.
    gathered = funcol.all_gather_tensor(torch.ones(2, device=dev) * rank, 0, dist.group.WORLD)
    _close(gathered, torch.cat([torch.ones(2) * r for r in range(world)]), "funcol all_gather")
    reduced = funcol.all_reduce(torch.ones(2, device=dev) * (rank + 1), "sum", dist.group.WORLD)
    _close(reduced, torch.full((2,), 3.0), "funcol all_reduce")
    assert torch_tpu.metrics.counters()["host_transfers"] > 0  # the CPU client stages through host memory
    print(f"rank {rank}: collectives ok", flush=True)


def _ddp(rank: int, world: int, dev: torch.device) -> None:
    from torch.nn.parallel import DistributedDataParallel

    import torch_tpu

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
    reference = copy.deepcopy(model)
    ddp = DistributedDataParallel(model.to(dev))
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9)
    g = torch.Generator().manual_seed(5)
    per_rank = 2
    for _ in range(4):
        x = torch.randn(per_rank * world, 8, generator=g)
        loss = ddp(x[rank * per_rank : (rank + 1) * per_rank].to(dev)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        ref_loss = reference(x).pow(2).mean()  # the whole batch on one process, on CPU
        ref_opt.zero_grad()
        ref_loss.backward()
        ref_opt.step()
    for p, q in zip(ddp.module.parameters(), reference.parameters()):
        assert p.device.type == "tpu"
        _close(p, q, "DDP parameters")
    assert not torch_tpu.metrics.counters()["cpu_fallback_ops"]
    print(f"rank {rank}: ddp ok", flush=True)


def _tensor_parallel(rank: int, world: int) -> None:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    import torch_tpu
    import torch_tpu.distributed as td

    mesh = init_device_mesh("tpu", (1, world), mesh_dim_names=("dp", "tp"))  # a 2-D mesh, data x model
    assert isinstance(dist.distributed_c10d._get_default_group(), td.c10d.TpuProcessGroup)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    reference = copy.deepcopy(model)
    tp = parallelize_module(model.to("tpu"), mesh["tp"], {"0": ColwiseParallel(), "2": RowwiseParallel()})
    w = tp[0].weight
    assert isinstance(w, DTensor) and w.placements == (Shard(0),) and w.to_local().shape == (16 // world, 8)
    assert w.to_local().device.type == "tpu"
    opt = torch.optim.AdamW(tp.parameters(), lr=1e-2)
    ref_opt = torch.optim.AdamW(reference.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(3)
    for _ in range(4):
        x = torch.randn(4, 8, generator=g)
        loss = tp(x.to("tpu")).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        ref_loss = reference(x).pow(2).mean()
        ref_opt.zero_grad()
        ref_loss.backward()
        ref_opt.step()
        _close(loss, ref_loss.detach(), "loss")
    for p, q in zip(tp.parameters(), reference.parameters()):
        _close(p.full_tensor(), q, "tensor-parallel parameters")
    assert not torch_tpu.metrics.counters()["cpu_fallback_ops"]
    print(f"rank {rank}: tensor parallel ok", flush=True)


def _worker(scenario: str) -> None:
    import torch.distributed as dist

    import torch_tpu.distributed as td

    if scenario == "tensor_parallel":
        _tensor_parallel(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]))
    else:
        dist.init_process_group("tpu")
        dev = td.c10d.local_device()
        _collectives(dist.get_rank(), dist.get_world_size(), dev)
        _ddp(dist.get_rank(), dist.get_world_size(), dev)
    dist.destroy_process_group()


if __name__ == "__main__":
    _worker(sys.argv[1])
