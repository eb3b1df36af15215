// torch_tpu._C: the Python face of the device surface.
#include <ATen/core/Tensor.h>
#include <c10/core/TensorImpl.h>
#include <torch/csrc/DynamicTypes.h>
#include <torch/csrc/Generator.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/utils/pybind.h>

#include <optional>
#include <string>
#include <vector>

#include "csrc/core/buffer_registry.h"
#include "csrc/core/cache_index.h"
#include "csrc/core/device_registry.h"
#include "csrc/device.h"
#include "csrc/device_buffer.h"
#include "csrc/eager_kernel.h"
#include "csrc/host_tier.h"
#include "csrc/profiler.h"

namespace py = pybind11;

namespace torch_tpu {
namespace {

c10::Storage storage_arg(const py::handle& obj) {
  if (THPVariable_Check(obj.ptr())) {
    return THPVariable_Unpack(obj.ptr()).storage();
  }
  return py::cast<c10::Storage>(obj);
}

py::object checked(PyObject* array) {
  if (array == nullptr) {
    throw py::error_already_set();
  }
  return py::reinterpret_steal<py::object>(array);
}

py::object get_buffer(const py::handle& obj) { return checked(buffer_of(storage_arg(obj)).array()); }

void set_buffer(const py::handle& obj, const py::handle& array, std::optional<at::ScalarType> dtype,
                std::optional<int64_t> numel) {
  writable_buffer_of(storage_arg(obj)).set_array(array.ptr(), dtype.value_or(at::ScalarType::Undefined), numel.value_or(-1));
}

// Where the storage's bytes start in its buffer: 0 unless it is a slice of another storage.
size_t buffer_offset(const py::handle& obj) { return view_of(storage_arg(obj)).offset; }

// Bytes of the buffer behind the storage (a slice's parent's, for a slice).
size_t buffer_nbytes(const py::handle& obj) { return buffer_of(storage_arg(obj)).nbytes(); }

// The dispatcher's per-argument fast path, one call per tensor argument:
// None for a non-tpu tensor, else (device index, buffer or None, key). The key
// is (sizes, dtype) when the tensor is its whole buffer in row-major order
// (its storage starting at the buffer's start) and the buffer has its shape,
// (sizes, dtype, buffer shape) when the buffer has another, and None when the dispatcher
// must work out the full geometry (also for a tensor with the conj or neg bit:
// the dispatcher applies the bit).
py::object arg_info(const py::handle& obj) {
  const at::Tensor& t = THPVariable_Unpack(obj.ptr());
  if (t.device().type() != c10::DeviceType::PrivateUse1) {
    return py::none();
  }
  const BufferView view = view_of(t.storage());
  DeviceBuffer& buffer = *view.buffer;
  py::object array = checked(buffer.array(/*force=*/!lazy_recording()));
  py::object key = py::none();
  if (!array.is_none() && !t.is_conj() && !t.is_neg() && t.storage_offset() == 0 && view.offset == 0 &&
      buffer.array_dtype() == t.scalar_type() &&
      buffer.array_numel() == t.numel() && t.is_contiguous()) {
    const auto sizes = t.sizes();
    py::tuple shape(sizes.size());
    for (size_t i = 0; i < sizes.size(); ++i) {
      shape[i] = py::int_(sizes[i]);
    }
    py::object dtype =
        py::reinterpret_borrow<py::object>(reinterpret_cast<PyObject*>(torch::getTHPDtype(t.scalar_type())));
    if (buffer.has_shape(sizes)) {
      key = py::make_tuple(shape, dtype);
    } else {  // the buffer holds the value in another shape (flat): the executable reads it so
      key = py::make_tuple(shape, dtype, py::tuple(py::cast(buffer.array_shape())));
    }
  }
  return py::make_tuple(static_cast<int>(t.device().index()), array, key);
}

py::dict memory_stats(int device) {
  const core::MemoryStats s = core::BufferRegistry::instance().stats(device);
  py::dict d;
  d["allocated_bytes.all.current"] = s.allocated_bytes;
  d["allocated_bytes.all.peak"] = s.peak_allocated_bytes;
  d["active.all.current"] = s.active_buffers;
  d["allocation.all.allocated"] = s.num_allocs;
  d["allocation.all.freed"] = s.num_frees;
  d["allocated_bytes.all.allocated"] = s.allocated_bytes_total;
  d["allocated_bytes.all.freed"] = s.freed_bytes_total;
  d["num_ooms"] = s.num_ooms;
  return d;
}

void set_devices(const std::vector<py::tuple>& devices) {
  std::vector<core::DeviceInfo> infos;
  for (const py::tuple& d : devices) {
    core::DeviceInfo info;
    info.index = d[0].cast<int>();
    info.kind = d[1].cast<std::string>();
    info.platform = d[2].cast<std::string>();
    info.coords = d[3].cast<std::vector<int>>();
    infos.push_back(std::move(info));
  }
  core::DeviceRegistry::instance().set_devices(std::move(infos));
}

py::object default_generator_object(int device) {
  return py::reinterpret_steal<py::object>(
      THPGenerator_initDefaultGenerator(default_generator(static_cast<c10::DeviceIndex>(device))));
}

std::pair<uint64_t, uint64_t> reserve(const std::optional<at::Generator>& generator, int device, uint64_t increment) {
  if (generator.has_value()) {
    return reserve_random(*generator, increment);
  }
  return reserve_random(default_generator(static_cast<c10::DeviceIndex>(device)), increment);
}

}  // namespace
}  // namespace torch_tpu

