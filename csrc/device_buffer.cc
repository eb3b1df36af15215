#include "csrc/device_buffer.h"

#include <c10/core/DeviceType.h>
#include <c10/util/Exception.h>

#include "csrc/core/buffer_registry.h"
#include "csrc/core/device_registry.h"

namespace torch_tpu {
namespace {

using core::BufferRegistry;

void delete_buffer(void* ctx) { delete static_cast<DeviceBuffer*>(ctx); }

class TpuAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t nbytes) override {
    return allocate_buffer(core::DeviceRegistry::instance().current_device(), nbytes);
  }
  c10::DeleterFnPtr raw_deleter() const override { return nullptr; }
  void copy_data(void* /*dest*/, const void* /*src*/, std::size_t /*count*/) const override {
    TORCH_CHECK(false, "tpu storages have no host memory to copy; use tensor.copy_() or .cpu()");
  }
};

TpuAllocator g_allocator;

}  // namespace

DeviceBuffer::DeviceBuffer(int device, size_t nbytes)
    : device_(device), nbytes_(nbytes), address_(BufferRegistry::instance().on_alloc(device, nbytes)) {}

DeviceBuffer::~DeviceBuffer() {
  BufferRegistry::instance().on_free(device_, address_, nbytes_);
  if (array_ != nullptr && Py_IsInitialized()) {
    PyGILState_STATE state = PyGILState_Ensure();
    Py_DECREF(array_);
    PyGILState_Release(state);
  }
}

PyObject* DeviceBuffer::array() const {
  PyObject* result = array_ != nullptr ? array_ : Py_None;
  Py_INCREF(result);
  return result;
}

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
  Py_XDECREF(old);
}

c10::Allocator* tpu_allocator() { return &g_allocator; }

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

DeviceBuffer& buffer_of(const c10::Storage& storage) {
  const c10::DataPtr& ptr = storage.data_ptr();
  TORCH_CHECK(ptr.device().type() == c10::DeviceType::PrivateUse1 && ptr.get_deleter() == &delete_buffer,
              "expected a tpu storage, got one on ", ptr.device());
  return *static_cast<DeviceBuffer*>(ptr.get_context());
}

void resize_storage_bytes(const c10::Storage& storage, size_t new_nbytes) {
  TORCH_CHECK(storage.resizable(), "Trying to resize storage that is not resizable");
  const c10::DataPtr& old_ptr = storage.data_ptr();
  const int device = old_ptr.device().index();
  c10::DataPtr new_ptr = allocate_buffer(device, new_nbytes);
  if (old_ptr.get_deleter() == &delete_buffer) {
    PyGILState_STATE state = PyGILState_Ensure();
    PyObject* array = buffer_of(storage).array();
    // The array keeps its old length; reads pad it to the new size.
    static_cast<DeviceBuffer*>(new_ptr.get_context())
        ->set_array(array, buffer_of(storage).array_dtype(), buffer_of(storage).array_numel());
    Py_DECREF(array);
    PyGILState_Release(state);
  }
  storage.unsafeGetStorageImpl()->set_data_ptr_noswap(std::move(new_ptr));
  storage.unsafeGetStorageImpl()->set_nbytes(new_nbytes);
}

}  // namespace torch_tpu
