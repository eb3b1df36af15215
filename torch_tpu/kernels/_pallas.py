"""Shared Pallas helpers: how a kernel is called on each platform.

Every kernel here is a TPU kernel, its blocks sized by Mosaic's rules (platforms/tpu/mosaic.py).
On TPU it compiles with Mosaic; elsewhere (the CPU client, a GPU) Pallas interprets the same
kernel, an emulator for testing. `lowering_for_tpu()` makes the kernels lower for Mosaic whatever
the client is, so any machine can check that they compile (python -m torch_tpu.kernels.check_lowering).

`call` traces a kernel with x64 off: 64-bit integers never reach Mosaic, so index maps, grid
indices and scalars are int32 whatever the process's jax_enable_x64 says.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator, Sequence

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from torch_tpu import platforms
from torch_tpu.platforms.tpu.mosaic import LANES, compiler_params, compute_dtype

# A finite "minus infinity": masked scores stay NaN-free even when a whole row is masked.
NEG_INF = -1e30

_force_mosaic: contextvars.ContextVar[bool] = contextvars.ContextVar("torch_tpu_force_mosaic", default=False)
_print_modules: contextvars.ContextVar[bool] = contextvars.ContextVar("torch_tpu_print_modules", default=False)


def compiled() -> bool:
    """True where kernels compile with Mosaic (TPU, or inside `lowering_for_tpu()`), False where
    Pallas interprets them."""
    return _force_mosaic.get() or platforms.kernels_compile()


def interpret() -> bool:
    return not compiled()


@contextlib.contextmanager
def lowering_for_tpu(print_modules: bool = False) -> Iterator[None]:
    """Kernels called inside lower with Mosaic, for `jax.jit(...).lower(lowering_platforms=("tpu",))`
    on any machine; `print_modules`: Pallas prints each kernel's Mosaic module (its debug mode)."""
    tokens = _force_mosaic.set(True), _print_modules.set(print_modules)
    try:
        yield
    finally:
        _force_mosaic.reset(tokens[0])
        _print_modules.reset(tokens[1])


def call(
    kernel: Callable,
    *,
    grid_spec: pl.GridSpec,
    out_shape,
    semantics: Sequence[str],
    name: str,
) -> Callable:
    """`pl.pallas_call` of `kernel`, compiled by Mosaic (with these grid dimension semantics) or
    interpreted, and traced with 64-bit types off."""
    if compiled():
        params = dict(compiler_params=compiler_params(semantics), interpret=False)
    else:
        params = dict(interpret=True)
    fn = pl.pallas_call(
        kernel, grid_spec=grid_spec, out_shape=out_shape, name=name, debug=_print_modules.get(), **params
    )

    def run(*args):
        with jax.enable_x64(False):
            return fn(*args)

    return run


def next_power_of_2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def to_lanes(x: jax.Array, width: int) -> jax.Array:
    """(rows, LANES) values that repeat across lanes, as (rows, width)."""
    if width % LANES == 0:
        return x if width == LANES else jnp.tile(x, (1, width // LANES))
    if width < LANES:
        return x[:, :width]
    raise ValueError(f"width {width} is neither below {LANES} nor a multiple of it")


def across_lanes(x: jax.Array) -> jax.Array:
    """(..., rows) as (..., rows, LANES), each value repeated across the lanes: how a kernel takes
    per-row statistics (logsumexp, the backward's delta) without a sublane-to-lane transpose."""
    return jnp.broadcast_to(x[..., None], (*x.shape, LANES))


def pad_to(x: jax.Array, axis: int, size: int, value=0) -> jax.Array:
    """`x` zero-padded (or `value`-padded) at the end of `axis` to `size`."""
    extra = size - x.shape[axis]
    if extra == 0:
        return x
    widths = [(0, 0)] * x.ndim
    widths[axis] = (0, extra)
    return jnp.pad(x, widths, constant_values=value)


def as_computed(*xs: jax.Array) -> tuple[jax.Array, ...]:
    """`xs` in the dtype the kernel computes in (mosaic.compute_dtype of the first)."""
    dtype = compute_dtype(xs[0].dtype)
    return tuple(x.astype(dtype) for x in xs)


def dot_precision(*operands) -> lax.Precision:
    """The precision of a kernel's matrix products of `operands`: float32 ones follow torch's
    float32 matmul precision (Mosaic has one bfloat16 pass, DEFAULT, for "medium" and exact
    float32, HIGHEST, for "high" and "highest"); other dtypes are exact in one pass. Read when
    the kernel is traced (part of the op's cache key)."""
    from torch_tpu.ops import precision  # (the ops package imports the kernels' custom ops)

    if operands and all(jnp.dtype(x.dtype) == jnp.float32 for x in operands):
        return lax.Precision.DEFAULT if precision.matmul(*operands) == lax.Precision.DEFAULT else lax.Precision.HIGHEST
    return lax.Precision.DEFAULT
