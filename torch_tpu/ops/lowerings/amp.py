"""GradScaler's ops: unscale gradients while checking for inf/nan, and update the scale."""

from __future__ import annotations

import jax.numpy as jnp

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
