// The host allocator of kPrivateUse1 (REGISTER_HOST_ALLOCATOR).
//
// PJRT stages every host-to-device transfer itself, and torch_tpu copies the host data before a
// copy returns (non_blocking included), so "pinned" memory is ordinary 64-byte aligned host memory
// (the alignment DLPack needs to share it without a copy). The allocator records its blocks, so
// is_pinned() is true exactly for tensors pin_memory() made, as on CUDA. Nothing is cached:
// empty_cache() has nothing to release and the stats count nothing.
#include "csrc/host_allocator.h"

#include <c10/core/impl/alloc_cpu.h>

#include <cstring>
#include <iterator>
#include <map>
#include <mutex>

namespace torch_tpu {
namespace {

struct Blocks {
  std::mutex mutex;
  std::map<uintptr_t, size_t> sizes;  // start address -> bytes
};

Blocks& blocks() {
  static auto* instance = new Blocks();  // leaked: frees may run during static destruction
  return *instance;
}

void free_block(void* ptr) {
  {
    Blocks& b = blocks();
    std::lock_guard<std::mutex> lock(b.mutex);
    b.sizes.erase(reinterpret_cast<uintptr_t>(ptr));
  }
  c10::free_cpu(ptr);
}

struct TpuHostAllocator final : at::HostAllocator {
  /** Returns `n` bytes of 64-byte aligned host memory on the CPU device, recorded as pinned. */
  at::DataPtr allocate(size_t n) override {
    void* ptr = c10::alloc_cpu(n == 0 ? 1 : n);
    {
      Blocks& b = blocks();
      std::lock_guard<std::mutex> lock(b.mutex);
      b.sizes[reinterpret_cast<uintptr_t>(ptr)] = n;
    }
    return {ptr, ptr, &free_block, at::Device(at::kCPU)};
  }
  at::DeleterFnPtr raw_deleter() const override { return &free_block; }
  void copy_data(void* dest, const void* src, std::size_t count) const override { std::memcpy(dest, src, count); }

  /** Tensor.record_stream on pinned memory: nothing to wait for, since transfers copy before returning. */
  bool record_event(void* /*ptr*/, void* /*ctx*/, c10::Stream /*stream*/) override { return true; }
  /** Nothing is cached, so nothing is released. */
  void empty_cache() override {}
  at::HostStats get_stats() override { return {}; }
  void reset_accumulated_stats() override {}
  void reset_peak_stats() override {}
};

TpuHostAllocator g_host_allocator;

}  // namespace

at::HostAllocator* host_allocator() { return &g_host_allocator; }

bool is_pinned_ptr(const void* data) {
  const auto address = reinterpret_cast<uintptr_t>(data);
  Blocks& b = blocks();
  std::lock_guard<std::mutex> lock(b.mutex);
  auto next = b.sizes.upper_bound(address);
  if (next == b.sizes.begin()) return false;
  const auto& [start, size] = *std::prev(next);
  return address < start + (size == 0 ? 1 : size);
}

REGISTER_HOST_ALLOCATOR(at::kPrivateUse1, &g_host_allocator)

}  // namespace torch_tpu
