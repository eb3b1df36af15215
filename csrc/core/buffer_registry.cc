#include "csrc/core/buffer_registry.h"

#include <algorithm>
#include <array>
#include <cstdio>
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
  int64_t limit = -1;
  int64_t capacity = -1;
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

// Bytes for people, as torch_tpu.memory.format_bytes: 512 B, 3.00 KiB, 1.50 GiB.
std::string mib(int64_t bytes) {
  static const char* const units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (unit < 4 && (value >= 1024.0 || value <= -1024.0)) {
    value /= 1024.0;
    ++unit;
  }
  char text[64];
  if (unit == 0) {
    std::snprintf(text, sizeof(text), "%lld B", static_cast<long long>(bytes));
  } else {
    std::snprintf(text, sizeof(text), "%.2f %s", value, units[unit]);
  }
  return text;
}

std::string oom_message(int device, size_t requested, int64_t allocated, int64_t limit, bool capacity) {
  const std::string name = "tpu:" + std::to_string(device);
  std::string text = name + " out of memory. Tried to allocate " + mib(static_cast<int64_t>(requested)) + " (" +
                     std::to_string(requested) + " bytes); " + mib(allocated) + " (" + std::to_string(allocated) +
                     " bytes) already allocated by tpu tensors; ";
  if (limit < 0) {
    return text + "the request exceeds the device address range";
  }
  if (capacity) {
    return text + name + " has a total capacity of " + mib(limit) + " (" + std::to_string(limit) + " bytes)";
  }
  return text + "limit " + mib(limit) + " (" + std::to_string(limit) +
         " bytes), set by torch.tpu.set_per_process_memory_fraction or TORCH_TPU_MEMORY_LIMIT";
}

int size_class(int device, size_t nbytes, int64_t allocated) {
  int log2 = kMinClassLog2;
  while (log2 < kDeviceShift && (size_t{1} << log2) < nbytes) {
    ++log2;
  }
  if (log2 >= kDeviceShift) {
    throw OutOfMemory(device, nbytes, allocated, -1);
  }
  return log2 - kMinClassLog2;
}

}  // namespace

OutOfMemory::OutOfMemory(int device, size_t requested, int64_t allocated, int64_t limit, bool capacity)
    : std::runtime_error(oom_message(device, requested, allocated, limit, capacity)),
      device(device),
      requested(requested),
      allocated(allocated),
      limit(limit),
      capacity(capacity) {}

BufferRegistry& BufferRegistry::instance() {
  static BufferRegistry registry;
  return registry;
}

uintptr_t BufferRegistry::on_alloc(int device, size_t nbytes) {
  check_device(device);
  std::lock_guard<std::mutex> lock(g_mutex);
  DeviceState& d = g_devices[device];
  const int cls = size_class(device, nbytes, d.stats.allocated_bytes);
  const int64_t wanted = d.stats.allocated_bytes + static_cast<int64_t>(nbytes);
  const bool over_limit = d.limit >= 0 && wanted > d.limit;
  if (over_limit || (d.capacity >= 0 && wanted > d.capacity)) {
    d.stats.num_ooms += 1;
    throw OutOfMemory(device, nbytes, d.stats.allocated_bytes, over_limit ? d.limit : d.capacity, !over_limit);
  }
  uintptr_t offset;
  auto& free_list = d.free_lists[cls];
  if (!free_list.empty()) {
    offset = free_list.back();
    free_list.pop_back();
  } else {
    const uintptr_t span = uintptr_t{1} << (cls + kMinClassLog2);
    if (d.bump + span > (uintptr_t{1} << kDeviceShift)) {
      throw OutOfMemory(device, nbytes, d.stats.allocated_bytes, -1);
    }
    offset = d.bump;
    d.bump += span;
  }
  d.stats.allocated_bytes += static_cast<int64_t>(nbytes);
  d.stats.allocated_bytes_total += static_cast<int64_t>(nbytes);
  d.stats.peak_allocated_bytes = std::max(d.stats.peak_allocated_bytes, d.stats.allocated_bytes);
  d.stats.active_buffers += 1;
  d.stats.num_allocs += 1;
  return kAddressBase + (static_cast<uintptr_t>(device) << kDeviceShift) + offset;
}

void BufferRegistry::on_free(int device, uintptr_t address, size_t nbytes) {
  check_device(device);
  std::lock_guard<std::mutex> lock(g_mutex);
  DeviceState& d = g_devices[device];
  const int cls = size_class(device, nbytes, d.stats.allocated_bytes);
  d.stats.allocated_bytes -= static_cast<int64_t>(nbytes);
  d.stats.freed_bytes_total += static_cast<int64_t>(nbytes);
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

void BufferRegistry::reset_accumulated(int device) {
  check_device(device);
  std::lock_guard<std::mutex> lock(g_mutex);
  MemoryStats& s = g_devices[device].stats;
  s.allocated_bytes_total = 0;
  s.freed_bytes_total = 0;
  s.num_allocs = 0;
  s.num_frees = 0;
  s.num_ooms = 0;
}

void BufferRegistry::set_limit(int device, int64_t limit) {
  check_device(device);
  std::lock_guard<std::mutex> lock(g_mutex);
  g_devices[device].limit = limit < 0 ? -1 : limit;
}

int64_t BufferRegistry::limit(int device) const {
  check_device(device);
  std::lock_guard<std::mutex> lock(g_mutex);
  return g_devices[device].limit;
}

void BufferRegistry::set_capacity(int device, int64_t capacity) {
  check_device(device);
  std::lock_guard<std::mutex> lock(g_mutex);
  g_devices[device].capacity = capacity < 0 ? -1 : capacity;
}

int64_t BufferRegistry::capacity(int device) const {
  check_device(device);
  std::lock_guard<std::mutex> lock(g_mutex);
  return g_devices[device].capacity;
}

int BufferRegistry::device_of(uintptr_t address) {
  if (address < kAddressBase) {
    return -1;
  }
  const uintptr_t device = (address - kAddressBase) >> kDeviceShift;
  return device < static_cast<uintptr_t>(kMaxDevices) ? static_cast<int>(device) : -1;
}

}  // namespace torch_tpu::core
