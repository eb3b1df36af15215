"""The host tier: an eager op call runs with PyTorch's CPU kernel while its executable compiles.

A first-seen op signature would otherwise wait for XLA (tens to hundreds of milliseconds per
signature on the CPU client, more on a TPU) before it runs. Instead the dispatcher hands the
compile to runtime/background_compile.py and runs the call here: the tensors' buffers are read
as CPU tensors through their geometry, the op runs on the CPU, and its results become tpu
tensors again. Calls of that signature keep running here until the executable is ready; then
they run it. CPU's kernel is PyTorch's reference, so results are CPU's (an executable's may
differ from them by rounding, as any tpu result may).

On the CPU client a buffer is host memory: both ways are DLPack views, no copy. A storage the
op writes is copied first, and the copy becomes the storage's new buffer, as an executable's
output would. Counted in metrics as "host_tier_runs".

What runs here: jit-lowered ops of tpu tensors without math bits, not random, without out=
tensors, outside lazy recording and SPMD placement, on the CPU client.
"""

from __future__ import annotations

import jax
import torch
from jax._src.lib import _jax

from torch_tpu import _C, metrics
from torch_tpu.ops.dtypes import to_numpy_dtype
from torch_tpu.ops.tensors import buffer_of, tensor_geometry
from torch_tpu.runtime import background_compile, client

_CPU = torch.device("cpu")


def available() -> bool:
    """Whether first-seen signatures run here while they compile (the CPU client, and
    TORCH_TPU_ASYNC_COMPILE not off)."""
    return client.platform() == "cpu" and background_compile.enabled()


def readable(t: torch.Tensor) -> bool:
    """Whether a tpu tensor can be read here: no math bits, and its buffer is of its own dtype."""
    if t.is_conj() or t.is_neg():
        return False
    buf = _C._get_buffer(t)
    return buf is None or (buf.ndim == 1 and buf.dtype == to_numpy_dtype(t.dtype))


def _host_view(buf: jax.Array) -> torch.Tensor:
    """A CPU tensor over a flat buffer's memory (it waits for the buffer to be computed)."""
    return torch.utils.dlpack.from_dlpack(_jax.buffer_to_dlpack_managed_tensor(buf))


def _device_array(flat: torch.Tensor, device: int) -> jax.Array:
    """A flat buffer on tpu device `device` over a contiguous 1-D CPU tensor's memory."""
    return _jax.dlpack_managed_tensor_to_buffer(flat.__dlpack__(), client.jax_device(device), None)


def _storage_key(t: torch.Tensor) -> int:
    """The tpu buffer `t` reads: a storage slice shares its parent's."""
    return t.untyped_storage().data_ptr() - _C._buffer_offset(t)


def run(op, args: tuple, kwargs: dict, mutated: list, returns: list, bound: list, device: int):
    """`op(*args, **kwargs)` with its CPU kernel on the tpu tensors' buffers; `mutated`: the
    tensors it writes (their storages get the written copies as buffers); `returns`: the
    dispatcher's OpPlan.returns ("fresh", i) / ("arg", i) over `bound`."""
    written = {_storage_key(t) for t in mutated if t is not None}
    flats: dict[int, torch.Tensor] = {}  # buffer key -> the CPU tensor over it (a copy if written)
    inputs: list[torch.Tensor] = []

    def to_host(x):
        if isinstance(x, torch.Tensor) and x.device.type == "tpu":
            key = _storage_key(x)
            buf = buffer_of(x)
            flat = flats.get(key)
            if flat is None:
                flat = _host_view(buf)
                if key in written:
                    flat = flat.clone()
                flats[key] = flat
            inputs.append(flat)
            g = tensor_geometry(x, buf)
            return flat.as_strided(g.sizes, g.strides, g.offset)
        if isinstance(x, (list, tuple)):
            return type(x)(to_host(v) for v in x)
        if isinstance(x, torch.device) and x.type == "tpu":
            return _CPU
        return x

    host_args = tuple(to_host(a) for a in args)
    host_kwargs = {k: to_host(v) for k, v in kwargs.items()}
    result = op(*host_args, **host_kwargs)
    for t in mutated:
        if t is not None:
            flat = flats[_storage_key(t)]
            _C._set_buffer(t, _device_array(flat, device), t.dtype, flat.numel())
    metrics.bump("host_tier_runs")
    results = result if isinstance(result, tuple) else (result,)
    out = []
    for value, (kind, i) in zip(results if returns else (), returns):
        out.append(_to_device(value, device, inputs) if kind == "fresh" else bound[i])
    if not out:
        return None
    return out[0] if len(out) == 1 else tuple(out)


def _to_device(value, device: int, inputs: list[torch.Tensor]):
    """A fresh CPU result as a tpu tensor of the same shape, strides and offset."""
    if isinstance(value, (list, tuple)):
        return [_to_device(v, device, inputs) for v in value]
    if not isinstance(value, torch.Tensor):
        return value
    storage = value.untyped_storage()
    if any(storage.data_ptr() == t.untyped_storage().data_ptr() for t in inputs):
        value = value.clone()  # a kernel that handed back an input's memory: the result owns its own
        storage = value.untyped_storage()
    n = storage.nbytes() // value.element_size()
    flat = value.as_strided((n,), (1,), 0)
    out = _C._wrap(_device_array(flat, device), [n], value.dtype, device)
    return out.as_strided_(value.shape, value.stride(), value.storage_offset())
