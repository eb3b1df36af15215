// ATen kernels the device surface owns in C++: allocation, views and storage
// metadata. Everything that computes goes to the Python lowerings.
#include <ATen/Context.h>
#include <ATen/EmptyTensor.h>
#include <ATen/core/Tensor.h>
#include <ATen/native/Resize.h>
#include <ATen/native/ResizeCommon.h>
#include <ATen/native/TensorFactories.h>
#include <ATen/ops/_reshape_alias_native.h>
#include <ATen/ops/as_strided_native.h>
#include <ATen/ops/is_set_to_native.h>
#include <ATen/ops/unfold_native.h>
#include <ATen/ops/view_as_complex_native.h>
#include <ATen/ops/view_as_real_native.h>
#include <ATen/ops/view_native.h>
#include <c10/core/DispatchKeySet.h>
#include <c10/core/impl/COW.h>
#include <torch/library.h>

#include <algorithm>
#include <optional>
#include <vector>

#include "csrc/core/device_registry.h"
#include "csrc/device_buffer.h"

namespace torch_tpu {
namespace {

constexpr c10::DispatchKeySet kTpuKeys{c10::DispatchKey::PrivateUse1};

int target_device(std::optional<c10::Device> device) {
  if (device.has_value() && device->has_index()) {
    return device->index();
  }
  return core::DeviceRegistry::instance().current_device();
}

struct CurrentDeviceScope {
  explicit CurrentDeviceScope(int device) : saved(core::DeviceRegistry::instance().current_device()) {
    core::DeviceRegistry::instance().set_current_device(device);
  }
  ~CurrentDeviceScope() { core::DeviceRegistry::instance().set_current_device(saved); }
  int saved;
};

// torch.use_deterministic_algorithms(True) with torch.utils.deterministic.fill_uninitialized_memory:
// new memory reads as NaN (floats) or the dtype's max (integers), as on CPU and CUDA.
bool fill_deterministically() {
  return at::globalContext().deterministicAlgorithms() && at::globalContext().deterministicFillUninitializedMemory();
}

at::Tensor filled_if_deterministic(at::Tensor t) {
  if (fill_deterministically() && t.numel() > 0) {
    at::native::fill_empty_deterministic_(t);
  }
  return t;
}

at::Tensor empty_memory_format(c10::IntArrayRef size, std::optional<at::ScalarType> dtype,
                               std::optional<at::Layout> layout, std::optional<at::Device> device,
                               std::optional<bool> /*pin_memory*/,
                               std::optional<at::MemoryFormat> memory_format) {
  TORCH_CHECK(!layout.has_value() || *layout == at::kStrided, "tpu tensors support only the strided layout");
  CurrentDeviceScope scope(target_device(device));
  return filled_if_deterministic(at::detail::empty_generic(size, tpu_allocator(), kTpuKeys,
                                                           c10::dtype_or_default(dtype), memory_format));
}

at::Tensor empty_strided(c10::IntArrayRef size, c10::IntArrayRef stride, std::optional<at::ScalarType> dtype,
                         std::optional<at::Layout> layout, std::optional<at::Device> device,
                         std::optional<bool> /*pin_memory*/) {
  TORCH_CHECK(!layout.has_value() || *layout == at::kStrided, "tpu tensors support only the strided layout");
  CurrentDeviceScope scope(target_device(device));
  return filled_if_deterministic(at::detail::empty_strided_generic(size, stride, tpu_allocator(), kTpuKeys,
                                                                   c10::dtype_or_default(dtype)));
}

const at::Tensor& resize_(const at::Tensor& self, c10::IntArrayRef size,
                          std::optional<at::MemoryFormat> memory_format) {
  for (int64_t s : size) {
    TORCH_CHECK(s >= 0, "Trying to create tensor with negative dimension ", s, ": ", size);
  }
  auto* impl = self.unsafeGetTensorImpl();
  impl->set_sizes_contiguous(size);
  if (memory_format.has_value()) {
    TORCH_CHECK(*memory_format != at::MemoryFormat::Preserve, "Unsupported memory format ", *memory_format);
    impl->empty_tensor_restride(*memory_format);
  }
  if (impl->numel() > 0) {
    const size_t needed = at::detail::computeStorageNbytes(impl->sizes(), impl->strides(),
                                                           self.dtype().itemsize(), impl->storage_offset());
    const c10::Storage& storage = impl->unsafe_storage();
    const size_t old_nbytes = storage.nbytes();
    if (needed > old_nbytes) {
      resize_storage_bytes(storage, needed);
      if (fill_deterministically()) {
        at::native::fill_resize_deterministic_(self, static_cast<int64_t>(old_nbytes));
      }
    }
  }
  return self;
}

at::Tensor& set_storage(at::Tensor& self, c10::Storage source, int64_t storage_offset, c10::IntArrayRef size,
                        c10::IntArrayRef stride) {
  // An empty stride list means contiguous, as in the CPU kernel.
  std::vector<int64_t> strides(stride.begin(), stride.end());
  if (strides.empty() && !size.empty()) {
    strides.resize(size.size());
    int64_t running = 1;
    for (size_t i = size.size(); i-- > 0;) {
      strides[i] = running;
      running *= std::max<int64_t>(size[i], 1);
    }
  }
  at::native::checkSetStorage(self, std::move(source), storage_offset, size, c10::IntArrayRef(strides));
  at::native::setStrided(self, size, c10::IntArrayRef(strides), storage_offset);
  return self;
}

at::Tensor& set_source_storage(at::Tensor& self, c10::Storage source) {
  const int64_t itemsize = static_cast<int64_t>(self.dtype().itemsize());
  TORCH_CHECK(source.nbytes() % itemsize == 0, "Expected storage nbytes ", source.nbytes(),
              " to be divisible by the element size ", itemsize);
  const int64_t numel = static_cast<int64_t>(source.nbytes()) / itemsize;
  return set_storage(self, std::move(source), 0, {numel}, {1});
}

at::Tensor& set_source_tensor(at::Tensor& self, const at::Tensor& source) {
  if (self.unsafeGetTensorImpl() == source.unsafeGetTensorImpl()) {
    return self;
  }
  TORCH_CHECK(self.dtype() == source.dtype(), "Could not set tensor of type ", source.dtype(),
              " to a tensor of type ", self.dtype());
  return set_storage(self, source.storage(), source.storage_offset(), source.sizes(), source.strides());
}

at::Tensor& set_empty(at::Tensor& self) {
  c10::Storage storage(c10::Storage::use_byte_size_t(), 0,
                       allocate_buffer(self.device().index(), 0), tpu_allocator(), true);
  return set_storage(self, std::move(storage), 0, {0}, {});
}

// Whether `self.data = from` may swap `from`'s storage into `self` in place. nn.Module.to() asks
// this; with upstream's answer (false: it knows only the built-in dense backends) a CPU <-> tpu
// move would replace every Parameter object, untying shared weights and leaving optimizers with
// stale references. Dense CPU and tpu tensors are the same plain TensorImpl, as CPU and CUDA are.
bool has_compatible_shallow_copy_type(const at::Tensor& self, const at::Tensor& from) {
  auto dense_cpu_or_tpu = [](c10::DispatchKeySet keys) {
    constexpr auto backends = c10::DispatchKeySet({c10::BackendComponent::CPUBit,
                                                   c10::BackendComponent::PrivateUse1Bit});
    return keys.has_any(c10::DispatchKeySet(c10::DispatchKey::Dense)) && keys.has_any(backends);
  };
  return self.unsafeGetTensorImpl()->has_compatible_shallow_copy_type(from.key_set()) ||
         (dense_cpu_or_tpu(self.key_set()) && dense_cpu_or_tpu(from.key_set()));
}

// at::native::_lazy_clone, with the tpu materializer in place of c10's.
at::Tensor lazy_clone(const at::Tensor& self) {
  c10::StorageImpl* source = self.storage().unsafeGetStorageImpl();
  c10::intrusive_ptr<c10::StorageImpl> storage = c10::impl::cow::lazy_clone_storage(*source);
  TORCH_CHECK(storage != nullptr,
              "_lazy_clone: this tpu storage aliases another's memory (a storage slice); clone() it instead");
  for (c10::StorageImpl* s : {source, storage.get()}) {
    s->clear_materializer();
    s->set_materializer(&materialize_lazy_clone);
  }
  auto clone = c10::make_intrusive<c10::TensorImpl>(c10::Storage(std::move(storage)), self.key_set(), self.dtype());
  clone->set_sizes_and_strides(self.sym_sizes(), self.sym_strides(), self.sym_storage_offset());
  return at::Tensor(std::move(clone));
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("empty.memory_format", empty_memory_format);
  m.impl("empty_strided", empty_strided);
  m.impl("resize_", resize_);
  m.impl("set_.source_Storage_storage_offset", set_storage);
  m.impl("set_.source_Storage", set_source_storage);
  m.impl("set_.source_Tensor", set_source_tensor);
  m.impl("set_", set_empty);
  m.impl("_has_compatible_shallow_copy_type", has_compatible_shallow_copy_type);
  m.impl("_lazy_clone", lazy_clone);
  m.impl("is_set_to", at::native::is_set_to);  // storage metadata only
  // Views reuse the metadata-only native kernels, so they alias storage.
  m.impl("as_strided", at::native::as_strided_tensorimpl);
  m.impl("view", at::native::view);
  m.impl("_reshape_alias", at::native::_reshape_alias);
  m.impl("unfold", at::native::unfold);
  m.impl("view_as_real", at::native::view_as_real);
  m.impl("view_as_complex", at::native::view_as_complex);
}

}  // namespace torch_tpu
