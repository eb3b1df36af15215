// jax's nan/inf debug checks as the C++ eager path reads them (csrc/eager_kernel.cc): a call
// that skips jax's call layer must not skip them.
#pragma once

#include <pybind11/pybind11.h>

namespace torch_tpu {

// jax's nan/inf check settings: their config states and the states' `value` getter (a C++
// function: no attribute lookup per call). All null if this jax has them elsewhere
// (then every call takes jax's call layer). Found when the first kernel registers (imports
// there, not mid-call).
struct JaxChecks {
  PyObject* get = nullptr;
  PyObject* nans = nullptr;
  PyObject* infs = nullptr;

  static JaxChecks find() {
    JaxChecks found;
    try {
      pybind11::module_ config = pybind11::module_::import("jax._src.config");
      pybind11::object nans = config.attr("debug_nans");
      pybind11::object infs = config.attr("debug_infs");
      pybind11::object get = pybind11::type::of(nans).attr("value").attr("fget");
      found = {get.release().ptr(), nans.release().ptr(), infs.release().ptr()};  // kept for good
    } catch (const pybind11::error_already_set&) {
      PyErr_Clear();
    }
    return found;
  }

  // Whether either check is on (or this jax's settings are unknown).
  bool any_on() const { return get == nullptr || on(nans) || on(infs); }

  bool on(PyObject* state) const {
    PyObject* v = PyObject_CallOneArg(get, state);
    if (v == nullptr) {
      PyErr_Clear();
      return true;  // unknown: jax's own call decides
    }
    const bool value = PyObject_IsTrue(v) != 0;
    Py_DECREF(v);
    return value;
  }
};

}  // namespace torch_tpu
