#include "csrc/core/buffer_registry.h"

#include <algorithm>
#include <array>
#include <mutex>
#include <stdexcept>
#include <vector>

namespace torch_tpu::core {
namespace {

constexpr uintptr_t kAddressBase = uintptr_t{1} << 46;
constexpr int kDeviceShift = 40;  // 1 TiB of fake addresses per device
constexpr int kMinClassLog2 = 8;  // 256-byte alignment
constexpr int kNumClasses = kDeviceShift - kMinClassLog2;

struct DeviceState {
  MemoryStats stats;
  uintptr_t bump = 0;
  std::array<std::vector<uintptr_t>, kNumClasses> free_lists;
};

std::mutex g_mutex;
std::array<DeviceState, BufferRegistry::kMaxDevices> g_devices{};

void check_device(int device) {
  if (device < 0 || device >= BufferRegistry::kMaxDevices) {
    throw std::out_of_range("torch_tpu: device index out of range");
  }
}

int size_class(size_t nbytes) {
  int log2 = kMinClassLog2;
  while (log2 < kDeviceShift && (size_t{1} << log2) < nbytes) {
    ++log2;
  }
  if (log2 >= kDeviceShift) {
    throw std::length_error("torch_tpu: buffer larger than the device address range");
  }
  return log2 - kMinClassLog2;
}

}  // namespace

BufferRegistry& BufferRegistry::instance() {
  static BufferRegistry registry;
  return registry;
}

uintptr_t BufferRegistry::on_alloc(int device, size_t nbytes) {
  check_device(device);
  const int cls = size_class(nbytes);
  std::lock_guard<std::mutex> lock(g_mutex);
  DeviceState& d = g_devices[device];
  d.stats.allocated_bytes += static_cast<int64_t>(nbytes);
  d.stats.peak_allocated_bytes = std::max(d.stats.peak_allocated_bytes, d.stats.allocated_bytes);
  d.stats.active_buffers += 1;
  d.stats.num_allocs += 1;
  uintptr_t offset;
  auto& free_list = d.free_lists[cls];
  if (!free_list.empty()) {
    offset = free_list.back();
    free_list.pop_back();
  } else {
    const uintptr_t span = uintptr_t{1} << (cls + kMinClassLog2);
    if (d.bump + span > (uintptr_t{1} << kDeviceShift)) {
      throw std::length_error("torch_tpu: device address range exhausted");
    }
    offset = d.bump;
    d.bump += span;
  }
  return kAddressBase + (static_cast<uintptr_t>(device) << kDeviceShift) + offset;
}

void BufferRegistry::on_free(int device, uintptr_t address, size_t nbytes) {
  check_device(device);
  const int cls = size_class(nbytes);
  std::lock_guard<std::mutex> lock(g_mutex);
  DeviceState& d = g_devices[device];
  d.stats.allocated_bytes -= static_cast<int64_t>(nbytes);
  d.stats.active_buffers -= 1;
  d.stats.num_frees += 1;
  const uintptr_t device_base = kAddressBase + (static_cast<uintptr_t>(device) << kDeviceShift);
  d.free_lists[cls].push_back(address - device_base);
}

MemoryStats BufferRegistry::stats(int device) const {
  check_device(device);
  std::lock_guard<std::mutex> lock(g_mutex);
  return g_devices[device].stats;
}

void BufferRegistry::reset_peak(int device) {
  check_device(device);
  std::lock_guard<std::mutex> lock(g_mutex);
  MemoryStats& s = g_devices[device].stats;
  s.peak_allocated_bytes = s.allocated_bytes;
}

int BufferRegistry::device_of(uintptr_t address) {
  if (address < kAddressBase) {
    return -1;
  }
  const uintptr_t device = (address - kAddressBase) >> kDeviceShift;
  return device < static_cast<uintptr_t>(kMaxDevices) ? static_cast<int>(device) : -1;
}

}  // namespace torch_tpu::core
