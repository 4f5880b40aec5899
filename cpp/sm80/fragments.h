// Views of mma.sync (m16n8k16) register fragments.
//
// An m16n8 accumulator holds 4 floats per thread: (c0, c1) in row lane/4, columns 2·(lane%4) + {0, 1},
// and (c2, c3) in row lane/4 + 8. A partitioned accumulator is (4, MMA_M, MMA_N).
#pragma once

#include <cute/tensor.hpp>
#include "common/fragment_convert.h"

namespace fa::sm80 {

// (4, MMA_M, MMA_N) -> ((2, MMA_M), (2, MMA_N)): mode 0 the rows this thread holds, mode 1 its
// values in a row. The online softmax and the row-wise epilogue read accumulators through it.
template <class Layout>
CUTE_HOST_DEVICE constexpr auto rowcol_layout(Layout acc) {
  using namespace cute;
  static_assert(decltype(size<0>(acc))::value == 4 && decltype(rank(acc))::value == 3);
  auto l = logical_divide(acc, Shape<_2>{});  // ((2 cols, 2 rows), MMA_M, MMA_N)
  return make_layout(make_layout(get<0, 1>(l), get<1>(l)), make_layout(get<0, 0>(l), get<2>(l)));
}

template <class Tensor>
CUTE_DEVICE auto rowcol_view(Tensor&& acc) {
  return cute::make_tensor(acc.data(), rowcol_layout(acc.layout()));
}

// (4, MMA_M, MMA_N) accumulator -> ((4, 2), MMA_M, MMA_N / 2) A operand: two n8 accumulator tiles
// side by side are exactly the registers of one k16 A fragment, so P = softmax(S) feeds the next
// MMA (O += P V) straight from registers, with no trip through shared memory.
template <class Layout>
CUTE_HOST_DEVICE constexpr auto accumulator_as_a_operand(Layout acc) {
  using namespace cute;
  static_assert(decltype(size<0>(acc))::value == 4 && decltype(rank(acc))::value == 3);
  auto l = logical_divide(acc, Shape<Underscore, Underscore, _2>{});  // (4, MMA_M, (2, MMA_N / 2))
  return make_layout(make_layout(get<0>(l), get<2, 0>(l)), get<1>(l), get<2, 1>(l));
}

}  // namespace fa::sm80
