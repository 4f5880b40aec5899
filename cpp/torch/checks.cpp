#include "checks.h"

#include <cinttypes>
#include <cmath>
#include <cstdio>

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

std::string str_of(IntArrayRef values) {
  std::string out = "[";
  for (size_t i = 0; i < values.size(); ++i) out += (i ? ", " : "") + str_of(values[i]);
  return out + "]";
}

std::string dtype_name(ScalarType dtype) { return torch::headeronly::toString(dtype); }

std::string device_name(const Tensor& t) {
  if (t.is_cpu()) return "cpu";
  if (t.is_cuda()) return "cuda:" + str_of(int64_t(t.get_device_index()));
  return "a device that is neither CPU nor CUDA";
}

namespace {

std::string shape_of(const Tensor& t) { return str_of(t.sizes()); }

bool same_device(const Tensor& a, const Tensor& b) {
  return a.is_cpu() == b.is_cpu() && a.is_cuda() == b.is_cuda() &&
         a.get_device_index() == b.get_device_index();
}

bool half_type(ScalarType t) { return t == ScalarType::Half || t == ScalarType::BFloat16; }

void check_rank4_half(const char* op, const char* name, const Tensor& t) {
  FA_CHECK(t.defined(), op, ": ", name, " is undefined");
  FA_CHECK(t.dim() == 4, op, ": ", name, " must be 4-D (batch, heads, seqlen, head_dim), got shape ",
           shape_of(t));
  FA_CHECK(half_type(t.scalar_type()), op, ": ", name, ".dtype must be float16 or bfloat16, got ",
           dtype_name(t.scalar_type()));
  FA_CHECK(t.is_cpu() || t.is_cuda(), op, ": ", name, " must be a CPU or CUDA tensor, got ",
           device_name(t));
  FA_CHECK(t.size(3) <= 1 || t.stride(3) == 1, op, ": ", name,
           " must have stride 1 in its last dimension (head_dim), got strides ", str_of(t.strides()),
           "; call .contiguous() on it");
}

void check_same_kind(const char* op, const char* name, const Tensor& t, const Tensor& q) {
  FA_CHECK(t.scalar_type() == q.scalar_type(), op, ": ", name, ".dtype (", dtype_name(t.scalar_type()),
           ") must match q.dtype (", dtype_name(q.scalar_type()), ")");
  FA_CHECK(same_device(t, q), op, ": ", name, " is on ", device_name(t), " but q is on ", device_name(q),
           "; all inputs must be on one device");
}

}  // namespace

AttentionShape check_forward_inputs(const Tensor& q, const Tensor& k, const Tensor& v) {
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

  FA_CHECK(k.sizes().equals(v.sizes()), op, ": k and v must have the same shape (batch, heads_kv, seqlen_k, ",
           "head_dim), got k ", shape_of(k), " and v ", shape_of(v));
  FA_CHECK(k.size(0) == s.batch, op, ": k and v must have q's batch size ", str_of(s.batch), ", got ",
           str_of(k.size(0)));
  FA_CHECK(k.size(3) == s.head_dim, op, ": k and v must have q's head_dim ", str_of(s.head_dim), ", got ",
           str_of(k.size(3)));
  FA_CHECK(s.head_dim % kHeadDimMultiple == 0 && s.head_dim >= kHeadDimMultiple && s.head_dim <= kMaxHeadDim,
           op, ": head_dim must be a multiple of ", str_of(kHeadDimMultiple), " between ",
           str_of(kHeadDimMultiple), " and ", str_of(kMaxHeadDim), ", got ", str_of(s.head_dim));
  if (s.heads_kv == 0) {
    FA_CHECK(s.heads_q == 0, op, ": k and v have 0 heads but q has ", str_of(s.heads_q));
  } else {
    FA_CHECK(s.heads_q % s.heads_kv == 0, op, ": the number of query heads (", str_of(s.heads_q),
             ") must be divisible by the number of key/value heads (", str_of(s.heads_kv), ")");
  }
  return s;
}

AttentionShape check_backward_inputs(const Tensor& dout, const Tensor& q, const Tensor& k,
                                     const Tensor& v, const Tensor& out, const Tensor& softmax_lse) {
  constexpr const char* op = "fa.backward";
  AttentionShape s = check_forward_inputs(q, k, v);
  check_rank4_half(op, "dout", dout);
  check_rank4_half(op, "out", out);
  check_same_kind(op, "dout", dout, q);
  check_same_kind(op, "out", out, q);
  FA_CHECK(dout.sizes().equals(q.sizes()), op, ": dout must have q's shape ", shape_of(q), ", got ",
           shape_of(dout));
  FA_CHECK(out.sizes().equals(q.sizes()), op, ": out must have q's shape ", shape_of(q), ", got ",
           shape_of(out));
  FA_CHECK(softmax_lse.defined() && softmax_lse.scalar_type() == ScalarType::Float, op,
           ": softmax_lse must be float32 (as fa.forward returns it)");
  FA_CHECK(same_device(softmax_lse, q), op, ": softmax_lse is on ", device_name(softmax_lse),
           " but q is on ", device_name(q));
  FA_CHECK(softmax_lse.dim() == 3 && softmax_lse.size(0) == s.batch && softmax_lse.size(1) == s.heads_q &&
               softmax_lse.size(2) == s.seqlen_q,
           op, ": softmax_lse must have shape (batch, heads_q, seqlen_q) = ",
           str_of({s.batch, s.heads_q, s.seqlen_q}), ", got ", shape_of(softmax_lse));
  return s;
}

float resolve_softmax_scale(std::optional<double> softmax_scale, int64_t head_dim) {
  if (!softmax_scale.has_value()) {
    return static_cast<float>(1.0 / std::sqrt(static_cast<double>(head_dim)));
  }
  // The kernels take each row's max of the raw scores as the max of the scaled ones: scale > 0.
  FA_CHECK(std::isfinite(*softmax_scale) && *softmax_scale > 0,
           "fa: softmax_scale must be a positive finite number, got ", str_of(*softmax_scale));
  return static_cast<float>(*softmax_scale);
}

}  // namespace fa::torch_binding
