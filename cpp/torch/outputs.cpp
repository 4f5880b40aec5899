#include "outputs.h"

#include <limits>

#include <ATen/ops/empty.h>

namespace fa::torch_binding {
namespace {

// Dense, laid out as (B, H, S, D), or as (B, S, H, D) when t has heads inside sequence positions (a
// (B, S, H, D) tensor seen through .transpose(1, 2)), so that out.transpose(1, 2).reshape(B, S, H·D)
// costs no copy. python/fa/_layout.py states the same rule for the fake kernels.
at::Tensor empty_like_attention(const at::Tensor& t) {
  const bool heads_inside_rows = t.size(1) > 1 && t.size(2) > 1 && t.stride(1) < t.stride(2);
  if (heads_inside_rows) {
    return at::empty({t.size(0), t.size(2), t.size(1), t.size(3)}, t.options()).transpose(1, 2);
  }
  return at::empty(t.sizes(), t.options());
}

}  // namespace

ForwardOutputs allocate_forward_outputs(const at::Tensor& q, const AttentionShape& s) {
  ForwardOutputs o;
  o.out = empty_like_attention(q);
  o.lse = at::empty({s.batch, s.heads_q, s.seqlen_q}, q.options().dtype(at::kFloat));
  return o;
}

Gradients allocate_gradients(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  return {empty_like_attention(q), empty_like_attention(k), empty_like_attention(v)};
}

bool finish_trivial_forward(const AttentionShape& s, ForwardOutputs& o) {
  if (!s.empty() && s.seqlen_k > 0) return false;
  o.out.zero_();
  o.lse.fill_(-std::numeric_limits<float>::infinity());
  return true;
}

bool finish_trivial_backward(const AttentionShape& s, Gradients& g) {
  if (!s.empty() && s.seqlen_k > 0) return false;
  g.dq.zero_();
  g.dk.zero_();
  g.dv.zero_();
  return true;
}

}  // namespace fa::torch_binding
