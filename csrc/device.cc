#include "csrc/device.h"

#include <ATen/Context.h>
#include <ATen/core/GeneratorForPrivateuseone.h>
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <c10/core/DeviceCapability.h>
#include <c10/core/GeneratorImpl.h>
#include <c10/core/TensorImpl.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/Exception.h>

#include <ATen/ATen.h>

#include <torch/csrc/utils/pybind.h>

#include <chrono>
#include <deque>
#include <mutex>
#include <stdexcept>

#include "csrc/core/buffer_registry.h"
#include "csrc/core/device_registry.h"
#include "csrc/device_buffer.h"
#include "csrc/host_allocator.h"

namespace torch_tpu {
namespace {

using c10::Device;
using c10::DeviceIndex;
using c10::DeviceType;
using c10::Stream;
using core::DeviceRegistry;

constexpr DeviceType kTpu = DeviceType::PrivateUse1;

// Never destroyed: it may be called during interpreter shutdown.
pybind11::object* g_synchronize_hook = new pybind11::object();

// Waits for all queued work (jax dispatches asynchronously).
void synchronize_all() {
  if (!Py_IsInitialized()) {
    return;
  }
  pybind11::gil_scoped_acquire gil;
  if (g_synchronize_hook->is_none() || !*g_synchronize_hook) {
    return;
  }
  (*g_synchronize_hook)();
}

// An event: when it was recorded, and whether it was created for timing.
struct TpuEvent {
  bool timing = false;
  bool recorded = false;
  std::chrono::steady_clock::time_point time;
};

DeviceIndex checked_index(DeviceIndex index) {
  const int count = DeviceRegistry::instance().device_count();
  TORCH_CHECK_INDEX(index >= 0 && index < count, "tpu device index ", static_cast<int>(index),
                    " is out of range: ", count, " tpu devices are visible");
  return index;
}

// ---- Device guard ----------------------------------------------------------

// Streams are ordering-only: every device has one in-order stream (id 0).
struct TpuGuardImpl final : c10::impl::DeviceGuardImplInterface {
  DeviceType type() const override { return kTpu; }

  Device exchangeDevice(Device d) const override {
    Device old = getDevice();
    if (d.index() != old.index()) {
      setDevice(d);
    }
    return old;
  }
  Device getDevice() const override {
    return Device(kTpu, static_cast<DeviceIndex>(DeviceRegistry::instance().current_device()));
  }
  void setDevice(Device d) const override {
    TORCH_CHECK(d.type() == kTpu, "expected a tpu device, got ", d);
    DeviceRegistry::instance().set_current_device(checked_index(d.index()));
  }
  void uncheckedSetDevice(Device d) const noexcept override {
    try {
      DeviceRegistry::instance().set_current_device(d.index());
    } catch (const std::exception&) {
    }
  }
  // The dtypes a tpu tensor can hold (torch_tpu/ops/dtypes.py's TORCH_TO_NUMPY).
  c10::DeviceCapability getDeviceCapability(Device /*d*/) const override {
    c10::DeviceCapability cap;
    cap.capability_data.capability_bits = 0;
    for (auto index : {c10::kIndex_Byte, c10::kIndex_Char, c10::kIndex_Short, c10::kIndex_Int, c10::kIndex_Long,
                       c10::kIndex_Half, c10::kIndex_Float, c10::kIndex_Double, c10::kIndex_ComplexFloat,
                       c10::kIndex_ComplexDouble, c10::kIndex_Bool, c10::kIndex_BFloat16, c10::kIndex_UInt16,
                       c10::kIndex_UInt32, c10::kIndex_UInt64, c10::kIndex_Float8_e4m3fn, c10::kIndex_Float8_e5m2}) {
      cap.capability_data.capability_bits |= 1ULL << index;
    }
    return cap;
  }
  Stream getStream(Device d) const override { return Stream(Stream::DEFAULT, resolved(d)); }
  Stream getDefaultStream(Device d) const override { return Stream(Stream::DEFAULT, resolved(d)); }
  Stream getNewStream(Device d, int /*priority*/) const override { return Stream(Stream::DEFAULT, resolved(d)); }
  Stream getStreamFromGlobalPool(Device d, bool /*high_priority*/) const override {
    return Stream(Stream::DEFAULT, resolved(d));
  }
  // Device d, with index -1 meaning the current device.
  Device resolved(Device d) const { return d.has_index() ? d : getDevice(); }
  Stream exchangeStream(Stream s) const override { return Stream(Stream::DEFAULT, s.device()); }
  DeviceIndex deviceCount() const noexcept override {
    return static_cast<DeviceIndex>(DeviceRegistry::instance().device_count());
  }

