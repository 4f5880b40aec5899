// e4m3 (torch.float8_e4m3fn) keys and values as the 16-bit elements the decode kernel's GEMMs read
// (decode_kernel.h with an FP8 cache).
//
// Every e4m3 value is exactly an fp16 (3 mantissa bits, exponents 2^-9 … 2^8, all of them fp16
// normals), so the conversion loses nothing:
//   V (and P) go to fp16: O += P V runs as an fp16 GEMM whatever q's dtype (P in [0, 1] is held more
//     precisely in fp16 than in bf16).
//   K goes to fp16 as well, so S = Q Kᵀ runs as an fp16 GEMM too: a bf16 query is taken into fp16
//     once, row by row, scaled by a power of two (fp16_row_shift), and the scores scaled back.
// The fp16 pair comes from one cvt.rn.f16x2.e4m3x2 on sm_89 and newer; sm_80/86 (no FP8
// instructions) place the bits themselves (the e4m3 value · 2^-8 as an fp16, fp16 subnormals
// included) and multiply by 2^8. The e4m3 NaN (0x7F/0xFF) reads as ±480 there (NaN on sm_89+).
#pragma once

#include <cstdint>

#include <cute/config.hpp>

namespace fa::sm80 {

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

// A bf16 query row into fp16: the power of two 2^shift that puts the row's largest magnitude
// (row_max_abs) in [2^14, 2^15), 0 for a row of zeros or with a non-finite value. Each bf16 value
// (8 significant bits) whose scaled magnitude is at least 2^-17, i.e. every value within 2^-31 of
// the row's largest, is then exactly an fp16; smaller ones round to a multiple of 2^-24, less than
// 2^-39 of the largest: below the rounding of the fp32 scores. The scores are scaled back by 2^-shift.
CUTE_DEVICE int fp16_row_shift(float row_max_abs) {
  if (!(row_max_abs > 0.f) || row_max_abs == INFINITY) return 0;
  int e;
  frexpf(row_max_abs, &e);  // row_max_abs in [2^(e-1), 2^e)
  return min(max(15 - e, -126), 126);
}

// 2^k for k in [-126, 127], exactly.
CUTE_DEVICE float exact_exp2(int k) { return __int_as_float((k + 127) << 23); }

// Two floats as an fp16 pair, lo in the low half (round to nearest).
CUTE_DEVICE uint32_t half2_of(float lo, float hi) {
  uint32_t h;
  asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(h) : "f"(hi), "f"(lo));
  return h;
}

// A bf16 pair (low half first) times factor, as an fp16 pair (round to nearest).
CUTE_DEVICE uint32_t bf16x2_to_scaled_half2(uint32_t x, float factor) {
  return half2_of(__uint_as_float(x << 16) * factor, __uint_as_float(x & 0xFFFF0000u) * factor);
}

// The largest magnitude of a bf16 pair.
CUTE_DEVICE float bf16x2_max_abs(uint32_t x) {
  return fmaxf(fabsf(__uint_as_float(x << 16)), fabsf(__uint_as_float(x & 0xFFFF0000u)));
}

}  // namespace fa::sm80