PYBIND11_MODULE(_C, m) {
  using namespace torch_tpu;
  m.doc() = "torch_tpu native device surface";
  m.def("_register_device", &register_device);
  m.def("_set_devices", &set_devices, py::arg("devices"));
  m.def("_device_count", [] { return core::DeviceRegistry::instance().device_count(); });
  m.def("_current_device", [] { return core::DeviceRegistry::instance().current_device(); });
  m.def("_set_current_device", [](int i) { core::DeviceRegistry::instance().set_current_device(i); });
  m.def("_device_info", [](int i) {
    const core::DeviceInfo d = core::DeviceRegistry::instance().device(i);
    return py::make_tuple(d.index, d.kind, d.platform, d.coords);
  });

  m.def("_get_buffer", &get_buffer, py::arg("storage"));
  m.def("_set_buffer", &set_buffer, py::arg("storage"), py::arg("array"), py::arg("dtype") = py::none(),
        py::arg("numel") = py::none());
  m.def("_buffer_offset", &buffer_offset, py::arg("storage"));
  m.def("_buffer_nbytes", &buffer_nbytes, py::arg("storage"));
  m.def("_arg_info", &arg_info, py::arg("tensor"));
  m.def("_set_lazy_hook", [](const py::object& type, const py::object& resolver) {
    set_lazy_hook(type.is_none() ? nullptr : type.ptr(), type.is_none() ? nullptr : resolver.ptr());
  }, py::arg("type"), py::arg("resolver"));
  m.def("_set_lazy_recording", &set_lazy_recording, py::arg("on"));
  m.def("_wrap", [](const py::handle& array, const std::vector<int64_t>& sizes, at::ScalarType dtype, int device) {
    return wrap_array(array.ptr(), sizes, dtype, device);
  }, py::arg("array"), py::arg("sizes"), py::arg("dtype"), py::arg("device"));

  init_eager_kernels(m);
  init_host_tier(m);

  m.def("_memory_stats", &memory_stats, py::arg("device"));
  m.def("_live_buffers", &live_buffers);
  m.def("_reset_peak_memory_stats", [](int d) { core::BufferRegistry::instance().reset_peak(d); });
  m.def("_set_memory_limit", [](int d, int64_t limit) { core::BufferRegistry::instance().set_limit(d, limit); },
        py::arg("device"), py::arg("limit"));
  m.def("_memory_limit", [](int d) { return core::BufferRegistry::instance().limit(d); }, py::arg("device"));
  m.def("_set_memory_capacity",
        [](int d, int64_t capacity) { core::BufferRegistry::instance().set_capacity(d, capacity); },
        py::arg("device"), py::arg("capacity"));
  m.def("_memory_capacity", [](int d) { return core::BufferRegistry::instance().capacity(d); }, py::arg("device"));
  m.def("_set_memory_info_hook", [](const py::object& hook) { set_memory_info_hook(hook.ptr()); }, py::arg("hook"));
  m.def("_set_synchronize_hook", [](const py::object& hook) { set_synchronize_hook(hook.ptr()); }, py::arg("hook"));
  m.def("_start_trace_annotations", [](const py::object& enter, bool ops) { start_trace_annotations(enter.ptr(), ops); },
        py::arg("enter"), py::arg("ops"));
  m.def("_stop_trace_annotations", &stop_trace_annotations);

  m.def("_default_generator", &default_generator_object, py::arg("device"));
  m.def("_reserve_random", &reserve, py::arg("generator"), py::arg("device"), py::arg("increment"));

  py::class_<core::CacheIndex>(m, "CacheIndex")
      .def(py::init<std::string>(), py::arg("directory"))
      .def_property_readonly("directory", &core::CacheIndex::directory)
      .def("get",
           [](const core::CacheIndex& c, const std::string& key) -> py::object {
             std::optional<std::string> v = c.get(key);
             if (!v) {
               return py::none();
             }
             return py::bytes(*v);
           })
      .def("put", [](const core::CacheIndex& c, const std::string& key,
                     const py::bytes& value) { return c.put(key, std::string(value)); })
      .def("__contains__", &core::CacheIndex::contains)
      .def("summary",
           [](const core::CacheIndex& c) {
             const auto s = c.summary();
             return py::make_tuple(s.entries, s.bytes);
           })
      .def("clear", &core::CacheIndex::clear);
}
