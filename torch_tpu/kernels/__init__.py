"""Pallas kernels on tpu tensors: flash attention, paged attention, grouped matmul, and
`jax_op` for one's own jax or Pallas functions. Imported by `import torch_tpu`, which
also routes scaled_dot_product_attention to flash attention (see sdpa.py)."""

from __future__ import annotations

from torch_tpu.kernels import sdpa  # noqa: F401  (registers the SDPA routing)
from torch_tpu.kernels.flash import flash_attention
from torch_tpu.kernels.grouped_matmul import gmm
from torch_tpu.kernels.jax_op import jax_op
from torch_tpu.kernels.paged import paged_attention

__all__ = ["flash_attention", "gmm", "jax_op", "paged_attention"]
