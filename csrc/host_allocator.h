// Pinned host memory for the tpu device: tensor.pin_memory(), is_pinned() and the
// torch.accelerator host-cache calls.
#pragma once

#include <ATen/core/CachingHostAllocator.h>

namespace torch_tpu {

/** The allocator of pin_memory(): 64-byte aligned host memory, recorded so is_pinned() knows it. */
at::HostAllocator* host_allocator();

/** Whether `data` lies inside a block the host allocator handed out and has not freed. */
bool is_pinned_ptr(const void* data);

}  // namespace torch_tpu
