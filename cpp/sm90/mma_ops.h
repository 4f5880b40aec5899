// The wgmma instruction of a warpgroup GEMM step: CuTe's SM90 MMA op for a 64 × N × 16 tile
// (64 × N × 32 for e4m3).
//
// CuTe's op selectors (GMMA::ss_op_selector, rs_op_selector) pick the largest N they know that
// divides the tile's, and without CUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED they know only N = 8, 16,
// 32, 64, 96, 128, 192 and 256: a 144-key tile would run on N = 16 instructions. That macro brings
// every other multiple of 8, but for every type, dense and sparse: 5 MB of headers that took 31 s
// of each Hopper translation unit's 43 s of header parsing (nvcc --time, CUDA 13.0, CUTLASS 4.2).
// The selectors here include only the dense shapes' headers (fp16 and bf16 among them) and name
// the instruction whose N is the tile's own, as the extended selectors do.
#pragma once

#include <cute/tensor.hpp>
#include <cute/atom/mma_traits_sm90_gmma.hpp>
#include <cute/arch/mma_sm90_gmma_ext.hpp>
#include <cute/atom/mma_traits_sm90_gmma_ext.hpp>

namespace fa::sm90 {

namespace detail {

// The extended ops: (Element, N) → the SS (both operands from shared memory) and RS (A from
// registers) op with fp32 accumulators.
template <class Element, int kN, cute::GMMA::Major kMajorA, cute::GMMA::Major kMajorB>
struct ExtendedGmma;

#define FA_SM90_EXTENDED_GMMA(N)                                                           \
  template <cute::GMMA::Major kMajorA, cute::GMMA::Major kMajorB>                          \
  struct ExtendedGmma<cutlass::half_t, N, kMajorA, kMajorB> {                              \
    using SS = cute::SM90::GMMA::MMA_64x##N##x16_F32F16F16_SS<kMajorA, kMajorB>;           \
    using RS = cute::SM90::GMMA::MMA_64x##N##x16_F32F16F16_RS<kMajorA, kMajorB>;           \
  };                                                                                       \
  template <cute::GMMA::Major kMajorA, cute::GMMA::Major kMajorB>                          \
  struct ExtendedGmma<cutlass::bfloat16_t, N, kMajorA, kMajorB> {                          \
    using SS = cute::SM90::GMMA::MMA_64x##N##x16_F32BF16BF16_SS<kMajorA, kMajorB>;         \
    using RS = cute::SM90::GMMA::MMA_64x##N##x16_F32BF16BF16_RS<kMajorA, kMajorB>;         \
  };
FA_SM90_EXTENDED_GMMA(24)
FA_SM90_EXTENDED_GMMA(40)
FA_SM90_EXTENDED_GMMA(48)
FA_SM90_EXTENDED_GMMA(56)
FA_SM90_EXTENDED_GMMA(72)
FA_SM90_EXTENDED_GMMA(80)
FA_SM90_EXTENDED_GMMA(88)
FA_SM90_EXTENDED_GMMA(104)
FA_SM90_EXTENDED_GMMA(112)
FA_SM90_EXTENDED_GMMA(120)
FA_SM90_EXTENDED_GMMA(136)
FA_SM90_EXTENDED_GMMA(144)
FA_SM90_EXTENDED_GMMA(152)
FA_SM90_EXTENDED_GMMA(160)
FA_SM90_EXTENDED_GMMA(168)
FA_SM90_EXTENDED_GMMA(176)
FA_SM90_EXTENDED_GMMA(184)
FA_SM90_EXTENDED_GMMA(200)
FA_SM90_EXTENDED_GMMA(208)
FA_SM90_EXTENDED_GMMA(216)
FA_SM90_EXTENDED_GMMA(224)
FA_SM90_EXTENDED_GMMA(232)
FA_SM90_EXTENDED_GMMA(240)
FA_SM90_EXTENDED_GMMA(248)
#undef FA_SM90_EXTENDED_GMMA

// The N sizes CuTe's selectors know without the extended shapes.
constexpr bool is_base_gmma_n(int n) {
  return n == 8 || n == 16 || n == 32 || n == 64 || n == 96 || n == 128 || n == 192 || n == 256;
}

template <class TileShape>
constexpr int gmma_n() {
  constexpr int n = cute::size<1>(TileShape{});
  static_assert(n % 8 == 0 && n <= 256, "a warpgroup tile's N is one wgmma's: a multiple of 8 up to 256");
  return n;
}

}  // namespace detail

// The op for TileShape (64, N, K) with both operands in shared memory, fp32 accumulators.
template <class Element, class TileShape, cute::GMMA::Major kMajorA = cute::GMMA::Major::K,
          cute::GMMA::Major kMajorB = cute::GMMA::Major::K>
constexpr auto ss_op() {
  constexpr int n = detail::gmma_n<TileShape>();
  if constexpr (detail::is_base_gmma_n(n)) {
    return cute::GMMA::ss_op_selector<Element, Element, float, TileShape, kMajorA, kMajorB>();
  } else {
    return typename detail::ExtendedGmma<Element, n, kMajorA, kMajorB>::SS{};
  }
}

// The op for TileShape (64, N, K) with A from registers (K-major), fp32 accumulators.
template <class Element, class TileShape, cute::GMMA::Major kMajorA = cute::GMMA::Major::K,
          cute::GMMA::Major kMajorB = cute::GMMA::Major::K>
constexpr auto rs_op() {
  constexpr int n = detail::gmma_n<TileShape>();
  if constexpr (detail::is_base_gmma_n(n)) {
    return cute::GMMA::rs_op_selector<Element, Element, float, TileShape, kMajorA, kMajorB>();
  } else {
    return typename detail::ExtendedGmma<Element, n, kMajorA, kMajorB>::RS{};
  }
}

}  // namespace fa::sm90
