"""The c10d process-group backend "tpu", for multi-process launchers (torchrun).

One process per tpu device (rank r uses tpu:LOCAL_RANK). Collectives on tpu tensors run
through a transport:
- HostTransport (this file, used on the CPU client): stages each tensor through host
  memory and runs the collective with gloo over the same store. Every staging copy is
  counted in torch_tpu.metrics "host_transfers".
- On a real TPU slice, jax's multi-controller runtime (jax.distributed.initialize, then a
  jitted collective over a global mesh) moves data over the ICI without the host; such a
  transport slots in behind the same five calls (allreduce, allgather, reduce_scatter,
  broadcast, barrier) and is left for when this runs on a slice.
The ProcessGroup subclass below is what torch.distributed, DDP, DeviceMesh and DTensor see.
Work completes before a call returns (the copies back to the device are queued on jax).
"""

from __future__ import annotations

import os
from datetime import timedelta

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import (
    AllgatherOptions,
    AllreduceOptions,
    AllToAllOptions,
    BarrierOptions,
    BroadcastOptions,
    GatherOptions,
    ScatterOptions,
)

from torch_tpu import debug, metrics
from torch_tpu.distributed import multihost

BACKEND_NAME = "tpu"


class _DoneWork(dist._Work):
    """A collective that already ran: wait() returns at once, the future holds its tensors."""

    def __init__(self, result):
        super().__init__()
        self._future = torch.futures.Future()
        self._future.set_result(result)

    def wait(self, timeout: timedelta | None = None) -> bool:
        return True

    def is_completed(self) -> bool:
        return True

    def is_success(self) -> bool:
        return True

    def get_future(self) -> torch.futures.Future:
        return self._future


def _host(t: torch.Tensor) -> torch.Tensor:
    return t.detach().cpu() if t.device.type != "cpu" else t.detach()


def _back(dst: torch.Tensor, host: torch.Tensor) -> None:
    if dst.device.type != "cpu" or dst.data_ptr() != host.data_ptr():
        with torch.no_grad():
            dst.copy_(host)


class HostTransport:
    """Collectives through host memory over gloo (the CPU client's path)."""

    def __init__(self, store, rank: int, size: int, timeout: timedelta):
        self.gloo = dist.ProcessGroupGloo(dist.PrefixStore("tpu_host/", store), rank, size, timeout)

    def _allreduce_host(self, host: list[torch.Tensor], op) -> None:
        average = op == dist.ReduceOp.AVG  # gloo has no AVG: a sum, then a division
        opts = AllreduceOptions()
        opts.reduceOp = dist.ReduceOp.SUM if average else op
        self.gloo.allreduce(host, opts).wait()
        if average:
            for h in host:
                h.div_(self.gloo.size())

    def allreduce(self, tensors: list[torch.Tensor], op) -> None:
        host = [_host(t) for t in tensors]
        self._allreduce_host(host, op)
        for t, h in zip(tensors, host):
            _back(t, h)

    def allgather(self, outputs: list[list[torch.Tensor]], inputs: list[torch.Tensor]) -> None:
        host_out = [[torch.empty(o.shape, dtype=o.dtype) for o in outs] for outs in outputs]
        self.gloo.allgather(host_out, [_host(t) for t in inputs], AllgatherOptions()).wait()
        for outs, hosts in zip(outputs, host_out):
            for o, h in zip(outs, hosts):
                _back(o, h)

    def reduce_scatter(self, outputs: list[torch.Tensor], inputs: list[list[torch.Tensor]], op) -> None:
        # gloo's reduce_scatter is an all-reduce and a slice; do that with one all-reduce per input.
        for out, chunks in zip(outputs, inputs):
            stacked = torch.stack([_host(c) for c in chunks])
            self._allreduce_host([stacked], op)
            _back(out, stacked[self.gloo.rank()])

    def broadcast(self, tensors: list[torch.Tensor], root: int) -> None:
        host = [_host(t) for t in tensors]
        opts = BroadcastOptions()
        opts.rootRank = root
        self.gloo.broadcast(host, opts).wait()
        if self.gloo.rank() != root:
            for t, h in zip(tensors, host):
                _back(t, h)

    def barrier(self) -> None:
        self.gloo.barrier(BarrierOptions()).wait()

    def scatter(self, output: torch.Tensor, chunks: list[torch.Tensor], root: int) -> None:
        host = torch.empty(output.shape, dtype=output.dtype)
        opts = ScatterOptions()
        opts.rootRank = root
        inputs = [[_host(c) for c in chunks]] if self.gloo.rank() == root else []
        self.gloo.scatter([host], inputs, opts).wait()
        _back(output, host)

    def gather(self, outputs: list[torch.Tensor], input: torch.Tensor, root: int) -> None:
        host_out = [[torch.empty(o.shape, dtype=o.dtype) for o in outputs]] if self.gloo.rank() == root else []
        opts = GatherOptions()
        opts.rootRank = root
        self.gloo.gather(host_out, [_host(input)], opts).wait()
        for o, h in zip(outputs, host_out[0] if host_out else []):
            _back(o, h)

    def send(self, tensors: list[torch.Tensor], dst: int, tag: int) -> _PendingWork:
        host = [_host(t).contiguous() for t in tensors]
        return _PendingWork(self.gloo.send(host, dst, tag), tensors=tensors)

    def recv(self, tensors: list[torch.Tensor], src: int | None, tag: int) -> _PendingWork:
        host = [torch.empty(t.shape, dtype=t.dtype) for t in tensors]
        work = self.gloo.recv(host, src, tag) if src is not None else self.gloo.recv_anysource(host, tag)

        def finish() -> None:
            for t, h in zip(tensors, host):
                _back(t, h)

        return _PendingWork(work, finish, tensors)

    def all_to_all(self, output: torch.Tensor, input: torch.Tensor, out_splits, in_splits) -> None:
        host = torch.empty(output.shape, dtype=output.dtype)
        self.gloo.alltoall_base(host, _host(input), list(out_splits), list(in_splits), AllToAllOptions()).wait()
        _back(output, host)


