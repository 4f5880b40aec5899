#include "cpu_attention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <utility>
#include <thread>
#include <type_traits>
#include <vector>

#include <torch/headeronly/util/BFloat16.h>
#include <torch/headeronly/util/Float8_e4m3fn.h>
#include <torch/headeronly/util/Half.h>

#include "checks.h"
#include "outputs.h"

namespace fa::torch_binding {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

// Runs fn(begin, end) over [0, n) in contiguous chunks, one per hardware thread.
template <class Fn>
void parallel_for(int64_t n, const Fn& fn) {
  const int64_t threads = std::min<int64_t>(n, std::max(1u, std::thread::hardware_concurrency()));
  if (threads <= 1) {
    fn(int64_t(0), n);
    return;
  }
  std::vector<std::thread> pool;
  const int64_t chunk = (n + threads - 1) / threads;
  for (int64_t begin = chunk; begin < n; begin += chunk) {
    pool.emplace_back([&fn, begin, end = std::min(n, begin + chunk)] { fn(begin, end); });
  }
  fn(int64_t(0), std::min(n, chunk));
  for (auto& t : pool) t.join();
}

// A tensor's elements by (batch entry, head, row), whatever its strides (the last one is 1): a
// (B, H, S, D) tensor, or a packed (total, H, D) one (batch stride 0, rows indexed from each
// sequence's start); lse likewise as (B, H, S) or (H, total); or a paged KV cache
// (num_pages, page_size, H, D), row s of entry b in page pages[b · pages_stride + s / page_size].
template <class T>
struct Rows {
  T* data;
  int64_t stride[3];  // paged: page, head, row within the page
  const int32_t* pages = nullptr;
  int64_t pages_stride = 0;
  int64_t page_size = 0;

  static Rows attention(const Tensor& t, bool packed) {
    if (packed) return {static_cast<T*>(t.data_ptr()), {0, t.stride(1), t.stride(0)}};
    return {static_cast<T*>(t.data_ptr()), {t.stride(0), t.stride(1), t.stride(2)}};
  }
  static Rows lse(const Tensor& t, bool packed) {
    if (packed) return {static_cast<T*>(t.data_ptr()), {0, t.stride(0), t.stride(1)}};
    return {static_cast<T*>(t.data_ptr()), {t.stride(0), t.stride(1), t.stride(2)}};
  }
  static Rows paged(const Tensor& t, const Tensor& page_table) {
    return {static_cast<T*>(t.data_ptr()), {t.stride(0), t.stride(2), t.stride(1)},
            static_cast<const int32_t*>(page_table.data_ptr()), page_table.stride(0), t.size(1)};
  }
  T* row(int64_t b, int64_t h, int64_t s) const {
    if (pages != nullptr) {
      const int64_t page = pages[b * pages_stride + s / page_size];
      return data + page * stride[0] + h * stride[1] + (s % page_size) * stride[2];
    }
    return data + b * stride[0] + h * stride[1] + s * stride[2];
  }
};

// Rows [first, first + rows) of head (b, h), as float32 in a dense (rows, D) buffer.
template <class T>
void load_rows(const Rows<const T>& src, int64_t b, int64_t h, int64_t first, int64_t rows, int64_t d,
               float* dst) {
  for (int64_t s = 0; s < rows; ++s) {
    const T* row = src.row(b, h, first + s);
    for (int64_t i = 0; i < d; ++i) dst[s * d + i] = static_cast<float>(row[i]);
  }
}

float dot(const float* a, const float* b, int64_t n) {
  float acc = 0.f;
#pragma omp simd reduction(+ : acc)
  for (int64_t i = 0; i < n; ++i) acc += a[i] * b[i];
  return acc;
}

void axpy(float alpha, const float* x, float* y, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) y[i] += alpha * x[i];
}

// The keys [begin, end) query i sees: all of them, or (causal or a window) those within its bounds
// around the bottom-right aligned diagonal i + Sk - Sq. Empty when end <= begin.
struct KeyRange {
  int64_t begin = 0, end = 0;
  bool holds(int64_t j) const { return j >= begin && j < end; }
};

