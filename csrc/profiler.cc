#include "csrc/profiler.h"

#include <ATen/record_function.h>
#include <torch/csrc/utils/pybind.h>

#include <memory>
#include <mutex>
#include <optional>

namespace torch_tpu {
namespace {

namespace py = pybind11;

std::mutex g_mutex;
std::optional<at::CallbackHandle> g_handle;
py::object* g_enter = new py::object();  // never destroyed: may run at shutdown

// One open region's annotation; closed (under the GIL) when the region ends.
struct Annotation final : at::ObserverContext {
  py::object scope;
  ~Annotation() override {
    if (scope && Py_IsInitialized()) {
      py::gil_scoped_acquire gil;
      scope = py::object();
    }
  }
};

std::unique_ptr<at::ObserverContext> on_start(const at::RecordFunction& fn) {
  if (!Py_IsInitialized()) {
    return nullptr;
  }
  py::gil_scoped_acquire gil;
  if (!*g_enter) {
    return nullptr;
  }
  auto annotation = std::make_unique<Annotation>();
  try {
    annotation->scope = (*g_enter)(fn.name());
  } catch (py::error_already_set& e) {
    e.discard_as_unraisable("torch_tpu trace annotation");
    return nullptr;
  }
  return annotation;
}

void on_end(const at::RecordFunction& /*fn*/, at::ObserverContext* ctx) {
  auto* annotation = static_cast<Annotation*>(ctx);
  if (annotation == nullptr || !annotation->scope || !Py_IsInitialized()) {
    return;
  }
  py::gil_scoped_acquire gil;
  try {
    annotation->scope.attr("__exit__")(py::none(), py::none(), py::none());
  } catch (py::error_already_set& e) {
    e.discard_as_unraisable("torch_tpu trace annotation");
  }
  annotation->scope = py::object();
}

}  // namespace

void start_trace_annotations(PyObject* enter, bool ops) {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (g_handle) {
    at::removeCallback(*g_handle);
  }
  *g_enter = py::reinterpret_borrow<py::object>(enter);
  std::unordered_set<at::RecordScope, std::hash<at::RecordScope>> scopes{at::RecordScope::USER_SCOPE};
  if (ops) {
    scopes.insert(at::RecordScope::FUNCTION);
    scopes.insert(at::RecordScope::BACKWARD_FUNCTION);
  }
  g_handle = at::addGlobalCallback(at::RecordFunctionCallback(&on_start, &on_end).scopes(scopes));
}

void stop_trace_annotations() {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (g_handle) {
    at::removeCallback(*g_handle);
    g_handle.reset();
  }
  *g_enter = py::object();
}

}  // namespace torch_tpu
