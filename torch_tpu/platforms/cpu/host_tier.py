"""The host tier: an eager op call runs with PyTorch's CPU kernel while its executable compiles.

A first-seen op signature would otherwise wait for XLA (tens to hundreds of milliseconds per
signature on the CPU client) before it runs. Instead the dispatcher hands the compile to
platforms/cpu/background_compile.py and runs the call here: the tensors' buffers are read as CPU
tensors through their geometry, the op runs on the CPU, and its results become tpu tensors
again. Calls of that signature keep running on the host (in C++, csrc/eager_kernel.cc, for the
ops it serves) until the executable is ready; then they run it. CPU's kernel is PyTorch's
reference, so results are CPU's (an executable's may differ from them by rounding, as any tpu
result may).

On the CPU client a buffer is host memory: both ways are DLPack views, no copy
(csrc/host_tier.cc). A result stays a CPU tensor inside its buffer until an executable reads it.
A storage the op writes gets a private copy first if an array shares its memory. Counted in
metrics as "host_tier_runs".

What runs here: jit-lowered ops of tpu tensors without math bits, not random, without out=
tensors, outside lazy recording and SPMD placement, on the CPU client.
"""

from __future__ import annotations

from collections.abc import Iterable

import jax
import torch
from jax._src.lib import _jax

from torch_tpu import _C, metrics, platforms
from torch_tpu.device import memory
from torch_tpu.ops import spmd, tensors
from torch_tpu.platforms.cpu import background_compile
from torch_tpu.runtime import client

_CPU = torch.device("cpu")


def install() -> None:
    """Gives the C++ buffers jax's DLPack functions (the moves between arrays and CPU tensors)."""
    _C._set_host_hooks(_to_dlpack, _jax.dlpack_managed_tensor_to_buffer, client.jax_device)


def _to_dlpack(array):
    """jax's DLPack export of `array` (a CPU tensor over its memory), once its value is computed.
    An array whose computation failed (its output did not fit in memory: the CPU client reports
    that when the value is awaited) raises its error here: exported, it would abort the process
    (an XLA check). Out of memory raises torch.OutOfMemoryError."""
    try:
        array.block_until_ready()
    except jax.errors.JaxRuntimeError as error:
        devices = client.devices()
        (device,) = array.devices()
        memory.raise_if_out_of_memory(error, devices.index(device) if device in devices else 0)
        raise
    return _jax.buffer_to_dlpack_managed_tensor(array)


def available() -> bool:
    """Whether first-seen signatures run here while they compile (the CPU client, and
    TORCH_TPU_ASYNC_COMPILE not off)."""
    return _on() and background_compile.enabled()


def _on() -> bool:
    """The CPU client, with flat buffers: TORCH_TPU_SHAPED_BUFFERS=1 (TPU's layout, for tests) runs
    ops as TPU does, without the host tier (whose host values are flat)."""
    return platforms.host_memory_buffers() and not platforms.shaped_buffers()


def readable(t: torch.Tensor) -> bool:
    """Whether a tpu tensor can be read here: no math bits, and its buffer is of its own dtype."""
    return _C._host_readable(t)


def view(t: torch.Tensor, writable: bool = False) -> torch.Tensor | None:
    """A CPU view of a tpu tensor's value where its buffer is host memory (the CPU client, one
    device per buffer, no math bits), else None: reading it, or writing it (`writable`: the
    writes are its storage's new value), compiles nothing, whatever its geometry."""
    if not _on() or spmd.layer is not None or tensors.lazy is not None:
        return None
    if not _C._host_readable(t):
        return None
    client.host_read()  # a host read, like host_value's
    return _C._host_view(t, writable)


def run(op, args: tuple, kwargs: dict, device: int, mutated: Iterable = ()):
    """`op(*args, **kwargs)` with its CPU kernel on the tpu tensors' buffers: fresh results come
    back as tpu tensors, and a result that is an argument (an in-place op's self) as that
    argument. `mutated`: the tensors it writes in place (their storages' values become what it
    wrote)."""
    written = {id(t) for t in mutated if t is not None}
    views: dict[int, torch.Tensor] = {}  # id(view) -> the tpu tensor it reads
    # The written storages first: the other arguments' views then read their private copies.
    # (Plain recursive functions, not closures: a closure calling itself is a reference cycle
    # that would keep the call's tensors alive until the garbage collector runs.)
    for writable_pass in (True, False):
        args = tuple(_to_host(a, writable_pass, written, views) for a in args)
        kwargs = {k: _to_host(v, writable_pass, written, views) for k, v in kwargs.items()}
    with _C._HostThreads():  # one intra-op thread fewer: a compile keeps a core busy (host_tier.h)
        result = op(*args, **kwargs)  # (args keep the views, so their ids stay theirs)
    metrics.bump("host_tier_runs")
    storages = {_storage(v) for v in _leaves((args, kwargs))}
    return _to_device(result, device, views, storages)


def _to_host(x, writable_pass: bool, written: set, views: dict):
    """`x` with its tpu tensors read as CPU views (those in `written` in the writable pass, the
    others in the other), each view recorded in `views`."""
    if isinstance(x, torch.Tensor) and x.device.type == "tpu":
        if (id(x) in written) != writable_pass:
            return x
        view = _C._host_view(x, writable_pass)
        views[id(view)] = x
        return view
    if isinstance(x, (list, tuple)):
        return type(x)(_to_host(v, writable_pass, written, views) for v in x)
    if isinstance(x, torch.device) and x.type == "tpu":
        return _CPU
    return x


def _to_device(value, device: int, views: dict, storages: set):
    """A host-tier result as tpu tensors: an argument's view as that argument, a fresh CPU
    tensor wrapped (copied first if it is an input's memory, `storages`)."""
    if isinstance(value, (list, tuple)):
        return type(value)(_to_device(v, device, views, storages) for v in value)
    if not isinstance(value, torch.Tensor):
        return value
    if id(value) in views:
        return views[id(value)]  # the op handed back its argument (in place)
    if _storage(value) in storages:
        value = value.clone()  # a kernel that handed back an input's memory: the result owns its own
    return _C._wrap_host(value, device)


def _storage(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


def _leaves(tree) -> list[torch.Tensor]:
    if isinstance(tree, torch.Tensor):
        return [tree]
    if isinstance(tree, dict):
        tree = list(tree.values())
    if isinstance(tree, (list, tuple)):
        return [leaf for item in tree for leaf in _leaves(item)]
    return []
