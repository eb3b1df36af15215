"""Growing-length buckets for eager mode: a tensor that grows by appends (a KV cache, generated
token ids: `torch.cat([past, new], dim)`) runs its appends, attention over it and pointwise ops
on it with one executable per length bucket instead of one per length.

A bucketed tensor is an ordinary contiguous tpu tensor whose buffer is longer than its storage:
its elements first, in row-major order, then padding up to its capacity (zeros from an append,
whatever a pointwise op made of them; never read), which is the element count of its shape with
the growing dim at its bucket (the next power of two, at least MIN_BUCKET).
PyTorch sees the exact shape, strides and storage size; every other op reads it through its
geometry, as it reads a narrowed view. Inside a bucketed executable the exact length is a traced
integer: reads and writes of the buffer are index arithmetic on it, and attention masks the keys
past it, so the padding never reaches a result.

What is bucketed (counted in metrics as "length_bucketed_ops", first calls per bucket as
"length_bucket_compiles"):
- `cat` of two same-dtype contiguous tensors where the first is at least twice the second
  along `dim` (an append), or is already bucketed;
- the fused SDPA forward when its key and value are bucketed (kernels/attention_math.py);
- pointwise ops whose tensors are bucketed tensors of one shape (0-dim tensors aside), over the
  whole padded buffers (the dispatcher calls `flatten_pointwise` / `unflatten_result`);
- the results of nonzero and masked_select, computed at their count's bucket
  (ops/lowerings/indexing.py, `wrap_prefix`).
Not under lazy recording or SPMD placement, which keep exact shapes.
"""

from __future__ import annotations

import functools
import math

import jax.numpy as jnp
import torch
from jax import lax

from torch_tpu import _C, metrics
from torch_tpu.ops import geometry as geo
from torch_tpu.ops import registry, spmd, tensors
from torch_tpu.platforms.cpu import host_tier
from torch_tpu.runtime import executable_cache

MIN_BUCKET = 16
# A bucketed output never exceeds this many bytes: larger appends keep exact shapes.
MAX_BYTES = 1 << 28

_seen: set = set()  # bucketed executables' static keys, for the compile counter


def bucket(n: int) -> int:
    """The padded length of a growing dim of length n."""
    return max(MIN_BUCKET, 1 << (n - 1).bit_length())


def row_major_length(t) -> int | None:
    """The length of the buffer behind `t` if `t` is a plain tpu tensor laid out row-major from
    the start of it (exactly, or bucketed), else None. Reads only what the buffer holds."""
    if not isinstance(t, torch.Tensor) or t.device.type != "tpu" or t.dim() == 0:
        return None
    if t.is_conj() or t.is_neg() or t.storage_offset() != 0 or not t.is_contiguous() or t.numel() == 0:
        return None
    if _C._buffer_offset(t) != 0:
        return None
    dtype, shape = _C._buffer_spec(t)
    return math.prod(shape) if dtype == t.dtype else None


def contiguous_buffer(t) -> object | None:
    """The flat buffer behind `t` if `t` is a plain tpu tensor laid out row-major from the start
    of it (exactly, or bucketed), else None."""
    if row_major_length(t) is None:
        return None
    buf = tensors.buffer_of(t)
    return buf if buf.ndim == 1 else None


def active() -> bool:
    return tensors.lazy is None and spmd.layer is None


def _split(shape: tuple[int, ...], dim: int) -> tuple[int, int]:
    """(elements before dim, elements after dim) of a row-major shape."""
    return math.prod(shape[:dim]), math.prod(shape[dim + 1 :])


def dim_padded(flat, outer: int, inner: int, length, padded: int):
    """The (outer, padded, inner) array of a (outer, length, inner) tensor laid out row-major at
    the start of `flat` (length traced), zeros past length."""
    shape = (outer, padded, inner)
    o, p, n = (lax.broadcasted_iota(jnp.int32, shape, d) for d in range(3))
    valid = p < length
    values = jnp.take(flat, jnp.where(valid, (o * length + p) * inner + n, 0), mode="clip")
    return jnp.where(valid, values, jnp.zeros((), flat.dtype))


