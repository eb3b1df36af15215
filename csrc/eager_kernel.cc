// The steady-state eager path (see eager_kernel.h).
#include "csrc/eager_kernel.h"

#include <ATen/Context.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <c10/core/DefaultDtype.h>
#include <c10/core/impl/TorchDispatchModeTLS.h>
#include <torch/csrc/DynamicTypes.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/jit/python/pybind_utils.h>
#include <torch/csrc/utils/tensor_memoryformats.h>
#include <torch/library.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

#include "csrc/core/device_registry.h"
#include "csrc/device_buffer.h"
#include "csrc/host_tier.h"
#include "csrc/jax_checks.h"
#include "csrc/python_call_args.h"

namespace py = pybind11;

namespace torch_tpu {
namespace {

std::atomic<bool> g_enabled{true};  // off once SPMD placement is installed
std::atomic<int64_t> g_hits{0};
std::atomic<int64_t> g_executions{0};
std::atomic<int64_t> g_host_runs{0};
thread_local int g_precision_override = -1;  // a graph's own matmul precision while it runs
// scalar(value, device) -> a weakly typed jax array on that tpu device (ops/scalars.py, cached
// by value): a traced Python number goes in as one, so the call takes the direct path and a
// repeated number costs no transfer. Null: numbers go through jax's call layer.
PyObject* g_scalar_hook = nullptr;  // owned reference, guarded by the GIL
// Entries over all ops, and the most kept (the dispatcher's op cache size): past it, all go.
size_t g_entry_count = 0;  // guarded by the GIL, as the tables are
size_t g_entry_limit = 4096;

struct Output {
  std::vector<int64_t> sizes;
  std::vector<int64_t> strides;  // empty: contiguous
  at::ScalarType dtype;
};

struct Entry {
  py::object run;  // run(inputs, None) -> [fresh results..., self's new buffer]
  // The same executable without jax's call layer, for calls whose inputs are all arrays:
  // execute(inputs) -> results, results.consume_with_handlers(handlers) -> run's list. Null
  // where jax's call does more than that (effects, pruned or constant inputs).
  py::object execute;
  py::object handlers;
  std::vector<Output> fresh;
  at::ScalarType self_dtype = at::ScalarType::Undefined;  // in-place ops: the new buffer's spec
  int64_t self_numel = -1;
  // Set instead of `run` while the executable compiles in the background: calls run on the host
  // tier until this torch_tpu.platforms.cpu.background_compile.Job is done.
  py::object job;
};

// A signature key's bytes: strings reused from a per-thread pool, so a call allocates none.
class KeyBuffer {
 public:
  KeyBuffer() {
    std::vector<std::string>& free = pool();
    if (!free.empty()) {
      text_ = std::move(free.back());
      free.pop_back();
      text_.clear();
    }
  }
  ~KeyBuffer() {
    if (text_.capacity() <= 1024) {
      pool().push_back(std::move(text_));
    }
  }
  KeyBuffer(const KeyBuffer&) = delete;
  KeyBuffer& operator=(const KeyBuffer&) = delete;
  std::string& text() { return text_; }

