// Views of wgmma register fragments.
//
// A warpgroup's 64 × N fp32 accumulator: thread t holds, in each 8-column group j, columns
// 8j + 2·(t % 4) + {0, 1} of row 16·(t / 32) + (t % 32) / 4 and of that row + 8. CuTe partitions it
// as ((2 columns, 2 rows, N / 8 column groups), MMA_M, MMA_N). As with mma.sync, the 4 lanes of a
// quad share their rows, so row reductions (common/online_softmax.h) finish within the quad.
#pragma once

#include <cute/tensor.hpp>

#include "common/fragment_convert.h"

namespace fa::sm90 {

// ((2, 2, N/8), MMA_M, MMA_N) -> ((2, MMA_M), (2, N/8, MMA_N)): mode 0 the rows this thread holds,
// mode 1 its values in a row.
template <class Layout>
CUTE_HOST_DEVICE constexpr auto rowcol_layout(Layout acc) {
  using namespace cute;
  static_assert(decltype(rank<0>(acc))::value == 3 && decltype(rank(acc))::value == 3);
  return make_layout(make_layout(get<0, 1>(acc), get<1>(acc)),
                     make_layout(get<0, 0>(acc), get<0, 2>(acc), get<2>(acc)));
}

template <class Tensor>
CUTE_DEVICE auto rowcol_view(Tensor&& acc) {
  return cute::make_tensor(acc.data(), rowcol_layout(acc.layout()));
}

// ((2, 2, N/8), MMA_M, MMA_N) accumulator -> ((2, 2, 2), MMA_M, N/16 · MMA_N) A operand of a
// register-sourced wgmma with K = 16: two 8-column groups of the accumulator hold exactly the
// registers of one k16 A fragment, so P = softmax(S) feeds O += P V without leaving registers.
template <class Layout>
CUTE_HOST_DEVICE constexpr auto accumulator_as_a_operand(Layout acc) {
  using namespace cute;
  static_assert(decltype(rank<0>(acc))::value == 3 && decltype(size<0, 2>(acc))::value % 2 == 0);
  auto groups = logical_divide(get<0, 2>(acc), Tile<_2>{});  // ((2, N/16))
  return make_layout(make_layout(get<0, 0>(acc), get<0, 1>(acc), get<0, 0>(groups)), get<1>(acc),
                     coalesce(make_layout(get<0, 1>(groups), get<2>(acc))));
}

// FP8: P as the e4m3 A operand of O += P V (K = 32 a wgmma). An A fragment holds, for the thread's
// row r (and r + 8), slots 4·(t % 4) + {0..3} and 16 + 4·(t % 4) + {0..3} of each 32 keys. The
// transposed V stores the keys of each 16 in the order of those slots (transpose_v.h,
// fp8_v_key_of_slot): slots 4·(t % 4) + {0..3} are keys 2·(t % 4) + {0, 1} and 8 + 2·(t % 4) + {0, 1},
// the accumulator columns this thread holds. So each thread converts its own values to e4m3 and
// packs them with byte permutes: no shuffles.
//
// acc: the fp32 probabilities ((2, 2, N/8), 1, 1); frag: e4m3 ((4, 2, 2), 1, N/32), compact.
template <class Acc, class Frag>
CUTE_DEVICE void fp8_probs_as_a_operand(Acc const& acc, Frag& frag) {
  using namespace cute;
  constexpr int kGroups = decltype(size(acc))::value / 4;  // 8-column groups
  static_assert(kGroups % 4 == 0 && decltype(size(frag))::value == 4 * kGroups);
  // Group j's four values (row r: columns 0, 1; row r + 8: columns 0, 1) as one word of e4m3.
  uint32_t words[kGroups];
  CUTE_UNROLL
  for (int j = 0; j < kGroups; ++j) {
    uint16_t lo, hi;
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %2, %1;" : "=h"(lo) : "f"(acc(4 * j)), "f"(acc(4 * j + 1)));
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %2, %1;" : "=h"(hi) : "f"(acc(4 * j + 2)), "f"(acc(4 * j + 3)));
    words[j] = uint32_t(lo) | uint32_t(hi) << 16;
  }
  uint32_t* out = reinterpret_cast<uint32_t*>(raw_pointer_cast(frag.data()));
  CUTE_UNROLL
  for (int k = 0; k < kGroups / 4; ++k) {
    CUTE_UNROLL
    for (int h = 0; h < 2; ++h) {  // row r, row r + 8
      const uint32_t row = h == 0 ? 0x5410 : 0x7632;
      out[4 * k + h] = __byte_perm(words[4 * k], words[4 * k + 1], row);          // keys 0 .. 15
      out[4 * k + 2 + h] = __byte_perm(words[4 * k + 2], words[4 * k + 3], row);  // keys 16 .. 31
    }
  }
}

}  // namespace fa::sm90
