// The host tier's tensor moves (see host_tier.h).
#include "csrc/host_tier.h"

#include <ATen/Parallel.h>
#include <c10/core/DispatchKeySet.h>
#include <c10/core/TensorImpl.h>
#include <c10/util/Exception.h>

#include <optional>
#include <utility>

#include "csrc/device_buffer.h"

namespace py = pybind11;

namespace torch_tpu {

bool host_readable(const at::Tensor& t) {
  if (t.is_conj() || t.is_neg()) {
    return false;
  }
  const BufferView view = view_of(t.storage());
  const DeviceBuffer& buffer = *view.buffer;
  if (view.offset % t.element_size() != 0) {
    return false;
  }
  if (!buffer.written() || buffer.array_dtype() == t.scalar_type()) {
    return true;
  }
  // A buffer of another dtype (a complex tensor over a float buffer, after view_as_complex or
  // view(dtype)): read through a dtype view of its bytes.
  if (buffer.array_dtype() == c10::ScalarType::Undefined || buffer.array_numel() < 0) {
    return false;
  }
  const int64_t nbytes = buffer.array_numel() * static_cast<int64_t>(c10::elementSize(buffer.array_dtype()));
  return nbytes % static_cast<int64_t>(t.element_size()) == 0;
}

at::Tensor host_view(const at::Tensor& t, bool writable) {
  TORCH_CHECK(host_readable(t), "torch_tpu: the host tier cannot read this tensor");
  if (writable) {
    writable_buffer_of(t.storage());
  }
  const BufferView view = view_of(t.storage());
  at::Tensor flat = writable ? view.buffer->host_for_write(t.scalar_type()) : view.buffer->host();
  if (!flat.defined()) {  // never written: zeros, as every read of it gives
    flat = view.buffer->host_for_write(t.scalar_type());
  }
  if (flat.scalar_type() != t.scalar_type()) {
    flat = flat.view(t.scalar_type());  // the same bytes (host_readable checked the length)
  }
  const int64_t offset = t.storage_offset() + static_cast<int64_t>(view.offset / t.element_size());
  return flat.as_strided(t.sizes(), t.strides(), offset);
}

HostThreads::HostThreads() : saved_(at::get_num_threads()) {
  if (saved_ > 1) {
    at::set_num_threads(saved_ - 1);
  }
}

HostThreads::~HostThreads() {
  if (saved_ > 1) {
    at::set_num_threads(saved_);
  }
}

at::Tensor wrap_host(const at::Tensor& value, int device) {
  TORCH_CHECK(value.device().is_cpu(), "torch_tpu: wrap_host takes a CPU tensor");
  const int64_t itemsize = static_cast<int64_t>(value.element_size());
  const int64_t numel = static_cast<int64_t>(value.storage().nbytes()) / itemsize;
  at::Tensor flat = value.as_strided({numel}, {1}, 0);
  const size_t nbytes = static_cast<size_t>(numel * itemsize);
  c10::Storage storage(c10::Storage::use_byte_size_t(), nbytes, allocate_buffer(device, nbytes), tpu_allocator(),
                       /*resizable=*/true);
  static_cast<DeviceBuffer*>(storage.data_ptr().get_context())->set_host(std::move(flat));
  at::Tensor t = at::detail::make_tensor<c10::TensorImpl>(
      std::move(storage), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), value.dtype());
  t.unsafeGetTensorImpl()->set_sizes_and_strides(value.sizes(), value.strides(), value.storage_offset());
  return t;
}

namespace {

// HostThreads as a Python context manager, for the host-tier calls Python makes.
class HostThreadsScope {
 public:
  void enter() { threads_.emplace(); }
  void exit() { threads_.reset(); }

 private:
  std::optional<HostThreads> threads_;
};

}  // namespace

void init_host_tier(py::module_& m) {
  py::class_<HostThreadsScope>(m, "_HostThreads")
      .def(py::init<>())
      .def("__enter__", [](HostThreadsScope& s) { s.enter(); })
      .def("__exit__", [](HostThreadsScope& s, const py::args&) {
        s.exit();
        return false;
      });
  m.def("_host_readable", &host_readable, py::arg("tensor"));
  m.def("_host_view", &host_view, py::arg("tensor"), py::arg("writable") = false);
  m.def("_wrap_host", &wrap_host, py::arg("value"), py::arg("device"));
  // Makes flat CPU tensor `flat` the value of `tensor`'s buffer (it may be longer than the
  // storage: a growing tensor's padded buffer, ops/growing.py).
  m.def("_set_host", [](const at::Tensor& t, at::Tensor flat) {
    TORCH_CHECK(flat.device().is_cpu() && flat.dim() == 1 && flat.is_contiguous(), "expected a flat CPU tensor");
    writable_buffer_of(t.storage()).set_host(std::move(flat));
  }, py::arg("tensor"), py::arg("flat"));
  m.def("_release_host_view", [](const at::Tensor& t) { return buffer_of(t.storage()).release_host_view(); },
        py::arg("tensor"));
  // (dtype, shape) of the value `tensor`'s buffer holds, without reading it: (None, None) when
  // unknown or never written.
  m.def("_buffer_spec", [](const at::Tensor& t) -> std::pair<std::optional<at::ScalarType>, py::object> {
    const DeviceBuffer& buffer = buffer_of(t.storage());
    if (!buffer.written() || buffer.array_dtype() == c10::ScalarType::Undefined) {
      return {std::nullopt, py::none()};
    }
    return {buffer.array_dtype(), py::tuple(py::cast(buffer.array_shape()))};
  }, py::arg("tensor"));
  m.def("_set_host_hooks", [](const py::object& to_dlpack, const py::object& from_dlpack, const py::object& jax_device) {
    set_host_hooks(to_dlpack.ptr(), from_dlpack.ptr(), jax_device.ptr());
  }, py::arg("to_dlpack"), py::arg("from_dlpack"), py::arg("jax_device"));
}

}  // namespace torch_tpu
