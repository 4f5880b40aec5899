// Adding the backward's dQ tiles into the fp32 workspace that every key tile's CTA adds to.
//
// On sm90 the Ampere-family kernel uses two Hopper additions that need no TMA descriptor:
// vector reductions (red.global.add.v2.f32) and the bulk reduction of a shared-memory block into
// global memory (cp.reduce.async.bulk ... .add.f32), which the copy engine performs in L2.
#pragma once

#include <cstdint>

#include <cute/config.hpp>

namespace fa::sm80 {

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
inline constexpr bool kArchHasBulkReduce = false;
#else
inline constexpr bool kArchHasBulkReduce = true;  // sm90+ (and the host pass, which runs no kernel)
#endif

// dst[0] += a and dst[1] += b in global memory (dst 8-byte aligned). On sm90 one vector reduction:
// the four threads of an accumulator row then cover one whole 32-byte sector per instruction.
CUTE_DEVICE void atomic_add_pair(float* dst, float a, float b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  atomicAdd(reinterpret_cast<float2*>(dst), make_float2(a, b));
#else
  atomicAdd(dst, a);
  atomicAdd(dst + 1, b);
#endif
}

// smem[0] = a, smem[1] = b as one 64-bit shared-memory store (smem 8-byte aligned). Written out
// because the compiler, unable to prove the alignment of a swizzled offset, splits a float2 store
// into two 32-bit ones, which conflict where the 64-bit one does not.
CUTE_DEVICE void store_shared_pair(float* smem, float a, float b) {
  const auto addr = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" :: "r"(addr), "f"(a), "f"(b));
}

// Makes this thread's ordinary shared-memory writes visible to the bulk copy engine (the async
// proxy); a barrier after it makes them visible to the thread that issues the reduction.
CUTE_DEVICE void fence_shared_for_bulk_copy() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
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

// Waits until all but the newest kPending of this thread's bulk reductions have read their shared
// memory (it may be rewritten).
template <int kPending = 0>
CUTE_DEVICE void bulk_reduce_wait_read() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.wait_group.read %0;\n" :: "n"(kPending) : "memory");
#endif
}

// Waits until this thread's bulk reductions are complete.
CUTE_DEVICE void bulk_reduce_wait_all() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
#endif
}

}  // namespace fa::sm80