 private:
  static std::vector<std::string>& pool() {
    thread_local std::vector<std::string> free;
    return free;
  }
  std::string text_;
};

// One call as the fast path reads it.
struct Call {
  KeyBuffer key_buffer;
  std::string& key = key_buffer.text();
  // The executable's inputs in argument order: a tensor's buffer (its array is read only when
  // an executable runs), or a traced number.
  std::vector<std::pair<DeviceBuffer*, py::object>> inputs;
  bool numbers = false;  // some input is a Python number (jax's call makes it an array)
  bool precision_in_key = false;  // the key holds the matmul precision
  int device = -1;
  // An in-place op's self, once read: another input over its buffer sends the call to Python.
  const c10::TensorImpl* self = nullptr;
  const DeviceBuffer* self_buffer = nullptr;
};

JaxChecks g_jax_checks;  // guarded by the GIL

class OpState;

// A miss in progress: the op's Python kernel offers its executable to the innermost frame.
struct Frame {
  OpState* op;
  const std::vector<c10::IValue>* arguments;
  bool precision_in_key;
  std::shared_ptr<const Entry> offered;
};
thread_local std::vector<Frame*> g_frames;

template <typename T>
void append(std::string& key, T value) {
  key.append(reinterpret_cast<const char*>(&value), sizeof(value));
}

bool is_tpu(const c10::IValue& v) {
  return v.isTensor() && v.toTensor().defined() && v.toTensor().device().type() == c10::DeviceType::PrivateUse1;
}

bool same_impl(const py::handle& obj, const at::Tensor& t) {
  return THPVariable_Check(obj.ptr()) && THPVariable_Unpack(obj.ptr()).unsafeGetTensorImpl() == t.unsafeGetTensorImpl();
}

// Holds a storage lock of torch_tpu/ops/storage_locks.py (a threading.RLock) for its scope.
class HeldLock {
 public:
  ~HeldLock() {
    if (lock_ != nullptr) {
      PyObject* r = PyObject_CallMethod(lock_, "release", nullptr);
      if (r == nullptr) {
        PyErr_Clear();
      }
      Py_XDECREF(r);
      Py_DECREF(lock_);
    }
  }
  // False when the lock does not exist yet (the Python kernel makes it) or was just pruned.
  bool acquire(PyObject* locks, const at::Tensor& t) {
    char* address = static_cast<char*>(t.storage().data_ptr().get());
    if (address == nullptr) {
      return true;  // an empty storage has nothing to lose
    }
    // Keyed by the buffer: a storage slice shares its parent's lock.
    py::object key = py::reinterpret_steal<py::object>(PyLong_FromVoidPtr(address - view_of(t.storage()).offset));
    PyObject* lock = PyDict_GetItemWithError(locks, key.ptr());
    if (lock == nullptr) {
      PyErr_Clear();
      return false;
    }
    Py_INCREF(lock);
    PyObject* r = PyObject_CallMethod(lock, "acquire", nullptr);
    if (r == nullptr) {
      PyErr_Clear();
      Py_DECREF(lock);
      return false;
    }
    Py_DECREF(r);
    lock_ = lock;
    return PyDict_GetItemWithError(locks, key.ptr()) == lock;  // not pruned meanwhile
  }

 private:
  PyObject* lock_ = nullptr;
};

class OpState {
 public:
  OpState(std::string name, const c10::FunctionSchema& schema, PyObject* python_kernel,
          const std::vector<int64_t>& traced, bool inplace, PyObject* locks, PyObject* check)
      : name_(std::move(name)),
        num_args_(schema.arguments().size()),
        traced_(num_args_, false),
        defaults_(num_args_),
        python_kernel_(python_kernel),
        inplace_(inplace),
        locks_(locks),
        check_(check) {
    Py_INCREF(python_kernel_);  // never released: the dispatcher outlives the interpreter
    Py_INCREF(locks_);
    Py_XINCREF(check_);
    for (int64_t i : traced) {
      traced_.at(i) = true;
      defaults_[i] = schema.arguments()[i].default_value();
    }
  }

  const std::string& name() const { return name_; }
  bool inplace() const { return inplace_; }
  // An executable of this op read the matmul precision while it was traced: from now on every
  // key of the op holds it (the entries keyed without it go).
  void note_reads_precision() {
    if (!reads_precision_) {
      reads_precision_ = true;
      clear();
    }
  }

  void call(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
    py::gil_scoped_acquire gil;
    Call call;
    bool fast = g_enabled.load(std::memory_order_relaxed) && !lazy_recording() &&
                c10::impl::TorchDispatchModeTLS::stack_len() == 0;
    if (fast) {
      // An in-place op reads, runs and swaps self's buffer under its storage's lock, released
      // before a miss runs the Python kernel (which takes its locks in address order).
      HeldLock held;
      const auto args = torch::jit::last(stack, num_args_);
      const bool locked = !inplace_ || held.acquire(locks_, args[0].toTensor());
      fast = read(args, call);
      if (fast && locked) {
        auto it = entries_.find(call.key);
        if (it != entries_.end() && check_ != nullptr) {
          if (!passes_check(op, args)) {  // it gave other arguments
            call_python(op, stack, nullptr);
            return;
          }
          it = entries_.find(call.key);  // the ops the check ran may have changed the table
        }
        if (it != entries_.end()) {
          std::shared_ptr<const Entry> entry = it->second;  // the table may change while it runs
          if (entry->job) {
            if (!compiled(entry->job) && run_on_host(op, stack, call.device)) {
              return;
            }
            entries_.erase(it);  // compiled (or the host kernel failed): the Python kernel takes it
            --g_entry_count;
          } else if (run(*entry, stack, call)) {
            return;
          }
        }
      }
    }
    call_python(op, stack, fast ? &call : nullptr);
  }

