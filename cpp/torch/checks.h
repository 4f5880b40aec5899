// Argument checks for the fa ops: one place, messages that name the argument and what was expected.
#pragma once

#include <optional>

#include "fa/params.h"  // kPageRows
#include "stable.h"

namespace fa::torch_binding {

struct AttentionShape {
  int64_t batch = 0;
  int64_t heads_q = 0;
  int64_t heads_kv = 0;
  int64_t seqlen_q = 0;
  int64_t seqlen_k = 0;
  int64_t head_dim = 0;    // q's and k's
  int64_t head_dim_v = 0;  // v's and the output's: head_dim, or another (DeepSeek's MLA: 192 and 128)

  int64_t group_size() const { return heads_kv == 0 ? 1 : heads_q / heads_kv; }
  bool empty() const { return batch == 0 || heads_q == 0 || seqlen_q == 0; }
};

// A variable-length batch: batch = len(cu_seqlens_q) - 1, seqlen_q/seqlen_k the given maxima (at
// most total_q / total_k).
struct VarlenShape : AttentionShape {
  int64_t total_q = 0;  // rows of the packed q
  int64_t total_k = 0;  // rows of the packed k and v
};

// A KV-cache call: seqlen_k is the cache's capacity (S_cap, or max_pages · page_size).
struct KVCacheShape : AttentionShape {
  int64_t page_size = 0;  // 0: a contiguous cache
  int64_t max_pages = 0;  // page_table's columns
  bool fp8 = false;       // float8_e4m3fn k_cache and v_cache (with optional k_descale, v_descale)
};

// The FP8 forward's extras (q, k and v float8_e4m3fn): float32 (batch, heads_kv) descales and the
// output's dtype (bfloat16, or float16). None of them for 16-bit inputs.
struct Fp8Args {
  bool fp8 = false;
  std::optional<Tensor> q_descale, k_descale, v_descale;
  std::optional<ScalarType> out_dtype;  // the output's dtype where it is not q's
};

inline constexpr int64_t kMaxHeadDim = 256;
inline constexpr int64_t kMaxSplits = 128;
inline constexpr int64_t kHeadDimMultiple = 8;

// q (B, Hq, Sq, D), k (B, Hk, Sk, D) and v (B, Hk, Sk, Dv): fp16/bf16 (or all three float8_e4m3fn:
// check_fp8_args), one device, stride 1 in the last dim. Every op takes v's head dim Dv (the
// output's) apart from q's and k's D; which CUDA kernels serve it is cuda_ops.cpp's choice (pair
// kernels, zero-padded copies, or a clear error).
AttentionShape check_forward_inputs(const Tensor& q, const Tensor& k, const Tensor& v);

// The forward's inputs plus dout and out ((B, Hq, Sq, Dv)) and softmax_lse ((B, Hq, Sq) float32).
AttentionShape check_backward_inputs(const Tensor& dout, const Tensor& q, const Tensor& k,
                                     const Tensor& v, const Tensor& out, const Tensor& softmax_lse);

// Variable-length batches (op names fa.forward_varlen / fa.backward_varlen): q (total_q, Hq, D),
// k (total_k, Hk, D), v (total_k, Hk, Dv), cu_seqlens_* int32 (batch + 1) on q's device. Their values are not
// read (that would synchronise with the GPU); the CPU implementation checks them.
VarlenShape check_varlen_inputs(const char* op, const Tensor& q, const Tensor& k, const Tensor& v,
                                const Tensor& cu_seqlens_q, const Tensor& cu_seqlens_k,
                                int64_t max_seqlen_q, int64_t max_seqlen_k);

// The varlen forward's inputs plus dout and out ((total_q, Hq, Dv)) and softmax_lse ((Hq, total_q) float32).
VarlenShape check_varlen_backward_inputs(const Tensor& dout, const Tensor& q, const Tensor& k,
                                         const Tensor& v, const Tensor& out, const Tensor& softmax_lse,
                                         const Tensor& cu_seqlens_q, const Tensor& cu_seqlens_k,
                                         int64_t max_seqlen_q, int64_t max_seqlen_k);

// fa.forward_kvcache: q (B, Hq, Sq, D); k_cache (B, Hk, S_cap, D) and v_cache (B, Hk, S_cap, Dv), or
// with page_table (int32 (B, max_pages)) (num_pages, page_size, Hk, D or Dv); cache_seqlens int32 (B,); cache_leftpad
// int32 (B,), contiguous caches only; num_splits in [0, kMaxSplits]. Index values are not read.
// The caches have q's dtype, or both float8_e4m3fn; k_descale and v_descale, float32 (B, Hk) on
// q's device, only with those.
KVCacheShape check_kvcache_inputs(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                                  const Tensor& cache_seqlens, const std::optional<Tensor>& page_table,
                                  const std::optional<Tensor>& cache_leftpad,
                                  int64_t num_splits, const std::optional<Tensor>& k_descale,
                                  const std::optional<Tensor>& v_descale);

// The attention variants every op takes beside causal: a sliding window, logit soft-capping and
// per-head sink logits (FlashAttention's window_size and softcap conventions).
struct Variant {
  // Query i sees key j iff i' - window_left <= j <= i' + window_right, i' = i + Sk - Sq (bottom-right
  // aligned, as causal); -1: unbounded on that side. causal is window_right = 0.
  int64_t window_left = -1;
  int64_t window_right = -1;
  double softcap = 0.0;          // > 0: scores become softcap · tanh(scores · scale / softcap)
  std::optional<Tensor> sinks;   // float32 (Hq,), stride 1: one logit a query head in every row's denominator

  // Whether a key's visibility depends on the query's position (causal or a window): the kernels
  // instantiated for causal serve every such mask, with the bounds at run time.
  bool local() const { return window_left >= 0 || window_right >= 0; }
  // Whether the call runs on the kernels instantiated for causal: a local mask, or soft-capping,
  // whose kernels exist with that mask alone (it serves a call without bounds too).
  bool causal_kernels() const { return local() || softcap > 0; }
};

// Checks and normalises the variant arguments of `op`: window bounds -1 or >= 0 (causal with
// window_right -1 or 0, which it becomes), softcap finite and >= 0, sinks float32 (heads_q,) on
// q's device (made stride 1).
Variant check_variant(const char* op, bool causal, int64_t window_left, int64_t window_right, double softcap,
                      const std::optional<Tensor>& sinks, const Tensor& q, int64_t heads_q);

// The FP8 forward's arguments of `op` (checks.h Fp8Args): descales only with float8_e4m3fn q, k
// and v, float32 (batch, heads_kv) on q's device, any strides; out_dtype only with them, bfloat16
// (the default) or float16.
Fp8Args check_fp8_args(const char* op, const Tensor& q, const AttentionShape& s, std::optional<Tensor> q_descale,
                       std::optional<Tensor> k_descale, std::optional<Tensor> v_descale,
                       std::optional<ScalarType> out_dtype);

// softmax_scale, or 1/sqrt(head_dim) when it is None.
float resolve_softmax_scale(std::optional<double> softmax_scale, int64_t head_dim);

}  // namespace fa::torch_binding