KeyRange visible_keys(const AttentionShape& s, const Variant& v, int64_t query) {
  const int64_t diagonal = query + s.seqlen_k - s.seqlen_q;
  KeyRange r{0, s.seqlen_k};
  if (v.window_left >= 0) r.begin = std::clamp<int64_t>(diagonal - v.window_left, 0, s.seqlen_k);
  if (v.window_right >= 0) r.end = std::clamp<int64_t>(diagonal + v.window_right + 1, 0, s.seqlen_k);
  return r;
}

// A score (q · k · scale), soft-capped where the variant says so; tanh_out: the tanh it took.
float capped_score(float score, const Variant& v, float* tanh_out = nullptr) {
  if (v.softcap <= 0) return score;
  const float cap = static_cast<float>(v.softcap);
  const float t = std::tanh(score / cap);
  if (tanh_out) *tanh_out = t;
  return cap * t;
}

// The batch entries the loops walk: every entry of a rectangular batch has the call's shape and
// its rows from 0; a variable-length batch's entries take their lengths and first rows from
// cu_seqlens (CPU tensors here, so their values are read and checked).
class Batch {
 public:
  explicit Batch(const AttentionShape& s) : shape_(s) {}

  Batch(const char* op, const VarlenShape& s, const Tensor& cu_seqlens_q, const Tensor& cu_seqlens_k)
      : shape_(s),
        cu_q_(static_cast<const int32_t*>(cu_seqlens_q.data_ptr())),
        cu_k_(static_cast<const int32_t*>(cu_seqlens_k.data_ptr())),
        stride_q_(cu_seqlens_q.stride(0)),
        stride_k_(cu_seqlens_k.stride(0)) {
    check_offsets(op, "q", cu_q_, stride_q_, s.total_q, s.seqlen_q);
    check_offsets(op, "k", cu_k_, stride_k_, s.total_k, s.seqlen_k);
  }

  // A KV cache: entry b sees keys [0, cache_seqlens[b]) of its cache, contiguous or paged
  // (page_table with stride 1 along its rows; cache_pages: k_cache's pages), or of a contiguous one
  // keys [cache_leftpad[b], cache_seqlens[b]).
  Batch(const char* op, const KVCacheShape& s, const Tensor& cache_seqlens, const std::optional<Tensor>& page_table,
        int64_t cache_pages, const std::optional<Tensor>& cache_leftpad)
      : shape_(s),
        used_k_(static_cast<const int32_t*>(cache_seqlens.data_ptr())),
        stride_k_(cache_seqlens.stride(0)),
        page_table_(page_table) {
    if (cache_leftpad) {
      leftpad_k_ = static_cast<const int32_t*>(cache_leftpad->data_ptr());
      stride_leftpad_ = cache_leftpad->stride(0);
    }
    for (int64_t b = 0; b < s.batch; ++b) {
      const int64_t used = used_k_[b * stride_k_];
      FA_CHECK(used >= 0 && used <= s.seqlen_k, op, ": cache_seqlens[", str_of(b), "] = ", str_of(used),
               " is outside [0, the cache's capacity ", str_of(s.seqlen_k), "]");
      FA_CHECK(leftpad(b) >= 0 && leftpad(b) <= used, op, ": cache_leftpad[", str_of(b), "] = ",
               str_of(leftpad(b)), " is outside [0, cache_seqlens[", str_of(b), "] = ", str_of(used), "]");
      if (!page_table) continue;
      const auto* pages = static_cast<const int32_t*>(page_table->data_ptr()) + b * page_table->stride(0);
      for (int64_t p = 0; p < (used + s.page_size - 1) / s.page_size; ++p) {
        FA_CHECK(pages[p] >= 0 && pages[p] < cache_pages, op, ": page_table[", str_of(b), ", ", str_of(p),
                 "] = ", str_of(int64_t(pages[p])), " is not a page of k_cache (", str_of(cache_pages), " pages)");
      }
    }
  }