class _PendingWork(dist._Work):
    """A gloo point-to-point transfer in flight; wait() finishes it and, for a receive, copies the
    received host tensors to their tpu destinations."""

    def __init__(self, work, finish=None, tensors=()):
        super().__init__()
        self._work = work
        self._finish = finish
        self._tensors = list(tensors)
        self._done = False

    def wait(self, timeout: timedelta | None = None) -> bool:
        if not self._done:
            self._work.wait() if timeout is None else self._work.wait(timeout)
            if self._finish is not None:
                self._finish()
            self._done = True
        return True

    def is_completed(self) -> bool:
        return self._done or self._work.is_completed()

    def is_success(self) -> bool:
        return self._work.is_success()

    def source_rank(self) -> int:
        return self._work.source_rank()

    def get_future(self) -> torch.futures.Future:
        future = torch.futures.Future()
        self.wait()
        future.set_result(self._tensors)
        return future


class TpuProcessGroup(dist.ProcessGroup):
    """torch.distributed's view of the "tpu" backend: each call stages tpu tensors through
    the transport and returns a completed Work."""

    def __init__(self, store, rank: int, size: int, timeout: timedelta):
        super().__init__(rank, size)
        self.transport = HostTransport(store, rank, size, timeout)
        self.device = None
        if multihost.is_initialized():
            from torch_tpu.distributed.device_collectives import DeviceCollectives

            self.device = DeviceCollectives(self.transport.gloo, rank, size)
        # c10d keeps a group's name on its backends: gloo serves as the CPU one (CPU tensors).
        self._register_backend(torch.device("cpu"), dist.ProcessGroup.BackendType.GLOO, self.transport.gloo)
        debug.log("c10d", f"tpu process group: rank {rank} of {size}")

    def getBackendName(self) -> str:
        return BACKEND_NAME

    # ---- collectives ----------------------------------------------------------

    def _device_mesh(self, tensors: list[torch.Tensor], op=None):
        """The ranks' device mesh where this collective runs as an XLA collective, else None
        (then the host transport runs it); counted either way."""
        mesh = None
        if self.device is not None and self.device.supports(tensors, op):
            mesh = self.device.mesh_for(tensors)
        metrics.bump("c10d_device_collectives" if mesh is not None else "c10d_host_collectives")
        return mesh

    def allreduce(self, tensors, opts=None):
        tensors = list(tensors)
        op = _reduce_op(opts)
        mesh = self._device_mesh(tensors, op)
        if mesh is not None:
            self.device.run("allreduce", mesh, tensors, op)
        else:
            self.transport.allreduce(tensors, op)
        return _DoneWork(tensors)

    def allreduce_coalesced(self, tensors, opts=None):
        return self.allreduce(tensors, opts)

    def allgather(self, output_tensors, input_tensors, opts=None):
        inputs = list(input_tensors)
        mesh = self._device_mesh(inputs + [o for outs in output_tensors for o in outs])
        if mesh is not None:
            self.device.run("allgather", mesh, output_tensors, inputs)
        else:
            self.transport.allgather(output_tensors, inputs)
        return _DoneWork(output_tensors)

    def _allgather_base(self, output, input, opts=None):
        self.allgather([list(output.chunk(self.size()))], [input])
        return _DoneWork([output])

    def allgather_into_tensor_coalesced(self, outputs, inputs, opts=None):
        self.allgather([list(o.chunk(self.size())) for o in outputs], list(inputs))
        return _DoneWork(list(outputs))

    def reduce_scatter(self, output_tensors, input_tensors, opts=None):
        outputs = list(output_tensors)
        op = _reduce_op(opts)
        mesh = self._device_mesh(outputs + [c for chunks in input_tensors for c in chunks], op)
        if mesh is not None:
            self.device.run("reduce_scatter", mesh, outputs, input_tensors, op)
        else:
            self.transport.reduce_scatter(outputs, input_tensors, op)
        return _DoneWork(outputs)

    def _reduce_scatter_base(self, output, input, opts=None):
        self.reduce_scatter([output], [list(input.chunk(self.size()))], opts)
        return _DoneWork([output])

    def reduce_scatter_tensor_coalesced(self, outputs, inputs, opts=None):
        self.reduce_scatter(list(outputs), [list(i.chunk(self.size())) for i in inputs], opts)
        return _DoneWork(list(outputs))

    def broadcast(self, tensors, opts=None):
        root = opts.rootRank if opts is not None else 0
        tensors = list(tensors)
        mesh = self._device_mesh(tensors)
        if mesh is not None:
            self.device.run("broadcast", mesh, tensors, root)
        else:
            self.transport.broadcast(tensors, root)
        return _DoneWork(tensors)

    def barrier(self, opts=None):
        self.transport.barrier()
        return _DoneWork([])

    def scatter(self, output_tensors, input_tensors, opts=None):
        root = opts.rootRank if opts is not None else 0
        self.transport.scatter(output_tensors[0], input_tensors[0] if input_tensors else [], root)
        return _DoneWork(list(output_tensors))

    def gather(self, output_tensors, input_tensors, opts=None):
        root = opts.rootRank if opts is not None else 0
        self.transport.gather(output_tensors[0] if output_tensors else [], input_tensors[0], root)
        return _DoneWork(list(output_tensors))

    def alltoall_base(self, output, input, output_split_sizes, input_split_sizes, opts=None):
        even = not output_split_sizes and not input_split_sizes and input.shape[0] % self.size() == 0
        mesh = self._device_mesh([output, input]) if even else self._device_mesh([])
        if mesh is not None:
            self.device.run("all_to_all", mesh, output, input)
        else:
            self.transport.all_to_all(output, input, output_split_sizes, input_split_sizes)
        return _DoneWork([output])

    # ---- point to point (host-staged over gloo) -----------------------------------------

    def send(self, tensors, dstRank, tag=0):
        return self.transport.send(list(tensors), dstRank, tag)

    def recv(self, tensors, srcRank, tag=0):
        return self.transport.recv(list(tensors), srcRank, tag)

    def recv_anysource(self, tensors, tag=0):
        return self.transport.recv(list(tensors), None, tag)

    def monitored_barrier(self, timeout=None, wait_all_ranks=False):
        return self.transport.gloo.monitored_barrier(timeout, wait_all_ranks)

    # The newer names of the same collectives.
    all_gather_single = _allgather_base
    all_gather_single_coalesced = allgather_into_tensor_coalesced
    reduce_scatter_single = _reduce_scatter_base
    reduce_scatter_single_coalesced = reduce_scatter_tensor_coalesced
    all_to_all_single = alltoall_base


