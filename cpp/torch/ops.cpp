// The op schemas of the `fa` library and their CPU implementations, registered through the stable
// ABI. The CUDA implementations live in a second library (cuda_ops.cpp, _C_cuda.so) that
// python/fa/_library.py loads when torch is a CUDA build; a build without CUDA kernels registers
// a "not built" error for CUDA tensors here instead.
#include "cpu_attention.h"

namespace fa::torch_binding {
namespace {

#ifndef FA_WITH_CUDA
[[noreturn]] void cuda_not_built(const char* op) {
  fail(op, ": this build of fa has no CUDA kernels (it was built without nvcc, or with FA_CUDA=OFF, "
           "or against a CPU-only torch); reinstall on a machine with both, or run on CPU tensors. "
           "fa.build_info() shows what this build contains.");
}

std::tuple<Tensor, Tensor> forward_cuda_not_built(Tensor, Tensor, Tensor, std::optional<double>, bool, int64_t, int64_t, double, std::optional<Tensor>,
                                                  std::optional<Tensor>, std::optional<Tensor>, std::optional<Tensor>,
                                                  std::optional<ScalarType>) {
  cuda_not_built("fa.forward");
}

std::tuple<Tensor, Tensor, Tensor> backward_cuda_not_built(Tensor, Tensor, Tensor, Tensor, Tensor, Tensor,
                                                           std::optional<double>, bool, int64_t, int64_t, double, bool) {
  cuda_not_built("fa.backward");
}

std::tuple<Tensor, Tensor> forward_varlen_cuda_not_built(Tensor, Tensor, Tensor, Tensor, Tensor, int64_t, int64_t,
                                                         std::optional<double>, bool, int64_t, int64_t, double, std::optional<Tensor>,
                                                         std::optional<Tensor>, std::optional<Tensor>, std::optional<Tensor>,
                                                         std::optional<ScalarType>) {
  cuda_not_built("fa.forward_varlen");
}

std::tuple<Tensor, Tensor> forward_kvcache_cuda_not_built(Tensor, Tensor, Tensor, Tensor, std::optional<Tensor>,
                                                          std::optional<double>, bool, int64_t, int64_t, int64_t, double, std::optional<Tensor>,
                                                          std::optional<Tensor>, std::optional<Tensor>, std::optional<Tensor>) {
  cuda_not_built("fa.forward_kvcache");
}

std::tuple<Tensor, Tensor, Tensor> backward_varlen_cuda_not_built(Tensor, Tensor, Tensor, Tensor, Tensor, Tensor,
                                                                  Tensor, Tensor, int64_t, int64_t,
                                                                  std::optional<double>, bool, int64_t, int64_t, double,
                                                                  bool) {
  cuda_not_built("fa.backward_varlen");
}
#endif

}  // namespace
}  // namespace fa::torch_binding

STABLE_TORCH_LIBRARY(fa, m) {
  m.def(
      "forward(Tensor q, Tensor k, Tensor v, float? softmax_scale=None, bool causal=False,"
      " int window_left=-1, int window_right=-1, float softcap=0.0, Tensor? sinks=None,"
      " Tensor? q_descale=None, Tensor? k_descale=None, Tensor? v_descale=None, ScalarType? out_dtype=None)"
      " -> (Tensor out, Tensor softmax_lse)");
  m.def(
      "backward(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor softmax_lse,"
      " float? softmax_scale=None, bool causal=False,"
      " int window_left=-1, int window_right=-1, float softcap=0.0, bool deterministic=False)"
      " -> (Tensor dq, Tensor dk, Tensor dv)");
  m.def(
      "forward_varlen(Tensor q, Tensor k, Tensor v, Tensor cu_seqlens_q, Tensor cu_seqlens_k,"
      " int max_seqlen_q, int max_seqlen_k, float? softmax_scale=None, bool causal=False,"
      " int window_left=-1, int window_right=-1, float softcap=0.0, Tensor? sinks=None,"
      " Tensor? q_descale=None, Tensor? k_descale=None, Tensor? v_descale=None, ScalarType? out_dtype=None)"
      " -> (Tensor out, Tensor softmax_lse)");
  m.def(
      "forward_kvcache(Tensor q, Tensor k_cache, Tensor v_cache, Tensor cache_seqlens,"
      " Tensor? page_table=None, float? softmax_scale=None, bool causal=True, int num_splits=0,"
      " int window_left=-1, int window_right=-1, float softcap=0.0, Tensor? sinks=None,"
      " Tensor? cache_leftpad=None, Tensor? k_descale=None, Tensor? v_descale=None)"
      " -> (Tensor out, Tensor softmax_lse)");
  m.def(
      "backward_varlen(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor softmax_lse,"
      " Tensor cu_seqlens_q, Tensor cu_seqlens_k, int max_seqlen_q, int max_seqlen_k,"
      " float? softmax_scale=None, bool causal=False,"
      " int window_left=-1, int window_right=-1, float softcap=0.0, bool deterministic=False)"
      " -> (Tensor dq, Tensor dk, Tensor dv)");
}

STABLE_TORCH_LIBRARY_IMPL(fa, CPU, m) {
  m.impl("forward", TORCH_BOX(&fa::torch_binding::forward_cpu));
  m.impl("backward", TORCH_BOX(&fa::torch_binding::backward_cpu));
  m.impl("forward_varlen", TORCH_BOX(&fa::torch_binding::forward_varlen_cpu));
  m.impl("forward_kvcache", TORCH_BOX(&fa::torch_binding::forward_kvcache_cpu));
  m.impl("backward_varlen", TORCH_BOX(&fa::torch_binding::backward_varlen_cpu));
}

#ifndef FA_WITH_CUDA
STABLE_TORCH_LIBRARY_IMPL(fa, CUDA, m) {
  m.impl("forward", TORCH_BOX(&fa::torch_binding::forward_cuda_not_built));
  m.impl("backward", TORCH_BOX(&fa::torch_binding::backward_cuda_not_built));
  m.impl("forward_varlen", TORCH_BOX(&fa::torch_binding::forward_varlen_cuda_not_built));
  m.impl("forward_kvcache", TORCH_BOX(&fa::torch_binding::forward_kvcache_cuda_not_built));
  m.impl("backward_varlen", TORCH_BOX(&fa::torch_binding::backward_varlen_cuda_not_built));
}
#endif