  void clear() {
    g_entry_count -= entries_.size();
    entries_.clear();
  }

  size_t entry_count() const { return entries_.size(); }

 private:
  // Builds the call's key and inputs; false when the call is not one for the fast path.
  bool read(c10::ArrayRef<c10::IValue> args, Call& call) const {
    std::string& key = call.key;
    key.reserve(64);
    append(key, static_cast<int8_t>(c10::typeMetaToScalarType(c10::get_default_dtype())));
    if (reads_precision_) {  // a hashtable lookup: only for ops whose lowerings read it
      call.precision_in_key = true;
      append(key, static_cast<int8_t>(g_precision_override >= 0
                                          ? g_precision_override
                                          : static_cast<int>(at::globalContext().float32MatmulPrecision())));
    }
    for (size_t i = 0; i < args.size(); ++i) {
      const c10::IValue& v = args[i];
      if (traced_[i] && (v.isInt() || v.isDouble() || v.isBool()) && !is_default(v, defaults_[i])) {
        key += v.isInt() ? "Ni" : v.isDouble() ? "Nf" : "Nb";
        call.inputs.emplace_back(nullptr, number(v));
        call.numbers = true;
      } else if (!read_value(v, call)) {
        return false;
      }
      if (inplace_ && i == 0 && is_tpu(v)) {
        call.self = v.toTensor().unsafeGetTensorImpl();
        call.self_buffer = call.inputs.back().first;
      }
    }
    append(key, static_cast<int8_t>(call.device));  // a direct call does not move inputs
    return call.device >= 0;  // neither a tpu tensor nor device=tpu: not a call of ours
  }

  static bool is_default(const c10::IValue& v, const std::optional<c10::IValue>& d) {
    if (!d.has_value()) {
      return false;
    }
    if (v.isInt() && d->isInt()) {
      return v.toInt() == d->toInt();
    }
    if (v.isDouble() && d->isDouble()) {
      return v.toDouble() == d->toDouble();
    }
    return v.isBool() && d->isBool() && v.toBool() == d->toBool();
  }

  static py::object number(const c10::IValue& v) {
    if (v.isInt()) {
      return py::int_(v.toInt());
    }
    if (v.isDouble()) {
      return py::float_(v.toDouble());
    }
    return py::bool_(v.toBool());
  }

  static bool read_value(const c10::IValue& v, Call& call) {
    std::string& key = call.key;
    if (v.isTensor()) {
      return read_tensor(v.toTensor(), call, /*numbers=*/true);
    }
    if (v.isNone()) {
      key += 'n';
    } else if (v.isInt()) {
      key += 'i';
      append(key, v.toInt());
    } else if (v.isBool()) {
      key += 'b';
      append(key, v.toBool());
    } else if (v.isDouble()) {
      const double d = v.toDouble();
      key += std::isnan(d) ? 'F' : 'f';
      append(key, std::isnan(d) ? 0.0 : d);  // -0.0 and 0.0 differ in their bytes
    } else if (v.isIntList()) {
      const auto list = v.toIntVector();
      key += 'L';
      append(key, list.size());
      for (int64_t x : list) {
        append(key, x);
      }
    } else if (v.isTensorList()) {
      const auto list = v.toTensorList();
      key += 'T';
      append(key, list.size());
      for (size_t i = 0; i < list.size(); ++i) {
        if (!read_tensor(list.get(i), call, /*numbers=*/false)) {
          return false;
        }
      }
    } else if (v.isString()) {
      const auto& s = v.toStringRef();
      key += 's';
      append(key, s.size());
      key += s;
    } else if (v.isDevice()) {
      const c10::Device device = v.toDevice();
      int index = device.index();
      if (device.type() == c10::DeviceType::PrivateUse1) {  // a factory's device=tpu: where its outputs go
        index = index >= 0 ? index : core::DeviceRegistry::instance().current_device();
        if (call.device >= 0 && call.device != index) {
          return false;
        }
        call.device = index;
      }
      key += 'd';
      append(key, static_cast<int16_t>(device.type()));
      append(key, static_cast<int16_t>(index));
    } else {
      return false;  // complex numbers, generators, optional-tensor lists, ...
    }
    return true;
  }