  bool packed() const { return cu_q_ != nullptr; }
  int64_t size() const { return shape_.batch; }
  int64_t q_begin(int64_t b) const { return packed() ? cu_q_[b * stride_q_] : 0; }
  int64_t k_begin(int64_t b) const { return packed() ? cu_k_[b * stride_k_] : leftpad(b); }
  int64_t leftpad(int64_t b) const { return leftpad_k_ ? leftpad_k_[b * stride_leftpad_] : 0; }
  // Entry b's shape (batch 1; its own lengths).
  AttentionShape entry(int64_t b) const {
    AttentionShape s = shape_;
    s.batch = 1;
    if (packed()) {
      s.seqlen_q = cu_q_[(b + 1) * stride_q_] - q_begin(b);
      s.seqlen_k = cu_k_[(b + 1) * stride_k_] - k_begin(b);
    } else if (used_k_ != nullptr) {
      s.seqlen_k = used_k_[b * stride_k_] - leftpad(b);
    }
    return s;
  }
  // K or V as the loops read them.
  template <class T>
  Rows<const T> kv_rows(const Tensor& t) const {
    return page_table_ ? Rows<const T>::paged(t, *page_table_) : Rows<const T>::attention(t, packed());
  }

 private:
  // cu_seqlens_x starts at 0, never decreases, ends inside the packed tensor, and no sequence is
  // longer than max_seqlen_x.
  void check_offsets(const char* op, const char* x, const int32_t* cu, int64_t stride, int64_t total,
                     int64_t max_len) const {
    const std::string name = std::string("cu_seqlens_") + x;
    FA_CHECK(cu[0] == 0, op, ": ", name, "[0] must be 0, got ", str_of(int64_t(cu[0])));
    for (int64_t b = 0; b < shape_.batch; ++b) {
      const int64_t len = int64_t(cu[(b + 1) * stride]) - cu[b * stride];
      FA_CHECK(len >= 0 && len <= max_len, op, ": sequence ", str_of(b), " has ", str_of(len), " rows by ",
               name, ", outside [0, max_seqlen_", x, " = ", str_of(max_len), "]");
    }
    const int64_t end = cu[shape_.batch * stride];
    FA_CHECK(end <= total, op, ": ", name, " ends at ", str_of(end), ", past the ", str_of(total),
             " rows of ", x == std::string("q") ? "q" : "k and v");
  }

  AttentionShape shape_;
  const int32_t* cu_q_ = nullptr;
  const int32_t* cu_k_ = nullptr;
  const int32_t* used_k_ = nullptr;  // a KV cache's cache_seqlens
  const int32_t* leftpad_k_ = nullptr;  // and its cache_leftpad
  int64_t stride_leftpad_ = 1;
  int64_t stride_q_ = 1, stride_k_ = 1;
  std::optional<Tensor> page_table_;
};

// FP8 factors: keys, values (and FP8 queries) of (batch entry b, kv head h) times descale[b, h]
// (1 where the call gave none).
struct Descales {
  std::optional<Tensor> k, v, q;
  static float at(const std::optional<Tensor>& t, int64_t b, int64_t h) {
    return t ? static_cast<const float*>(t->data_ptr())[b * t->stride(0) + h * t->stride(1)] : 1.f;
  }
};

void scale_rows(std::vector<float>& rows, float factor) {
  if (factor != 1.f) {
    for (float& x : rows) x *= factor;
  }
}

