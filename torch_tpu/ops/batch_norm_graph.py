"""Batch norm in compiled graphs as ATen statistics and elementwise ops, so that aot_autograd's
min-cut partitioner can recompute its output, and the ReLU after it, in the backward from the
saved input instead of keeping both.

The backward of a conv -> batch norm -> ReLU reads the batch norm's input (for its own
gradient) and the ReLU's output (for the ReLU's and the next convolution's). As one opaque op
the batch norm cannot be recomputed without its reductions, so the forward kept both: ResNet-50
at 224² kept 42.2 MB per image, 19.0 MB of it ReLU outputs, which jax's one-module step need not
keep (XLA fuses the normalization and ReLU into their readers). Decomposed, the output is
`(x - mean) * invstd * weight + bias` of the saved input and per-channel statistics, which the
backward recomputes (with compile/backend.py's PARTITIONER_DEFAULTS: 31.0 MB per image). The
arithmetic is the lowering's (ops/lowerings/normalization.py: two-pass moments in float32 for
half inputs), and the backward stays aten's batch norm backward from the input and statistics.
"""

from __future__ import annotations

import torch

aten = torch.ops.aten


def _opmath(t: torch.Tensor) -> torch.Tensor:
    return t.float() if t.dtype in (torch.float16, torch.bfloat16) else t


def _channel(v: torch.Tensor, ndim: int) -> torch.Tensor:
    return v.reshape([1, -1] + [1] * (ndim - 2))


def _affine(out: torch.Tensor, weight, bias) -> torch.Tensor:
    if weight is not None:
        out = out * _channel(_opmath(weight), out.dim())
    if bias is not None:
        out = out + _channel(_opmath(bias), out.dim())
    return out


def _train(input, weight, bias, eps):
    """(output, mean, invstd, biased variance): the batch's statistics over all dims but 1."""
    x = _opmath(input)
    dims = [0, *range(2, x.dim())]
    mean = x.mean(dims, keepdim=True)
    centered = x - mean
    var = centered.square().mean(dims, keepdim=True)
    invstd = torch.rsqrt(var + eps)
    out = _affine(centered * invstd, weight, bias)
    return out.to(input.dtype), mean.reshape(-1), invstd.reshape(-1), var.reshape(-1)


def _updated(input, mean, var, running_mean, running_var, momentum):
    n = input.numel() // input.shape[1]
    unbiased = var * (n / torch.sym_max(n - 1, 1))
    new_mean = (1 - momentum) * _opmath(running_mean) + momentum * mean  # promoted, as the meta kernel
    new_var = (1 - momentum) * _opmath(running_var) + momentum * unbiased
    return new_mean, new_var


def legit_functional(input, weight, bias, running_mean, running_var, training, momentum, eps):
    """aten._native_batch_norm_legit_functional in training: output, saved statistics and the new
    running statistics (the functional form's outputs, copied back into the buffers)."""
    if not training:
        return NotImplemented  # the lowering: normalized by the running statistics
    out, mean, invstd, var = _train(input, weight, bias, eps)
    new_mean, new_var = _updated(input, mean, var, running_mean, running_var, momentum)
    return out, mean, invstd, new_mean, new_var


def legit_no_stats(input, weight, bias, training, momentum, eps):
    """aten._native_batch_norm_legit.no_stats (track_running_stats=False)."""
    out, mean, invstd, _ = _train(input, weight, bias, eps)
    return out, mean, invstd


def legit_no_training(input, weight, bias, running_mean, running_var, momentum, eps):
    """aten._native_batch_norm_legit_no_training (evaluation, a frozen batch norm): normalized by
    the running statistics, which it returns as mean and invstd (PyTorch's meta kernel)."""
    x = _opmath(input)
    mean = running_mean.to(x.dtype)
    invstd = torch.rsqrt(running_var.to(x.dtype) + eps)
    out = _affine((x - _channel(mean, x.dim())) * _channel(invstd, x.dim()), weight, bias)
    return out.to(input.dtype), mean, invstd


def graph_decompositions() -> dict:
    """aten's batch norm forwards -> statistics and elementwise ops, for aot_autograd's graphs."""
    return {
        aten._native_batch_norm_legit_functional.default: legit_functional,
        aten._native_batch_norm_legit.no_stats: legit_no_stats,
        aten._native_batch_norm_legit_no_training.default: legit_no_training,
    }
