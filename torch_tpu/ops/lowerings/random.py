"""Random ops, drawn from jax's threefry PRNG with a key from the op's tpu
generator (`rng=`, see the lowering contract): same seed, same numbers; the
numbers differ from CPU's."""

from __future__ import annotations

import math
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import torch
from jax import lax

from torch_tpu.ops import random_fills
from torch_tpu.ops.checks import PREDICATES, Failure, flags
from torch_tpu.ops.dtypes import opmath, to_numpy_dtype, type_name
from torch_tpu.ops.promotion import cast, float_dtype, is_integral, require, result_dtype
from torch_tpu.ops.registry import Check, aten, lower
from torch_tpu.ops.tensors import to_jax


def _value_check(predicate: str, message: str, position: int) -> Check:
    """CPU's RuntimeError(message) when `PREDICATES[predicate]` holds for the float tensor argument at
    `position` (probabilities, a std): eager reads one flag (a host sync), graphs return it."""

    def host(*args, **kwargs):
        t = args[position] if len(args) > position else None
        if isinstance(t, torch.Tensor) and t.device.type == "tpu" and t.is_floating_point() and t.numel():
            if flags((to_jax(t),), (predicate,))[0]:
                raise RuntimeError(message)

    def graph(*args, **kwargs):
        a = args[position] if len(args) > position else None
        if a is None or not hasattr(a, "dtype") or not jnp.issubdtype(a.dtype, jnp.floating) or not jnp.size(a):
            return []
        return [Failure(PREDICATES[predicate](a), jnp.int64(0), RuntimeError, message)]

    return Check(host, graph)


_P_IN_UNIT = "Expected p_in >= 0 && p_in <= 1 to be true, but got false."
_bernoulli_check = _value_check("outside_unit", _P_IN_UNIT, 1)
_std_check = _value_check("negative", "normal expects all elements of std >= 0.0", 1)


def _float_p_in_unit(p) -> None:
    if isinstance(p, float) and not 0 <= p <= 1:
        raise RuntimeError(f"bernoulli_ expects p to be in [0, 1], but got p={p}")


def _from_below_to(low: int, to: int) -> None:
    if low >= to:
        raise RuntimeError(f"random_ expects 'from' to be less than 'to', but got from={low} >= to={to}")


# CPU's names of the dtypes in its random_ bounds messages.
_CPU_NAMES = {
    torch.bool: "bool",
    torch.int8: "signed char",
    torch.uint8: "unsigned char",
    torch.int16: "short int",
    torch.uint16: "short unsigned int",
    torch.int32: "int",
    torch.uint32: "unsigned int",
    torch.int64: "long int",
    torch.uint64: "long unsigned int",
    torch.float16: "c10::Half",
    torch.bfloat16: "c10::BFloat16",
    torch.float32: "float",
    torch.float64: "double",
}


def _check_from_to_in_range(low: int, to_inc: int, dtype: torch.dtype) -> None:
    """CPU's check_from_to_in_range: an error outside the dtype's range, a warning outside the
    integers a float dtype holds exactly."""
    name = _CPU_NAMES.get(dtype, str(dtype))
    if dtype.is_complex:
        raise RuntimeError("check_random_bounds handles only integral, floating-point and boolean types")
    if dtype.is_floating_point:
        lowest, highest = torch.finfo(dtype).min, torch.finfo(dtype).max
    elif dtype == torch.uint64:
        lowest, highest = 0, 2**63 - 1
    elif dtype == torch.bool:
        lowest, highest = 0, 1
    else:
        lowest, highest = torch.iinfo(dtype).min, torch.iinfo(dtype).max
    for value, what in ((low, "from"), (to_inc, "to - 1")):
        if not lowest <= value <= highest:
            raise RuntimeError(f"{what} is out of bounds for {name}")
    if not dtype.is_floating_point:
        return
    digits = jnp.finfo(to_numpy_dtype(dtype)).nmant + 1  # the integers the dtype holds exactly: up to 2**digits
    for value, what in ((low, "from"), (to_inc, "to - 1")):
        if not -(1 << digits) <= value <= 1 << digits:
            warnings.warn(
                f"{what} is out of bounds [-(2^{digits}), 2^{digits}]. Due to precision limitations {name} can "
                "support discrete uniform distribution only within this range. This warning will become an error "
                "in version 1.7 release, please fix the code in advance",
                stacklevel=2,
            )


def _uniform_check(self, low=0.0, high=1.0, **_):
    """CPU's bounds checks of uniform_ (a complex tensor's parts are of its real dtype)."""
    dtype = self.dtype.to_real() if self.is_complex() else self.dtype
    if not dtype.is_floating_point:
        return  # the lowering raises CPU's NotImplementedError
    info, name = torch.finfo(dtype), _CPU_NAMES[dtype]
    for value, what in ((low, "from"), (high, "to")):
        if not info.min <= value <= info.max:
            raise RuntimeError(f"{what} is out of bounds for {name}")
    if low > high:
        raise RuntimeError(f"uniform_ expects to return a [from, to) range, but found from={low:g} > to={high:g}")
    if high - low > info.max:
        raise RuntimeError(
            f"uniform_ expects to-from <= std::numeric_limits<{type_name(dtype)}>::max(), but found to={high:g} "
            f"and from={low:g} which result in to-from to exceed the limit"
        )


