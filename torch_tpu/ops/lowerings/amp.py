"""GradScaler's ops: unscale gradients while checking for inf/nan, and update the scale."""

from __future__ import annotations

import jax.numpy as jnp

from torch_tpu.ops.dtypes import to_opmath
from torch_tpu.ops.registry import aten, lower


@lower(aten._amp_foreach_non_finite_check_and_unscale.default)
def amp_foreach_non_finite_check_and_unscale(self, found_inf, inv_scale):
    """CPU's kernel: each gradient times inv_scale (in float32 for half floats; unchanged when
    inv_scale is 1), and found_inf set to 1 if any element of any gradient is inf or nan."""
    scale = inv_scale.reshape(())
    unscaled, found = [], jnp.zeros((), jnp.bool_)
    for grad in self:
        found = found | ~jnp.all(jnp.isfinite(grad))
        opmath = grad.astype(jnp.promote_types(grad.dtype, jnp.float32))
        product = jnp.where(scale == 1, opmath, opmath * scale.astype(opmath.dtype))
        unscaled.append(product.astype(grad.dtype))
    return unscaled, jnp.where(found, jnp.ones_like(found_inf), found_inf)


@lower(aten._amp_update_scale.default)
def amp_update_scale(self, growth_tracker, found_inf, scale_growth_factor, scale_backoff_factor, growth_interval):
    """CPU's kernel: back off and reset the tracker after an inf; else count a good step and
    grow the scale (when the grown scale is finite) every growth_interval steps."""
    found = found_inf.reshape(()) != 0
    successful = growth_tracker + 1
    grown = self * jnp.asarray(scale_growth_factor, self.dtype)
    grow = (successful == growth_interval) & jnp.isfinite(grown)
    scale = jnp.where(found, self * jnp.asarray(scale_backoff_factor, self.dtype), jnp.where(grow, grown, self))
    tracker = jnp.where(found | (successful == growth_interval), jnp.zeros_like(growth_tracker), successful)
    return scale, tracker


# ---- AMP gradient scaling ---------------------------------------------------


@lower(aten._amp_foreach_non_finite_check_and_unscale_.default)
def amp_foreach_non_finite_check_and_unscale_(self, found_inf, inv_scale):
    inv = inv_scale.reshape(())
    unscaled = [(to_opmath(x) * inv).astype(x.dtype) for x in self]
    bad = jnp.zeros((), bool)
    for x in unscaled:
        bad = bad | ~jnp.all(jnp.isfinite(x))
    return unscaled, jnp.where(bad, jnp.ones_like(found_inf), found_inf)


@lower(aten._amp_update_scale_.default)
def amp_update_scale_(self, growth_tracker, found_inf, scale_growth_factor, scale_backoff_factor, growth_interval):
    scale, tracker, inf = self.reshape(()), growth_tracker.reshape(()), found_inf.reshape(()) != 0
    successful = tracker + 1
    grow = successful == growth_interval
    grown = scale * scale_growth_factor
    grown = jnp.where(jnp.isfinite(grown), grown, scale)
    new_scale = jnp.where(inf, scale * scale_backoff_factor, jnp.where(grow, grown, scale))
    new_tracker = jnp.where(inf | grow, 0, successful)
    return new_scale.reshape(self.shape), new_tracker.reshape(growth_tracker.shape)
