"""Fused attention in plain XLA ops: what SDPA's fused path runs where Pallas only interprets.

On the CPU client a Pallas kernel runs in interpret mode, an emulator for testing kernels: each
new sequence length costs seconds of tracing and compiling. There the fused SDPA path runs this
one-op XLA attention instead (one executable per shape, as cheap to compile as a matmul). It
has the flash kernel's contract: (batch, heads, seq, head_dim) inputs, grouped key/value heads,
SDPA's top-left causal mask, float32 scores, and the logsumexp the backward reuses.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import torch
from jax import lax

from torch_tpu.kernels import flash
from torch_tpu.ops import geometry as geo
from torch_tpu.ops import growing, precision, tensors
from torch_tpu.platforms.cpu import host_tier
from torch_tpu.runtime import executable_cache


def _grouped(x: jax.Array, heads: int) -> jax.Array:
    """Key/value heads repeated for the query heads that share them."""
    group = heads // x.shape[1]
    return x if group == 1 else jnp.repeat(x, group, axis=1)


def _scores(q: jax.Array, k: jax.Array, causal: bool, sm_scale: float, key_len=None) -> jax.Array:
    k = _grouped(k, q.shape[1])
    s = jnp.einsum("bhqd,bhkd->bhqk", q, k, preferred_element_type=jnp.float32, precision=precision.matmul(q, k))
    s = s * jnp.float32(sm_scale)
    rows = lax.broadcasted_iota(jnp.int32, s.shape[-2:], 0)
    cols = lax.broadcasted_iota(jnp.int32, s.shape[-2:], 1)
    if causal:
        s = jnp.where(cols <= rows, s, -jnp.inf)
    if key_len is not None:  # keys padded past a traced length
        s = jnp.where(cols < key_len, s, -jnp.inf)
    return s


def _attend(q: jax.Array, k: jax.Array, v: jax.Array, causal: bool, sm_scale: float, key_len=None):
    s = _scores(q, k, causal, sm_scale, key_len)
    lse = jax.nn.logsumexp(s, axis=-1)
    p = jnp.exp(s - lse[..., None])
    v = _grouped(v, q.shape[1])
    out = jnp.einsum("bhqk,bhkd->bhqd", p, v.astype(jnp.float32), precision=precision.matmul(q, v))
    return out.astype(q.dtype), lse


def attention_forward(q, k, v, causal: bool, sm_scale: float):
    """(out, logsumexp) of softmax(q @ k.T * sm_scale [+ causal mask]) @ v."""
    return _attend(q, k, v, causal, sm_scale)


def attention_backward(dout, q, k, v, out, lse, causal: bool, sm_scale: float):
    """(dq, dk, dv) of attention_forward (recomputed: one fused executable)."""
    _, vjp = jax.vjp(lambda q, k, v: _attend(q, k, v, causal, sm_scale)[0], q, k, v)
    return vjp(dout.astype(q.dtype))


forward_op, backward_op = flash.define_attention_ops("xla_attention", attention_forward, attention_backward)


# ---- over a growing key/value (ops/growing.py) ----------------------------------------


@functools.partial(executable_cache.jit, static_argnames=("q_geom", "kv_shape", "causal", "sm_scale"))
def _bucketed_forward(q_buf, k_flat, v_flat, key_len, q_geom, kv_shape, causal, sm_scale):
    batch, heads, padded, head_dim = kv_shape
    key_len = key_len.astype(jnp.int32)
    q = geo.read(q_buf, q_geom)
    k, v = (growing.dim_padded(f, batch * heads, head_dim, key_len, padded).reshape(kv_shape) for f in (k_flat, v_flat))
    return _attend(q, k, v, causal, sm_scale, key_len)


def bucketed_forward(query, key, value, causal: bool, sm_scale: float) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The fused forward's (out, logsumexp) when key and value are bucketed growing tensors (a
    KV cache): one executable per key-length bucket, the padded keys masked. None otherwise."""
    if not growing.active() or query.dim() != 4 or key.shape != value.shape or key.dtype != value.dtype:
        return None
    if query.is_conj() or query.is_neg() or query.dtype != key.dtype or query.device != key.device:
        return None
    k_size, v_size = growing.row_major_length(key), growing.row_major_length(value)
    if k_size is None or v_size is None or k_size == key.numel() or k_size != v_size:
        return None
    batch, heads, key_len, head_dim = key.shape
    padded = k_size // (batch * heads * head_dim)
    if k_size != batch * heads * padded * head_dim:
        return None
    device = query.device.index
    q_geom, k_geom = tensors.known_geometry(query), tensors.known_geometry(key)
    kv_shape = (batch, heads, padded, head_dim)
    statics = (q_geom, kv_shape, causal, sm_scale)
    if host_tier.available():

        def arguments():
            kv_abs = tensors.abstract_buffer(k_geom, device)
            return tensors.abstract_buffer(q_geom, device), kv_abs, kv_abs, key_len, *statics

        held = (k_geom.buffer_dtype, k_geom.buffer_shape, statics, device)  # what the signature holds
        if not _bucketed_forward.ready_by(held, arguments):  # compiling: on the host
            return host_tier.run(forward_op, (query, key, value, causal, sm_scale), {}, device)
    growing.counted(("attention", q_geom, key.dtype, kv_shape, causal, sm_scale))
    bufs = (tensors.buffer_of(t) for t in (query, key, value))
    out, lse = _bucketed_forward(*bufs, key_len, *statics)
    return tensors.from_jax(out, device), tensors.from_jax(lse, device)
