// The FP8-cache decode tile of at most 8 query rows, with the keys on the mma's M side
// (decode_kernel.h, DecodeConfig::kKeysOnM).
//
// With the query rows on M (the other decode tiles), an m16n8k16 tile computes 16 rows, of which a
// decoding step with 4 query heads a kv head has 4. Here both products are transposed so that the
// rows sit on N, 8 wide:
//   Sᵀ = K Qᵀ     A: K, 16 keys × 16 head-dim values; B: Qᵀ, 8 rows; C: 16 keys × 8 rows
//   Oᵀ += Vᵀ Pᵀ   A: Vᵀ, 16 head-dim values × 16 keys; B: Pᵀ; C: 16 head-dim values × 8 rows
// which halves the mma's, the exponentials and O's accumulator registers of a 16-row tile. Lane
// (g = lane / 4, t = lane % 4) holds rows 2t and 2t + 1 of each accumulator: of Sᵀ at keys g and
// g + 8 of each 16-key tile, of Oᵀ at head-dim values g and g + 8 of each 16-value tile. A row's
// values thus lie across the 8 lanes of one t (OnlineSoftmax's kRowLanes 0b11100).
//
// The operands, from the e4m3 bytes in shared memory (converted in registers, fp8_kv.h):
//   K: A of Sᵀ wants key rows g and g + 8, contraction indices 2t, 2t+1, 2t+8, 2t+9 of each k16
//     slice: the pattern of the 16-row tile's B fragment of K, so the same 16-byte loads of one key
//     row serve four slices, and Q's columns are permuted the same way (permute_query_block).
//   Qᵀ: B of Sᵀ, row g at those contraction indices: two 32-bit loads a slice, once, kept in registers.
//   Pᵀ: B of Oᵀ wants keys 2t, 2t+1 (and + 8) at row g; Sᵀ's accumulator holds keys g (and g + 8)
//     at rows 2t, 2t+1: each 8 × 8 half of a key tile, as fp16 pairs, is transposed by one
//     movmatrix.
//   Vᵀ: A of Oᵀ wants head-dim values (g, g + 8) at keys 2t, 2t+1, 2t+8, 2t+9. Lane g reads its
//     own D/8 consecutive bytes of each of those key rows, and the head-dim tile i takes bytes 2i
//     (as value g) and 2i + 1 (as g + 8) of them, paired across two key rows by one byte_perm. So
//     lane (g, t) ends with O's rows 2t, 2t+1 at head-dim values g · D/8 + 2i + h, where h = 0, 1
//     picks the accumulator's half: in the natural order, D/8 consecutive values a row.
#pragma once

#include <cstdint>

#include <cute/arch/mma_sm80.hpp>
#include <cute/tensor.hpp>

#include "sm80/fp8_kv.h"

namespace fa::sm80 {

// The 8 × 8 matrix of 16-bit values a warp holds (lane l: row l / 4, columns 2 (l % 4) and + 1),
// transposed.
CUTE_DEVICE uint32_t transpose_8x8(uint32_t x) {
  uint32_t y;
  asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;" : "=r"(y) : "r"(x));
  return y;
}

// d += a · b, one m16n8k16 fp16 mma with fp32 accumulators.
CUTE_DEVICE void mma_m16n8k16(float* d, const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  cute::SM80_16x8x16_F32F16F16F32_TN::fma(d[0], d[1], d[2], d[3], a[0], a[1], a[2], a[3], b0, b1,
                                          d[0], d[1], d[2], d[3]);
}

template <int kHeadDim, int kWarpKeys>
struct KeysOnM {
  static constexpr int kKeyTiles = kWarpKeys / 16;  // Sᵀ's M tiles; Oᵀ's k16 slices
  static constexpr int kSlices = kHeadDim / 16;     // Sᵀ's k16 slices; Oᵀ's M tiles
  static constexpr int kLaneBytes = kHeadDim / 8;   // the bytes of a V row a lane reads
  // Sᵀ's contraction runs in kChains independent sums a key tile (64-value blocks alternate
  // between them), added at the end: more independent chains of mma's in a step.
  static constexpr int kChains = kKeyTiles >= 4 || kHeadDim == 64 ? 1 : 2;
  static_assert(kWarpKeys % 16 == 0 && (kHeadDim == 64 || kHeadDim == 128 || kHeadDim == 256));

  // Row-column views (OnlineSoftmax): (rows 2t, 2t+1) × (half h, tile m): register 4m + 2h + r.
  using ScoreLayout = cute::Layout<cute::Shape<cute::_2, cute::Shape<cute::_2, cute::Int<kKeyTiles>>>,
                                   cute::Stride<cute::_1, cute::Stride<cute::_2, cute::_4>>>;
  using OutLayout = cute::Layout<cute::Shape<cute::_2, cute::Shape<cute::_2, cute::Int<kSlices>>>,
                                 cute::Stride<cute::_1, cute::Stride<cute::_2, cute::_4>>>;
  static constexpr unsigned kRowLanes = 0b11100u;

  int g, t;
  uint32_t q[kSlices][2];  // Qᵀ's B fragments

  CUTE_DEVICE explicit KeysOnM(int lane) : g(lane / 4), t(lane % 4) {}