def _reduce_op(opts):
    return opts.reduceOp if opts is not None else dist.ReduceOp.SUM


def _create(store, rank: int, size: int, timeout: timedelta) -> TpuProcessGroup:
    if "LOCAL_RANK" in os.environ:
        local_device()  # under a launcher, each process computes on its own device
    return TpuProcessGroup(store, rank, size, timeout)


def register() -> None:
    """Registers "tpu" with torch.distributed (idempotent); `init_process_group("tpu")` and
    `init_device_mesh("tpu", ...)` then use it for tpu tensors."""
    if BACKEND_NAME.upper() not in dist.Backend._plugins:
        dist.Backend.register_backend(BACKEND_NAME, _create, devices=["tpu"])


def local_device() -> torch.device:
    """This process's tpu device under a launcher, made current: tpu:LOCAL_RANK where the
    process sees every local device, tpu:0 where it sees only its own
    (TORCH_TPU_NUM_CPU_DEVICES=1 per process, or one chip per process on a TPU host)."""
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    count = torch.tpu.device_count()
    if local_rank < count:
        index = local_rank
    elif count == 1:
        index = 0
    else:
        raise RuntimeError(f"LOCAL_RANK={local_rank} but this process sees {count} tpu devices")
    torch.tpu.set_device(index)
    return torch.device("tpu", index)


def monitored_barrier(group=None, timeout: timedelta | None = None, wait_all_ranks: bool = False) -> None:
    """torch.distributed.monitored_barrier for a "tpu" group (torch's own accepts only gloo
    groups): a barrier over the group's gloo transport that names the ranks that did not
    arrive within `timeout` (all of them with `wait_all_ranks`), raising RuntimeError."""
    group = group if group is not None else dist.distributed_c10d._get_default_group()
    if not isinstance(group, TpuProcessGroup):
        dist.monitored_barrier(group, timeout, wait_all_ranks)
        return
    group.monitored_barrier(timeout if timeout is not None else timedelta(minutes=30), wait_all_ranks)
