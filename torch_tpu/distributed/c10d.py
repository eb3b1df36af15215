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

from torch_tpu import debug

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

    def all_to_all(self, output: torch.Tensor, input: torch.Tensor, out_splits, in_splits) -> None:
        host = torch.empty(output.shape, dtype=output.dtype)
        self.gloo.alltoall_base(host, _host(input), list(out_splits), list(in_splits), AllToAllOptions()).wait()
        _back(output, host)


class TpuProcessGroup(dist.ProcessGroup):
    """torch.distributed's view of the "tpu" backend: each call stages tpu tensors through
    the transport and returns a completed Work."""

    def __init__(self, store, rank: int, size: int, timeout: timedelta):
        super().__init__(rank, size)
        self.transport = HostTransport(store, rank, size, timeout)
        # c10d keeps a group's name on its backends: gloo serves as the CPU one (CPU tensors).
        self._register_backend(torch.device("cpu"), dist.ProcessGroup.BackendType.GLOO, self.transport.gloo)
        debug.log("c10d", f"tpu process group: rank {rank} of {size}")

    def getBackendName(self) -> str:
        return BACKEND_NAME

    # ---- collectives ----------------------------------------------------------

    def allreduce(self, tensors, opts=None):
        self.transport.allreduce(list(tensors), _reduce_op(opts))
        return _DoneWork(list(tensors))

    def allreduce_coalesced(self, tensors, opts=None):
        self.transport.allreduce(list(tensors), _reduce_op(opts))
        return _DoneWork(list(tensors))

    def allgather(self, output_tensors, input_tensors, opts=None):
        self.transport.allgather(output_tensors, list(input_tensors))
        return _DoneWork(output_tensors)

    def _allgather_base(self, output, input, opts=None):
        self.transport.allgather([list(output.chunk(self.size()))], [input])
        return _DoneWork([output])

    def allgather_into_tensor_coalesced(self, outputs, inputs, opts=None):
        self.transport.allgather([list(o.chunk(self.size())) for o in outputs], list(inputs))
        return _DoneWork(list(outputs))

    def reduce_scatter(self, output_tensors, input_tensors, opts=None):
        self.transport.reduce_scatter(list(output_tensors), input_tensors, _reduce_op(opts))
        return _DoneWork(list(output_tensors))

    def _reduce_scatter_base(self, output, input, opts=None):
        self.transport.reduce_scatter([output], [list(input.chunk(self.size()))], _reduce_op(opts))
        return _DoneWork([output])

    def reduce_scatter_tensor_coalesced(self, outputs, inputs, opts=None):
        chunks = [list(i.chunk(self.size())) for i in inputs]
        self.transport.reduce_scatter(list(outputs), chunks, _reduce_op(opts))
        return _DoneWork(list(outputs))

    def broadcast(self, tensors, opts=None):
        root = opts.rootRank if opts is not None else 0
        self.transport.broadcast(list(tensors), root)
        return _DoneWork(list(tensors))

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
        self.transport.all_to_all(output, input, output_split_sizes, input_split_sizes)
        return _DoneWork([output])

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
