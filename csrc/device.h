// The tpu device surface: device guard, hooks and generator.
#pragma once

#include <Python.h>
#include <ATen/core/Generator.h>
#include <c10/core/Device.h>

#include <cstdint>

namespace torch_tpu {

// Registers the guard, hooks and allocator for PrivateUse1. Idempotent.
void register_device();

// The default generator of a tpu device (-1: current device).
const at::Generator& default_generator(c10::DeviceIndex device);

// Reserves `increment` random values from a tpu generator: returns the seed
// and the offset to use, then advances the offset (like CUDA's philox).
std::pair<uint64_t, uint64_t> reserve_random(at::Generator generator, uint64_t increment);

// The Python callable (torch_tpu.sync) that device, stream and event
// synchronization run; None clears it. Caller holds the GIL.
void set_synchronize_hook(PyObject* hook);

}  // namespace torch_tpu