def _random_to_check(self, to, **_):
    _from_below_to(0, to)
    _check_from_to_in_range(0, to - 1, self.dtype)


def _random_from_check(self, low, to=None, **_):
    if self.is_complex() and to is None:
        raise RuntimeError("random_from_to_impl handles only integral, floating-point and boolean types")
    if to is not None:
        _from_below_to(low, to)
        _check_from_to_in_range(low, to - 1, self.dtype)
    elif low != -(2**63):
        to_inc = _upper_bound(to_numpy_dtype(self.dtype))
        _check_from_to_in_range(low, to_inc, self.dtype)
        if low > to_inc:
            raise RuntimeError(
                "random_ expects 'from' casted to dtype to be less than or equal to 'to_inc' casted to dtype, "
                f"but got from={low} > to_inc={to_inc}"
            )


def _uniform(rng, shape, dtype) -> jnp.ndarray:
    """Uniform floats in [0, 1) of a float dtype (reduced precision draws in float32)."""
    return jax.random.uniform(rng, shape, opmath(dtype))


def _fill(op, check=None, complex_parts=None):
    """`@lower(op, random=True, check=check)` for an in-place fill that reads only self's shape and
    dtype: small contiguous tensors draw through a length bucket, complex ones through their
    real view with `complex_parts` (ops/random_fills.py)."""

    def register(fn):
        return lower(op, random=True, check=check, front=random_fills.bucketed(fn, op, complex_parts))(fn)

    return register


def _uniform_parts(parts, low=0.0, high=1.0, *, generator=None):
    """CPU's complex uniform_: the real and the imaginary part each uniform in [low, high)."""
    parts.uniform_(low, high, generator=generator)


def _normal_parts(parts, mean=0.0, std=1.0, *, generator=None):
    """CPU's complex normal_: each part normal with mean `mean` and half the variance."""
    parts.normal_(mean, std / math.sqrt(2), generator=generator)


# ---- in-place distributions -------------------------------------------------


@_fill(aten.uniform_.default, check=_uniform_check, complex_parts=_uniform_parts)
def uniform_(self, low=0.0, high=1.0, *, rng):
    require("check_uniform_bounds", self.dtype, bool_ok=False, int_ok=False)
    if low > high:
        raise RuntimeError(f"uniform_ expects to return a [from, to) range, but found from={low} > to={high}")
    if jnp.issubdtype(self.dtype, jnp.complexfloating):
        # As CPU: the real and the imaginary part each uniform in [low, high).
        parts = jax.random.uniform(rng, (*self.shape, 2), jnp.finfo(self.dtype).dtype, low, high)
        return lax.complex(parts[..., 0], parts[..., 1])
    if low == 0.0 and high == 1.0:
        values = jax.random.uniform(rng, self.shape, opmath(self.dtype))
    else:
        values = jax.random.uniform(rng, self.shape, opmath(self.dtype), low, high)
    if values.dtype == self.dtype:
        return values
    # Reduced precision draws in float32 and rounds, as CPU does (drawn in bfloat16, 10,000 values
    # in [-100, 100) take 256 distinct values; CPU's about 1,400); a value rounded up to `high`
    # becomes the one below it.
    values = values.astype(self.dtype)
    top = jnp.nextafter(jnp.asarray(high, self.dtype), jnp.asarray(low, self.dtype))
    return jnp.where(values >= jnp.asarray(high, self.dtype), top, values) if low < high else values


@_fill(aten.normal_.default, complex_parts=_normal_parts)
def normal_(self, mean=0.0, std=1.0, *, rng):
    return mean + std * jax.random.normal(rng, self.shape, opmath(self.dtype))


@lower(aten.normal.float_Tensor, aten.normal.Tensor_Tensor, random=True, check=_std_check)
def normal_std_tensor(mean, std, *, rng):
    return normal(mean, std, rng=rng)


@lower(aten.normal.Tensor_float, random=True)
def normal(mean, std=1.0, *, rng):
    dtype = opmath(float_dtype(result_dtype(mean, std)))
    shape = jnp.broadcast_shapes(jnp.shape(mean), jnp.shape(std))
    return cast(mean, dtype) + cast(std, dtype) * jax.random.normal(rng, shape, dtype)


@_fill(aten.log_normal_.default)
def log_normal_(self, mean=1.0, std=2.0, *, rng):
    return jnp.exp(mean + std * jax.random.normal(rng, self.shape, opmath(self.dtype)))


@_fill(aten.exponential_.default)
def exponential_(self, lambd=1.0, *, rng):
    return -jnp.log1p(-_uniform(rng, self.shape, self.dtype)) / lambd


