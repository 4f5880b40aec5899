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

}  // namespace fa::sm90