// T: q's element type; TKV: k's and v's (T's, or an FP8 cache's); TOut: the output's (T's, or
// bf16 / fp16 for FP8 inputs).
template <class T, class TKV = T, class TOut = T>
void forward_impl(const Tensor& q_t, const Tensor& k_t, const Tensor& v_t, const ForwardOutputs& o,
                  const Batch& batch, float scale, const Variant& variant, const Descales& descales = {}) {
  const bool packed = batch.packed();
  const auto q = Rows<const T>::attention(q_t, packed);
  const auto k = batch.kv_rows<TKV>(k_t), v = batch.kv_rows<TKV>(v_t);
  const float* sinks = variant.sinks ? static_cast<const float*>(variant.sinks->data_ptr()) : nullptr;
  const auto out = Rows<TOut>::attention(o.out, packed);
  const auto lse = Rows<float>::lse(o.lse, packed);

  for (int64_t b = 0; b < batch.size(); ++b) {
    const AttentionShape s = batch.entry(b);
    const int64_t q0 = batch.q_begin(b), k0 = batch.k_begin(b);
    const int64_t d = s.head_dim, dv = s.head_dim_v, group = s.group_size();
    std::vector<float> keys(s.seqlen_k * d), values(s.seqlen_k * dv);
    for (int64_t hk = 0; hk < s.heads_kv; ++hk) {
      load_rows(k, b, hk, k0, s.seqlen_k, d, keys.data());
      load_rows(v, b, hk, k0, s.seqlen_k, dv, values.data());
      scale_rows(keys, Descales::at(descales.k, b, hk));
      scale_rows(values, Descales::at(descales.v, b, hk));
      const float q_factor = Descales::at(descales.q, b, hk);
      // The group's query heads stacked as rows: (hq, i) for hq in the group, i < Sq.
      parallel_for(group * s.seqlen_q, [&](int64_t begin, int64_t end) {
        std::vector<float> query(d), acc(dv), scores(s.seqlen_k);
        for (int64_t r = begin; r < end; ++r) {
          const int64_t hq = hk * group + r / s.seqlen_q, i = r % s.seqlen_q;
          const KeyRange keys_seen = visible_keys(s, variant, i);
          const T* q_row = q.row(b, hq, q0 + i);
          for (int64_t c = 0; c < d; ++c) query[c] = static_cast<float>(q_row[c]) * q_factor;
          // A sink joins the row's softmax as one more logit, with no value.
          const float sink = sinks ? sinks[hq] : -kInf;
          float row_max = sink;
          for (int64_t j = keys_seen.begin; j < keys_seen.end; ++j) {
            scores[j] = capped_score(dot(query.data(), &keys[j * d], d) * scale, variant);
            row_max = std::max(row_max, scores[j]);
          }
          std::fill(acc.begin(), acc.end(), 0.f);
          TOut* out_row = out.row(b, hq, q0 + i);
          if (row_max == -kInf) {  // no key and no sink: output 0, lse -inf
            for (int64_t c = 0; c < dv; ++c) out_row[c] = static_cast<TOut>(0.f);
            *lse.row(b, hq, q0 + i) = -kInf;
            continue;
          }
          float row_sum = std::exp(sink - row_max);
          for (int64_t j = keys_seen.begin; j < keys_seen.end; ++j) {
            const float p = std::exp(scores[j] - row_max);
            row_sum += p;
            axpy(p, &values[j * dv], acc.data(), dv);
          }
          const float inv = 1.f / row_sum;
          for (int64_t c = 0; c < dv; ++c) out_row[c] = static_cast<TOut>(acc[c] * inv);
          *lse.row(b, hq, q0 + i) = row_max + std::log(row_sum);
        }
      });
    }
  }
}

