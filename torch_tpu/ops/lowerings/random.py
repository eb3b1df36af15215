"""Random ops, drawn from jax's threefry PRNG with a key from the op's tpu
generator (`rng=`, see the lowering contract): same seed, same numbers; the
numbers differ from CPU's."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from torch_tpu.ops.dtypes import opmath, to_numpy_dtype, type_name
from torch_tpu.ops.promotion import cast, float_dtype, is_integral, require, result_dtype
from torch_tpu.ops.registry import aten, lower


def _uniform(rng, shape, dtype) -> jnp.ndarray:
    """Uniform floats in [0, 1) of a float dtype (reduced precision draws in float32)."""
    return jax.random.uniform(rng, shape, opmath(dtype))


# ---- in-place distributions -------------------------------------------------


@lower(aten.uniform_.default, random=True)
def uniform_(self, low=0.0, high=1.0, *, rng):
    require("check_uniform_bounds", self.dtype, bool_ok=False, int_ok=False)
    if low > high:
        raise RuntimeError(f"uniform_ expects to return a [from, to) range, but found from={low} > to={high}")
    if jnp.issubdtype(self.dtype, jnp.complexfloating):
        # As CPU: the real and the imaginary part each uniform in [low, high).
        parts = jax.random.uniform(rng, (*self.shape, 2), jnp.finfo(self.dtype).dtype, low, high)
        return lax.complex(parts[..., 0], parts[..., 1])
    if low == 0.0 and high == 1.0:
        return jax.random.uniform(rng, self.shape, self.dtype)
    return jax.random.uniform(rng, self.shape, self.dtype, low, high)


@lower(aten.normal_.default, random=True)
def normal_(self, mean=0.0, std=1.0, *, rng):
    return mean + std * jax.random.normal(rng, self.shape, opmath(self.dtype))


@lower(aten.normal.Tensor_float, aten.normal.float_Tensor, aten.normal.Tensor_Tensor, random=True)
def normal(mean, std=1.0, *, rng):
    dtype = opmath(float_dtype(result_dtype(mean, std)))
    shape = jnp.broadcast_shapes(jnp.shape(mean), jnp.shape(std))
    return cast(mean, dtype) + cast(std, dtype) * jax.random.normal(rng, shape, dtype)


@lower(aten.log_normal_.default, random=True)
def log_normal_(self, mean=1.0, std=2.0, *, rng):
    return jnp.exp(mean + std * jax.random.normal(rng, self.shape, opmath(self.dtype)))


@lower(aten.exponential_.default, random=True)
def exponential_(self, lambd=1.0, *, rng):
    return -jnp.log1p(-_uniform(rng, self.shape, self.dtype)) / lambd


@lower(aten.geometric_.default, random=True)
def geometric_(self, p, *, rng):
    """The number of Bernoulli(p) trials up to the first success: ceil(log(u) / log(1 - p))."""
    u = 1 - jax.random.uniform(rng, self.shape, np.float64)  # in (0, 1]
    return jnp.ceil(jnp.log(u) / math.log1p(-p))


@lower(aten.cauchy_.default, random=True)
def cauchy_(self, median=0.0, sigma=1.0, *, rng):
    u = _uniform(rng, self.shape, float_dtype(self.dtype))
    return median + sigma * jnp.tan(math.pi * (u - 0.5))


# ---- bernoulli --------------------------------------------------------------


def _bernoulli(rng, shape, p) -> jnp.ndarray:
    """True with probability p (a float or an array broadcast to shape)."""
    dtype = np.float32 if isinstance(p, float) else opmath(float_dtype(p.dtype))  # f64 is slow on TPU
    return jax.random.uniform(rng, shape, dtype) < cast(p, dtype)


@lower(aten.bernoulli_.float, aten.bernoulli_.Tensor, random=True)
def bernoulli_(self, p=0.5, *, rng):
    return _bernoulli(rng, self.shape, p)


@lower(aten.bernoulli.default, random=True)
def bernoulli(self, *, rng):
    require("bernoulli_tensor_cpu_p_", self.dtype, bool_ok=False, int_ok=False)
    return _bernoulli(rng, self.shape, self)


@lower(aten.bernoulli.p, random=True)
def bernoulli_p(self, p, *, rng):
    return _bernoulli(rng, self.shape, p)


# ---- random integers --------------------------------------------------------


def _random_integers(rng, shape, low: int, span: int) -> jnp.ndarray:
    """low + (64 random bits mod span), as int64 (CPU's random_from_to)."""
    bits = jax.random.bits(rng, shape, np.uint64)
    if span < 2**64:
        bits = lax.rem(bits, jnp.full(shape, span, np.uint64))
    return lax.bitcast_convert_type(bits + np.uint64(low % 2**64), np.int64)


def _upper_bound(dtype: np.dtype) -> int:
    """The largest value random_ draws without `to`: 2**digits for floats, max for integers."""
    if dtype == np.bool_:
        return 1
    if is_integral(dtype):
        return int(jnp.iinfo(dtype).max)
    return min(2 ** jnp.finfo(dtype).nmant * 2, 2**63 - 1)


@lower(aten.random_.default, random=True)
def random_(self, *, rng):
    return _random_integers(rng, self.shape, 0, _upper_bound(self.dtype) + 1)


@lower(aten.random_.to, random=True)
def random_to(self, to, *, rng):
    return _random_integers(rng, self.shape, 0, to)


@lower(getattr(aten.random_, "from"), random=True)
def random_from(self, low, to=None, *, rng):
    high = _upper_bound(self.dtype) + 1 if to is None else to
    return _random_integers(rng, self.shape, low, high - low)


@lower(aten.randperm.default, aten.randperm.generator, random=True)
def randperm(n, *, dtype=None, layout=None, device=None, pin_memory=None, rng):
    out = np.dtype(np.int64) if dtype is None else to_numpy_dtype(dtype)
    require("randperm", out, bool_ok=False)
    return jax.random.permutation(rng, n).astype(out)


@lower(aten.multinomial.default, random=True)
def multinomial(self, num_samples, replacement=False, *, rng):
    """Categorical draws over the last dim; without replacement, the Gumbel top-k trick."""
    if is_integral(self.dtype):
        raise RuntimeError(f"multinomial only supports floating-point dtypes for input, got: {type_name(self.dtype)}")
    logits = jnp.log(cast(self, opmath(self.dtype)))
    if replacement:
        batch = logits.shape[:-1]
        samples = jax.random.categorical(rng, logits, axis=-1, shape=(num_samples, *batch))
        return jnp.moveaxis(samples, 0, -1)
    _, indices = lax.top_k(logits + jax.random.gumbel(rng, logits.shape, logits.dtype), num_samples)
    return indices


# ---- dropout ----------------------------------------------------------------


@lower(aten.native_dropout.default, random=True)
def native_dropout(input, p, train, *, rng):
    """Keeps each element with probability 1 - p and scales kept ones by 1 / (1 - p)."""
    if train is False:
        return input, jnp.ones(input.shape, bool)
    keep = jax.random.uniform(rng, input.shape, np.float32) < 1 - p
    scale = 0.0 if p == 1 else 1 / (1 - p)
    x = cast(input, opmath(input.dtype))
    return x * keep * scale, keep


@lower(aten.native_dropout_backward.default)
def native_dropout_backward(grad_output, mask, scale):
    g = cast(grad_output, opmath(grad_output.dtype))
    return g * mask * scale
