"""Fused attention in plain XLA ops: what SDPA's fused path runs where Pallas only interprets.

On the CPU client a Pallas kernel runs in interpret mode, an emulator for testing kernels: each
new sequence length costs seconds of tracing and compiling. There the fused SDPA path runs this
one-op XLA attention instead (one executable per shape, as cheap to compile as a matmul). It
has the flash kernel's contract: (batch, heads, seq, head_dim) inputs, grouped key/value heads,
SDPA's top-left causal mask, float32 scores, and the logsumexp the backward reuses.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from torch_tpu.kernels import flash
from torch_tpu.ops import precision


def _grouped(x: jax.Array, heads: int) -> jax.Array:
    """Key/value heads repeated for the query heads that share them."""
    group = heads // x.shape[1]
    return x if group == 1 else jnp.repeat(x, group, axis=1)


def _scores(q: jax.Array, k: jax.Array, causal: bool, sm_scale: float) -> jax.Array:
    k = _grouped(k, q.shape[1])
    s = jnp.einsum("bhqd,bhkd->bhqk", q, k, preferred_element_type=jnp.float32, precision=precision.matmul(q, k))
    s = s * jnp.float32(sm_scale)
    if causal:
        rows = lax.broadcasted_iota(jnp.int32, s.shape[-2:], 0)
        cols = lax.broadcasted_iota(jnp.int32, s.shape[-2:], 1)
        s = jnp.where(cols <= rows, s, -jnp.inf)
    return s


def _attend(q: jax.Array, k: jax.Array, v: jax.Array, causal: bool, sm_scale: float):
    s = _scores(q, k, causal, sm_scale)
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
