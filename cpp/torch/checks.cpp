#include "checks.h"

#include <cinttypes>
#include <cmath>
#include <cstdio>

#include <c10/util/Exception.h>

namespace fa::torch_binding {

std::string str_of(int64_t value) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%" PRId64, value);
  return buf;
}

std::string str_of(double value) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%g", value);
  return buf;
}

std::string str_of(c10::IntArrayRef values) {
  std::string out = "[";
  for (size_t i = 0; i < values.size(); ++i) out += (i ? ", " : "") + str_of(values[i]);
  return out + "]";
}

namespace {

std::string shape_of(const at::Tensor& t) { return str_of(t.sizes()); }

void check_rank4_half(const char* op, const char* name, const at::Tensor& t) {
  TORCH_CHECK(t.defined(), op, ": ", name, " is undefined");
  TORCH_CHECK(t.dim() == 4, op, ": ", name, " must be 4-D (batch, heads, seqlen, head_dim), got shape ",
              shape_of(t));
  TORCH_CHECK(t.scalar_type() == at::kHalf || t.scalar_type() == at::kBFloat16, op, ": ", name,
              ".dtype must be float16 or bfloat16, got ", t.scalar_type());
  TORCH_CHECK(t.is_cpu() || t.is_cuda(), op, ": ", name, " must be a CPU or CUDA tensor, got device ",
              t.device());
  TORCH_CHECK(t.size(3) <= 1 || t.stride(3) == 1, op, ": ", name,
              " must have stride 1 in its last dimension (head_dim), got strides ", str_of(t.strides()),
              "; call .contiguous() on it");
}

void check_same_kind(const char* op, const char* name, const at::Tensor& t, const at::Tensor& q) {
  TORCH_CHECK(t.scalar_type() == q.scalar_type(), op, ": ", name, ".dtype (", t.scalar_type(),
              ") must match q.dtype (", q.scalar_type(), ")");
  TORCH_CHECK(t.device() == q.device(), op, ": ", name, " is on ", t.device(), " but q is on ",
              q.device(), "; all inputs must be on one device");
}

}  // namespace

AttentionShape check_forward_inputs(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  constexpr const char* op = "fa.forward";
  check_rank4_half(op, "q", q);
  check_rank4_half(op, "k", k);
  check_rank4_half(op, "v", v);
  check_same_kind(op, "k", k, q);
  check_same_kind(op, "v", v, q);

  AttentionShape s;
  s.batch = q.size(0);
  s.heads_q = q.size(1);
  s.seqlen_q = q.size(2);
  s.head_dim = q.size(3);
  s.heads_kv = k.size(1);
  s.seqlen_k = k.size(2);

  TORCH_CHECK(k.sizes() == v.sizes(), op, ": k and v must have the same shape (batch, heads_kv, seqlen_k, ",
              "head_dim), got k ", shape_of(k), " and v ", shape_of(v));
  TORCH_CHECK(k.size(0) == s.batch, op, ": k and v must have q's batch size ", str_of(s.batch), ", got ",
              str_of(k.size(0)));
  TORCH_CHECK(k.size(3) == s.head_dim, op, ": k and v must have q's head_dim ", str_of(s.head_dim), ", got ",
              str_of(k.size(3)));
  TORCH_CHECK(s.head_dim % kHeadDimMultiple == 0 && s.head_dim >= kHeadDimMultiple &&
                  s.head_dim <= kMaxHeadDim,
              op, ": head_dim must be a multiple of ", str_of(kHeadDimMultiple), " between ",
              str_of(kHeadDimMultiple), " and ", str_of(kMaxHeadDim), ", got ", str_of(s.head_dim));
  if (s.heads_kv == 0) {
    TORCH_CHECK(s.heads_q == 0, op, ": k and v have 0 heads but q has ", str_of(s.heads_q));
  } else {
    TORCH_CHECK(s.heads_q % s.heads_kv == 0, op, ": the number of query heads (", str_of(s.heads_q),
                ") must be divisible by the number of key/value heads (", str_of(s.heads_kv), ")");
  }
  return s;
}

AttentionShape check_backward_inputs(const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k,
                                     const at::Tensor& v, const at::Tensor& out,
                                     const at::Tensor& softmax_lse) {
  constexpr const char* op = "fa.backward";
  AttentionShape s = check_forward_inputs(q, k, v);
  check_rank4_half(op, "dout", dout);
  check_rank4_half(op, "out", out);
  check_same_kind(op, "dout", dout, q);
  check_same_kind(op, "out", out, q);
  TORCH_CHECK(dout.sizes() == q.sizes(), op, ": dout must have q's shape ", shape_of(q), ", got ",
              shape_of(dout));
  TORCH_CHECK(out.sizes() == q.sizes(), op, ": out must have q's shape ", shape_of(q), ", got ",
              shape_of(out));
  TORCH_CHECK(softmax_lse.defined() && softmax_lse.scalar_type() == at::kFloat, op,
              ": softmax_lse must be float32 (as fa.forward returns it)");
  TORCH_CHECK(softmax_lse.device() == q.device(), op, ": softmax_lse is on ", softmax_lse.device(),
              " but q is on ", q.device());
  TORCH_CHECK(softmax_lse.dim() == 3 && softmax_lse.size(0) == s.batch &&
                  softmax_lse.size(1) == s.heads_q && softmax_lse.size(2) == s.seqlen_q,
              op, ": softmax_lse must have shape (batch, heads_q, seqlen_q) = ",
              str_of(c10::IntArrayRef({s.batch, s.heads_q, s.seqlen_q})), ", got ", shape_of(softmax_lse));
  return s;
}

float resolve_softmax_scale(std::optional<double> softmax_scale, int64_t head_dim) {
  if (!softmax_scale.has_value()) {
    return static_cast<float>(1.0 / std::sqrt(static_cast<double>(head_dim)));
  }
  // The kernels take each row's max of the raw scores as the max of the scaled ones: scale > 0.
  TORCH_CHECK(std::isfinite(*softmax_scale) && *softmax_scale > 0,
              "fa: softmax_scale must be a positive finite number, got ", str_of(*softmax_scale));
  return static_cast<float>(*softmax_scale);
}

}  // namespace fa::torch_binding
