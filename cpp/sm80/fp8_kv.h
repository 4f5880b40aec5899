// e4m3 (torch.float8_e4m3fn) keys and values as the 16-bit elements the decode kernel's GEMMs read
// (decode_kernel.h with an FP8 cache).
//
// Every e4m3 value is exactly an fp16 (3 mantissa bits, exponents 2^-9 … 2^8, all of them fp16
// normals), so the conversion loses nothing:
//   V (and P) go to fp16: O += P V runs as an fp16 GEMM whatever q's dtype (P in [0, 1] is held more
//     precisely in fp16 than in bf16).
//   K goes to q's dtype. For fp16, as V. For bf16, each fp16 h is re-encoded as the bf16 with h's
//     sign, exponent field and top 7 mantissa bits: a shift, which gives h · 2^-112 exactly
//     (bf16's exponent bias is 127, fp16's 15; every such bf16 is a normal number or zero), and the
//     kernel multiplies the scores by 2^112 (kBf16KeyScale) with the call's k_descale.
// The fp16 pair comes from one cvt.rn.f16x2.e4m3x2 on sm_89 and newer; sm_80/86 (no FP8
// instructions) place the bits themselves (the e4m3 value · 2^-8 as an fp16, fp16 subnormals
// included) and multiply by 2^8. The e4m3 NaN (0x7F/0xFF) reads as ±480 there (NaN on sm_89+).
#pragma once

#include <cstdint>

#include <cute/config.hpp>

namespace fa::sm80 {

// 2^112: the factor a bf16 key read through half2_of_e4m3_to_scaled_bf16x2 lacks.
inline constexpr float kBf16KeyScale = 0x1p112f;

// The e4m3 values in the low and high byte of x as an fp16 pair (low half from the low byte).
CUTE_DEVICE uint32_t e4m3x2_to_half2(uint32_t x) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  uint32_t h;
  const uint16_t pair = static_cast<uint16_t>(x);
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(h) : "h"(pair));
  return h;
#else
  const uint32_t t = __byte_perm(x, 0u, 0x1404);  // bytes: 0, x.byte0, 0, x.byte1
  // Sign to bit 15, exponent and mantissa to bits 13..7 of each half: value · 2^-8.
  const uint32_t scaled = (t & 0x80008000u) | ((t & 0x7F007F00u) >> 1);
  uint32_t h;
  asm("mul.rn.f16x2 %0, %1, %2;" : "=r"(h) : "r"(scaled), "r"(0x5C005C00u));  // × 256 (fp16 2^8)
  return h;
#endif
}

// An fp16 pair holding e4m3 values, re-encoded as the bf16 pair of the same values · 2^-112.
CUTE_DEVICE uint32_t half2_of_e4m3_to_scaled_bf16x2(uint32_t h) {
  return (h & 0x80008000u) | ((h & 0x7FFF7FFFu) >> 3);
}

}  // namespace fa::sm80
