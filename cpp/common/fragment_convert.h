// Element-wise conversion of a register fragment (fp32 -> fp16/bf16), shared by both families.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/numeric_conversion.h>

namespace fa {

// Converts two values per instruction into a new register tensor of the same (compact) layout.
template <class To, class Engine, class Layout>
CUTE_DEVICE auto convert_fragment(cute::Tensor<Engine, Layout> const& src) {
  using From = typename Engine::value_type;
  constexpr int kSize = decltype(cute::size(src))::value;
  cutlass::NumericArrayConverter<To, From, kSize> convert;
  auto dst = cute::make_tensor<To>(src.layout());
  *reinterpret_cast<cutlass::Array<To, kSize>*>(dst.data()) =
      convert(*reinterpret_cast<const cutlass::Array<From, kSize>*>(src.data()));
  return dst;
}

}  // namespace fa
