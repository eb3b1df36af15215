#include "csrc/device_buffer.h"

#include <ATen/DLConvertor.h>
#include <ATen/dlpack.h>
#include <c10/core/CachingDeviceAllocator.h>
#include <c10/core/DispatchKeySet.h>
#include <c10/core/TensorImpl.h>
#include <c10/core/DeviceType.h>
#include <c10/core/impl/COW.h>
#include <c10/core/impl/COWDeleter.h>
#include <c10/util/Exception.h>
#include <c10/util/ParallelGuard.h>
#include <torch/csrc/Exceptions.h>

#include <iterator>
#include <map>
#include <mutex>
#include <utility>
#include <variant>
#include <vector>

#include "csrc/core/buffer_registry.h"
#include "csrc/core/device_registry.h"

namespace torch_tpu {
namespace {

using core::BufferRegistry;

void delete_buffer(void* ctx) { delete static_cast<DeviceBuffer*>(ctx); }

PyObject* g_memory_info_hook = nullptr;  // owned reference, or null
PyObject* g_lazy_type = nullptr;         // owned references, or null
PyObject* g_lazy_resolver = nullptr;
bool g_lazy_recording = false;
PyObject* g_to_dlpack = nullptr;  // owned references, or null (see set_host_hooks)
PyObject* g_from_dlpack = nullptr;
PyObject* g_jax_device = nullptr;
std::vector<PyObject*> g_jax_devices;  // by tpu index, owned, filled on first use

void dlpack_capsule_destructor(PyObject* capsule) {
  if (PyCapsule_IsValid(capsule, "used_dltensor")) {
    return;  // its consumer owns the tensor
  }
  auto* managed = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule, "dltensor"));
  if (managed != nullptr && managed->deleter != nullptr) {
    managed->deleter(managed);
  }
  PyErr_Clear();
}

// A CPU tensor over a jax array's memory (it waits for the array to be computed).
at::Tensor array_to_host(PyObject* array) {
  TORCH_CHECK(g_to_dlpack != nullptr, "torch_tpu: the host tier is not set up");
  PyObject* capsule = PyObject_CallOneArg(g_to_dlpack, array);
  if (capsule == nullptr) {
    throw python_error();
  }
  auto* managed = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule, "dltensor"));
  if (managed == nullptr) {
    Py_DECREF(capsule);
    throw python_error();
  }
  PyCapsule_SetName(capsule, "used_dltensor");
  Py_DECREF(capsule);
  return at::fromDLPack(managed);
}

// A jax array on tpu device `device` over a flat CPU tensor's memory; new reference, or null
// with a Python error set.
PyObject* host_to_array(const at::Tensor& flat, int device) {
  if (g_from_dlpack == nullptr) {
    PyErr_SetString(PyExc_RuntimeError, "torch_tpu: the host tier is not set up");
    return nullptr;
  }
  if (static_cast<size_t>(device) >= g_jax_devices.size()) {
    g_jax_devices.resize(device + 1, nullptr);
  }
  if (g_jax_devices[device] == nullptr) {
    g_jax_devices[device] = PyObject_CallFunction(g_jax_device, "i", device);
    if (g_jax_devices[device] == nullptr) {
      return nullptr;
    }
  }
  PyObject* capsule = PyCapsule_New(at::toDLPack(flat), "dltensor", dlpack_capsule_destructor);
  if (capsule == nullptr) {
    return nullptr;
  }
  PyObject* array = PyObject_CallFunctionObjArgs(g_from_dlpack, capsule, g_jax_devices[device], Py_None, nullptr);
  Py_DECREF(capsule);
  return array;
}

// Live buffers by fake address, so a storage that only points into one (a slice) finds it.
std::mutex g_live_mutex;
std::map<uintptr_t, DeviceBuffer*> g_live;

c10::CachingAllocator::Stat stat(int64_t current, int64_t peak, int64_t allocated, int64_t freed) {
  c10::CachingAllocator::Stat s;
  s.current = current;
  s.peak = peak;
  s.allocated = allocated;
  s.freed = freed;
  return s;
}

