// The steady-state eager path: the PrivateUse1 kernel of each jit-lowered op.
//
// A call of tpu tensors (each its whole buffer, or a view: its geometry is in the key), numbers,
// int lists, strings and dtypes has a signature key built here. On a hit the kernel runs the op's
// cached executable and wraps its outputs (or swaps self's buffer, for an in-place op): no Python
// bytecode of torch_tpu's runs. Everything else (a miss, CPU scalar tensors, never-written
// storage, lazy mode, SPMD) goes to the op's Python kernel (torch_tpu/ops/dispatcher.py), which
// compiles the executable and offers it back for the key.
#pragma once

#include <torch/csrc/utils/pybind.h>

namespace torch_tpu {

// Adds _register_eager_kernel, _offer_eager_entry and the fast path's switches and counters.
void init_eager_kernels(pybind11::module_& m);

}  // namespace torch_tpu
