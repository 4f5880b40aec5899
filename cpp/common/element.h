// Maps the binding's element tags (fa/params.h) onto CUTLASS numeric types.
#pragma once

#include <cutlass/numeric_types.h>

#include "fa/params.h"

namespace fa {

template <class Tag>
struct CutlassElement;

template <>
struct CutlassElement<Float16> {
  using type = cutlass::half_t;
};

template <>
struct CutlassElement<BFloat16> {
  using type = cutlass::bfloat16_t;
};

template <class Tag>
using cutlass_element_t = typename CutlassElement<Tag>::type;

}  // namespace fa
