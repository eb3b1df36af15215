"""Data-dependent checks: the errors CPU raises (an index out of range) that jax cannot.

Each check has two forms, declared together as a `registry.Check` on the op's `lower(...)` line:
the host form runs before the eager kernel (one host sync), and the graph form computes
`Failure`s (a traced error predicate each) inside a compiled graph, which compile/graph.py
returns as extra outputs of the executable and reads once after it runs."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import torch
from torch._prims_common import is_non_overlapping_and_dense_or_false as is_non_overlapping_and_dense

from torch_tpu import metrics
from torch_tpu.ops import deferred_checks
from torch_tpu.ops.dtypes import type_name
from torch_tpu.ops.registry import Check, SignatureCheck
from torch_tpu.ops.tensors import to_jax
from torch_tpu.platforms.cpu import host_tier
from torch_tpu.runtime import executable_cache
from torch_tpu.runtime.global_arrays import host_value


def jax_value_checks_on() -> bool:
    """Whether jax's nan/inf checks (jax_debug_nans, jax_debug_infs) are on. jax applies them in
    jax.jit's call, so an eager op then runs through its jax.jit function, never through a
    cached executable directly nor on the CPU client's host tier."""
    return bool(jax.config.jax_debug_nans or jax.config.jax_debug_infs)


@executable_cache.jit
def _minmax(arrays):
    return jnp.stack([jnp.stack([jnp.min(a).astype(jnp.int64), jnp.max(a).astype(jnp.int64)]) for a in arrays])


def to_host(array) -> np.ndarray:
    metrics.bump("host_transfers")
    return host_value(array)


def index_bounds(index: torch.Tensor) -> tuple[int, int]:
    """(min, max) of a non-empty integer tpu tensor: one host sync."""
    view = host_tier.view(index)
    if view is not None:  # host memory: read it where it is
        return int(view.min()), int(view.max())
    metrics.bump("executions")
    lo, hi = to_host(_minmax((to_jax(index),)))[0]
    return int(lo), int(hi)


def check_ranges(checks: list[tuple[torch.Tensor, int, int, Callable[[int], Exception]]]) -> None:
    """Raises `error(value)` for the first index outside [low, high): one sync for tpu indices, or
    none where checks are deferred (ops/deferred_checks.py: the verdict waits for the next host
    read)."""
    checks = [c for c in checks if c[0].numel() > 0 and not c[0].is_floating_point() and c[0].dtype != torch.bool]
    device = [c for c in checks if c[0].device.type != "cpu"]
    if device and deferred_checks.enabled():
        deferred_checks.check(deferred_checks.range_verdicts(device), [c[3] for c in device], _DEFERRED)
        checks, device = [c for c in checks if c[0].device.type == "cpu"], []
    values = {id(c): host_tier.view(c[0]) for c in device}  # host memory: read it where it is
    rows = {}
    if any(v is None for v in values.values()):
        read = deferred_checks.read(deferred_checks.range_verdicts(device))
        rows = {id(c): row for c, row in zip(device, read)}
    for c in checks:
        index, low, high, error = c
        if id(c) in rows:
            failed, value = rows[id(c)]
            if failed:
                raise error(int(value))
            continue
        flat = values.get(id(c), index).reshape(-1)
        outside = (flat < low) | (flat >= high)
        if bool(outside.any()):
            raise error(int(flat[int(outside.int().argmax())]))


_DEFERRED = "an index check of a queued tpu op"


class Failure(NamedTuple):
    """A graph check's verdict: `error(message.format(value=value))` is raised when `bad` holds."""

    bad: object  # a traced bool scalar
    value: object  # a traced integer scalar (the offending index)
    error: type[Exception]
    message: str


def first_outside(index, low: int, high: int, error: type[Exception], message: str) -> list[Failure]:
    """The graph form of check_ranges: a failure when some element of `index` is outside [low, high)."""
    index = jnp.asarray(index)
    if index.size == 0 or not jnp.issubdtype(index.dtype, jnp.integer):
        return []
    bad, value = deferred_checks.first_outside(index.reshape(-1), low, high)
    return [Failure(bad, value.astype(jnp.int64), error, message)]


def dim_size(self, dim: int) -> tuple[int, int] | None:
    """(normalized dim, size) as torch sees it (a 0-dim tensor has size 1), or
    None for a bad dim, which the kernel's meta pass then reports."""
    ndim = max(self.ndim, 1)
    if not -ndim <= dim < ndim:
        return None
    dim %= ndim
    return dim, (self.shape[dim] if self.ndim else 1)


def range_check(
    low_negative: bool,
    error: type[Exception] = RuntimeError,
    message: str = "index {value} is out of bounds for dimension {dim} with size {size}",
) -> Check:
    """A check of `index` (third argument) against self.size(dim); `message` names {value}, {dim}, {size}."""

    def host(self, dim, index, *args, **kwargs):
        found = dim_size(self, dim)
        if found is None or not isinstance(index, torch.Tensor):
            return
        d, size = found
        low = -size if low_negative else 0
        check_ranges([(index, low, size, lambda v: error(message.format(value=v, dim=d, size=size)))])

    def graph(self, dim, index, *args, **kwargs):
        found = dim_size(jnp.asarray(self), dim)
        if found is None or index is None:
            return []
        d, size = found
        text = message.replace("{dim}", str(d)).replace("{size}", str(size))
        return first_outside(index, -size if low_negative else 0, size, error, text)

    return Check(host, graph)


