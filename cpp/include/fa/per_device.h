// Host code's facts about a device and its settings there, asked of (or made with) the runtime
// once per device: a KV-cache call runs at every decoded token, and it asks the runtime nothing
// twice.
#pragma once

#include <atomic>

#include <cuda_runtime_api.h>

namespace fa {

// ask(device) for `device` the first time, its answer after that; ask returns a nonzero value,
// or 0 where the runtime cannot say (then asked again at the next call). Each call site (each
// closure type of ask) keeps its own answers, for up to 64 devices (others are asked every time).
template <class Ask>
int once_for_device(int device, Ask&& ask) {
  constexpr int kDevices = 64;
  static std::atomic<int> known[kDevices] = {};
  const bool kept = device >= 0 && device < kDevices;
  int value = kept ? known[device].load(std::memory_order_relaxed) : 0;
  if (value == 0) {
    value = ask(device);
    if (value != 0 && kept) known[device].store(value, std::memory_order_relaxed);
  }
  return value;
}

// once_for_device for the current device; 0 where there is none.
template <class Ask>
int once_per_device(Ask&& ask) {
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return 0;
  return once_for_device(device, static_cast<Ask&&>(ask));
}

// Opts kKernel in to `bytes` of dynamic shared memory (the opt-in above 48 KB) on the current
// device, once per device and kernel (`bytes` must be the same at every call on a device); the
// runtime's error where it fails (then tried again at the next call). max_carveout: also asks for
// the largest shared-memory carve-out of L1 (for kernels that run several CTAs an SM).
template <auto kKernel>
cudaError_t opt_in_shared_memory(int bytes, bool max_carveout = false) {
  cudaError_t err = cudaSuccess;
  once_per_device([&](int) {
    err = cudaFuncSetAttribute(kKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
    if (err == cudaSuccess && max_carveout) {
      err = cudaFuncSetAttribute(kKernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                 cudaSharedmemCarveoutMaxShared);
    }
    return err == cudaSuccess ? 1 : 0;
  });
  return err;
}

// The compute capability of `device` as one number (80, 86, 90), or 0 where the runtime cannot say.
inline int device_capability(int device) {
  return once_for_device(device, [](int d) {
    int major = 0, minor = 0;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, d) != cudaSuccess ||
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, d) != cudaSuccess) {
      return 0;
    }
    return major * 10 + minor;
  });
}

// The SM count of `device`, or 0 where the runtime cannot say.
inline int device_sm_count(int device) {
  return once_for_device(device, [](int d) {
    int sms = 0;
    return cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, d) == cudaSuccess ? sms : 0;
  });
}

}  // namespace fa
