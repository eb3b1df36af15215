// A dispatcher call's arguments and results as a Python kernel takes and gives them, as
// torch.library builds them (used by the C++ eager path, csrc/eager_kernel.cc, when it hands a
// call to the op's Python kernel).
#pragma once

#include <ATen/core/function_schema.h>
#include <ATen/core/ivalue.h>
#include <ATen/core/stack.h>
#include <pybind11/pybind11.h>

#include <utility>
#include <vector>

namespace torch_tpu {

// A schema argument as torch.library hands it to a Python kernel: dtypes, layouts and memory
// formats as their Python objects.
pybind11::object python_value(const c10::Argument& arg, const c10::IValue& v);

// (args, kwargs) of a Python kernel call, as torch.library builds them: positional arguments
// up to the keyword-only ones, less trailing ones equal to their defaults; keyword-only ones
// that differ from their defaults.
std::pair<pybind11::tuple, pybind11::dict> python_arguments(const c10::FunctionSchema& schema,
                                                            const std::vector<c10::IValue>& arguments);

// Pushes a Python kernel's result as the schema's returns.
void push_python_result(const c10::FunctionSchema& schema, torch::jit::Stack* stack, const pybind11::object& out);

}  // namespace torch_tpu