template <class T>
void backward_impl(const Tensor& dout_t, const Tensor& q_t, const Tensor& k_t, const Tensor& v_t,
                   const Tensor& out_t, const Tensor& lse_t, const Gradients& g, const Batch& batch,
                   float scale, const Variant& variant) {
  const bool packed = batch.packed();
  const auto q = Rows<const T>::attention(q_t, packed), k = Rows<const T>::attention(k_t, packed),
             v = Rows<const T>::attention(v_t, packed), out = Rows<const T>::attention(out_t, packed),
             dout = Rows<const T>::attention(dout_t, packed);
  const auto dq = Rows<T>::attention(g.dq, packed), dk = Rows<T>::attention(g.dk, packed),
             dv_rows = Rows<T>::attention(g.dv, packed);
  const auto lse_rows = Rows<const float>::lse(lse_t, packed);

  for (int64_t b = 0; b < batch.size(); ++b) {
    const AttentionShape s = batch.entry(b);
    const int64_t q0 = batch.q_begin(b), k0 = batch.k_begin(b);
    const int64_t d = s.head_dim, dv = s.head_dim_v, group = s.group_size(), rows = group * s.seqlen_q;
    std::vector<float> keys(s.seqlen_k * d), values(s.seqlen_k * dv);
    std::vector<float> queries(rows * d), grads(rows * dv), lse(rows), delta(rows);
    for (int64_t hk = 0; hk < s.heads_kv; ++hk) {
      load_rows(k, b, hk, k0, s.seqlen_k, d, keys.data());
      load_rows(v, b, hk, k0, s.seqlen_k, dv, values.data());
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t hq = hk * group + r / s.seqlen_q, i = q0 + r % s.seqlen_q;
        const T* q_row = q.row(b, hq, i);
        const T* do_row = dout.row(b, hq, i);
        const T* o_row = out.row(b, hq, i);
        for (int64_t c = 0; c < d; ++c) queries[r * d + c] = static_cast<float>(q_row[c]);
        float row_delta = 0.f;  // delta = rowsum(dO ∘ O) = Σ_j P_ij dP_ij
        for (int64_t c = 0; c < dv; ++c) {
          grads[r * dv + c] = static_cast<float>(do_row[c]);
          row_delta += grads[r * dv + c] * static_cast<float>(o_row[c]);
        }
        delta[r] = row_delta;
        // A row that saw no key has lse -inf; +inf makes its P exactly 0, so its gradients are 0.
        const float l = *lse_rows.row(b, hq, i);
        lse[r] = l == -kInf ? kInf : l;
      }
      // P_rj and dS_rj = P_rj (dP_rj - delta_r) for query row r and key j, recomputed by each pass.
      // With soft-capping, dS is taken with respect to the score before the cap: times 1 - tanh².
      // (lse includes the sinks, so P and delta need nothing more for them.)
      auto probs = [&](int64_t r, int64_t j, float* ds) {
        float t = 0.f;
        const float p = std::exp(capped_score(dot(&queries[r * d], &keys[j * d], d) * scale, variant, &t) - lse[r]);
        *ds = p * (dot(&grads[r * dv], &values[j * dv], dv) - delta[r]) * (1.f - t * t);
        return p;
      };
      // dQ: parallel over query rows.
      parallel_for(rows, [&](int64_t begin, int64_t end) {
        std::vector<float> acc(d);
        for (int64_t r = begin; r < end; ++r) {
          const int64_t hq = hk * group + r / s.seqlen_q, i = r % s.seqlen_q;
          std::fill(acc.begin(), acc.end(), 0.f);
          const KeyRange keys_seen = visible_keys(s, variant, i);
          for (int64_t j = keys_seen.begin; j < keys_seen.end; ++j) {
            float ds;
            probs(r, j, &ds);
            axpy(ds, &keys[j * d], acc.data(), d);
          }
          T* dq_row = dq.row(b, hq, q0 + i);
          for (int64_t c = 0; c < d; ++c) dq_row[c] = static_cast<T>(acc[c] * scale);
        }
      });
      // dK and dV: parallel over keys, summed over the group's query heads.
      parallel_for(s.seqlen_k, [&](int64_t begin, int64_t end) {
        std::vector<float> dk_acc(d), dv_acc(dv);
        for (int64_t j = begin; j < end; ++j) {
          std::fill(dk_acc.begin(), dk_acc.end(), 0.f);
          std::fill(dv_acc.begin(), dv_acc.end(), 0.f);
          for (int64_t r = 0; r < rows; ++r) {
            if (!visible_keys(s, variant, r % s.seqlen_q).holds(j)) continue;
            float ds;
            const float p = probs(r, j, &ds);
            axpy(p, &grads[r * dv], dv_acc.data(), dv);
            axpy(ds, &queries[r * d], dk_acc.data(), d);
          }
          T* dk_row = dk.row(b, hk, k0 + j);
          T* dv_row = dv_rows.row(b, hk, k0 + j);
          for (int64_t c = 0; c < d; ++c) dk_row[c] = static_cast<T>(dk_acc[c] * scale);
          for (int64_t c = 0; c < dv; ++c) dv_row[c] = static_cast<T>(dv_acc[c]);
        }
      });
    }
  }
}

// forward_impl for q's dtype; TKV: k's and v's element type where it is not q's (an FP8 cache).
template <class TKV = void, class... Args>
void forward_any(const Tensor& q, Args&&... args) {
  auto run = [&](auto q_type) {
    using T = decltype(q_type);
    forward_impl<T, std::conditional_t<std::is_void_v<TKV>, T, TKV>>(q, std::forward<Args>(args)...);
  };
  if (q.scalar_type() == ScalarType::Half) {
    run(torch::headeronly::Half{});
  } else if (q.scalar_type() == ScalarType::Float) {
    run(float{});
  } else {
    run(torch::headeronly::BFloat16{});
  }
}