  static bool read_tensor(const at::Tensor& t, Call& call, bool numbers) {
    std::string& key = call.key;
    if (!t.defined()) {
      key += 'u';
      return true;
    }
    if (t.device().type() != c10::DeviceType::PrivateUse1) {
      // A Python number where the op takes a tensor (`x + 2`): traced, as the Python kernel does.
      if (!numbers || !t.unsafeGetTensorImpl()->is_wrapped_number()) {
        return false;
      }
      call.numbers = true;
      switch (t.scalar_type()) {
        case at::ScalarType::Bool:
          key += "wb";
          call.inputs.emplace_back(nullptr, py::bool_(*t.const_data_ptr<bool>()));
          return true;
        case at::ScalarType::Long:
          key += "wi";
          call.inputs.emplace_back(nullptr, py::int_(*t.const_data_ptr<int64_t>()));
          return true;
        case at::ScalarType::Double:
          key += "wf";
          call.inputs.emplace_back(nullptr, py::float_(*t.const_data_ptr<double>()));
          return true;
        default:
          return false;
      }
    }
    const BufferView view = view_of(t.storage());
    DeviceBuffer& buffer = *view.buffer;
    if (&buffer == call.self_buffer && t.unsafeGetTensorImpl() != call.self) {
      // An input sharing memory with the tensor an in-place op writes (y.view(2, 3).add_(y[:3])):
      // the Python kernel applies CPU's overlap checks (a partial overlap raises).
      return false;
    }
    const at::ScalarType dtype = t.scalar_type();
    if (!t.is_conj() && !t.is_neg() && t.storage_offset() == 0 && view.offset == 0 &&
        buffer.array_dtype() == dtype && buffer.array_numel() == t.numel() && t.is_contiguous() &&
        buffer.has_shape(t.sizes())) {
      key += 't';  // the whole buffer, in its own shape
      append(key, static_cast<int8_t>(dtype));
      append(key, static_cast<int8_t>(t.dim()));
      for (int64_t s : t.sizes()) {
        append(key, s);
      }
    } else {
      // A view: the executable reads the buffer through the view's geometry and math bits.
      const size_t itemsize = t.element_size();
      if (buffer.array_dtype() == at::ScalarType::Undefined || buffer.array_numel() < 0 || view.offset % itemsize) {
        return false;
      }
      key += 'g';
      append(key, static_cast<int8_t>(dtype));
      append(key, static_cast<int8_t>(buffer.array_dtype()));
      const std::vector<int64_t>& held = buffer.array_shape();  // flat, or a tensor's shape
      append(key, static_cast<int8_t>(held.size()));
      for (int64_t s : held) {
        append(key, s);
      }
      append(key, static_cast<int8_t>(t.is_conj() | (t.is_neg() << 1)));
      append(key, static_cast<int64_t>(t.storage_offset() + view.offset / itemsize));
      append(key, static_cast<int8_t>(t.dim()));
      for (int64_t s : t.sizes()) {
        append(key, s);
      }
      for (int64_t s : t.strides()) {
        append(key, s);
      }
    }
    const int device = t.device().index();
    if (call.device >= 0 && call.device != device) {
      return false;  // the Python kernel raises the same-device error
    }
    call.device = device;
    call.inputs.emplace_back(&buffer, py::object());
    return true;
  }

  // The executable's input list; false (a Python error cleared) if a buffer cannot be read as
  // an array, or was never written (the Python kernel makes its zeros). With `device_numbers`,
  // numbers go in as device scalars (g_scalar_hook).
  static bool arrays(const Call& call, py::list& out, bool device_numbers) {
    for (const auto& [buffer, number] : call.inputs) {
      if (buffer == nullptr) {
        if (!device_numbers) {
          out.append(number);
          continue;
        }
        PyObject* scalar = PyObject_CallFunction(g_scalar_hook, "Oi", number.ptr(), call.device);
        if (scalar == nullptr) {
          PyErr_Clear();
          return false;
        }
        out.append(py::reinterpret_steal<py::object>(scalar));
        continue;
      }
      PyObject* array = buffer->array(/*force=*/true);
      if (array == nullptr) {
        PyErr_Clear();
        return false;
      }
      py::object owned = py::reinterpret_steal<py::object>(array);
      if (array == Py_None) {
        return false;
      }
      out.append(owned);
    }
    return true;
  }