def _tail_padded(x, length):
    """The flat buffer of x[:, :length, :] (x is (outer, padded, inner)) in row-major order,
    then zeros to x's size."""
    outer, padded, inner = x.shape
    i = lax.iota(jnp.int32, outer * padded * inner)
    valid = i < outer * length * inner
    o = jnp.where(valid, i // (length * inner), 0)
    p = jnp.where(valid, (i // inner) % length, 0)
    values = x[o, p, i % inner]
    return jnp.where(valid, values, jnp.zeros((), x.dtype))


def counted(key: tuple) -> None:
    """Counts a bucketed call, and its bucket's first call (`key`: the executable's static part)."""
    metrics.bump("length_bucketed_ops")
    metrics.bump("executions")
    if key not in _seen:
        _seen.add(key)
        metrics.bump("length_bucket_compiles")


# ---- cat ----------------------------------------------------------------------------


@functools.partial(executable_cache.jit, static_argnames=("outer", "inner", "a_padded", "b_geom", "out_padded"))
def _append(a_flat, b_buf, a_len, outer, inner, a_padded, b_geom, out_padded):
    a_len = a_len.astype(jnp.int32)  # index arithmetic in int32 (capacities stay below 2**31)
    a = dim_padded(a_flat, outer, inner, a_len, a_padded)
    b = geo.read(b_buf, b_geom).reshape(outer, -1, inner)
    x = jnp.pad(a, ((0, 0), (0, out_padded - a_padded), (0, 0)))
    x = lax.dynamic_update_slice(x, b, (jnp.int32(0), a_len, jnp.int32(0)))
    return _tail_padded(x, a_len + b.shape[1])


def _append_plan(tensors_, dim) -> tuple | None:
    """(a, b, dim, statics) of `torch.cat([a, b], dim)` when the call is a bucketed append, else None.
    Decided by what the call's signature holds: its tensors' shapes, dtypes and buffers."""
    if len(tensors_) != 2 or not active():
        return None
    a, b = tensors_
    if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)) or a.dtype != b.dtype:
        return None
    if a.dim() != b.dim() or a.dim() == 0 or a.device != b.device or b.device.type != "tpu":
        return None
    dim = dim % a.dim()
    if a.shape[:dim] != b.shape[:dim] or a.shape[dim + 1 :] != b.shape[dim + 1 :] or b.numel() == 0:
        return None
    if b.is_conj() or b.is_neg():
        return None
    a_size = row_major_length(a)
    if a_size is None:
        return None
    a_len, b_len = a.shape[dim], b.shape[dim]
    if a_size == a.numel() and a_len < 2 * b_len:  # neither bucketed nor an append
        return None
    outer, inner = _split(tuple(a.shape), dim)
    a_padded = a_size // (outer * inner)
    out_padded = bucket(a_len + b_len)
    if a_size != outer * a_padded * inner or a_padded > out_padded:
        return None
    if outer * out_padded * inner * a.element_size() > MAX_BYTES:
        return None
    return a, b, dim, (outer, inner, a_padded, tensors.known_geometry(b), out_padded)


def is_append(tensors_, dim=0) -> bool:
    """Whether `torch.cat(tensors_, dim)` runs as a bucketed append."""
    return _append_plan(tensors_, dim) is not None


def cat(tensors_, dim=0) -> torch.Tensor | None:
    """`torch.cat([a, b], dim)` as a bucketed append, or None when the call is not one."""
    plan = _append_plan(tensors_, dim)
    if plan is None:
        return None
    a, b, dim, statics = plan
    outer, inner, _, _, out_padded = statics
    device = a.device.index
    a_len = a.shape[dim]
    out_len = a_len + b.shape[dim]
    if host_tier.available():
        a_geom, b_geom = tensors.known_geometry(a), statics[3]

        def arguments():
            return tensors.abstract_buffer(a_geom, device), tensors.abstract_buffer(b_geom, device), a_len, *statics

        held = (a_geom.buffer_dtype, a_geom.buffer_shape, statics, device)  # what the signature holds
        if not _append.ready_by(held, arguments):  # compiling: the append runs on the host
            return _append_on_host(a, b, dim, outer * out_padded * inner)
    counted(("cat", a.dtype, *statics))
    flat = _append(tensors.buffer_of(a), tensors.buffer_of(b), a_len, *statics)
    sizes = list(a.shape)
    sizes[dim] = out_len
    return wrap_prefix(flat, sizes, a.dtype, device)


def wrap_prefix(flat, sizes: list[int], dtype: torch.dtype, device: int) -> torch.Tensor:
    """A contiguous tpu tensor of `sizes` whose elements are the first of flat buffer `flat`,
    which may be longer (a bucketed tensor)."""
    out = _C._wrap(flat, sizes, dtype, device)
    _C._set_buffer(out, flat, dtype, flat.size)  # the buffer may be longer than the storage
    return out


APPEND = registry.FrontPath(is_append, cat)


def _append_on_host(a: torch.Tensor, b: torch.Tensor, dim: int, capacity: int) -> torch.Tensor:
    """`torch.cat([a, b], dim)` on the host tier, as a bucketed tensor of buffer length `capacity`:
    CPU's cat writes straight into the padded buffer."""
    host_a, host_b = _C._host_view(a), _C._host_view(b)
    sizes = list(a.shape)
    sizes[dim] += b.shape[dim]
    padded = host_a.new_zeros(capacity)
    torch.cat([host_a, host_b], dim, out=padded[: math.prod(sizes)].view(sizes))
    metrics.bump("host_tier_runs")
    out = _C._wrap_host(host_a.new_empty(sizes), a.device.index)
    _C._set_host(out, padded)  # the buffer is longer than the storage
    return out


# ---- pointwise ops ----------------------------------------------------------------------


def is_pointwise(op) -> bool:
    """Ops that map elements to elements with no shape rule of their own (torch.Tag.pointwise),
    not random ones: on bucketed tensors they run over the whole padded buffer."""
    tags = op.tags
    return torch.Tag.pointwise in tags and torch.Tag.nondeterministic_seeded not in tags


class Flattened:
    """A pointwise call's arguments with each bucketed tensor replaced by a flat tensor over its
    whole padded buffer (`sizes`: the tensors' exact shape)."""

    __slots__ = ("args", "capacity", "kwargs", "self_flat", "self_tensor", "sizes")

    def __init__(self, args, kwargs, sizes, capacity, self_tensor, self_flat):
        self.args, self.kwargs = args, kwargs
        self.sizes, self.capacity = sizes, capacity
        self.self_tensor, self.self_flat = self_tensor, self_flat


def _bucketed_buffers(args: tuple, kwargs: dict) -> tuple | None:
    """(shape, [(position, buffer)]) of a call whose dimensioned tensors are bucketed tensors of one
    shape and capacity (0-dim tensors and numbers aside), else None. Cheap for other calls: the
    first tpu tensor that is its whole buffer ends the search."""
    if not active() or "out" in kwargs:
        return None
    if kwargs.get("memory_format") not in (None, torch.preserve_format, torch.contiguous_format):
        return None  # a layout of the exact shape (channels_last): not one of the flat buffer
    sizes = capacity = None
    found = []
    for i, a in enumerate(args):
        if not isinstance(a, torch.Tensor) or a.dim() == 0:
            continue
        info = _C._arg_info(a)
        if info is None or info[2] is not None:  # not tpu, or its whole buffer
            return None
        buf = contiguous_buffer(a)
        # Bucketed: the tensor is its whole storage, and the buffer is longer. (A prefix view of a
        # larger tensor also starts its buffer, but a pointwise op must not touch the rest.)
        if buf is None or buf.size <= a.numel() or a.untyped_storage().nbytes() != a.numel() * a.element_size():
            return None
        if sizes is None:
            sizes, capacity = tuple(a.shape), buf.size
        elif tuple(a.shape) != sizes or buf.size != capacity:
            return None
        found.append((i, buf))
    if sizes is None or any(isinstance(v, torch.Tensor) and v.dim() for v in kwargs.values()):
        return None
    return sizes, found


def is_bucketed_call(args: tuple, kwargs: dict) -> bool:
    return _bucketed_buffers(args, kwargs) is not None


def flatten_pointwise(args: tuple, kwargs: dict, inplace: bool) -> Flattened | None:
    """The call with each bucketed tensor replaced by a flat tensor over its whole padded buffer
    (see `_bucketed_buffers`), or None when it is not such a call."""
    found = _bucketed_buffers(args, kwargs)
    if found is None:
        return None
    sizes, buffers = found
    if inplace and buffers[0][0] != 0:  # in place into a tensor that is not bucketed
        return None
    flat_args = list(args)
    for i, buf in buffers:
        flat_args[i] = _C._wrap(buf, [buf.size], args[i].dtype, args[i].device.index)
    self_tensor, self_flat = (args[0], flat_args[0]) if inplace else (None, None)
    return Flattened(tuple(flat_args), kwargs, sizes, buffers[0][1].size, self_tensor, self_flat)


def unflatten_result(result, call: Flattened):
    """The flat call's result as the caller's: a fresh flat output becomes a tensor of the exact
    shape over its padded buffer; an in-place op's new buffer goes to the caller's tensor."""
    metrics.bump("length_bucketed_ops")
    if call.self_tensor is not None:
        t = call.self_tensor
        buf = tensors.buffer_of(call.self_flat)
        _C._set_buffer(t, buf, t.dtype, buf.size)
        return t
    buf = tensors.buffer_of(result)
    out = _C._wrap(buf, list(call.sizes), result.dtype, result.device.index)
    _C._set_buffer(out, buf, result.dtype, buf.size)
    return out
