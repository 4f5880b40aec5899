// The bulk reduction of a shared-memory block into global memory (cp.reduce.async.bulk ...
// .add.f32, sm90): the copy engine adds it in L2, asynchronously. Both kernel families' backwards
// add their dQ tiles into the fp32 workspace with it (and the Hopper D = 64 backward stores a
// query tile's first partial with the plain bulk copy, common/dq_claims.h). Compiled for an arch
// before sm90 (the Ampere family's kernel there reduces otherwise), these do nothing.
#pragma once

#include <cstdint>

#include <cute/config.hpp>

namespace fa {

// Makes this thread's ordinary shared-memory writes visible to the bulk copy engine (the async
// proxy); a barrier after it makes them visible to the thread that issues the reduction.
CUTE_DEVICE void fence_shared_for_bulk_copy() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}

// Orders this thread's bulk copies and reductions (the async proxy) after the global-memory writes
// it has seen (through an acquire, or as its own): a proxy fence over global memory.
CUTE_DEVICE void fence_view_async_global() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("fence.proxy.async.global;\n" ::: "memory");
#endif
}

// gmem[i] += smem[i] for bytes / 4 floats, asynchronously (one thread issues it). Both addresses
// 16-byte aligned, bytes a multiple of 16.
CUTE_DEVICE void bulk_reduce_add(float* gmem, const float* smem, int bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  const auto smem_addr = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n"
               :: "l"(gmem), "r"(smem_addr), "r"(bytes) : "memory");
  asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
#endif
}

// gmem[i] = smem[i] for bytes / 4 floats, asynchronously, as a bulk group like a reduction's (the
// waits below count it). Both addresses 16-byte aligned, bytes a multiple of 16.
CUTE_DEVICE void bulk_store(float* gmem, const float* smem, int bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  const auto smem_addr = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;\n"
               :: "l"(gmem), "r"(smem_addr), "r"(bytes) : "memory");
  asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
#endif
}

// Waits until all but the newest kPending of this thread's bulk reductions have read their shared
// memory (it may be rewritten).
template <int kPending = 0>
CUTE_DEVICE void bulk_reduce_wait_read() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.wait_group.read %0;\n" :: "n"(kPending) : "memory");
#endif
}

// Waits until all but the newest kPending of this thread's bulk reductions are complete.
template <int kPending = 0>
CUTE_DEVICE void bulk_reduce_wait_complete() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.wait_group %0;\n" :: "n"(kPending) : "memory");
#endif
}

}  // namespace fa
