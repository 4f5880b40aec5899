#include "outputs.h"

#include <limits>

namespace fa::torch_binding {
namespace {

// Dense, t's shape with head dim d (t's own by default), laid out as (B, H, S, d), or as (B, S, H, d)
// when t has heads inside sequence positions (a (B, S, H, D) tensor seen through .transpose(1, 2)),
// so that out.transpose(1, 2).reshape(B, S, H·d) costs no copy. python/fa/_layout.py states the
// same rule for the fake kernels.
Tensor empty_like_attention(const Tensor& t, int64_t d = -1, std::optional<ScalarType> dtype = std::nullopt) {
  if (d < 0) d = t.size(3);
  const bool heads_inside_rows = t.size(1) > 1 && t.size(2) > 1 && t.stride(1) < t.stride(2);
  if (heads_inside_rows) {
    const Tensor rows = torch::stable::new_empty(t, {t.size(0), t.size(2), t.size(1), d}, dtype);
    return torch::stable::transpose(rows, 1, 2);
  }
  return torch::stable::new_empty(t, {t.size(0), t.size(1), t.size(2), d}, dtype);
}

}  // namespace

ForwardOutputs allocate_forward_outputs(const Tensor& q, const AttentionShape& s, std::optional<ScalarType> out_dtype) {
  return {empty_like_attention(q, s.head_dim_v, out_dtype),
          torch::stable::new_empty(q, {s.batch, s.heads_q, s.seqlen_q}, ScalarType::Float)};
}

Gradients allocate_gradients(const Tensor& q, const Tensor& k, const Tensor& v) {
  return {empty_like_attention(q), empty_like_attention(k), empty_like_attention(v)};
}

ForwardOutputs allocate_varlen_outputs(const Tensor& q, const VarlenShape& s, std::optional<ScalarType> out_dtype) {
  return {torch::stable::new_empty(q, {s.total_q, s.heads_q, s.head_dim_v}, out_dtype),
          torch::stable::new_empty(q, {s.heads_q, s.total_q}, ScalarType::Float)};
}

Gradients allocate_varlen_gradients(const Tensor& q, const Tensor& k, const Tensor& v) {
  return {torch::stable::new_empty(q, q.sizes()), torch::stable::new_empty(k, k.sizes()),
          torch::stable::new_empty(v, v.sizes())};
}

Tensor contiguous_copy(const Tensor& t) {
  Tensor copy = torch::stable::new_empty(t, t.sizes());
  torch::stable::copy_(copy, t);
  return copy;
}

Tensor dense_last_dim(const Tensor& t) {
  const int64_t last = t.dim() - 1;
  return t.size(last) <= 1 || t.stride(last) == 1 ? t : contiguous_copy(t);
}

bool finish_trivial_forward(const AttentionShape& s, ForwardOutputs& o, const std::optional<Tensor>& sinks) {
  if (!s.empty() && s.seqlen_k > 0) return false;
  torch::stable::zero_(o.out);
  if (sinks) {
    // lse (B, Hq, Sq) or (Hq, total_q), seen with the heads last: each row's value is its head's sink.
    Tensor rows = torch::stable::transpose(o.lse, o.lse.dim() == 2 ? 0 : 1, o.lse.dim() - 1);
    torch::stable::copy_(rows, *sinks);
  } else {
    torch::stable::fill_(o.lse, -std::numeric_limits<double>::infinity());
  }
  return true;
}

bool finish_trivial_backward(const AttentionShape& s, Gradients& g) {
  if (!s.empty() && s.seqlen_k > 0) return false;
  torch::stable::zero_(g.dq);
  torch::stable::zero_(g.dk);
  torch::stable::zero_(g.dv);
  return true;
}

}  // namespace fa::torch_binding