// fa.forward's and fa.forward_varlen's loops: forward_any, or for float8_e4m3fn q, k and v with
// their descales, the output bf16 or fp16.
void forward_inputs(const Tensor& q, const Tensor& k, const Tensor& v, const ForwardOutputs& o, const Batch& batch,
                    float scale, const Variant& variant, const Fp8Args& fp8) {
  if (!fp8.fp8) {
    forward_any(q, k, v, o, batch, scale, variant);
    return;
  }
  using F8 = torch::headeronly::Float8_e4m3fn;
  const Descales descales{fp8.k_descale, fp8.v_descale, fp8.q_descale};
  if (o.out.scalar_type() == ScalarType::Half) {
    forward_impl<F8, F8, torch::headeronly::Half>(q, k, v, o, batch, scale, variant, descales);
  } else {
    forward_impl<F8, F8, torch::headeronly::BFloat16>(q, k, v, o, batch, scale, variant, descales);
  }
}

// The KV cache's forward: forward_any, with float8_e4m3fn caches too.
template <class... Args>
void forward_kvcache_any(const Tensor& q, const Tensor& k_cache, Args&&... args) {
  if (k_cache.scalar_type() == ScalarType::Float8_e4m3fn) {
    forward_any<torch::headeronly::Float8_e4m3fn>(q, k_cache, std::forward<Args>(args)...);
  } else {
    forward_any(q, k_cache, std::forward<Args>(args)...);
  }
}

template <class... Args>
void backward_any(const Tensor& dout, const Tensor& q, Args&&... args) {
  if (q.scalar_type() == ScalarType::Half) {
    backward_impl<torch::headeronly::Half>(dout, q, std::forward<Args>(args)...);
  } else if (q.scalar_type() == ScalarType::Float) {
    backward_impl<float>(dout, q, std::forward<Args>(args)...);
  } else {
    backward_impl<torch::headeronly::BFloat16>(dout, q, std::forward<Args>(args)...);
  }
}

}  // namespace

std::tuple<Tensor, Tensor> forward_cpu(const Tensor& q, const Tensor& k, const Tensor& v,
                                       std::optional<double> softmax_scale, bool causal, int64_t window_left,
                                       int64_t window_right, double softcap, std::optional<Tensor> sinks,
                                       std::optional<Tensor> q_descale, std::optional<Tensor> k_descale,
                                       std::optional<Tensor> v_descale, std::optional<ScalarType> out_dtype) {
  constexpr const char* op = "fa.forward";
  const AttentionShape s = check_forward_inputs(q, k, v);
  const Variant variant = check_variant(op, causal, window_left, window_right, softcap, sinks, q, s.heads_q);
  const Fp8Args fp8 = check_fp8_args(op, q, s, q_descale, k_descale, v_descale, out_dtype);
  const float scale = resolve_softmax_scale(softmax_scale, s.head_dim);
  ForwardOutputs o = allocate_forward_outputs(q, s, fp8.out_dtype);
  if (finish_trivial_forward(s, o, variant.sinks)) return {o.out, o.lse};
  forward_inputs(q, k, v, o, Batch(s), scale, variant, fp8);
  return {o.out, o.lse};
}

std::tuple<Tensor, Tensor, Tensor> backward_cpu(const Tensor& dout, const Tensor& q, const Tensor& k,
                                                const Tensor& v, const Tensor& out, const Tensor& softmax_lse,
                                                std::optional<double> softmax_scale, bool causal,
                                                int64_t window_left, int64_t window_right, double softcap,
                                                bool /*deterministic: every CPU backward is*/) {
  const AttentionShape s = check_backward_inputs(dout, q, k, v, out, softmax_lse);
  const Variant variant =
      check_variant("fa.backward", causal, window_left, window_right, softcap, std::nullopt, q, s.heads_q);
  const float scale = resolve_softmax_scale(softmax_scale, s.head_dim);
  Gradients g = allocate_gradients(q, k, v);
  if (finish_trivial_backward(s, g)) return {g.dq, g.dk, g.dv};
  backward_any(dout, q, k, v, out, softmax_lse, g, Batch(s), scale, variant);
  return {g.dq, g.dk, g.dv};
}

