// Adding the backward's dQ tiles into the fp32 workspace that every key tile's CTA adds to.
//
// On sm90 the Ampere-family kernel uses two Hopper additions that need no TMA descriptor:
// vector reductions (red.global.add.v2.f32) and the bulk reduction of a shared-memory block into
// global memory (common/bulk_reduce.h), which the copy engine performs in L2.
#pragma once

#include <cstdint>

#include <cute/config.hpp>

#include "common/bulk_reduce.h"

namespace fa::sm80 {

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
inline constexpr bool kArchHasBulkReduce = false;
#else
inline constexpr bool kArchHasBulkReduce = true;  // sm90+ (and the host pass, which runs no kernel)
#endif

// dst[0] += a and dst[1] += b in global memory (dst 8-byte aligned), or where `store` (the
// tile's first addition in the deterministic order, common/dq_claims.h) dst[0] = a, dst[1] = b:
// predicated instructions, no branch. On sm90 one vector reduction: the four threads of an
// accumulator row then cover one whole 32-byte sector per instruction.
CUTE_DEVICE void add_or_store_pair(float* dst, bool store, float a, float b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile(
      "{\n .reg .pred s;\n setp.ne.b32 s, %3, 0;\n"
      " @s st.global.v2.f32 [%0], {%1, %2};\n"
      " @!s red.relaxed.gpu.global.add.v2.f32 [%0], {%1, %2};\n}"
      :: "l"(dst), "f"(a), "f"(b), "r"(int(store)) : "memory");
#elif defined(__CUDA_ARCH__)
  asm volatile(
      "{\n .reg .pred s;\n setp.ne.b32 s, %3, 0;\n"
      " @s st.global.v2.f32 [%0], {%1, %2};\n"
      " @!s red.relaxed.gpu.global.add.f32 [%0], %1;\n"
      " @!s red.relaxed.gpu.global.add.f32 [%0+4], %2;\n}"
      :: "l"(dst), "f"(a), "f"(b), "r"(int(store)) : "memory");
#endif
}

// smem[0] = a, smem[1] = b as one 64-bit shared-memory store (smem 8-byte aligned). Written out
// because the compiler, unable to prove the alignment of a swizzled offset, splits a float2 store
// into two 32-bit ones, which conflict where the 64-bit one does not.
CUTE_DEVICE void store_shared_pair(float* smem, float a, float b) {
  const auto addr = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" :: "r"(addr), "f"(a), "f"(b));
}

}  // namespace fa::sm80