# Named predicates of `flags` (a name, not a function, keys the persistent cache).
PREDICATES: dict[str, Callable] = {
    # multinomial / normal: an element that is nan, inf or negative
    "not_finite_nonnegative": lambda a: ~jnp.all(jnp.isfinite(a) & (a >= 0)),
    "negative": lambda a: jnp.any(a < 0),
    "outside_unit": lambda a: ~jnp.all((a >= 0) & (a <= 1)),
    # multinomial: a row whose probabilities sum to zero
    "zero_row": lambda a: jnp.any(jnp.sum(a.reshape(-1, a.shape[-1]) if a.ndim else a, axis=-1) <= 0),
}


def flags(arrays: tuple, predicates: tuple[str, ...]) -> list[bool]:
    """`PREDICATES[name](array)` for each (array, name) pair (a bool each), on the device: one host sync."""
    metrics.bump("executions")
    return [bool(v) for v in to_host(_flags(arrays, predicates))]


@functools.partial(executable_cache.jit, static_argnums=1)
def _flags(arrays, predicates):
    return jnp.stack([jnp.asarray(PREDICATES[p](a), bool) for a, p in zip(arrays, predicates)])


def dim_in_range(dim: int, ndim: int) -> None:
    """CPU's IndexError for a dim outside [-ndim, ndim) (a 0-dim tensor takes dims -1 and 0)."""
    n = max(ndim, 1)
    if not -n <= dim < n:
        raise IndexError(f"Dimension out of range (expected to be in range of [{-n}, {n - 1}], but got {dim})")


_C_TYPE_NAMES = {
    torch.float32: "float",
    torch.float64: "double",
    torch.float16: "c10::Half",
    torch.bfloat16: "c10::BFloat16",
    torch.int64: "long int",
    torch.int32: "int",
    torch.int16: "short int",
    torch.int8: "signed char",
    torch.uint8: "unsigned char",
    torch.bool: "bool",
    torch.complex64: "c10::complex<float>",
    torch.complex128: "c10::complex<double>",
}


def c_type_name(dtype: torch.dtype) -> str:
    """The C++ type name some CPU messages use ("float", "long int")."""
    return _C_TYPE_NAMES.get(dtype, str(dtype))


# In-place ops whose result type need not cast to self (comparisons and logical ops write bools as 0/1).
_CAST_EXEMPT = frozenset(
    ("eq", "ne", "ge", "gt", "le", "lt", "greater", "greater_equal", "less", "less_equal", "not_equal", "copy")
)


def inplace_cast_check(op, check: Callable | None) -> Callable | None:
    """For a derived in-place variant `op` taking (self, other, ...): CPU's error when `other` would
    broadcast self to a larger shape, or the result type of self and other can't be cast to self's
    dtype (x.add_(1j) on a float x); then `check`."""
    schema = op._schema
    name = schema.name.split("::")[1].rstrip("_")
    if (
        len(schema.arguments) < 2
        or schema.arguments[1].name != "other"
        or name in _CAST_EXEMPT
        or name.startswith("logical_")
    ):
        return check

    def cast_check(self, other, *args, **kwargs):
        if not isinstance(self, torch.Tensor):  # _foreach_*_: lists of tensors
            return None if check is None else check(self, other, *args, **kwargs)
        if isinstance(other, torch.Tensor) and other.dim() and tuple(other.shape) != tuple(self.shape):
            shape = torch.broadcast_shapes(self.shape, other.shape)  # raises CPU's error where none is
            if tuple(shape) != tuple(self.shape):
                raise RuntimeError(
                    f"output with shape {list(self.shape)} doesn't match the broadcast shape {list(shape)}"
                )
        if isinstance(other, (torch.Tensor, bool, int, float, complex)):
            result = torch.result_type(self, other)
            if not torch.can_cast(result, self.dtype):
                raise RuntimeError(
                    f"result type {type_name(result)} can't be cast to the desired output type {type_name(self.dtype)}"
                )
        return None if check is None else check(self, other, *args, **kwargs)

    return SignatureCheck(cast_check) if check is None or isinstance(check, SignatureCheck) else cast_check


def _span(t: torch.Tensor) -> tuple[int, int]:
    """The bytes `t` can touch, [first, last): data addresses (a tpu buffer's fake one) read
    without a mutable access, so a lazy clone stays one."""
    first = torch._C._data_address(t) + t.storage_offset() * t.element_size()
    elements = 1 + sum((size - 1) * stride for size, stride in zip(t.shape, t.stride()))
    return first, first + elements * t.element_size()


def overlap(a: torch.Tensor, b: torch.Tensor) -> str:
    """CPU's get_overlap_status of two tensors: "full", "partial", "no" or "too hard"."""
    if a is b:
        return "full"
    if a.numel() == 0 or b.numel() == 0 or a.device != b.device:
        return "no"
    (a_begin, a_end), (b_begin, b_end) = _span(a), _span(b)
    if a_end <= b_begin or b_end <= a_begin:  # (most calls end here: cheaper than CPU's order)
        return "no"
    if not (is_non_overlapping_and_dense(a) and is_non_overlapping_and_dense(b)):
        return "too hard"
    if a_begin == b_begin and a_end == b_end:
        return "full" if a.stride() == b.stride() else "partial"
    return "partial"


def check_no_overlap(written: torch.Tensor, read: torch.Tensor, partial_only: bool = False) -> None:
    """CPU's assert_no_overlap: `written` must not share memory with `read`, in part or whole
    (`partial_only`: assert_no_partial_overlap, where sharing all of it is fine)."""
    if overlap(written, read) in (("partial",) if partial_only else ("full", "partial")):
        raise RuntimeError(
            "unsupported operation: some elements of the input tensor and the written-to tensor refer to a "
            "single memory location. Please clone() the tensor before performing the operation."
        )
