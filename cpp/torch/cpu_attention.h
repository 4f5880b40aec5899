// The CPU implementation of the ops: correct, not fast. ATen ops in float32 over chunks of keys
// with the online softmax, so memory stays O(Sq · chunk) per head instead of O(Sq · Sk).
#pragma once

#include <optional>
#include <tuple>

#include <ATen/core/Tensor.h>

namespace fa::torch_binding {

std::tuple<at::Tensor, at::Tensor> forward_cpu(const at::Tensor& q, const at::Tensor& k,
                                               const at::Tensor& v, std::optional<double> softmax_scale,
                                               bool causal);

std::tuple<at::Tensor, at::Tensor, at::Tensor> backward_cpu(
    const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const at::Tensor& out, const at::Tensor& softmax_lse, std::optional<double> softmax_scale,
    bool causal);

}  // namespace fa::torch_binding
