"""FFTs: the three ATen primitives torch.fft decomposes into, on jnp.fft.

`normalization` is ATen's fft_norm_mode: 0 leaves the transform unscaled, 1 scales by
1/sqrt(n), 2 by 1/n, with n the product of the signal sizes over `dim`.
"""

from __future__ import annotations

import math

import jax.numpy as jnp

from torch_tpu.ops.registry import aten, lower


def _normalize(x, sizes, normalization: int):
    n = math.prod(sizes)
    if normalization == 1:
        return x / math.sqrt(n)
    if normalization == 2:
        return x / n
    return x


@lower(aten._fft_c2c.default)
def fft_c2c(self, dim, normalization, forward):
    axes = tuple(dim)
    if not axes:
        return self
    out = jnp.fft.fftn(self, axes=axes) if forward else jnp.fft.ifftn(self, axes=axes, norm="forward")
    return _normalize(out, [self.shape[d] for d in axes], normalization)


@lower(aten._fft_r2c.default)
def fft_r2c(self, dim, normalization, onesided):
    axes = tuple(dim)
    out = jnp.fft.rfftn(self, axes=axes) if onesided else jnp.fft.fftn(self.astype(_complex(self.dtype)), axes=axes)
    return _normalize(out, [self.shape[d] for d in axes], normalization)


@lower(aten._fft_c2r.default)
def fft_c2r(self, dim, normalization, last_dim_size):
    axes = tuple(dim)
    sizes = [self.shape[d] for d in axes[:-1]] + [last_dim_size]
    # As pocketfft: unscaled c2c over the leading axes, then c2r over the last (the two differ
    # from one multi-axis irfftn on inputs that are not Hermitian).
    if len(axes) > 1:
        self = jnp.fft.ifftn(self, axes=axes[:-1], norm="forward")
    out = jnp.fft.irfft(self, n=last_dim_size, axis=axes[-1], norm="forward")
    return _normalize(out, sizes, normalization)


def _complex(dtype):
    return jnp.complex128 if dtype == jnp.float64 else jnp.complex64
