// Device discovery results and the current device. Torch-independent.
#pragma once

#include <string>
#include <vector>

namespace torch_tpu::core {

struct DeviceInfo {
  int index = 0;
  std::string kind;      // e.g. "TPU v5 lite", "NVIDIA H100", "cpu"
  std::string platform;  // "tpu", "cuda" or "cpu"
  std::vector<int> coords;  // topology coordinates where the runtime gives them
};

// Filled once by the Python runtime after PJRT client selection; read by the
// device guard and hooks on any thread.
class DeviceRegistry {
 public:
  static DeviceRegistry& instance();

  void set_devices(std::vector<DeviceInfo> devices);
  int device_count() const;
  DeviceInfo device(int index) const;  // throws std::out_of_range

  // The current device is per thread, as in CUDA.
  int current_device() const;
  void set_current_device(int index);  // throws std::out_of_range

 private:
  DeviceRegistry() = default;
};

}  // namespace torch_tpu::core