class TpuAllocator final : public c10::DeviceAllocator {
 public:
  c10::DataPtr allocate(size_t nbytes) override {
    return allocate_buffer(core::DeviceRegistry::instance().current_device(), nbytes);
  }
  c10::DeleterFnPtr raw_deleter() const override { return nullptr; }
  // A buffer's own DataPtr: c10's copy-on-write may wrap it (see materialize_lazy_clone).
  bool is_simple_data_ptr(const c10::DataPtr& ptr) const override { return ptr.get_deleter() == &delete_buffer; }
  void copy_data(void* /*dest*/, const void* /*src*/, std::size_t /*count*/) const override {
    TORCH_CHECK(false, "tpu storages have no host memory to copy; use tensor.copy_() or .cpu()");
  }

  // Buffers are freed when their storage dies: nothing is cached, and reserved equals allocated.
  bool initialized() override { return true; }
  void emptyCache(c10::MempoolId_t /*mempool_id*/) override {}
  void recordStream(const c10::DataPtr& /*ptr*/, c10::Stream /*stream*/) override {}
  c10::CachingDeviceAllocator::DeviceStats getDeviceStats(c10::DeviceIndex device) override {
    const core::MemoryStats m = BufferRegistry::instance().stats(device);
    c10::CachingDeviceAllocator::DeviceStats stats;
    const auto all = static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE);
    const auto bytes =
        stat(m.allocated_bytes, m.peak_allocated_bytes, m.allocated_bytes_total, m.freed_bytes_total);
    stats.allocated_bytes[all] = bytes;
    stats.reserved_bytes[all] = bytes;
    stats.active_bytes[all] = bytes;
    stats.requested_bytes[all] = bytes;
    const auto buffers = stat(m.active_buffers, m.active_buffers, m.num_allocs, m.num_frees);
    stats.allocation[all] = buffers;
    stats.segment[all] = buffers;
    stats.active[all] = buffers;
    stats.num_ooms = m.num_ooms;
    return stats;
  }
  void resetAccumulatedStats(c10::DeviceIndex device) override { BufferRegistry::instance().reset_accumulated(device); }
  void resetPeakStats(c10::DeviceIndex device) override { BufferRegistry::instance().reset_peak(device); }
  std::pair<size_t, size_t> getMemoryInfo(c10::DeviceIndex device) override {
    PyGILState_STATE state = PyGILState_Ensure();
    unsigned long long free_bytes = 0, total_bytes = 0;
    PyObject* result =
        g_memory_info_hook != nullptr ? PyObject_CallFunction(g_memory_info_hook, "i", static_cast<int>(device)) : nullptr;
    const bool ok = result != nullptr && PyArg_ParseTuple(result, "KK", &free_bytes, &total_bytes);
    Py_XDECREF(result);
    std::string error = "torch.tpu.mem_get_info is not available";
    if (!ok && PyErr_Occurred()) {
      PyObject *type, *value, *traceback;
      PyErr_Fetch(&type, &value, &traceback);
      PyObject* text = value != nullptr ? PyObject_Str(value) : nullptr;
      if (text != nullptr && PyUnicode_Check(text)) {
        error = PyUnicode_AsUTF8(text);
      }
      Py_XDECREF(text);
      Py_XDECREF(type);
      Py_XDECREF(value);
      Py_XDECREF(traceback);
    }
    PyGILState_Release(state);
    TORCH_CHECK(ok, error);
    return {static_cast<size_t>(free_bytes), static_cast<size_t>(total_bytes)};
  }
};

TpuAllocator g_allocator;

}  // namespace

DeviceBuffer::DeviceBuffer(int device, size_t nbytes)
    : device_(device), nbytes_(nbytes), address_(BufferRegistry::instance().on_alloc(device, nbytes)) {
  std::lock_guard<std::mutex> lock(g_live_mutex);
  g_live[address_] = this;
}

DeviceBuffer::~DeviceBuffer() {
  {
    // Before on_free: the address may be handed out again from then on.
    std::lock_guard<std::mutex> lock(g_live_mutex);
    auto it = g_live.find(address_);
    if (it != g_live.end() && it->second == this) {
      g_live.erase(it);
    }
  }
  BufferRegistry::instance().on_free(device_, address_, nbytes_);
  if ((array_ != nullptr || host_.defined()) && Py_IsInitialized()) {
    PyGILState_STATE state = PyGILState_Ensure();  // host_ may be a view of an array
    host_.reset();
    Py_XDECREF(array_);
    PyGILState_Release(state);
  }
}

