// The CPU implementation of the ops: correct, not fast; the reference for every variant. Plain loops in float32 over the tensors'
// memory (any strides), parallel over query rows or key rows with std::thread, so it needs nothing
// from torch beyond the stable ABI's tensor accessors.
#pragma once

#include <optional>
#include <tuple>

#include "checks.h"

namespace fa::torch_binding {

std::tuple<Tensor, Tensor> forward_cpu(const Tensor& q, const Tensor& k, const Tensor& v,
                                       std::optional<double> softmax_scale, bool causal, int64_t window_left,
                                       int64_t window_right, double softcap, std::optional<Tensor> sinks,
                                       std::optional<Tensor> q_descale, std::optional<Tensor> k_descale,
                                       std::optional<Tensor> v_descale, std::optional<ScalarType> out_dtype);

// The backward: deterministic whatever `deterministic` says (each thread owns the rows it writes).
std::tuple<Tensor, Tensor, Tensor> backward_cpu(const Tensor& dout, const Tensor& q, const Tensor& k,
                                                const Tensor& v, const Tensor& out,
                                                const Tensor& softmax_lse,
                                                std::optional<double> softmax_scale, bool causal,
                                                int64_t window_left, int64_t window_right, double softcap,
                                                bool deterministic);

// The KV cache (fa::forward_kvcache). Here cache_seqlens and page_table are checked (in range).
std::tuple<Tensor, Tensor> forward_kvcache_cpu(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                                               const Tensor& cache_seqlens, std::optional<Tensor> page_table,
                                               std::optional<double> softmax_scale, bool causal, int64_t num_splits,
                                               int64_t window_left, int64_t window_right, double softcap,
                                               std::optional<Tensor> sinks, std::optional<Tensor> cache_leftpad,
                                               std::optional<Tensor> k_descale, std::optional<Tensor> v_descale);

// Variable-length batches (fa::forward_varlen / fa::backward_varlen). Here, unlike on CUDA, the
// values of cu_seqlens_q / cu_seqlens_k are checked (reading them costs nothing on the CPU).
std::tuple<Tensor, Tensor> forward_varlen_cpu(const Tensor& q, const Tensor& k, const Tensor& v,
                                              const Tensor& cu_seqlens_q, const Tensor& cu_seqlens_k,
                                              int64_t max_seqlen_q, int64_t max_seqlen_k,
                                              std::optional<double> softmax_scale, bool causal, int64_t window_left,
                                              int64_t window_right, double softcap, std::optional<Tensor> sinks,
                                              std::optional<Tensor> q_descale, std::optional<Tensor> k_descale,
                                              std::optional<Tensor> v_descale, std::optional<ScalarType> out_dtype);

std::tuple<Tensor, Tensor, Tensor> backward_varlen_cpu(const Tensor& dout, const Tensor& q, const Tensor& k,
                                                       const Tensor& v, const Tensor& out,
                                                       const Tensor& softmax_lse, const Tensor& cu_seqlens_q,
                                                       const Tensor& cu_seqlens_k, int64_t max_seqlen_q,
                                                       int64_t max_seqlen_k, std::optional<double> softmax_scale,
                                                       bool causal, int64_t window_left, int64_t window_right,
                                                       double softcap, bool deterministic);

}  // namespace fa::torch_binding
