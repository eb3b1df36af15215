// The host tier's tensor moves (torch_tpu/platforms/cpu/host_tier.py): a tpu tensor read as a CPU tensor
// over its buffer's host memory, and a CPU result made a tpu tensor, neither copying on the
// CPU client (DeviceBuffer::host, set_host).
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/csrc/utils/pybind.h>

namespace torch_tpu {

// Whether the host tier can read `t`: no conj or neg bit, and its buffer holds its dtype (or
// was never written).
bool host_readable(const at::Tensor& t);

// `t`'s value as a CPU tensor: its sizes, strides and offset over the buffer's host memory.
// `writable`: the caller writes it in place, and the writes are the storage's new value.
// Caller holds the GIL.
at::Tensor host_view(const at::Tensor& t, bool writable);

// A new tpu tensor on `device` holding CPU tensor `value` (same sizes, strides and offset; its
// storage becomes the buffer's value). Caller holds the GIL.
at::Tensor wrap_host(const at::Tensor& value, int device);

// While alive, the calling thread's CPU kernels use one intra-op thread fewer (at least one):
// a host-tier op runs while a compile keeps a core busy, and a parallel region would wait on
// the thread that shares that core (a CPU attention call took 20x its time). Per calling
// thread under OpenMP; restored on destruction.
class HostThreads {
 public:
  HostThreads();
  ~HostThreads();
  HostThreads(const HostThreads&) = delete;
  HostThreads& operator=(const HostThreads&) = delete;

 private:
  int saved_;
};

// Adds _host_readable, _host_view, _wrap_host and _set_host_hooks.
void init_host_tier(pybind11::module_& m);

}  // namespace torch_tpu
