// The CPU implementation of the ops: correct, not fast. Plain loops in float32 over the tensors'
// memory (any strides), parallel over query rows or key rows with std::thread, so it needs nothing
// from torch beyond the stable ABI's tensor accessors.
#pragma once

#include <optional>
#include <tuple>

#include "stable.h"

namespace fa::torch_binding {

std::tuple<Tensor, Tensor> forward_cpu(const Tensor& q, const Tensor& k, const Tensor& v,
                                       std::optional<double> softmax_scale, bool causal);

std::tuple<Tensor, Tensor, Tensor> backward_cpu(const Tensor& dout, const Tensor& q, const Tensor& k,
                                                const Tensor& v, const Tensor& out,
                                                const Tensor& softmax_lse,
                                                std::optional<double> softmax_scale, bool causal);

}  // namespace fa::torch_binding
