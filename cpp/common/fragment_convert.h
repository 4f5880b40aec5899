// Element-wise conversion of a register fragment (fp32 -> fp16/bf16), shared by both families.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/numeric_conversion.h>

namespace fa {

// Converts src into dst, a register tensor of as many elements, two values per instruction and
// written as whole registers (an element-wise copy of 16-bit values assembles each register with
// byte permutes).
template <class SrcEngine, class SrcLayout, class DstEngine, class DstLayout>
CUTE_DEVICE void convert_fragment_into(cute::Tensor<SrcEngine, SrcLayout> const& src,
                                       cute::Tensor<DstEngine, DstLayout>& dst) {
  using From = typename SrcEngine::value_type;
  using To = typename DstEngine::value_type;
  constexpr int kSize = decltype(cute::size(src))::value;
  static_assert(decltype(cute::size(dst))::value == kSize);
  cutlass::NumericArrayConverter<To, From, kSize> convert;
  *reinterpret_cast<cutlass::Array<To, kSize>*>(dst.data()) =
      convert(*reinterpret_cast<const cutlass::Array<From, kSize>*>(src.data()));
}

// Converts two values per instruction into a new register tensor of the same (compact) layout.
template <class To, class Engine, class Layout>
CUTE_DEVICE auto convert_fragment(cute::Tensor<Engine, Layout> const& src) {
  auto dst = cute::make_tensor<To>(src.layout());
  convert_fragment_into(src, dst);
  return dst;
}

}  // namespace fa