  // Execution is in order per device, so an event is an ordering point only;
  // waits are no-ops. A timing event waits for queued work before it takes
  // its timestamp, so elapsed_time is real wall time of the work between two.
  void record(void** event, const Stream& /*stream*/, const DeviceIndex /*device_index*/,
              const c10::EventFlag flag) const override {
    if (*event == nullptr) {
      auto* created = new TpuEvent();
      created->timing = flag == c10::EventFlag::BACKEND_DEFAULT;
      *event = created;
    }
    auto* e = static_cast<TpuEvent*>(*event);
    if (e->timing) {
      synchronize_all();
    }
    e->time = std::chrono::steady_clock::now();
    e->recorded = true;
  }
  void block(void* /*event*/, const Stream& /*stream*/) const override {}
  bool queryEvent(void* /*event*/) const override { return true; }
  void destroyEvent(void* event, const DeviceIndex /*device_index*/) const noexcept override {
    delete static_cast<TpuEvent*>(event);
  }
  bool queryStream(const Stream& /*stream*/) const override { return true; }
  void synchronizeStream(const Stream& /*stream*/) const override { synchronize_all(); }
  void synchronizeEvent(void* /*event*/) const override { synchronize_all(); }
  void synchronizeDevice(const DeviceIndex /*device_index*/) const override { synchronize_all(); }
  void recordDataPtrOnStream(const c10::DataPtr& /*data_ptr*/, const Stream& /*stream*/) const override {}
  double elapsedTime(void* event1, void* event2, const DeviceIndex /*device_index*/) const override {
    const auto* start = static_cast<const TpuEvent*>(event1);
    const auto* end = static_cast<const TpuEvent*>(event2);
    TORCH_CHECK(start != nullptr && end != nullptr && start->recorded && end->recorded,
                "Both events must be recorded before calculating elapsed time.");
    TORCH_CHECK(start->timing && end->timing,
                "Both events must be created with argument 'enable_timing=True'.");
    return std::chrono::duration<double, std::milli>(end->time - start->time).count();
  }
};

// ---- Generator ---------------------------------------------------------------

// Counter-based like CUDA's philox: (seed, offset) pairs feed jax.random keys.
struct TpuGeneratorImpl final : c10::GeneratorImpl {
  explicit TpuGeneratorImpl(DeviceIndex index)
      : c10::GeneratorImpl(Device(kTpu, index), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1)) {}

  void set_current_seed(uint64_t seed) override {
    seed_ = seed;
    offset_ = 0;
  }
  void set_offset(uint64_t offset) override { offset_ = offset; }
  uint64_t get_offset() const override { return offset_; }
  uint64_t current_seed() const override { return seed_; }
  uint64_t seed() override {
    const uint64_t s = c10::detail::getNonDeterministicRandom(true);
    set_current_seed(s);
    return s;
  }
  // State: 16 bytes, seed then offset, as a CPU uint8 tensor.
  void set_state(const c10::TensorImpl& new_state) override {
    TORCH_CHECK(new_state.numel() == 16 && new_state.dtype().itemsize() == 1,
                "tpu generator state must be a 16-byte uint8 tensor, got ", new_state.numel(), " elements");
    const auto* bytes = static_cast<const uint64_t*>(new_state.data());
    seed_ = bytes[0];
    offset_ = bytes[1];
  }
  c10::intrusive_ptr<c10::TensorImpl> get_state() const override {
    at::Tensor state = at::empty({16}, at::TensorOptions().dtype(at::kByte));
    auto* bytes = static_cast<uint64_t*>(state.data_ptr());
    bytes[0] = seed_;
    bytes[1] = offset_;
    return state.getIntrusivePtr();
  }
  static DeviceType device_type() { return kTpu; }

  uint64_t seed_ = c10::default_rng_seed_val;
  uint64_t offset_ = 0;

