#include "csrc/core/device_registry.h"

#include <mutex>
#include <stdexcept>
#include <utility>

namespace torch_tpu::core {
namespace {

std::mutex g_mutex;
std::vector<DeviceInfo> g_devices;
thread_local int t_current_device = 0;

}  // namespace

DeviceRegistry& DeviceRegistry::instance() {
  static DeviceRegistry registry;
  return registry;
}

void DeviceRegistry::set_devices(std::vector<DeviceInfo> devices) {
  std::lock_guard<std::mutex> lock(g_mutex);
  g_devices = std::move(devices);
}

int DeviceRegistry::device_count() const {
  std::lock_guard<std::mutex> lock(g_mutex);
  return static_cast<int>(g_devices.size());
}

DeviceInfo DeviceRegistry::device(int index) const {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (index < 0 || index >= static_cast<int>(g_devices.size())) {
    throw std::out_of_range("tpu device index " + std::to_string(index) + " is out of range (" +
                            std::to_string(g_devices.size()) + " devices)");
  }
  return g_devices[index];
}

int DeviceRegistry::current_device() const { return t_current_device; }

void DeviceRegistry::set_current_device(int index) {
  const int count = device_count();
  if (index < 0 || index >= count) {
    throw std::out_of_range("tpu device index " + std::to_string(index) + " is out of range (" +
                            std::to_string(count) + " devices)");
  }
  t_current_device = index;
}

}  // namespace torch_tpu::core