  // Runs a cached entry (an in-place op's caller holds self's lock); false (nothing changed)
  // sends the call to the Python kernel.
  bool run(const Entry& entry, torch::jit::Stack* stack, Call& call) const {
    if (g_jax_checks.any_on()) {
      return false;  // the Python kernel applies jax's nan/inf checks
    }
    const auto args = torch::jit::last(stack, num_args_);
    py::list inputs;
    const bool direct = direct_call_allowed(entry, call);
    if (!arrays(call, inputs, direct && call.numbers)) {
      return false;
    }
    PyObject* out = direct ? call_direct(entry, inputs)
                           : PyObject_CallFunctionObjArgs(entry.run.ptr(), inputs.ptr(), Py_None, nullptr);
    if (out == nullptr) {
      PyErr_Clear();  // the Python kernel runs it again and raises its error (out of memory, ...)
      return false;
    }
    py::object result = py::reinterpret_steal<py::object>(out);
    const size_t expected = entry.fresh.size() + (inplace_ ? 1 : 0);
    if (!PyList_Check(out) || static_cast<size_t>(PyList_GET_SIZE(out)) != expected) {
      return false;
    }
    g_hits.fetch_add(1, std::memory_order_relaxed);
    g_executions.fetch_add(1, std::memory_order_relaxed);
    if (inplace_) {
      c10::IValue self = args[0];
      writable_buffer_of(self.toTensor().storage())
          .set_array(PyList_GET_ITEM(out, entry.fresh.size()), entry.self_dtype, entry.self_numel);
      torch::jit::drop(stack, num_args_);
      stack->push_back(std::move(self));
      return true;
    }
    torch::jit::drop(stack, num_args_);
    for (size_t i = 0; i < entry.fresh.size(); ++i) {
      const Output& o = entry.fresh[i];
      at::Tensor t = wrap_array(PyList_GET_ITEM(out, i), o.sizes, o.dtype, call.device);
      if (!o.strides.empty()) {  // the buffer holds the value in these strides' order
        t.unsafeGetTensorImpl()->set_sizes_and_strides(o.sizes, o.strides);
      }
      stack->push_back(std::move(t));
    }
    return true;
  }

  // Runs the op's host check on the call's arguments as the Python kernel would: throws its
  // error; false if it returned other arguments for the kernel.
  bool passes_check(const c10::OperatorHandle& op, c10::ArrayRef<c10::IValue> args) const {
    auto [pos, kw] = python_arguments(op.schema(), std::vector<c10::IValue>(args.begin(), args.end()));
    PyObject* result = PyObject_Call(check_, pos.ptr(), kw.ptr());
    if (result == nullptr) {
      throw python_error();
    }
    const bool same = result == Py_None;
    Py_DECREF(result);
    return same;
  }

  // Whether a background compile `job` finished; a call waiting for it counts towards its
  // rank (platforms/cpu/background_compile.py).
  static bool compiled(const py::object& job) {
    if (py::cast<bool>(job.attr("done"))) {
      return true;
    }
    job.attr("calls") = py::cast<int64_t>(job.attr("calls")) + 1;
    return false;
  }

