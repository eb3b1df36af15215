// See python_call_args.h.
#include "csrc/python_call_args.h"

#include <c10/core/ScalarType.h>
#include <torch/csrc/DynamicTypes.h>
#include <torch/csrc/jit/python/pybind_utils.h>
#include <torch/csrc/utils/tensor_memoryformats.h>

namespace py = pybind11;

namespace torch_tpu {

// A schema argument as torch.library hands it to a Python kernel: dtypes, layouts and memory
// formats as their Python objects.
py::object python_value(const c10::Argument& arg, const c10::IValue& v) {
  if (v.isNone()) {
    return py::none();
  }
  c10::TypePtr type = arg.real_type();
  if (auto optional = type->cast<c10::OptionalType>()) {
    type = optional->getElementType();
  }
  switch (type->kind()) {
    case c10::TypeKind::ScalarTypeType:
      return py::reinterpret_borrow<py::object>(
          reinterpret_cast<PyObject*>(torch::getTHPDtype(static_cast<at::ScalarType>(v.toInt()))));
    case c10::TypeKind::LayoutType:
      return py::reinterpret_borrow<py::object>(
          reinterpret_cast<PyObject*>(torch::getTHPLayout(static_cast<at::Layout>(v.toInt()))));
    case c10::TypeKind::MemoryFormatType:
      return py::reinterpret_borrow<py::object>(
          torch::utils::getTHPMemoryFormat(static_cast<at::MemoryFormat>(v.toInt())));
    default:
      return torch::jit::toPyObject(v);
  }
}

// (args, kwargs) of a Python kernel call, as torch.library builds them: positional arguments
// up to the keyword-only ones, less trailing ones equal to their defaults; keyword-only ones
// that differ from their defaults.
std::pair<py::tuple, py::dict> python_arguments(const c10::FunctionSchema& schema,
                                                const std::vector<c10::IValue>& arguments) {
  const auto& params = schema.arguments();
  auto is_default = [&](size_t i) {
    const auto& d = params[i].default_value();
    return d.has_value() && *d == arguments[i];
  };
  size_t kwarg_only_start = arguments.size();
  while (kwarg_only_start > 0 && params[kwarg_only_start - 1].kwarg_only()) {
    --kwarg_only_start;
  }
  size_t positional_end = kwarg_only_start;
  while (positional_end > 0 && is_default(positional_end - 1)) {
    --positional_end;
  }
  py::tuple args(positional_end);
  for (size_t i = 0; i < positional_end; ++i) {
    args[i] = python_value(params[i], arguments[i]);
  }
  py::dict kwargs;
  for (size_t i = kwarg_only_start; i < arguments.size(); ++i) {
    if (!is_default(i)) {
      kwargs[py::str(params[i].name())] = python_value(params[i], arguments[i]);
    }
  }
  return {std::move(args), std::move(kwargs)};
}

// Pushes a Python kernel's result as the schema's returns.
void push_python_result(const c10::FunctionSchema& schema, torch::jit::Stack* stack, const py::object& out) {
  const auto& returns = schema.returns();
  if (returns.empty()) {
    TORCH_CHECK(out.is_none(), "the tpu kernel of ", schema.name(), " returned a value where none is expected");
  } else if (returns.size() == 1) {
    stack->push_back(torch::jit::toIValue(out, returns[0].real_type()));
  } else {
    const py::sequence outs = py::cast<py::sequence>(out);
    TORCH_CHECK(outs.size() == returns.size(), "the tpu kernel of ", schema.name(), " returned ", outs.size(),
                " values, expected ", returns.size());
    for (size_t i = 0; i < returns.size(); ++i) {
      stack->push_back(torch::jit::toIValue(outs[i], returns[i].real_type()));
    }
  }
}

}  // namespace torch_tpu