PyObject* DeviceBuffer::array(bool force) {
  while (array_ == nullptr && host_.defined()) {  // the host tier's value: its array shares its memory
    const at::Tensor value = host_;
    PyObject* array = host_to_array(value, device_);  // may let another thread run
    if (array == nullptr) {
      return nullptr;
    }
    if (array_ == nullptr && host_.is_same(value)) {
      array_ = array;
      host_shared_ = true;
    } else {
      Py_DECREF(array);  // another thread wrote a new value meanwhile: read that one
    }
  }
  if (array_ != nullptr && g_lazy_type != nullptr && reinterpret_cast<PyObject*>(Py_TYPE(array_)) == g_lazy_type) {
    PyObject* value = PyObject_CallFunction(g_lazy_resolver, "OO", array_, force ? Py_True : Py_False);
    if (value == nullptr) {
      return nullptr;
    }
    if (value != array_) {  // resolved: the storage holds the concrete array from now on
      set_array(value, array_dtype_, array_numel_);
    }
    return value;
  }
  PyObject* result = array_ != nullptr ? array_ : Py_None;
  Py_INCREF(result);
  return result;
}

at::Tensor DeviceBuffer::host() {
  while (!host_.defined()) {
    PyObject* array = this->array(/*force=*/true);
    if (array == nullptr) {
      throw python_error();
    }
    if (array == Py_None) {
      Py_DECREF(array);
      return {};
    }
    at::Tensor value;
    try {
      value = array_to_host(array);  // may let another thread run
      if (value.dim() != 1) {
        value = value.reshape({-1});  // a shaped buffer: its row-major elements (a view)
      }
    } catch (...) {
      Py_DECREF(array);
      throw;
    }
    if (!host_.defined() && array_ == array) {
      const int64_t length = static_cast<int64_t>(nbytes_ / value.element_size());
      if (value.numel() < length) {  // a resized storage's shorter array: reads pad it with zeros
        at::Tensor padded = at::zeros({length}, value.options());
        padded.narrow(0, 0, value.numel()).copy_(value);
        Py_DECREF(array);
        set_host(std::move(padded));
        continue;
      }
      host_ = std::move(value);
      host_shared_ = true;
    }  // else another thread wrote a new value meanwhile: read that one
    Py_DECREF(array);
  }
  return host_;
}

at::Tensor DeviceBuffer::host_for_write(c10::ScalarType dtype) {
  at::Tensor flat = host();
  if (!flat.defined()) {
    flat = at::zeros({static_cast<int64_t>(nbytes_ / c10::elementSize(dtype))}, at::TensorOptions().dtype(dtype));
    set_host(flat);
  } else if (host_shared_) {
    flat = flat.clone();
    set_host(flat);
  }
  return flat;
}

void DeviceBuffer::share_value_of(DeviceBuffer& other) {
  if (other.array_ != nullptr) {
    set_array(other.array_, other.array_dtype_, other.array_numel_);
  } else if (other.host_.defined()) {
    set_host(other.host_.clone());
  }  // else never written: this one reads as zeros too
}

bool DeviceBuffer::release_host_view() {
  if (!host_shared_) {
    return false;
  }
  host_ = at::Tensor();
  host_shared_ = false;
  return true;
}

void DeviceBuffer::set_host(at::Tensor flat) {
  PyObject* old = array_;
  array_ = nullptr;
  array_dtype_ = flat.scalar_type();
  array_numel_ = flat.numel();
  array_shape_.assign(1, array_numel_);
  host_ = std::move(flat);
  host_shared_ = false;
  Py_XDECREF(old);
}

void set_host_hooks(PyObject* to_dlpack, PyObject* from_dlpack, PyObject* jax_device) {
  for (PyObject** slot : {&g_to_dlpack, &g_from_dlpack, &g_jax_device}) {
    Py_XDECREF(*slot);
  }
  for (PyObject*& device : g_jax_devices) {
    Py_XDECREF(device);
  }
  g_jax_devices.clear();
  Py_INCREF(to_dlpack);
  Py_INCREF(from_dlpack);
  Py_INCREF(jax_device);
  g_to_dlpack = to_dlpack;
  g_from_dlpack = from_dlpack;
  g_jax_device = jax_device;
}

void set_lazy_hook(PyObject* type, PyObject* resolver) {
  Py_XINCREF(type);
  Py_XINCREF(resolver);
  Py_XDECREF(g_lazy_type);
  Py_XDECREF(g_lazy_resolver);
  g_lazy_type = type;
  g_lazy_resolver = resolver;
}