  // Runs the call with the op's CPU kernel on its tensors' host memory (host_tier.h): in place
  // into a writable view of self's buffer, or fresh CPU results wrapped as tpu tensors. False
  // (no Python error set) if the CPU kernel raised: the Python kernel then runs the call. Also
  // false while jax's nan/inf checks are on: they apply to the executable's results only.
  bool run_on_host(const c10::OperatorHandle& op, torch::jit::Stack* stack, int device) const {
    if (g_jax_checks.any_on()) {
      return false;
    }
    const auto args = torch::jit::last(stack, num_args_);
    torch::jit::Stack host;
    host.reserve(num_args_);
    std::vector<const void*> read;  // host memory the inputs view: a result aliasing it is copied
    auto view = [&](const at::Tensor& t, bool writable) {
      at::Tensor v = host_view(t, writable);
      read.push_back(v.storage().data());
      return v;
    };
    try {
      for (size_t i = 0; i < args.size(); ++i) {
        const c10::IValue& v = args[i];
        if (is_tpu(v)) {
          host.emplace_back(view(v.toTensor(), inplace_ && i == 0));
        } else if (v.isDevice() && v.toDevice().type() == c10::DeviceType::PrivateUse1) {
          host.emplace_back(c10::Device(c10::DeviceType::CPU));  // a factory makes its result on the host
        } else if (v.isTensorList()) {
          c10::List<at::Tensor> list;
          for (const at::Tensor& t : v.toTensorList()) {
            list.push_back(t.defined() && t.device().type() == c10::DeviceType::PrivateUse1 ? view(t, false) : t);
          }
          host.emplace_back(std::move(list));
        } else {
          host.push_back(v);
        }
      }
      const HostThreads threads;
      op.callBoxed(host);
    } catch (const std::exception&) {
      PyErr_Clear();
      return false;
    }
    g_host_runs.fetch_add(1, std::memory_order_relaxed);
    if (inplace_) {
      c10::IValue self = args[0];
      torch::jit::drop(stack, num_args_);
      stack->push_back(std::move(self));
      return true;
    }
    torch::jit::drop(stack, num_args_);
    for (c10::IValue& result : host) {
      at::Tensor value = result.toTensor();
      if (!value.defined()) {  // an output the op did not make (need_weights=False, ...)
        stack->push_back(std::move(value));
        continue;
      }
      if (std::find(read.begin(), read.end(), value.storage().data()) != read.end()) {
        value = value.clone();  // the kernel handed back an input's memory: the result owns its own
      }
      stack->push_back(wrap_host(value, device));
    }
    return true;
  }

  // The executable's results for `call`, run without jax's call layer; null with a Python error
  // set if it fails.
  static PyObject* call_direct(const Entry& entry, const py::list& inputs) {
    PyObject* results = PyObject_CallOneArg(entry.execute.ptr(), inputs.ptr());
    if (results == nullptr) {
      return nullptr;
    }
    static PyObject* consume = PyUnicode_InternFromString("consume_with_handlers");
    PyObject* out = PyObject_CallMethodOneArg(results, consume, entry.handlers.ptr());
    Py_DECREF(results);
    return out;
  }

  // Whether `call` may skip jax's call layer: its numbers can go in as device scalars (else jax
  // turns them into arrays). (`run` has left jax's nan/inf checks to the Python kernel.)
  static bool direct_call_allowed(const Entry& entry, const Call& call) {
    return entry.execute && !(call.numbers && g_scalar_hook == nullptr);
  }

  // The op's Python kernel, called as torch.library calls a Python kernel; on a miss (`missed`
  // set) it may offer its executable for the call's key.
  void call_python(const c10::OperatorHandle& op, torch::jit::Stack* stack, const Call* missed) {
    std::vector<c10::IValue> arguments = torch::jit::pop(*stack, num_args_);
    auto [args, kwargs] = python_arguments(op.schema(), arguments);
    Frame frame{this, &arguments, missed != nullptr && missed->precision_in_key, nullptr};
    if (missed != nullptr) {
      g_frames.push_back(&frame);
    }
    PyObject* out = PyObject_Call(python_kernel_, args.ptr(), kwargs.ptr());
    if (missed != nullptr) {
      g_frames.pop_back();
    }
    if (out == nullptr) {
      throw python_error();
    }
    if (frame.offered != nullptr) {
      if (g_entry_count >= g_entry_limit) {
        clear_all();
      }
      g_entry_count += entries_.insert_or_assign(missed->key, std::move(frame.offered)).second ? 1 : 0;
    }
    push_python_result(op.schema(), stack, py::reinterpret_steal<py::object>(out));
  }

 public:
  static void clear_all();
  static void clear_named(const std::string& label);
  static size_t count_named(const std::string& label);

