// Output allocation shared by every device's implementation, so that all of them (and the fake
// kernels in python/fa/_registration.py) agree on shapes and strides.
#pragma once

#include "checks.h"

namespace fa::torch_binding {

struct ForwardOutputs {
  Tensor out;  // q's shape with v's head dim, q's dtype (or out_dtype); dense (see empty_like_attention in outputs.cpp)
  Tensor lse;  // (B, Hq, Sq) float32, contiguous
};

struct Gradients {
  Tensor dq, dk, dv;  // shaped and laid out like q, k, v
};

// out_dtype: the output's dtype where it is not q's (FP8 inputs: Fp8Args::out_dtype).
ForwardOutputs allocate_forward_outputs(const Tensor& q, const AttentionShape& s,
                                        std::optional<ScalarType> out_dtype = std::nullopt);
Gradients allocate_gradients(const Tensor& q, const Tensor& k, const Tensor& v);

// Variable-length batches: out (total_q, Hq, Dv) and the gradients contiguous whatever the inputs'
// strides (a slice of a packed (total, 3, H, D) projection gives dense outputs), lse (Hq, total_q).
ForwardOutputs allocate_varlen_outputs(const Tensor& q, const VarlenShape& s,
                                       std::optional<ScalarType> out_dtype = std::nullopt);
Gradients allocate_varlen_gradients(const Tensor& q, const Tensor& k, const Tensor& v);

// A dense copy of t, contiguous in (B, H, S, D) order.
Tensor contiguous_copy(const Tensor& t);

// t if its last dimension is dense (stride 1, or at most one element), else a contiguous copy:
// index tensors (cu_seqlens, cache_seqlens, page_table rows) as the kernels and loops read them.
Tensor dense_last_dim(const Tensor& t);

// When there is nothing to multiply (an empty dimension, or no keys at all) these give the outputs
// their values (out 0 and lse -inf for rows that see no key, or their head's sink logit with
// sinks; zero gradients) and return true.
bool finish_trivial_forward(const AttentionShape& s, ForwardOutputs& outputs,
                            const std::optional<Tensor>& sinks = std::nullopt);
bool finish_trivial_backward(const AttentionShape& s, Gradients& grads);

}  // namespace fa::torch_binding