 private:
  TpuGeneratorImpl* clone_impl() const override {
    auto* copy = new TpuGeneratorImpl(device().index());
    copy->seed_ = seed_;
    copy->offset_ = offset_;
    return copy;
  }
};

std::mutex g_generators_mutex;
std::deque<at::Generator> g_default_generators;  // deque: references stay valid

// ---- Hooks -------------------------------------------------------------------

struct TpuHooks final : at::PrivateUse1HooksInterface {
  bool isBuilt() const override { return true; }
  bool isAvailable() const override { return DeviceRegistry::instance().device_count() > 0; }
  bool hasPrimaryContext(DeviceIndex /*device_index*/) const override { return true; }
  const at::Generator& getDefaultGenerator(DeviceIndex device_index) const override {
    return default_generator(device_index);
  }
  at::Generator getNewGenerator(DeviceIndex device_index) const override {
    const DeviceIndex index =
        device_index < 0 ? static_cast<DeviceIndex>(DeviceRegistry::instance().current_device()) : device_index;
    return at::make_generator<TpuGeneratorImpl>(checked_index(index));
  }
  at::Device getDeviceFromPtr(void* data) const override {
    const int device = core::BufferRegistry::device_of(reinterpret_cast<uintptr_t>(data));
    TORCH_CHECK(device >= 0, "pointer ", data, " is not a tpu buffer address");
    return Device(kTpu, static_cast<DeviceIndex>(device));
  }
  /** pin_memory()'s allocator (host_allocator.cc); is_pinned() is true for its blocks only. */
  at::Allocator* getPinnedMemoryAllocator() const override { return host_allocator(); }
  bool isPinnedPtr(const void* data) const override { return is_pinned_ptr(data); }
  DeviceIndex deviceCount() const override {
    return static_cast<DeviceIndex>(DeviceRegistry::instance().device_count());
  }
  void setCurrentDevice(DeviceIndex device) const override {
    DeviceRegistry::instance().set_current_device(checked_index(device));
  }
  DeviceIndex getCurrentDevice() const override {
    return static_cast<DeviceIndex>(DeviceRegistry::instance().current_device());
  }
  DeviceIndex exchangeDevice(DeviceIndex device) const override {
    const DeviceIndex old = getCurrentDevice();
    setCurrentDevice(device);
    return old;
  }
  DeviceIndex maybeExchangeDevice(DeviceIndex device) const override { return exchangeDevice(device); }
  void resizePrivateUse1Bytes(const c10::Storage& storage, size_t newsize) const override {
    resize_storage_bytes(storage, newsize);
  }
};

}  // namespace

void set_synchronize_hook(PyObject* hook) {
  *g_synchronize_hook = pybind11::reinterpret_borrow<pybind11::object>(hook);
}

C10_REGISTER_GUARD_IMPL(PrivateUse1, TpuGuardImpl);

const at::Generator& default_generator(DeviceIndex device) {
  const DeviceIndex index =
      device < 0 ? static_cast<DeviceIndex>(DeviceRegistry::instance().current_device()) : device;
  checked_index(index);
  std::lock_guard<std::mutex> lock(g_generators_mutex);
  while (static_cast<DeviceIndex>(g_default_generators.size()) <= index) {
    const auto next = static_cast<DeviceIndex>(g_default_generators.size());
    g_default_generators.push_back(at::make_generator<TpuGeneratorImpl>(next));
  }
  return g_default_generators[index];
}

std::pair<uint64_t, uint64_t> reserve_random(at::Generator generator, uint64_t increment) {
  TORCH_CHECK(generator.defined() && generator.device().type() == kTpu,
              "expected a tpu generator, got one for ", generator.device());
  std::lock_guard<std::mutex> lock(generator.mutex());
  auto* impl = static_cast<TpuGeneratorImpl*>(generator.unsafeGetGeneratorImpl());
  const std::pair<uint64_t, uint64_t> result{impl->seed_, impl->offset_};
  impl->offset_ += increment;
  return result;
}

void register_device() {
  static std::once_flag once;
  std::call_once(once, [] {
    static TpuHooks hooks;
    at::RegisterPrivateUse1HooksInterface(&hooks);
    c10::SetAllocator(kTpu, tpu_allocator());
  });
}

}  // namespace torch_tpu