 private:
  std::string name_;
  size_t num_args_;
  std::vector<bool> traced_;
  std::vector<std::optional<c10::IValue>> defaults_;
  PyObject* python_kernel_;
  bool inplace_;
  PyObject* locks_;
  PyObject* check_;  // the host check run before each call taken here, or null
  bool reads_precision_ = false;  // the keys hold the matmul precision (see note_reads_precision)
  std::unordered_map<std::string, std::shared_ptr<const Entry>> entries_;
};

std::vector<OpState*>& all_ops() {
  static auto* ops = new std::vector<OpState*>();
  return *ops;
}

void OpState::clear_all() {
  for (OpState* op : all_ops()) {
    op->clear();
  }
}

void OpState::clear_named(const std::string& label) {
  for (OpState* op : all_ops()) {
    if (op->name() == label) {
      op->clear();
    }
  }
}

size_t OpState::count_named(const std::string& label) {
  size_t count = 0;
  for (const OpState* op : all_ops()) {
    if (op->name() == label) {
      count += op->entry_count();
    }
  }
  return count;
}

class EagerKernel final : public c10::OperatorKernel {
 public:
  explicit EagerKernel(OpState* state) : state_(state) {}
  void operator()(const c10::OperatorHandle& op, c10::DispatchKeySet /*keys*/, torch::jit::Stack* stack) {
    state_->call(op, stack);
  }

