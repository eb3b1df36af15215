// Byte accounting and fake addresses for device buffers. Torch-independent.
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

namespace torch_tpu::core {

struct MemoryStats {
  int64_t allocated_bytes = 0;
  int64_t peak_allocated_bytes = 0;
  int64_t active_buffers = 0;
  int64_t num_allocs = 0;
  int64_t num_frees = 0;
  int64_t allocated_bytes_total = 0;  // ever allocated
  int64_t freed_bytes_total = 0;
  int64_t num_ooms = 0;  // allocations refused by the limit
};

// Thrown by on_alloc when a buffer would take a device past its byte limit or capacity;
// nothing is accounted, so the process stays usable.
class OutOfMemory : public std::runtime_error {
 public:
  OutOfMemory(int device, size_t requested, int64_t allocated, int64_t limit, bool capacity = false);
  int device;
  size_t requested;
  int64_t allocated;
  int64_t limit;  // -1: the request exceeds the device address range
  bool capacity;  // the bound was the device's capacity, not a limit the user set
};

// Every device buffer registers here when it is created and when it dies.
// It hands out fake addresses: unique among live buffers, never dereferenced,
// with the device encoded in the high bits. Freed ranges are reused per
// power-of-two size class, so the address space stays bounded by peak use.
class BufferRegistry {
 public:
  static constexpr int kMaxDevices = 64;

  static BufferRegistry& instance();

  uintptr_t on_alloc(int device, size_t nbytes);
  void on_free(int device, uintptr_t address, size_t nbytes);
  MemoryStats stats(int device) const;
  void reset_peak(int device);
  // Zeroes the cumulative counters (bytes and buffers ever allocated and freed, OOMs).
  void reset_accumulated(int device);
  // Caps the bytes live on `device`; a negative limit means none (the default).
  void set_limit(int device, int64_t limit);
  int64_t limit(int device) const;
  // The device's memory (where the platform reports it); no allocation may exceed it.
  // Negative means unknown (the default): only the limit applies.
  void set_capacity(int device, int64_t capacity);
  int64_t capacity(int device) const;
  // Device that owns a fake address, or -1 if it is not one of ours.
  static int device_of(uintptr_t address);

 private:
  BufferRegistry() = default;
};

}  // namespace torch_tpu::core
