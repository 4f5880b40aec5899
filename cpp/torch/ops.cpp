// The op schemas of the `fa` library and their CPU implementations. The CUDA implementations are
// registered in cuda_ops.cpp when the kernels are built, and by a "not built" error otherwise.
#include <torch/library.h>

#include "cpu_attention.h"

#ifndef FA_WITH_CUDA
#include <c10/util/Exception.h>
#endif

namespace fa::torch_binding {
namespace {

#ifndef FA_WITH_CUDA
[[noreturn]] void cuda_not_built(const char* op) {
  TORCH_CHECK(false, op,
              ": this build of fa has no CUDA kernels (it was built without a CUDA-enabled torch or "
              "without nvcc, or with FA_CUDA=OFF); reinstall on a machine with both, or run on CPU "
              "tensors. fa.build_info() shows what this build contains.");
}

std::tuple<at::Tensor, at::Tensor> forward_cuda_not_built(const at::Tensor&, const at::Tensor&,
                                                          const at::Tensor&, std::optional<double>,
                                                          bool) {
  cuda_not_built("fa.forward");
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> backward_cuda_not_built(
    const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
    const at::Tensor&, std::optional<double>, bool) {
  cuda_not_built("fa.backward");
}
#endif

}  // namespace
}  // namespace fa::torch_binding

TORCH_LIBRARY(fa, m) {
  m.def(
      "forward(Tensor q, Tensor k, Tensor v, float? softmax_scale=None, bool causal=False)"
      " -> (Tensor out, Tensor softmax_lse)",
      {at::Tag::pt2_compliant_tag});
  m.def(
      "backward(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor softmax_lse,"
      " float? softmax_scale=None, bool causal=False) -> (Tensor dq, Tensor dk, Tensor dv)",
      {at::Tag::pt2_compliant_tag});
}

TORCH_LIBRARY_IMPL(fa, CPU, m) {
  m.impl("forward", &fa::torch_binding::forward_cpu);
  m.impl("backward", &fa::torch_binding::backward_cpu);
}

#ifndef FA_WITH_CUDA
TORCH_LIBRARY_IMPL(fa, CUDA, m) {
  m.impl("forward", &fa::torch_binding::forward_cuda_not_built);
  m.impl("backward", &fa::torch_binding::backward_cuda_not_built);
}
#endif