 private:
  OpState* state_;  // never freed (see OpState)
};

// The PrivateUse1 IMPL library of namespace `ns` (aten, or torch_tpu's own tpu_kernels).
torch::Library& library(const std::string& ns) {
  static auto* libs = new std::map<std::string, std::unique_ptr<torch::Library>>();
  std::unique_ptr<torch::Library>& lib = (*libs)[ns];
  if (!lib) {
    lib = std::make_unique<torch::Library>(torch::Library::IMPL, ns, c10::DispatchKey::PrivateUse1, __FILE__, __LINE__);
  }
  return *lib;
}

// `kernel` (the Python kernel of op `name`.`overload`, "ns::op") behind the fast path. `traced`: the
// Scalar arguments the Python kernel traces; `inplace`: the op writes self and returns it
// (else it returns fresh tensors); `locks`: storage_locks' table; `check`: a host check whose
// outcome depends on values (run on every call taken here), or None.
void register_eager_kernel(const std::string& label, const std::string& name, const std::string& overload,
                           const py::object& kernel, const std::vector<int64_t>& traced, bool inplace,
                           const py::object& locks, const py::object& check) {
  const c10::OperatorHandle handle = c10::Dispatcher::singleton().findSchemaOrThrow(name.c_str(), overload.c_str());
  if (g_jax_checks.get == nullptr) {
    g_jax_checks = JaxChecks::find();
  }
  auto* state = new OpState(label, handle.schema(), kernel.ptr(), traced, inplace, locks.ptr(),
                            check.is_none() ? nullptr : check.ptr());
  all_ops().push_back(state);
  const size_t separator = name.find("::");
  const std::string short_name = name.substr(separator + 2);
  const std::string impl_name = overload.empty() ? short_name : short_name + "." + overload;
  library(name.substr(0, separator))
      .impl(impl_name.c_str(), torch::CppFunction::makeFromBoxedFunctor(std::make_unique<EagerKernel>(state)));
}

using OutputSpec = std::tuple<std::vector<int64_t>, std::optional<std::vector<int64_t>>, at::ScalarType>;

// The innermost miss in progress, if it is op `label`'s call with `bound`'s tpu tensors (not a
// call its kernel rewrote) and nothing was offered for it yet; else null.
Frame* frame_of(const std::string& label, const py::list& bound) {
  if (g_frames.empty()) {
    return nullptr;
  }
  Frame& frame = *g_frames.back();
  const std::vector<c10::IValue>& args = *frame.arguments;
  if (frame.op->name() != label || frame.offered != nullptr || bound.size() != args.size()) {
    return nullptr;
  }
  for (size_t i = 0; i < args.size(); ++i) {  // the same tensors: not a call the kernel rewrote
    if (is_tpu(args[i]) && !same_impl(bound[i], args[i].toTensor())) {
      return nullptr;
    }
    if (args[i].isTensorList()) {
      const auto list = args[i].toTensorList();
      py::handle given = bound[i];
      if (!PyList_Check(given.ptr()) || static_cast<size_t>(PyList_GET_SIZE(given.ptr())) != list.size()) {
        return nullptr;
      }
      for (size_t j = 0; j < list.size(); ++j) {
        if (!same_impl(PyList_GET_ITEM(given.ptr(), j), list.get(j))) {
          return nullptr;
        }
      }
    }
  }
  return &frame;
}

// Called by the Python kernel after a miss ran: `run` is the executable for the innermost
// frame's call (see frame_of); `direct` (execute, handlers) runs it without jax's call layer,
// or is None; `reads_precision`: its trace read the matmul precision (a key without it is
// refused, and the op's keys hold it from then on). True if taken.
bool offer_eager_entry(const std::string& label, const py::list& bound, const py::object& run,
                       const std::optional<std::pair<py::object, py::object>>& direct, bool reads_precision,
                       const std::vector<OutputSpec>& fresh,
                       const std::optional<std::pair<at::ScalarType, int64_t>>& self_spec, size_t limit) {
  Frame* frame = frame_of(label, bound);
  if (frame == nullptr || frame->op->inplace() != self_spec.has_value()) {
    return false;
  }
  if (reads_precision && !frame->precision_in_key) {
    frame->op->note_reads_precision();
    return false;
  }
  auto entry = std::make_shared<Entry>();
  entry->run = run;
  if (direct.has_value()) {
    entry->execute = direct->first;
    entry->handlers = direct->second;
  }
  for (const auto& [sizes, strides, dtype] : fresh) {
    entry->fresh.push_back(Output{sizes, strides.value_or(std::vector<int64_t>{}), dtype});
  }
  if (self_spec.has_value()) {
    entry->self_dtype = self_spec->first;
    entry->self_numel = self_spec->second;
  }
  frame->offered = std::move(entry);
  g_entry_limit = limit;
  return true;
}

// Called by the Python kernel when the innermost frame's call ran on the host tier while
// `job` compiles: the key's later calls run on the host in C++ until the job is done.
bool offer_host_entry(const std::string& label, const py::list& bound, const py::object& job, size_t limit) {
  Frame* frame = frame_of(label, bound);
  if (frame == nullptr) {
    return false;
  }
  auto entry = std::make_shared<Entry>();
  entry->job = job;
  frame->offered = std::move(entry);
  g_entry_limit = limit;
  return true;
}

}  // namespace

void init_eager_kernels(py::module_& m) {
  m.def("_register_eager_kernel", &register_eager_kernel, py::arg("label"), py::arg("name"), py::arg("overload"),
        py::arg("kernel"), py::arg("traced"), py::arg("inplace"), py::arg("locks"), py::arg("check") = py::none());
  m.def("_offer_eager_entry", &offer_eager_entry, py::arg("label"), py::arg("bound"), py::arg("run"),
        py::arg("direct"), py::arg("reads_precision"), py::arg("fresh"), py::arg("self_spec"), py::arg("limit"));
  m.def("_offer_host_entry", &offer_host_entry, py::arg("label"), py::arg("bound"), py::arg("job"), py::arg("limit"));
  m.def("_set_eager_fast_path", [](bool on) { g_enabled = on; }, py::arg("on"));
  m.def(
      "_set_scalar_hook",
      [](const py::object& hook) {
        PyObject* old = g_scalar_hook;
        g_scalar_hook = hook.is_none() ? nullptr : hook.inc_ref().ptr();
        Py_XDECREF(old);
      },
      py::arg("hook"));
  m.def("_set_matmul_precision_override", [](std::optional<int> level) { g_precision_override = level.value_or(-1); },
        py::arg("level"));
  m.def("_clear_eager_entries_of", [](const std::string& label) { OpState::clear_named(label); }, py::arg("label"));
  m.def(
      "_eager_entry_count",
      [](const std::optional<std::string>& label) { return label ? OpState::count_named(*label) : g_entry_count; },
      py::arg("label") = py::none());
  m.def("_eager_counters", [] {
    return py::make_tuple(g_hits.load(std::memory_order_relaxed), g_executions.load(std::memory_order_relaxed),
                          g_host_runs.load(std::memory_order_relaxed));
  });
  m.def("_reset_eager_counters", [] {
    g_hits = 0;
    g_executions = 0;
    g_host_runs = 0;
  });
}

}  // namespace torch_tpu
