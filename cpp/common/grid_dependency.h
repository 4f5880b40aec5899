// Programmatic dependent launch (sm90 and later): a kernel launched with launch_after_prior_grid
// may be scheduled onto SMs before the kernel ahead of it in the stream has finished, and waits in
// wait_for_prior_grid until that kernel has completed and its writes are visible. What runs before
// the wait (a CTA's launch, its barrier set-up) overlaps the prior kernel's last CTAs and the
// launch latency between the two. The prior kernel lets the dependent one be scheduled early with
// allow_dependent_grid (else that happens as its CTAs exit).
//
// The rule that keeps this exact: before its wait a dependent kernel touches no global memory that
// the prior kernel writes, and writes none that it reads. The backward chains its own three
// kernels this way (pre-pass, main kernel, dQ conversion: sm90/bwd_launch.h); the first of them is
// launched plainly, so nothing of the caller's runs alongside it and the call's inputs are
// complete before any of the three starts: the main kernel loads its first K, V and Q before its
// wait (sm90/bwd_load.h). Split-KV's combine pass follows the KV-cache kernels the same way
// (common/split_kv.h), waiting before anything else.
#pragma once

#include <cuda_runtime.h>  // cudaLaunchKernelEx

#include "fa/per_device.h"

namespace fa {

// Whether a dependent launch of kKernel on the current device is exact: the code the device runs
// was compiled for sm90 or later, so its wait_for_prior_grid is a griddepcontrol.wait (code
// JIT-compiled from an older arch's PTX has none, and would read the prior grid's results before
// they are complete). Asked of the runtime once per device (fa/per_device.h).
template <auto kKernel>
bool dependent_launch_exact() {
  return once_per_device([](int) {  // 0: unknown; 1: no; 2: yes
    cudaFuncAttributes attributes;
    if (cudaFuncGetAttributes(&attributes, reinterpret_cast<const void*>(kKernel)) != cudaSuccess) return 0;
    return attributes.ptxVersion >= 90 ? 2 : 1;
  }) == 2;
}

// Block until the grid this one depends on has completed, its memory operations visible. Returns
// at once in a kernel launched without the attribute (or below sm90).
__device__ __forceinline__ void wait_for_prior_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// Let a grid launched after this one with the attribute be scheduled once every CTA of this grid
// has called this (or exited). It does not make this grid's writes visible to it: the dependent
// grid's wait does.
__device__ __forceinline__ void allow_dependent_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Launch `kernel` so that it may start before the stream's previous kernel has finished (it must
// call wait_for_prior_grid before touching what that kernel writes or reads).
template <class Kernel, class... Args>
cudaError_t launch_after_prior_grid(Kernel kernel, dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                                    const Args&... args) {
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  cudaLaunchAttribute attribute[1];
  attribute[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute[0].val.programmaticStreamSerializationAllowed = 1;
  config.attrs = attribute;
  config.numAttrs = 1;
  return cudaLaunchKernelEx(&config, kernel, args...);
}

}  // namespace fa
