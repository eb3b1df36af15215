// The device buffer handle: what a tpu storage's DataPtr owns.
#pragma once

#include <ATen/core/Tensor.h>
#include <Python.h>
#include <c10/core/Allocator.h>
#include <c10/core/ScalarType.h>
#include <c10/core/Storage.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <tuple>
#include <vector>

namespace torch_tpu {

// Holds the storage's current jax.Array (flat and storage-sized, or shaped as the tensor
// that wrote it: ops/geometry.py) and a fake
// address from the core registry. The array may be null: storage that was
// allocated but never written (torch.empty) reads as zeros.
class DeviceBuffer {
 public:
  DeviceBuffer(int device, size_t nbytes);
  ~DeviceBuffer();
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  int device() const { return device_; }
  size_t nbytes() const { return nbytes_; }
  void* address() const { return reinterpret_cast<void*>(address_); }

  // New reference, or Py_None. Caller holds the GIL. A pending lazy value
  // (see set_lazy_hook) is resolved first: always when `force`, else only
  // when it already has its value. Null with a Python error set if that fails.
  PyObject* array(bool force = true);
  // Increments `array`. `dtype`/`numel` describe it when the caller knows them
  // (Undefined/-1 otherwise); they let the dispatcher take its fast path.
  // Caller holds the GIL.
  void set_array(PyObject* array, c10::ScalarType dtype = c10::ScalarType::Undefined, int64_t numel = -1);
  bool written() const { return array_ != nullptr || host_.defined(); }  // else it reads as zeros
  bool has_array() const { return array_ != nullptr; }  // a jax array or a lazy value (not a host value)
  c10::ScalarType array_dtype() const { return array_dtype_; }
  int64_t array_numel() const { return array_numel_; }
  // The array's shape where its dtype and numel are known (empty otherwise): flat {numel}, or
  // the shape of the tensor that wrote it. Keys of executables that read the buffer hold it.
  const std::vector<int64_t>& array_shape() const { return array_shape_; }
  // Whether the array has exactly the shape `sizes` (a tensor that is its whole buffer reads it
  // without a reshape).
  bool has_shape(c10::IntArrayRef sizes) const {
    return array_shape_.size() == sizes.size() && std::equal(array_shape_.begin(), array_shape_.end(), sizes.begin());
  }

  // The value as a flat CPU tensor over the buffer's host memory (the host tier, on the CPU
  // client): the value the host tier computed, or a view of the array, made on first use and
  // kept. Undefined if the storage was never written. Caller holds the GIL; throws if reading
  // the array fails. The caller must not write it (see host_for_write).
  at::Tensor host();
  // host(), for a caller that writes it in place: a private copy first when an array shares
  // its memory (the copy becomes the value), zeros of `dtype` if never written.
  at::Tensor host_for_write(c10::ScalarType dtype);
  // Makes `flat` (a contiguous 1-D CPU tensor, handed over) the value; the array is made from
  // it when first read. Caller holds the GIL.
  void set_host(at::Tensor flat);
  // Makes this buffer hold `other`'s value: the same array (arrays are immutable), or a copy of
  // a host value. Caller holds the GIL.
  void share_value_of(DeviceBuffer& other);
  // Drops a host view that only mirrors the array (it is remade on the next host read), so
  // the array has no holder but this buffer: XLA may then take it over (donation). Whether
  // there was one (jax drops the view's reference to the array at its next garbage collection).
  bool release_host_view();

 private:
  int device_;
  size_t nbytes_;
  uintptr_t address_;
  PyObject* array_ = nullptr;  // a jax.Array, or a lazy value (torch_tpu/compile/lazy.py)
  c10::ScalarType array_dtype_ = c10::ScalarType::Undefined;
  int64_t array_numel_ = -1;
  std::vector<int64_t> array_shape_;
  at::Tensor host_;           // the value on the host, or undefined
  bool host_shared_ = false;  // an array shares host_'s memory (it must not be written)
};

// The allocator registered for the PrivateUse1 device type: a c10::DeviceAllocator, so
// torch.accelerator's memory functions read the buffer registry's stats.
c10::Allocator* tpu_allocator();

// The Python callable (index -> (free, total)) behind the allocator's getMemoryInfo
// (torch.accelerator.get_memory_info). Caller holds the GIL.
void set_memory_info_hook(PyObject* hook);

// The lazy-value type and its resolver (value, force) -> the concrete array, or the
// value itself while it is still pending and not forced. Caller holds the GIL.
void set_lazy_hook(PyObject* type, PyObject* resolver);

// How buffers move between jax arrays and CPU tensors on the CPU client (DLPack, no copy):
// `to_dlpack` is jax's buffer_to_dlpack_managed_tensor(array), `from_dlpack` its
// dlpack_managed_tensor_to_buffer(capsule, device, stream), `jax_device` maps a tpu index to
// its jax device. Caller holds the GIL.
void set_host_hooks(PyObject* to_dlpack, PyObject* from_dlpack, PyObject* jax_device);

// Whether lazy mode records ops: then the dispatcher's argument reads do not force
// pending values (every other read does).
void set_lazy_recording(bool on);
bool lazy_recording();

// Every live buffer as (device, address, bytes), by address (torch.tpu.memory_snapshot).
std::vector<std::tuple<int, uintptr_t, size_t>> live_buffers();

// Makes a DataPtr owning a fresh DeviceBuffer on `device`.
c10::DataPtr allocate_buffer(int device, size_t nbytes);

// Where a tpu storage's bytes live: a buffer and the byte offset into it.
struct BufferView {
  DeviceBuffer* buffer;
  size_t offset;
};

// The buffer behind a tpu storage: the one it owns, or, for a storage aliasing another's
// memory (a storage slice, from_blob of a tpu address), the live buffer holding its bytes.
// Throws if neither.
BufferView view_of(const c10::Storage& storage);
DeviceBuffer& buffer_of(const c10::Storage& storage);  // view_of(storage).buffer
// buffer_of, for a caller about to write the value: a lazy clone's storage gets its own
// buffer first (copy on write).
DeviceBuffer& writable_buffer_of(const c10::Storage& storage);

// Copy-on-write lazy clones (torch._lazy_clone). c10 wraps a tpu storage's DataPtr in its COW
// context (the allocator calls it simple), and this materializer replaces c10's, which needs a
// DataPtr whose context is its address: the storage takes back the buffer when it holds the
// last reference, else a new buffer sharing the value.
void materialize_lazy_clone(c10::StorageImpl* storage);

// A new contiguous tpu tensor on `device` whose storage holds `array` (flat, numel long).
// Caller holds the GIL.
at::Tensor wrap_array(PyObject* array, const std::vector<int64_t>& sizes, c10::ScalarType dtype, int device);

// Gives `storage` `new_nbytes` bytes, keeping its array (reads pad or trim).
void resize_storage_bytes(const c10::Storage& storage, size_t new_nbytes);

}  // namespace torch_tpu
