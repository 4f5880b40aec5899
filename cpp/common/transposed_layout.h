// The same shared-memory bytes seen transposed, for GEMM operands read with the other mode
// contiguous (ldmatrix.trans on sm80, an MN-major wgmma operand on sm90), or in part.
#pragma once

#include <cute/tensor.hpp>

namespace fa {

// A (cols × rows [× stages]) view of a (rows × cols [× stages]) layout.
template <class Layout>
CUTE_HOST_DEVICE constexpr auto transposed(Layout const& layout) {
  using namespace cute;
  const auto rows = size<0>(layout);
  const auto cols = size<1>(layout);
  if constexpr (decltype(rank(layout))::value == 2) {
    return composition(layout, make_layout(make_shape(cols, rows), GenRowMajor{}));
  } else {
    static_assert(decltype(rank(layout))::value == 3, "rows × cols, or rows × cols × stages");
    return composition(layout, make_ordered_layout(make_shape(cols, rows, size<2>(layout)),
                                                   Step<_2, _1, _3>{}));
  }
}

template <class Layout>
using TransposedLayout = decltype(transposed(Layout{}));

// The first kCols columns of a (rows × cols [× stages]) layout: (rows × kCols [× stages]), each
// coordinate where the whole layout puts it (a view of part of a tile, every stage's).
template <int kCols, class Layout>
CUTE_HOST_DEVICE constexpr auto first_columns(Layout const& layout) {
  using namespace cute;
  const auto rows = size<0>(layout);
  static_assert(kCols <= decltype(size<1>(layout))::value);
  if constexpr (decltype(rank(layout))::value == 2) {
    return composition(layout, make_layout(make_shape(rows, Int<kCols>{}), make_stride(_1{}, rows)));
  } else {
    return composition(layout, make_layout(make_shape(rows, Int<kCols>{}, size<2>(layout)),
                                           make_stride(_1{}, rows, rows * size<1>(layout))));
  }
}

template <class Layout, int kCols>
using ColumnsOf = decltype(first_columns<kCols>(Layout{}));

}  // namespace fa