  // The query rows (fp16, columns permuted: permute_query_block), from shared memory.
  template <class QTensor>
  CUTE_DEVICE void load_query(QTensor const& sQ) {
    CUTE_UNROLL
    for (int s = 0; s < kSlices; ++s) {
      q[s][0] = *reinterpret_cast<const uint32_t*>(&sQ(g, 16 * s + 2 * t));
      q[s][1] = *reinterpret_cast<const uint32_t*>(&sQ(g, 16 * s + 2 * t + 8));
    }
  }

  // acc_s (ScoreLayout) = Sᵀ of the key slice whose bytes k8 holds (layout: (key, d) -> byte).
  template <class Layout, class Acc>
  CUTE_DEVICE void scores(const uint8_t* k8, Layout const& layout, Acc& acc_s) const {
    float chain[kChains][kKeyTiles][4] = {};
    CUTE_UNROLL
    for (int b = 0; b < kHeadDim / 64; ++b) {
      CUTE_UNROLL
      for (int m = 0; m < kKeyTiles; ++m) {
        const uint4 lo = *reinterpret_cast<const uint4*>(k8 + layout(16 * m + g, 64 * b + 16 * t));
        const uint4 hi = *reinterpret_cast<const uint4*>(k8 + layout(16 * m + g + 8, 64 * b + 16 * t));
        const uint32_t wl[4] = {lo.x, lo.y, lo.z, lo.w}, wh[4] = {hi.x, hi.y, hi.z, hi.w};
        CUTE_UNROLL
        for (int c = 0; c < 4; ++c) {
          const uint32_t a[4] = {e4m3x2_to_half2(wl[c] & 0xFFFFu), e4m3x2_to_half2(wh[c] & 0xFFFFu),
                                 e4m3x2_to_half2(wl[c] >> 16), e4m3x2_to_half2(wh[c] >> 16)};
          mma_m16n8k16(chain[b % kChains][m], a, q[4 * b + c][0], q[4 * b + c][1]);
        }
      }
    }
    CUTE_UNROLL
    for (int m = 0; m < kKeyTiles; ++m) {
      CUTE_UNROLL
      for (int i = 0; i < 4; ++i) {
        float sum = chain[0][m][i];
        CUTE_UNROLL
        for (int c = 1; c < kChains; ++c) sum += chain[c][m][i];
        acc_s.data()[4 * m + i] = sum;
      }
    }
  }

  // acc_o (OutLayout) += Vᵀ Pᵀ: probs (ScoreLayout, fp32) and the value slice's bytes v8.
  template <class Layout, class Probs, class Acc>
  CUTE_DEVICE void values(Probs const& probs, const uint8_t* v8, Layout const& layout, Acc& acc_o) const {
    CUTE_UNROLL
    for (int m = 0; m < kKeyTiles; ++m) {
      const float* p = &probs.data()[4 * m];
      const uint32_t b0 = transpose_8x8(half2_of(p[0], p[1])), b1 = transpose_8x8(half2_of(p[2], p[3]));
      const int key = 16 * m + 2 * t;  // and key + 1, key + 8, key + 9
      // The lane's bytes of each row, 4 to a word: one 8-byte load (D = 64) or 16-byte loads.
      constexpr int kWords = kLaneBytes / 4;
      uint32_t w[4][kWords];
      const int rows[4] = {key, key + 1, key + 8, key + 9};
      CUTE_UNROLL
      for (int r = 0; r < 4; ++r) {
        if constexpr (kWords == 2) {
          const uint2 x = *reinterpret_cast<const uint2*>(v8 + layout(rows[r], kLaneBytes * g));
          w[r][0] = x.x, w[r][1] = x.y;
        } else {
          CUTE_UNROLL
          for (int p = 0; p < kWords / 4; ++p) {  // (16-byte pieces: contiguous within the swizzle)
            const uint4 x = *reinterpret_cast<const uint4*>(v8 + layout(rows[r], kLaneBytes * g + 16 * p));
            w[r][4 * p] = x.x, w[r][4 * p + 1] = x.y, w[r][4 * p + 2] = x.z, w[r][4 * p + 3] = x.w;
          }
        }
      }
      CUTE_UNROLL
      for (int i = 0; i < kSlices; ++i) {  // head-dim tile i: bytes 2i, 2i + 1 of the lane's
        const int word = i / 2, e = 2 * (i % 2);
        // Bytes: the first value of keys 2t and 2t+1 (head-dim value g), then the second (g + 8).
        const uint32_t select = e | (4 + e) << 4 | (e + 1) << 8 | (5 + e) << 12;
        const uint32_t near = __byte_perm(w[0][word], w[1][word], select);  // keys 2t, 2t+1
        const uint32_t far = __byte_perm(w[2][word], w[3][word], select);   // keys 2t+8, 2t+9
        const uint32_t a[4] = {e4m3x2_to_half2(near & 0xFFFFu), e4m3x2_to_half2(near >> 16),
                               e4m3x2_to_half2(far & 0xFFFFu), e4m3x2_to_half2(far >> 16)};
        mma_m16n8k16(&acc_o.data()[4 * i], a, b0, b1);
      }
    }
  }

  // The key (within the slice) and row of score register 4m + 2h + r.
  CUTE_DEVICE int key_of(int i) const { return 16 * (i / 4) + 8 * (i / 2 % 2) + g; }
  CUTE_DEVICE int row_of(int i) const { return 2 * t + i % 2; }
  // The head-dim value of output register 4i + 2h + r (row r of the lane's two).
  CUTE_DEVICE int column_of(int i) const { return kLaneBytes * g + 2 * (i / 4) + i / 2 % 2; }
};

}  // namespace fa::sm80
