#include "cpu_attention.h"

#include <limits>

#include <ATen/ATen.h>

#include "checks.h"
#include "outputs.h"

namespace fa::torch_binding {
namespace {

constexpr int64_t kKeyChunk = 256;
constexpr double kInf = std::numeric_limits<double>::infinity();

// (B, Hq, Sq, X) -> (B, Hk, G·Sq, X) in float32: the G query heads that share a kv head stacked as
// rows, so one matmul per kv head serves its whole group and the sums dK, dV need over the group
// are part of the matmul.
at::Tensor group_rows(const at::Tensor& t, const AttentionShape& s) {
  return t.to(at::kFloat).reshape({s.batch, s.heads_kv, s.group_size() * s.seqlen_q, t.size(-1)});
}

// Causal, bottom-right aligned: query i sees key j iff j <= i + (Sk - Sq). Returns the positions to
// hide, (G·Sq, len) for keys [key_begin, key_begin + len).
at::Tensor causal_hidden(const AttentionShape& s, int64_t key_begin, int64_t len) {
  auto opts = at::TensorOptions().dtype(at::kLong);
  auto query = at::arange(s.seqlen_q, opts).repeat({s.group_size()}).unsqueeze(1);
  auto key = at::arange(key_begin, key_begin + len, opts).unsqueeze(0);
  return key > query + (s.seqlen_k - s.seqlen_q);
}

at::Tensor scaled_scores(const at::Tensor& q_rows, const at::Tensor& k_chunk, float scale,
                         const AttentionShape& s, int64_t key_begin, bool causal) {
  auto scores = at::matmul(q_rows, k_chunk.transpose(-2, -1)).mul_(scale);
  if (causal) scores.masked_fill_(causal_hidden(s, key_begin, k_chunk.size(2)), -kInf);
  return scores;
}

}  // namespace

std::tuple<at::Tensor, at::Tensor> forward_cpu(const at::Tensor& q, const at::Tensor& k,
                                               const at::Tensor& v, std::optional<double> softmax_scale,
                                               bool causal) {
  const AttentionShape s = check_forward_inputs(q, k, v);
  const float scale = resolve_softmax_scale(softmax_scale, s.head_dim);
  ForwardOutputs o = allocate_forward_outputs(q, s);
  if (finish_trivial_forward(s, o)) return {o.out, o.lse};

  const auto q_rows = group_rows(q, s);
  const auto k_f = k.to(at::kFloat);
  const auto v_f = v.to(at::kFloat);
  const int64_t rows = q_rows.size(2);
  auto row_max = at::full({s.batch, s.heads_kv, rows, 1}, -kInf, q_rows.options());
  auto row_sum = at::zeros_like(row_max);
  auto acc = at::zeros_like(q_rows);

  for (int64_t key_begin = 0; key_begin < s.seqlen_k; key_begin += kKeyChunk) {
    const int64_t len = std::min(kKeyChunk, s.seqlen_k - key_begin);
    auto scores = scaled_scores(q_rows, k_f.narrow(2, key_begin, len), scale, s, key_begin, causal);
    auto new_max = at::maximum(row_max, std::get<0>(scores.max(-1, /*keepdim=*/true)));
    // A row that has seen only hidden keys keeps max -inf; exp(-inf - 0) = 0 keeps it empty.
    auto safe_max = at::where(new_max == -kInf, at::zeros_like(new_max), new_max);
    auto probs = (scores - safe_max).exp_();
    auto correction = (row_max - safe_max).exp_();
    row_sum = row_sum * correction + probs.sum(-1, /*keepdim=*/true);
    acc = acc * correction + at::matmul(probs, v_f.narrow(2, key_begin, len));
    row_max = new_max;
  }

  auto seen = row_sum > 0;
  auto out_rows = at::where(seen, acc / row_sum, at::zeros_like(acc));
  auto lse_rows = at::where(seen, row_max + row_sum.log(), at::full_like(row_sum, -kInf));
  o.out.copy_(out_rows.view({s.batch, s.heads_q, s.seqlen_q, s.head_dim}));
  o.lse.copy_(lse_rows.view({s.batch, s.heads_q, s.seqlen_q}));
  return {o.out, o.lse};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> backward_cpu(
    const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const at::Tensor& out, const at::Tensor& softmax_lse, std::optional<double> softmax_scale,
    bool causal) {
  const AttentionShape s = check_backward_inputs(dout, q, k, v, out, softmax_lse);
  const float scale = resolve_softmax_scale(softmax_scale, s.head_dim);
  Gradients g = allocate_gradients(q, k, v);
  if (finish_trivial_backward(s, g)) return {g.dq, g.dk, g.dv};

  const auto q_rows = group_rows(q, s);
  const auto dout_rows = group_rows(dout, s);
  const auto k_f = k.to(at::kFloat);
  const auto v_f = v.to(at::kFloat);
  // delta_i = rowsum(dO ∘ O) = Σ_j P_ij dP_ij, the softmax-gradient term shared by a row.
  const auto delta = (dout_rows * group_rows(out, s)).sum(-1, /*keepdim=*/true);
  // A row that saw no key has lse -inf; +inf makes its P exactly 0, so its gradients are 0.
  auto lse = softmax_lse.reshape({s.batch, s.heads_kv, q_rows.size(2), 1});
  lse = at::where(lse == -kInf, at::full_like(lse, kInf), lse);

  auto dq = at::zeros_like(q_rows);
  auto dk = at::zeros_like(k_f);
  auto dv = at::zeros_like(v_f);
  for (int64_t key_begin = 0; key_begin < s.seqlen_k; key_begin += kKeyChunk) {
    const int64_t len = std::min(kKeyChunk, s.seqlen_k - key_begin);
    const auto k_chunk = k_f.narrow(2, key_begin, len);
    const auto v_chunk = v_f.narrow(2, key_begin, len);
    auto probs = (scaled_scores(q_rows, k_chunk, scale, s, key_begin, causal) - lse).exp_();
    dv.narrow(2, key_begin, len).add_(at::matmul(probs.transpose(-2, -1), dout_rows));
    auto dscores = probs * (at::matmul(dout_rows, v_chunk.transpose(-2, -1)) - delta);
    dq.add_(at::matmul(dscores, k_chunk));
    dk.narrow(2, key_begin, len).add_(at::matmul(dscores.transpose(-2, -1), q_rows));
  }
  g.dq.copy_(dq.mul_(scale).view({s.batch, s.heads_q, s.seqlen_q, s.head_dim}));
  g.dk.copy_(dk.mul_(scale));
  g.dv.copy_(dv);
  return {g.dq, g.dk, g.dv};
}

}  // namespace fa::torch_binding
