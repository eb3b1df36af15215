"""Convolution and its backward op."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import torch
from jax import lax

from torch_tpu.ops.dtypes import opmath, to_opmath, type_name
from torch_tpu.ops.lowerings.common import HIGHEST, ntuple
from torch_tpu.ops.registry import aten, lower, signature_check

# ---- convolution ------------------------------------------------------------


def _cpu_memory_format(input, weight, **conv_args):
    """The memory format CPU's convolution gives its result (as FakeTensor works it out):
    channels_last when the input or weight is. None: contiguous, as meta gives."""
    if input.is_contiguous() and weight.is_contiguous():
        return None
    # CPU stand-ins with the meta strides; never written, so never touched.
    x = torch.empty_strided(input.shape, input.stride(), dtype=input.dtype)
    w = torch.empty_strided(weight.shape, weight.stride(), dtype=weight.dtype)
    backend = torch._C._select_conv_backend(x, w, **conv_args)
    if weight.dim() == 3:  # CPU expands a 1-d convolution to 2-d
        x, w = x.contiguous().unsqueeze(2), w.unsqueeze(2)
    return torch._C._conv_determine_backend_memory_format(x, w, backend)


def _to_format(t, memory_format):
    if t is None or memory_format is None:
        return t
    if t.dim() == 3 and memory_format == torch.channels_last:
        return t.unsqueeze(2).to(memory_format=memory_format).squeeze(2)
    return t.to(memory_format=memory_format)


_GEOMETRY = ("stride", "padding", "dilation", "transposed", "output_padding", "groups")


def _conv_layout(args, out):
    input, weight, bias, *geometry = args
    return _to_format(out, _cpu_memory_format(input, weight, bias=bias, **dict(zip(_GEOMETRY, geometry))))


def _conv_backward_layout(args, out):
    _, input, weight, bias_sizes, *geometry, _ = args
    conv_args = dict(zip(_GEOMETRY, geometry), bias=None, bias_sizes=bias_sizes)
    fmt = _cpu_memory_format(input, weight, **conv_args)
    return _to_format(out[0], fmt), _to_format(out[1], fmt), out[2]


def _conv(input, weight, stride, padding, dilation, transposed, output_padding, groups):
    nd = input.ndim - 2
    stride, padding, dilation = ntuple(stride, nd), ntuple(padding, nd), ntuple(dilation, nd)
    spatial = "DHW"[3 - nd :]
    dn = lax.conv_dimension_numbers(input.shape, weight.shape, ("NC" + spatial, "OI" + spatial, "NC" + spatial))
    out_dtype = input.dtype
    preferred = jnp.float32 if opmath(out_dtype) != out_dtype else None
    if transposed:
        # The conv with a dilated input and the flipped, in/out-swapped kernel.
        output_padding = ntuple(output_padding, nd)
        cin, cout_g, *kernel = weight.shape
        w = weight.reshape(groups, cin // groups, cout_g, *kernel)
        w = jnp.swapaxes(w, 1, 2).reshape(groups * cout_g, cin // groups, *kernel)
        weight = jnp.flip(w, axis=tuple(range(2, 2 + nd)))
        pads = [(d * (k - 1) - p, d * (k - 1) - p + o) for k, p, d, o in zip(kernel, padding, dilation, output_padding)]
        stride, input_dilation = (1,) * nd, stride
    else:
        pads, input_dilation = [(p, p) for p in padding], None
    out = lax.conv_general_dilated(
        input,
        weight,
        stride,
        pads,
        lhs_dilation=input_dilation,
        rhs_dilation=dilation,
        dimension_numbers=dn,
        feature_group_count=groups,
        precision=HIGHEST,
        preferred_element_type=preferred,
    )
    return out.astype(out_dtype)


def _check_conv_params(stride, padding, dilation) -> None:
    """CPU's ConvParams checks, which PyTorch's meta kernel leaves out."""
    if any(s <= 0 for s in stride):
        raise RuntimeError("non-positive stride is not supported")
    if any(p < 0 for p in padding):
        raise RuntimeError("negative padding is not supported")
    if any(d <= 0 for d in dilation):
        raise RuntimeError("dilation should be greater than zero")


@signature_check
def _conv_check(input, weight, bias, stride, padding, dilation, transposed, output_padding, groups):
    """CPU's checks of the operands that jax would report as its own TypeError or ValueError."""
    if input.dtype != weight.dtype:
        raise RuntimeError(f"expected scalar type {type_name(input.dtype)} but found {type_name(weight.dtype)}")
    out_channels = weight.shape[1] * groups if transposed else weight.shape[0]
    if bias is not None and tuple(bias.shape) != (out_channels,):
        raise RuntimeError(
            f"Given weight of size {list(weight.shape)}, expected bias to be 1-dimensional with {out_channels} "
            f"elements, but got bias of size {list(bias.shape)} instead"
        )
    if transposed and input.dim() == weight.dim() and input.shape[1] != weight.shape[0]:
        raise RuntimeError(
            f"Given transposed=1, weight of size {list(weight.shape)}, expected input{list(input.shape)} to have "
            f"{weight.shape[0]} channels, but got {input.shape[1]} channels instead"
        )


@lower(aten.convolution.default, check=_conv_check, layout=_conv_layout)
def convolution(input, weight, bias, stride, padding, dilation, transposed, output_padding, groups):
    _check_conv_params(stride, padding, dilation)
    out = _conv(input, weight, stride, padding, dilation, transposed, output_padding, groups)
    if bias is not None:
        out = out + bias.reshape((1, -1) + (1,) * (out.ndim - 2)).astype(out.dtype)
    return out


@lower(aten.convolution_backward.default, layout=_conv_backward_layout)
def convolution_backward(
    grad_output, input, weight, bias_sizes, stride, padding, dilation, transposed, output_padding, groups, output_mask
):
    def f(x, w):
        return _conv(x, w, stride, padding, dilation, transposed, output_padding, groups)

    _, vjp = jax.vjp(f, input, weight)
    grad_input, grad_weight = vjp(grad_output.astype(input.dtype))
    grad_bias = None
    if output_mask[2]:
        axes = (0, *tuple(range(2, grad_output.ndim)))
        grad_bias = jnp.sum(to_opmath(grad_output), axis=axes)
    return (
        grad_input if output_mask[0] else None,
        grad_weight if output_mask[1] else None,
        grad_bias,
    )
