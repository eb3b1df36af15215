"""Max pooling's backward in compiled graphs: `tpu_kernels::max_pool_backward_from_input` finds
each output's input position again from the input instead of reading the forward's int64
indices, and the compile backend decomposes aten's max_pool{2,3}d_with_indices_backward into it.
The forward's indices are then dead in the graph: XLA never computes them, and aot_autograd
never keeps them for the backward (on TPU an int64 is a pair of u32 words: ResNet-50's one max
pool spent ~4 ms a step making and moving them, and kept 205 MB)."""

from __future__ import annotations

import torch
from torch._ops import OpOverload

from torch_tpu.kernels import _custom_ops
from torch_tpu.ops.lowerings import pooling

aten = torch.ops.aten


def _fake(grad_output, self, kernel_size, stride, padding, dilation, ceil_mode):
    return grad_output.new_empty(self.shape)


BACKWARD_FROM_INPUT: OpOverload = _custom_ops.define(
    "max_pool_backward_from_input(Tensor grad_output, Tensor self, int[] kernel_size, int[] stride, "
    "int[] padding, int[] dilation, bool ceil_mode) -> Tensor",
    pooling.max_pool_backward_from_input,
    _fake,
)


def _from_input(nd: int):
    def decomposition(grad_output, self, kernel_size, stride, padding, dilation, ceil_mode, indices):
        # each as nd sizes: the schema's int[2] may hold one size for all dims
        params = pooling._pool_params(nd, kernel_size, stride, padding, dilation)
        return BACKWARD_FROM_INPUT(grad_output, self, *[list(p) for p in params], ceil_mode)

    return decomposition


def graph_decompositions() -> dict[OpOverload, object]:
    """aten's max pool backwards -> the one from the input, for aot_autograd's joint graph."""
    return {
        aten.max_pool2d_with_indices_backward.default: _from_input(2),
        aten.max_pool3d_with_indices_backward.default: _from_input(3),
    }