@_fill(aten.geometric_.default)
def geometric_(self, p, *, rng):
    """The number of Bernoulli(p) trials up to the first success: ceil(log(u) / log(1 - p))."""
    u = 1 - jax.random.uniform(rng, self.shape, np.float64)  # in (0, 1]
    return jnp.ceil(jnp.log(u) / math.log1p(-p))


@_fill(aten.cauchy_.default)
def cauchy_(self, median=0.0, sigma=1.0, *, rng):
    u = _uniform(rng, self.shape, float_dtype(self.dtype))
    return median + sigma * jnp.tan(math.pi * (u - 0.5))


# ---- bernoulli --------------------------------------------------------------


def _bernoulli(rng, shape, p) -> jnp.ndarray:
    """True with probability p (a float or an array broadcast to shape)."""
    dtype = np.float32 if isinstance(p, float) else opmath(float_dtype(p.dtype))  # f64 is slow on TPU
    return jax.random.uniform(rng, shape, dtype) < cast(p, dtype)


@lower(aten.bernoulli_.float, aten.bernoulli_.Tensor, random=True, check=_bernoulli_check)
def bernoulli_(self, p=0.5, *, rng):
    _float_p_in_unit(p)
    return _bernoulli(rng, self.shape, p)


@lower(aten.bernoulli.default, random=True, check=_value_check("outside_unit", _P_IN_UNIT, 0))
def bernoulli(self, *, rng):
    require("bernoulli_tensor_cpu_p_", self.dtype, bool_ok=False, int_ok=False)
    return _bernoulli(rng, self.shape, self)


@lower(aten.bernoulli.p, random=True)
def bernoulli_p(self, p, *, rng):
    _float_p_in_unit(p)
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


@_fill(aten.random_.default)
def random_(self, *, rng):
    return _random_integers(rng, self.shape, 0, _upper_bound(self.dtype) + 1)


@_fill(aten.random_.to, check=_random_to_check)
def random_to(self, to, *, rng):
    _from_below_to(0, to)
    return _random_integers(rng, self.shape, 0, to)


@_fill(getattr(aten.random_, "from"), check=_random_from_check)
def random_from(self, low, to=None, *, rng):
    high = _upper_bound(self.dtype) + 1 if to is None else to
    _from_below_to(low, high)
    return _random_integers(rng, self.shape, low, high - low)


@lower(aten.randperm.default, aten.randperm.generator, random=True)
def randperm(n, *, dtype=None, layout=None, device=None, pin_memory=None, rng):
    out = np.dtype(np.int64) if dtype is None else to_numpy_dtype(dtype)
    require("randperm", out, bool_ok=False)
    return jax.random.permutation(rng, n).astype(out)


_BAD_PROBABILITY = "probability tensor contains either `inf`, `nan` or element < 0"


def _multinomial_host_check(self, num_samples, replacement=False, *, generator=None, out=None):
    # CPU's argument checks, in its order, before the data checks (multinomial_out)
    if not 0 < self.dim() <= 2:
        raise RuntimeError("prob_dist must be 1 or 2 dim")
    if not self.is_floating_point():
        raise RuntimeError(f"multinomial only supports floating-point dtypes for input, got: {type_name(self.dtype)}")
    if out is not None and out.dtype != torch.int64:
        raise RuntimeError(f"multinomial expects Long tensor out, got: {type_name(out.dtype)}")
    if num_samples <= 0:
        raise RuntimeError("cannot sample n_sample <= 0 samples")
    if not replacement and num_samples > self.shape[-1]:
        raise RuntimeError("cannot sample n_sample > prob_dist.size(-1) samples without replacement")
    if self.shape[-1] > 2**24:
        raise RuntimeError("number of categories cannot exceed 2^24")
    if self.device.type == "tpu" and self.numel():
        bad, zero = flags((to_jax(self), to_jax(self)), ("not_finite_nonnegative", "zero_row"))
        if bad:
            raise RuntimeError(_BAD_PROBABILITY)
        if zero:
            raise RuntimeError("invalid multinomial distribution (sum of probabilities <= 0)")


def _multinomial_graph_check(self, *args, **kwargs) -> list[Failure]:
    if not jnp.issubdtype(self.dtype, jnp.floating) or not self.size:
        return []
    return [
        Failure(PREDICATES["not_finite_nonnegative"](self), jnp.int64(0), RuntimeError, _BAD_PROBABILITY),
        Failure(
            PREDICATES["zero_row"](self),
            jnp.int64(0),
            RuntimeError,
            "invalid multinomial distribution (sum of probabilities <= 0)",
        ),
    ]


@lower(aten.multinomial.default, random=True, check=Check(_multinomial_host_check, _multinomial_graph_check))
def multinomial(self, num_samples, replacement=False, *, rng):
    """Categorical draws over the last dim; without replacement, the Gumbel top-k trick."""
    if is_integral(self.dtype):
        raise RuntimeError(f"multinomial only supports floating-point dtypes for input, got: {type_name(self.dtype)}")
    if not replacement and num_samples > self.shape[-1]:
        raise RuntimeError("cannot sample n_sample > prob_dist.size(-1) samples without replacement")
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