void set_lazy_recording(bool on) { g_lazy_recording = on; }
bool lazy_recording() { return g_lazy_recording; }

namespace {

// `array.shape` (a jax.Array's or a lazy value's), or {numel} where it has none.
std::vector<int64_t> shape_of(PyObject* array, int64_t numel) {
  std::vector<int64_t> dims;
  bool known = false;
  PyObject* shape = PyObject_GetAttrString(array, "shape");
  if (shape != nullptr && PyTuple_Check(shape)) {
    known = true;
    int64_t product = 1;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(shape); ++i) {
      const long long d = PyLong_AsLongLong(PyTuple_GET_ITEM(shape, i));
      if (d < 0) {
        known = false;
        break;
      }
      dims.push_back(d);
      product *= d;
    }
    known = known && product == numel;
  }
  Py_XDECREF(shape);
  PyErr_Clear();
  if (!known) {
    dims.assign(1, numel);  // no usable shape: described as flat
  }
  return dims;
}

}  // namespace

void DeviceBuffer::set_array(PyObject* array, c10::ScalarType dtype, int64_t numel) {
  PyObject* old = array_;
  if (array == Py_None) {
    array_ = nullptr;
    dtype = c10::ScalarType::Undefined;
    numel = -1;
  } else {
    Py_INCREF(array);
    array_ = array;
  }
  array_dtype_ = dtype;
  array_numel_ = numel;
  if (numel >= 0 && array_ != nullptr) {
    array_shape_ = shape_of(array_, numel);
  } else {
    array_shape_.clear();
  }
  host_.reset();
  host_shared_ = false;
  Py_XDECREF(old);
}

c10::Allocator* tpu_allocator() { return &g_allocator; }

void set_memory_info_hook(PyObject* hook) {
  Py_XINCREF(hook);
  PyObject* old = g_memory_info_hook;
  g_memory_info_hook = hook == Py_None ? nullptr : hook;
  if (hook == Py_None) {
    Py_DECREF(hook);
  }
  Py_XDECREF(old);
}

c10::DataPtr allocate_buffer(int device, size_t nbytes) {
  DeviceBuffer* buffer = nullptr;
  try {
    buffer = new DeviceBuffer(device, nbytes);
  } catch (const core::OutOfMemory& e) {
    // Surfaces in Python as torch.OutOfMemoryError, as on CUDA.
    TORCH_CHECK_WITH(OutOfMemoryError, false, e.what());
  }
  return c10::DataPtr(buffer->address(), buffer, &delete_buffer,
                      c10::Device(c10::DeviceType::PrivateUse1, static_cast<c10::DeviceIndex>(device)));
}

namespace {

BufferView view_at(const c10::DataPtr& ptr, size_t nbytes) {
  TORCH_CHECK(ptr.device().type() == c10::DeviceType::PrivateUse1, "expected a tpu storage, got one on ",
              ptr.device());
  if (ptr.get_deleter() == &delete_buffer) {
    return {static_cast<DeviceBuffer*>(ptr.get_context()), 0};
  }
  // Not its own buffer (a slice, a lazy clone): its bytes must lie inside a live one, which
  // its owner keeps alive.
  const auto address = reinterpret_cast<uintptr_t>(ptr.get());
  std::lock_guard<std::mutex> lock(g_live_mutex);
  auto it = g_live.upper_bound(address);
  if (it != g_live.begin()) {
    DeviceBuffer* buffer = std::prev(it)->second;
    const size_t offset = address - std::prev(it)->first;
    if (offset + nbytes <= buffer->nbytes()) {
      return {buffer, offset};
    }
  }
  TORCH_CHECK(false, "tpu storage at ", ptr.get(), " (", nbytes, " bytes) is not inside a live tpu buffer");
}

}  // namespace

std::vector<std::tuple<int, uintptr_t, size_t>> live_buffers() {
  std::lock_guard<std::mutex> lock(g_live_mutex);
  std::vector<std::tuple<int, uintptr_t, size_t>> out;
  out.reserve(g_live.size());
  for (const auto& [address, buffer] : g_live) {
    out.emplace_back(buffer->device(), address, buffer->nbytes());
  }
  return out;
}

BufferView view_of(const c10::Storage& storage) { return view_at(storage.data_ptr(), storage.nbytes()); }

DeviceBuffer& buffer_of(const c10::Storage& storage) { return *view_of(storage).buffer; }

