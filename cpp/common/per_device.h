// Host launch code's facts about the current device, asked of the runtime once per device: a
// KV-cache call runs at every decoded token, and its launch asks the runtime nothing twice.
#pragma once

#include <atomic>

#include <cuda_runtime_api.h>

namespace fa {

// ask(device) for the current device the first time, its answer after that; ask returns a
// nonzero value, or 0 where the runtime cannot say (then asked again at the next call). Each
// call site (each closure type of ask) keeps its own answers, for up to 64 devices (others are
// asked every time). 0 where there is no current device.
template <class Ask>
int once_per_device(Ask&& ask) {
  constexpr int kDevices = 64;
  static std::atomic<int> known[kDevices] = {};
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return 0;
  int value = device < kDevices ? known[device].load(std::memory_order_relaxed) : 0;
  if (value == 0) {
    value = ask(device);
    if (value != 0 && device < kDevices) known[device].store(value, std::memory_order_relaxed);
  }
  return value;
}

}  // namespace fa
