"""Host transfers and the ops that cross the device boundary: copies, .item()."""

from __future__ import annotations

import jax
import torch

from torch_tpu import _C, metrics
from torch_tpu.device import memory
from torch_tpu.ops import storage_locks, tensors
from torch_tpu.ops.dtypes import to_numpy_dtype, to_torch_dtype
from torch_tpu.ops.registry import aten, lower
from torch_tpu.ops.tensors import reshape, to_jax, write_jax
from torch_tpu.platforms.cpu import host_tier
from torch_tpu.runtime import client
from torch_tpu.runtime.global_arrays import host_value

# numpy cannot hold these torch dtypes; they travel as same-width integers.
_BIT_CARRIERS = {
    torch.bfloat16: torch.int16,
    torch.float8_e4m3fn: torch.int8,
    torch.float8_e5m2: torch.int8,
    torch.float8_e4m3fnuz: torch.int8,
    torch.float8_e5m2fnuz: torch.int8,
}
_NUMPY_MAX_DIMS = 64


def cpu_to_jax(t: torch.Tensor, device: int) -> jax.Array:
    """A copy of a CPU tensor on a tpu device."""
    metrics.bump("host_transfers")
    dtype = to_numpy_dtype(t.dtype)  # raises for a dtype tpu tensors cannot hold (complex32)
    t = t.detach().contiguous().resolve_conj().resolve_neg()
    shape = tuple(t.shape)
    if len(shape) > _NUMPY_MAX_DIMS:  # numpy holds up to 64 dims, torch and XLA more: travel flat
        t = t.reshape(-1)
    carrier = _BIT_CARRIERS.get(t.dtype)
    array = (t.view(carrier) if carrier else t).numpy().copy()
    if carrier:
        array = array.view(dtype)
    with memory.out_of_memory_as_torch(device, "copying a CPU tensor to the device", array.nbytes):
        value = jax.device_put(array, client.jax_device(device))
    return reshape(value, shape) if len(shape) > _NUMPY_MAX_DIMS else value


def jax_to_cpu(array: jax.Array) -> torch.Tensor:
    metrics.bump("host_transfers")
    shape = tuple(array.shape)
    if len(shape) > _NUMPY_MAX_DIMS:
        array = reshape(array, (-1,))
    host = host_value(array)
    torch_dtype = to_torch_dtype(host.dtype)
    carrier = _BIT_CARRIERS.get(torch_dtype)
    if carrier:
        t = torch.from_numpy(host.view(to_numpy_dtype(carrier)).copy()).view(torch_dtype)
    else:
        t = torch.from_numpy(host.copy() if not host.flags.writeable else host)
    return t.reshape(shape) if len(shape) > _NUMPY_MAX_DIMS else t


def _copy_on_host(src: torch.Tensor, dst: torch.Tensor) -> bool:
    """CPU's copy_ between host views (host_tier.view); False where one side has none."""
    for t in (src, dst):
        if t.device.type == "tpu":
            to_numpy_dtype(t.dtype)  # a dtype tpu tensors cannot hold (complex32) raises its TypeError
    if dst.device.type != "tpu":
        source = host_tier.view(src)
        if source is None:
            return False
        dst.copy_(source)
    else:
        if src.device.type == "tpu" and not _C._host_readable(src):
            return False
        with storage_locks.held((dst,)):  # the write (and the copy a shared buffer needs first) is atomic
            target = host_tier.view(dst, writable=True)  # first: a source sharing its storage reads the copy
            source = host_tier.view(src) if src.device.type == "tpu" else src
            if target is None or source is None:
                return False
            target.copy_(source)
    if src.device.type != dst.device.type:
        metrics.bump("host_transfers")
    return True


def _converted(dtype, shape: tuple, complex_dst: bool, value):
    """`value` as a copy_ writes it into a tensor of `dtype` and `shape` (traced)."""
    if not complex_dst and value.dtype.kind == "c":
        value = value.real
    return jax.numpy.broadcast_to(value.astype(dtype), shape)


def _copy(src: torch.Tensor, dst: torch.Tensor) -> torch.Tensor:
    if _copy_on_host(src, dst):
        return dst
    if src.device.type == "tpu" and dst.device.type != "tpu":
        dst.copy_(jax_to_cpu(to_jax(src)))
        return dst
    if tuple(src.shape) != tuple(dst.shape):
        torch.broadcast_shapes(tuple(dst.shape), tuple(src.shape))  # CPU's error for a size mismatch
    static = (to_numpy_dtype(dst.dtype), tuple(dst.shape), dst.dtype.is_complex)
    if tensors.lazy is not None and src.device == dst.device:
        # Recorded: reading the value would run the ops recorded so far (an arange's out= copy
        # would split a lazy step's executable).
        write_jax(dst, tensors.lazy.call(_converted, static, tensors.lazy.read(src)))
        return dst
    if src.device.type == "tpu":
        value = to_jax(src)
        if src.device.index != dst.device.index:
            with memory.out_of_memory_as_torch(dst.device.index, "copying between devices", src.nbytes):
                value = jax.device_put(value, client.jax_device(dst.device.index))
    else:
        value = cpu_to_jax(src, dst.device.index)
    write_jax(dst, _converted(*static, value))
    return dst


@lower(aten._copy_from.default, eager=True)
def copy_from(self, dst, non_blocking=False):
    if isinstance(self, (bool, int, float, complex)):  # `t.copy_(2.5)`: the number comes unwrapped
        return dst.fill_(self)
    return _copy(self, dst)


@lower(aten._copy_from_and_resize.default, eager=True)
def copy_from_and_resize(self, dst):
    if dst.shape != self.shape:
        dst.resize_(self.shape)
    return _copy(self, dst)


@lower(aten._local_scalar_dense.default, eager=True)
def local_scalar_dense(self):
    if self.numel() == 0:
        raise RuntimeError("Empty tensor not supported")  # (tensor.item() raises its own message first)
    metrics.bump("host_transfers")
    view = host_tier.view(self)
    return view.item() if view is not None else host_value(to_jax(self)).item()


__all__ = ["cpu_to_jax", "jax_to_cpu"]