DeviceBuffer& writable_buffer_of(const c10::Storage& storage) {
  c10::StorageImpl* impl = storage.unsafeGetStorageImpl();
  if (impl->has_materializer()) {
    impl->mutable_data();  // runs it
  }
  return buffer_of(storage);
}

void materialize_lazy_clone(c10::StorageImpl* storage) {
  using c10::impl::cow::COWDeleterContext;
  TORCH_CHECK(!c10::ParallelGuard::is_enabled(),
              "Materializing a storage in the loop function of at::parallel_for is forbidden");
  const c10::DataPtr& ptr = storage->data_ptr();
  if (!c10::impl::cow::is_cow_data_ptr(ptr)) {
    return;  // its memory was replaced meanwhile (resize_)
  }
  auto* context = ptr.cast_context<COWDeleterContext>(&c10::impl::cow::cow_deleter);
  const int device = ptr.device().index();
  c10::DataPtr own;
  auto reference = context->decrement_refcount();
  if (auto* last = std::get_if<COWDeleterContext::LastReference>(&reference)) {
    TORCH_INTERNAL_ASSERT(last->get_deleter() == &delete_buffer);
    auto* buffer = static_cast<DeviceBuffer*>(last->release());
    own = c10::DataPtr(buffer->address(), buffer, &delete_buffer, ptr.device());
  } else {  // others share it: a new buffer with the same value (the shared lock keeps the source)
    PyGILState_STATE state = PyGILState_Ensure();
    try {
      own = allocate_buffer(device, storage->nbytes());
      static_cast<DeviceBuffer*>(own.get_context())->share_value_of(*view_at(ptr, storage->nbytes()).buffer);
    } catch (...) {
      PyGILState_Release(state);
      context->increment_refcount();  // still a clone: the hook stays and the next write retries
      throw;
    }
    PyGILState_Release(state);
  }
  // The old DataPtr's reference was dropped above: release it without running its deleter.
  storage->_mutable_data_ptr_no_checks().release_context();
  storage->set_data_ptr_noswap(std::move(own));
}

at::Tensor wrap_array(PyObject* array, const std::vector<int64_t>& sizes, c10::ScalarType dtype, int device) {
  int64_t numel = 1;
  for (int64_t s : sizes) {
    numel *= s;
  }
  const size_t nbytes = static_cast<size_t>(numel) * c10::elementSize(dtype);
  c10::Storage storage(c10::Storage::use_byte_size_t(), nbytes, allocate_buffer(device, nbytes), tpu_allocator(),
                       /*resizable=*/true);
  static_cast<DeviceBuffer*>(storage.data_ptr().get_context())->set_array(array, dtype, numel);
  at::Tensor t = at::detail::make_tensor<c10::TensorImpl>(std::move(storage),
                                                         c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                                         c10::scalarTypeToTypeMeta(dtype));
  t.unsafeGetTensorImpl()->set_sizes_contiguous(sizes);
  return t;
}

void resize_storage_bytes(const c10::Storage& storage, size_t new_nbytes) {
  TORCH_CHECK(storage.resizable(), "Trying to resize storage that is not resizable");
  const c10::DataPtr& old_ptr = storage.data_ptr();
  const int device = old_ptr.device().index();
  c10::DataPtr new_ptr = allocate_buffer(device, new_nbytes);
  const bool lazy_clone = c10::impl::cow::is_cow_data_ptr(old_ptr);
  if (old_ptr.get_deleter() == &delete_buffer || lazy_clone) {
    PyGILState_STATE state = PyGILState_Ensure();
    PyObject* array = buffer_of(storage).array(/*force=*/false);
    if (array == nullptr) {
      PyErr_Clear();
      array = Py_None;
      Py_INCREF(array);
    }
    // The array keeps its old length; reads pad it to the new size.
    static_cast<DeviceBuffer*>(new_ptr.get_context())
        ->set_array(array, buffer_of(storage).array_dtype(), buffer_of(storage).array_numel());
    Py_DECREF(array);
    PyGILState_Release(state);
  }
  storage.unsafeGetStorageImpl()->set_data_ptr_noswap(std::move(new_ptr));  // drops a clone's reference
  if (lazy_clone) {
    storage.unsafeGetStorageImpl()->clear_materializer();
  }
  storage.unsafeGetStorageImpl()->set_nbytes(new_nbytes);
}

}  // namespace torch_tpu