std::tuple<Tensor, Tensor> forward_kvcache_cpu(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                                               const Tensor& cache_seqlens, std::optional<Tensor> page_table,
                                               std::optional<double> softmax_scale, bool causal, int64_t num_splits,
                                               int64_t window_left, int64_t window_right, double softcap,
                                               std::optional<Tensor> sinks, std::optional<Tensor> cache_leftpad,
                                               std::optional<Tensor> k_descale, std::optional<Tensor> v_descale) {
  constexpr const char* op = "fa.forward_kvcache";
  const KVCacheShape s = check_kvcache_inputs(q, k_cache, v_cache, cache_seqlens, page_table, cache_leftpad,
                                              num_splits, k_descale, v_descale);
  const Variant variant = check_variant(op, causal, window_left, window_right, softcap, sinks, q, s.heads_q);
  const float scale = resolve_softmax_scale(softmax_scale, s.head_dim);
  if (page_table) page_table = dense_last_dim(*page_table);
  const Batch batch(op, s, cache_seqlens, page_table, page_table ? k_cache.size(0) : 0, cache_leftpad);
  ForwardOutputs o = allocate_forward_outputs(q, s);
  if (finish_trivial_forward(s, o, variant.sinks)) return {o.out, o.lse};
  // num_splits: one pass on the CPU.
  forward_kvcache_any(q, k_cache, v_cache, o, batch, scale, variant, Descales{k_descale, v_descale});
  return {o.out, o.lse};
}

std::tuple<Tensor, Tensor> forward_varlen_cpu(const Tensor& q, const Tensor& k, const Tensor& v,
                                              const Tensor& cu_seqlens_q, const Tensor& cu_seqlens_k,
                                              int64_t max_seqlen_q, int64_t max_seqlen_k,
                                              std::optional<double> softmax_scale, bool causal, int64_t window_left,
                                              int64_t window_right, double softcap, std::optional<Tensor> sinks,
                                              std::optional<Tensor> q_descale, std::optional<Tensor> k_descale,
                                              std::optional<Tensor> v_descale, std::optional<ScalarType> out_dtype) {
  constexpr const char* op = "fa.forward_varlen";
  const VarlenShape s = check_varlen_inputs(op, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k);
  const Variant variant = check_variant(op, causal, window_left, window_right, softcap, sinks, q, s.heads_q);
  const Fp8Args fp8 = check_fp8_args(op, q, s, q_descale, k_descale, v_descale, out_dtype);
  const float scale = resolve_softmax_scale(softmax_scale, s.head_dim);
  const Batch batch(op, s, cu_seqlens_q, cu_seqlens_k);
  ForwardOutputs o = allocate_varlen_outputs(q, s, fp8.out_dtype);
  // Rows past the last sequence belong to none: out 0, lse -inf, as for rows that see no key.
  torch::stable::zero_(o.out);
  torch::stable::fill_(o.lse, -std::numeric_limits<double>::infinity());
  if (finish_trivial_forward(s, o, variant.sinks)) return {o.out, o.lse};
  forward_inputs(q, k, v, o, batch, scale, variant, fp8);
  return {o.out, o.lse};
}

std::tuple<Tensor, Tensor, Tensor> backward_varlen_cpu(const Tensor& dout, const Tensor& q, const Tensor& k,
                                                       const Tensor& v, const Tensor& out,
                                                       const Tensor& softmax_lse, const Tensor& cu_seqlens_q,
                                                       const Tensor& cu_seqlens_k, int64_t max_seqlen_q,
                                                       int64_t max_seqlen_k, std::optional<double> softmax_scale,
                                                       bool causal, int64_t window_left, int64_t window_right,
                                                       double softcap, bool /*deterministic: every CPU backward is*/) {
  constexpr const char* op = "fa.backward_varlen";
  const VarlenShape s = check_varlen_backward_inputs(dout, q, k, v, out, softmax_lse, cu_seqlens_q, cu_seqlens_k,
                                                     max_seqlen_q, max_seqlen_k);
  const Variant variant = check_variant(op, causal, window_left, window_right, softcap, std::nullopt, q, s.heads_q);
  const float scale = resolve_softmax_scale(softmax_scale, s.head_dim);
  const Batch batch(op, s, cu_seqlens_q, cu_seqlens_k);
  Gradients g = allocate_varlen_gradients(q, k, v);
  torch::stable::zero_(g.dq);
  torch::stable::zero_(g.dk);
  torch::stable::zero_(g.dv);
  if (finish_trivial_backward(s, g)) return {g.dq, g.dk, g.dv};
  backward_any(dout, q, k, v, out, softmax_lse, g, batch, scale, variant);
  return {g.dq, g.dk, g.dv};
}

}  // namespace fa::torch_binding
