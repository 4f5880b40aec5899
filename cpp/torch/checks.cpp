#include "checks.h"

#include "outputs.h"  // dense_last_dim

#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <vector>

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

// Whether a and b have the same sizes but for the last (k and v: their head dims may differ).
bool same_rows(const Tensor& a, const Tensor& b) {
  if (a.dim() != b.dim()) return false;
  for (int64_t d = 0; d + 1 < a.dim(); ++d) {
    if (a.size(d) != b.size(d)) return false;
  }
  return true;
}

bool half_type(ScalarType t) { return t == ScalarType::Half || t == ScalarType::BFloat16; }

// A 4-D (batch, heads, seqlen, head_dim) or, packed for a variable-length batch, a 3-D
// (total, heads, head_dim) fp16/bf16 tensor (or float32 on the CPU) with stride 1 in its last
// dimension.
void check_attention_tensor(const char* op, const char* name, const Tensor& t, bool packed = false,
                            bool fp8 = false) {
  FA_CHECK(t.defined(), op, ": ", name, " is undefined");
  if (packed) {
    FA_CHECK(t.dim() == 3, op, ": ", name, " must be 3-D (total, heads, head_dim), got shape ", shape_of(t));
  } else {
    FA_CHECK(t.dim() == 4, op, ": ", name, " must be 4-D (batch, heads, seqlen, head_dim), got shape ",
             shape_of(t));
  }
  if (fp8) {
    FA_CHECK(t.scalar_type() == ScalarType::Float8_e4m3fn, op, ": ", name, ".dtype must be float8_e4m3fn, got ",
             dtype_name(t.scalar_type()));
  } else {
    FA_CHECK(half_type(t.scalar_type()) || (t.scalar_type() == ScalarType::Float && t.is_cpu()), op, ": ", name,
             ".dtype must be float16 or bfloat16 (float32 too on the CPU), got ", dtype_name(t.scalar_type()),
             t.is_cuda() ? " on CUDA" : "");
  }
  FA_CHECK(t.is_cpu() || t.is_cuda(), op, ": ", name, " must be a CPU or CUDA tensor, got ",
           device_name(t));
  const int64_t last = t.dim() - 1;
  FA_CHECK(t.size(last) <= 1 || t.stride(last) == 1, op, ": ", name,
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

namespace {

// What q, k and v must share in either layout: dtype, device, q's and k's head_dim, the allowed
// values of it and of v's, and query heads divisible by key/value heads.
void check_heads(const char* op, const Tensor& q, const Tensor& k, const Tensor& v, const AttentionShape& s,
                 bool kv_dtype_checked = false) {
  if (kv_dtype_checked) {  // an FP8 cache: the device alone
    FA_CHECK(same_device(k, q) && same_device(v, q), op, ": k_cache is on ", device_name(k), " and v_cache on ",
             device_name(v), " but q is on ", device_name(q), "; all inputs must be on one device");
  } else {
    check_same_kind(op, "k", k, q);
    check_same_kind(op, "v", v, q);
  }
  const int64_t last = q.dim() - 1;
  FA_CHECK(k.size(last) == s.head_dim, op, ": k must have q's head_dim ", str_of(s.head_dim), ", got ",
           str_of(k.size(last)));
  auto check_head_dim = [&](const char* name, int64_t d) {
    FA_CHECK(d % kHeadDimMultiple == 0 && d >= kHeadDimMultiple && d <= kMaxHeadDim, op, ": ", name,
             " must be a multiple of ", str_of(kHeadDimMultiple), " between ", str_of(kHeadDimMultiple), " and ",
             str_of(kMaxHeadDim), ", got ", str_of(d));
  };
  check_head_dim("head_dim", s.head_dim);
  check_head_dim("v's head_dim", s.head_dim_v);
  if (s.heads_kv == 0) {
    FA_CHECK(s.heads_q == 0, op, ": k and v have 0 heads but q has ", str_of(s.heads_q));
  } else {
    FA_CHECK(s.heads_q % s.heads_kv == 0, op, ": the number of query heads (", str_of(s.heads_q),
             ") must be divisible by the number of key/value heads (", str_of(s.heads_kv), ")");
  }
}

// cu_seqlens_q / cu_seqlens_k: int32, 1-D, (batch + 1), on q's device.
void check_cu_seqlens(const char* op, const char* name, const Tensor& t, const Tensor& q) {
  FA_CHECK(t.defined(), op, ": ", name, " is undefined");
  FA_CHECK(t.scalar_type() == ScalarType::Int, op, ": ", name, ".dtype must be int32, got ",
           dtype_name(t.scalar_type()));
  FA_CHECK(t.dim() == 1 && t.size(0) >= 1, op, ": ", name,
           " must be 1-D with batch + 1 entries (0, then each sequence's end), got shape ", shape_of(t));
  FA_CHECK(same_device(t, q), op, ": ", name, " is on ", device_name(t), " but q is on ", device_name(q));
}

}  // namespace

namespace {

// FP8 inputs: q float8_e4m3fn (k and v then must be too).
bool fp8_inputs(const Tensor& q) { return q.defined() && q.scalar_type() == ScalarType::Float8_e4m3fn; }

// A descale factor of the FP8 inputs (or caches): float32 (batch, heads_kv) on q's device.
void check_descale(const char* op, const char* name, const Tensor& t, const Tensor& q, const AttentionShape& s) {
  FA_CHECK(t.scalar_type() == ScalarType::Float, op, ": ", name, ".dtype must be float32, got ",
           dtype_name(t.scalar_type()));
  FA_CHECK(t.dim() == 2 && t.size(0) == s.batch && t.size(1) == s.heads_kv, op, ": ", name,
           " must be (batch, heads_kv) = (", str_of(s.batch), ", ", str_of(s.heads_kv), "), got shape ",
           shape_of(t));
  FA_CHECK(same_device(t, q), op, ": ", name, " is on ", device_name(t), " but q is on ", device_name(q));
}

}  // namespace

Fp8Args check_fp8_args(const char* op, const Tensor& q, const AttentionShape& s, std::optional<Tensor> q_descale,
                       std::optional<Tensor> k_descale, std::optional<Tensor> v_descale,
                       std::optional<ScalarType> out_dtype) {
  Fp8Args a{fp8_inputs(q), q_descale, k_descale, v_descale, std::nullopt};
  const char* names[3] = {"q_descale", "k_descale", "v_descale"};
  const std::optional<Tensor>* descales[3] = {&q_descale, &k_descale, &v_descale};
  for (int i = 0; i < 3; ++i) {
    if (!*descales[i]) continue;
    FA_CHECK(a.fp8, op, ": ", names[i], " applies to float8_e4m3fn q, k and v; q is ", dtype_name(q.scalar_type()));
    check_descale(op, names[i], **descales[i], q, s);
  }
  if (out_dtype) {
    FA_CHECK(a.fp8, op, ": out_dtype applies to float8_e4m3fn q, k and v (the output of 16-bit inputs has their ",
             "dtype); q is ", dtype_name(q.scalar_type()));
  }
  if (a.fp8) {
    const ScalarType dtype = out_dtype.value_or(ScalarType::BFloat16);
    FA_CHECK(half_type(dtype), op, ": out_dtype must be torch.bfloat16 or torch.float16, got ", dtype_name(dtype));
    a.out_dtype = dtype;
  }
  return a;
}

AttentionShape check_forward_inputs(const Tensor& q, const Tensor& k, const Tensor& v) {
  constexpr const char* op = "fa.forward";
  const bool fp8 = fp8_inputs(q);
  check_attention_tensor(op, "q", q, false, fp8);
  check_attention_tensor(op, "k", k, false, fp8);
  check_attention_tensor(op, "v", v, false, fp8);

  AttentionShape s;
  s.batch = q.size(0);
  s.heads_q = q.size(1);
  s.seqlen_q = q.size(2);
  s.head_dim = q.size(3);
  s.head_dim_v = v.size(3);
  s.heads_kv = k.size(1);
  s.seqlen_k = k.size(2);

  FA_CHECK(same_rows(k, v), op, ": k and v must have the same (batch, heads_kv, seqlen_k) (their head dims ",
           "may differ), got k ", shape_of(k), " and v ", shape_of(v));
  FA_CHECK(k.size(0) == s.batch, op, ": k and v must have q's batch size ", str_of(s.batch), ", got ",
           str_of(k.size(0)));
  check_heads(op, q, k, v, s);
  return s;
}

VarlenShape check_varlen_inputs(const char* op, const Tensor& q, const Tensor& k, const Tensor& v,
                                const Tensor& cu_seqlens_q, const Tensor& cu_seqlens_k,
                                int64_t max_seqlen_q, int64_t max_seqlen_k) {
  const bool fp8 = fp8_inputs(q);
  check_attention_tensor(op, "q", q, true, fp8);
  check_attention_tensor(op, "k", k, true, fp8);
  check_attention_tensor(op, "v", v, true, fp8);
  FA_CHECK(same_rows(k, v), op, ": k and v must have the same (total_k, heads_kv) (their head dims may ",
           "differ), got k ", shape_of(k), " and v ", shape_of(v));
  check_cu_seqlens(op, "cu_seqlens_q", cu_seqlens_q, q);
  check_cu_seqlens(op, "cu_seqlens_k", cu_seqlens_k, q);
  FA_CHECK(cu_seqlens_q.size(0) == cu_seqlens_k.size(0), op,
           ": cu_seqlens_q and cu_seqlens_k must have the same length (batch + 1), got ",
           str_of(cu_seqlens_q.size(0)), " and ", str_of(cu_seqlens_k.size(0)));
  FA_CHECK(max_seqlen_q >= 0 && max_seqlen_k >= 0, op, ": max_seqlen_q and max_seqlen_k must be >= 0, got ",
           str_of(max_seqlen_q), " and ", str_of(max_seqlen_k));

  VarlenShape s;
  s.batch = cu_seqlens_q.size(0) - 1;
  s.heads_q = q.size(1);
  s.head_dim = q.size(2);
  s.head_dim_v = v.size(2);
  s.heads_kv = k.size(1);
  s.total_q = q.size(0);
  s.total_k = k.size(0);
  // No sequence is longer than its packed tensor: the grid never needs more.
  s.seqlen_q = std::min(max_seqlen_q, s.total_q);
  s.seqlen_k = std::min(max_seqlen_k, s.total_k);
  check_heads(op, q, k, v, s);
  return s;
}

KVCacheShape check_kvcache_inputs(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                                  const Tensor& cache_seqlens, const std::optional<Tensor>& page_table,
                                  const std::optional<Tensor>& cache_leftpad,
                                  int64_t num_splits, const std::optional<Tensor>& k_descale,
                                  const std::optional<Tensor>& v_descale) {
  constexpr const char* op = "fa.forward_kvcache";
  check_attention_tensor(op, "q", q);
  FA_CHECK(k_cache.defined() && v_cache.defined(), op, ": k_cache and v_cache must be defined");
  const bool fp8 = k_cache.scalar_type() == ScalarType::Float8_e4m3fn;
  FA_CHECK(fp8 == (v_cache.scalar_type() == ScalarType::Float8_e4m3fn), op,
           ": k_cache and v_cache must both have q's dtype or both be float8_e4m3fn, got ",
           dtype_name(k_cache.scalar_type()), " and ", dtype_name(v_cache.scalar_type()));
  check_attention_tensor(op, "k_cache", k_cache, false, fp8);
  check_attention_tensor(op, "v_cache", v_cache, false, fp8);
  FA_CHECK(same_rows(k_cache, v_cache), op, ": k_cache and v_cache must have the same shape but for their head ",
           "dims, got ", shape_of(k_cache), " and ", shape_of(v_cache));
  KVCacheShape s;
  s.batch = q.size(0);
  s.heads_q = q.size(1);
  s.seqlen_q = q.size(2);
  s.head_dim = q.size(3);
  s.head_dim_v = v_cache.size(3);
  const bool paged = page_table.has_value();
  if (paged) {
    const Tensor& pt = *page_table;
    FA_CHECK(pt.scalar_type() == ScalarType::Int, op, ": page_table.dtype must be int32, got ",
             dtype_name(pt.scalar_type()));
    FA_CHECK(pt.dim() == 2 && pt.size(0) == s.batch, op, ": page_table must be (batch, max_pages) = (",
             str_of(s.batch), ", max_pages), got shape ", shape_of(pt));
    FA_CHECK(same_device(pt, q), op, ": page_table is on ", device_name(pt), " but q is on ", device_name(q));
    s.page_size = k_cache.size(1);
    s.max_pages = pt.size(1);
    s.heads_kv = k_cache.size(2);
    s.seqlen_k = s.max_pages * s.page_size;
    FA_CHECK(s.page_size > 0 && s.page_size % kPageRows == 0, op,
             ": with page_table, k_cache and v_cache are (num_pages, page_size, heads_kv, head_dim) with "
             "page_size a multiple of ", str_of(int64_t(kPageRows)), ", got shape ", shape_of(k_cache));
  } else {
    FA_CHECK(k_cache.size(0) == s.batch, op, ": k_cache and v_cache must be (batch, heads_kv, capacity, ",
             "head_dim) with q's batch size ", str_of(s.batch), " (or paged, with page_table), got shape ",
             shape_of(k_cache));
    s.heads_kv = k_cache.size(1);
    s.seqlen_k = k_cache.size(2);
  }
  FA_CHECK(cache_seqlens.defined() && cache_seqlens.scalar_type() == ScalarType::Int, op,
           ": cache_seqlens must be int32");
  FA_CHECK(cache_seqlens.dim() == 1 && cache_seqlens.size(0) == s.batch, op, ": cache_seqlens must be (batch,) = (",
           str_of(s.batch), ",), got shape ", shape_of(cache_seqlens));
  FA_CHECK(same_device(cache_seqlens, q), op, ": cache_seqlens is on ", device_name(cache_seqlens),
           " but q is on ", device_name(q));
  if (cache_leftpad) {
    const Tensor& lp = *cache_leftpad;
    FA_CHECK(!paged, op, ": cache_leftpad is for contiguous caches; with page_table, start each entry's page "
             "list at its first key instead");
    FA_CHECK(lp.scalar_type() == ScalarType::Int, op, ": cache_leftpad must be int32, got ",
             dtype_name(lp.scalar_type()));
    FA_CHECK(lp.dim() == 1 && lp.size(0) == s.batch, op, ": cache_leftpad must be (batch,) = (", str_of(s.batch),
             ",), got shape ", shape_of(lp));
    FA_CHECK(same_device(lp, q), op, ": cache_leftpad is on ", device_name(lp), " but q is on ", device_name(q));
  }
  FA_CHECK(num_splits >= 0 && num_splits <= kMaxSplits, op, ": num_splits must be in [0, ", str_of(kMaxSplits),
           "] (0 chooses), got ", str_of(num_splits));
  check_heads(op, q, k_cache, v_cache, s, fp8);
  s.fp8 = fp8;
  auto check_cache_descale = [&](const char* name, const std::optional<Tensor>& t) {
    if (!t) return;
    FA_CHECK(fp8, op, ": ", name, " applies to float8_e4m3fn caches; k_cache is ", dtype_name(k_cache.scalar_type()));
    check_descale(op, name, *t, q, s);
  };
  check_cache_descale("k_descale", k_descale);
  check_cache_descale("v_descale", v_descale);
  return s;
}

namespace {

// dout and out: the forward's output shape (q's with v's head dim), q's dtype and device.
void check_dout_and_out(const char* op, const Tensor& dout, const Tensor& q, const Tensor& out, bool packed,
                        int64_t head_dim_v) {
  check_attention_tensor(op, "dout", dout, packed);
  check_attention_tensor(op, "out", out, packed);
  check_same_kind(op, "dout", dout, q);
  check_same_kind(op, "out", out, q);
  std::vector<int64_t> shape(q.sizes().begin(), q.sizes().end());
  shape.back() = head_dim_v;
  const IntArrayRef expected(shape);
  FA_CHECK(dout.sizes().equals(expected), op, ": dout must have the output's shape ", str_of(expected),
           " (q's, with v's head_dim), got ", shape_of(dout));
  FA_CHECK(out.sizes().equals(expected), op, ": out must have the output's shape ", str_of(expected),
           " (q's, with v's head_dim), got ", shape_of(out));
}

// softmax_lse: float32 on q's device with the shape the forward returned.
void check_lse(const char* op, const Tensor& lse, const Tensor& q, std::initializer_list<int64_t> shape,
               const char* shape_names) {
  FA_CHECK(lse.defined() && lse.scalar_type() == ScalarType::Float, op,
           ": softmax_lse must be float32 (as the forward returns it)");
  FA_CHECK(same_device(lse, q), op, ": softmax_lse is on ", device_name(lse), " but q is on ", device_name(q));
  FA_CHECK(lse.sizes().equals(IntArrayRef(shape)), op, ": softmax_lse must have shape ", shape_names, " = ",
           str_of(shape), ", got ", shape_of(lse));
}

}  // namespace

AttentionShape check_backward_inputs(const Tensor& dout, const Tensor& q, const Tensor& k,
                                     const Tensor& v, const Tensor& out, const Tensor& softmax_lse) {
  constexpr const char* op = "fa.backward";
  AttentionShape s = check_forward_inputs(q, k, v);
  check_dout_and_out(op, dout, q, out, false, s.head_dim_v);
  check_lse(op, softmax_lse, q, {s.batch, s.heads_q, s.seqlen_q}, "(batch, heads_q, seqlen_q)");
  return s;
}

VarlenShape check_varlen_backward_inputs(const Tensor& dout, const Tensor& q, const Tensor& k,
                                         const Tensor& v, const Tensor& out, const Tensor& softmax_lse,
                                         const Tensor& cu_seqlens_q, const Tensor& cu_seqlens_k,
                                         int64_t max_seqlen_q, int64_t max_seqlen_k) {
  constexpr const char* op = "fa.backward_varlen";
  VarlenShape s = check_varlen_inputs(op, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k);
  check_dout_and_out(op, dout, q, out, true, s.head_dim_v);
  check_lse(op, softmax_lse, q, {s.heads_q, s.total_q}, "(heads_q, total_q)");
  return s;
}

Variant check_variant(const char* op, bool causal, int64_t window_left, int64_t window_right, double softcap,
                      const std::optional<Tensor>& sinks, const Tensor& q, int64_t heads_q) {
  FA_CHECK(window_left >= -1 && window_right >= -1, op, ": window_size = (", str_of(window_left), ", ",
           str_of(window_right), "): each bound must be -1 (unbounded) or >= 0");
  FA_CHECK(!causal || window_right <= 0, op, ": causal=True sees no key after the diagonal, so window_size[1] ",
           "(window_right) must be -1 or 0 with it, got ", str_of(window_right));
  FA_CHECK(std::isfinite(softcap) && softcap >= 0, op, ": softcap must be a finite number >= 0 (0: none), got ",
           str_of(softcap));
  Variant v;
  v.window_left = window_left;
  v.window_right = causal ? 0 : window_right;
  v.softcap = softcap;
  if (sinks) {
    const Tensor& t = *sinks;
    FA_CHECK(t.defined() && t.scalar_type() == ScalarType::Float, op, ": sinks must be float32, got ",
             t.defined() ? dtype_name(t.scalar_type()) : std::string("an undefined tensor"));
    FA_CHECK(t.dim() == 1 && t.size(0) == heads_q, op, ": sinks must be 1-D (heads_q,) = (", str_of(heads_q),
             ",), one logit a query head, got shape ", shape_of(t));
    FA_CHECK(same_device(t, q), op, ": sinks is on ", device_name(t), " but q is on ", device_name(q));
    v.sinks = dense_last_dim(t);
  }
  return v;
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
