#include "cpu_attention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <thread>
#include <vector>

#include <torch/headeronly/util/BFloat16.h>
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

// A (B, H, S, D) tensor's elements by index, whatever its strides (the last one is 1).
template <class T>
struct Rows {
  T* data;
  int64_t stride[3];

  explicit Rows(const Tensor& t)
      : data(static_cast<T*>(t.data_ptr())), stride{t.stride(0), t.stride(1), t.stride(2)} {}
  T* row(int64_t b, int64_t h, int64_t s) const {
    return data + b * stride[0] + h * stride[1] + s * stride[2];
  }
};

// Rows [0, rows) of head (b, h), as float32 in a dense (rows, D) buffer.
template <class T>
void load_rows(const Rows<const T>& src, int64_t b, int64_t h, int64_t rows, int64_t d, float* dst) {
  for (int64_t s = 0; s < rows; ++s) {
    const T* row = src.row(b, h, s);
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

// Causal, bottom-right aligned: query i sees keys [0, i + Sk - Sq]; the end of that range.
int64_t visible_keys(const AttentionShape& s, bool causal, int64_t query) {
  if (!causal) return s.seqlen_k;
  return std::clamp<int64_t>(query + s.seqlen_k - s.seqlen_q + 1, 0, s.seqlen_k);
}

// The first query that sees key j (Sq when none does).
int64_t first_query_seeing(const AttentionShape& s, bool causal, int64_t key) {
  if (!causal) return 0;
  return std::clamp<int64_t>(key - (s.seqlen_k - s.seqlen_q), 0, s.seqlen_q);
}

template <class T>
void forward_impl(const Tensor& q_t, const Tensor& k_t, const Tensor& v_t, const ForwardOutputs& o,
                  const AttentionShape& s, float scale, bool causal) {
  const Rows<const T> q(q_t), k(k_t), v(v_t);
  const Rows<T> out(o.out);
  float* lse = static_cast<float*>(o.lse.data_ptr());  // contiguous (B, Hq, Sq)
  const int64_t d = s.head_dim, group = s.group_size();
  std::vector<float> keys(s.seqlen_k * d), values(s.seqlen_k * d);

  for (int64_t b = 0; b < s.batch; ++b) {
    for (int64_t hk = 0; hk < s.heads_kv; ++hk) {
      load_rows(k, b, hk, s.seqlen_k, d, keys.data());
      load_rows(v, b, hk, s.seqlen_k, d, values.data());
      // The group's query heads stacked as rows: (hq, i) for hq in the group, i < Sq.
      parallel_for(group * s.seqlen_q, [&](int64_t begin, int64_t end) {
        std::vector<float> query(d), acc(d), scores(s.seqlen_k);
        for (int64_t r = begin; r < end; ++r) {
          const int64_t hq = hk * group + r / s.seqlen_q, i = r % s.seqlen_q;
          const int64_t seen = visible_keys(s, causal, i);
          const T* q_row = q.row(b, hq, i);
          for (int64_t c = 0; c < d; ++c) query[c] = static_cast<float>(q_row[c]);
          float row_max = -kInf;
          for (int64_t j = 0; j < seen; ++j) {
            scores[j] = dot(query.data(), &keys[j * d], d) * scale;
            row_max = std::max(row_max, scores[j]);
          }
          std::fill(acc.begin(), acc.end(), 0.f);
          float row_sum = 0.f;
          for (int64_t j = 0; j < seen; ++j) {
            const float p = std::exp(scores[j] - row_max);
            row_sum += p;
            axpy(p, &values[j * d], acc.data(), d);
          }
          T* out_row = out.row(b, hq, i);
          const float inv = seen > 0 ? 1.f / row_sum : 0.f;
          for (int64_t c = 0; c < d; ++c) out_row[c] = static_cast<T>(acc[c] * inv);
          lse[(b * s.heads_q + hq) * s.seqlen_q + i] = seen > 0 ? row_max + std::log(row_sum) : -kInf;
        }
      });
    }
  }
}

template <class T>
void backward_impl(const Tensor& dout_t, const Tensor& q_t, const Tensor& k_t, const Tensor& v_t,
                   const Tensor& out_t, const Tensor& lse_t, const Gradients& g, const AttentionShape& s,
                   float scale, bool causal) {
  const Rows<const T> q(q_t), k(k_t), v(v_t), out(out_t), dout(dout_t);
  const Rows<T> dq(g.dq), dk(g.dk), dv(g.dv);
  const float* lse_data = static_cast<const float*>(lse_t.data_ptr());
  const int64_t lse_stride[3] = {lse_t.stride(0), lse_t.stride(1), lse_t.stride(2)};
  const int64_t d = s.head_dim, group = s.group_size(), rows = group * s.seqlen_q;
  std::vector<float> keys(s.seqlen_k * d), values(s.seqlen_k * d);
  std::vector<float> queries(rows * d), grads(rows * d), lse(rows), delta(rows);

  for (int64_t b = 0; b < s.batch; ++b) {
    for (int64_t hk = 0; hk < s.heads_kv; ++hk) {
      load_rows(k, b, hk, s.seqlen_k, d, keys.data());
      load_rows(v, b, hk, s.seqlen_k, d, values.data());
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t hq = hk * group + r / s.seqlen_q, i = r % s.seqlen_q;
        const T* q_row = q.row(b, hq, i);
        const T* do_row = dout.row(b, hq, i);
        const T* o_row = out.row(b, hq, i);
        float row_delta = 0.f;  // delta = rowsum(dO ∘ O) = Σ_j P_ij dP_ij
        for (int64_t c = 0; c < d; ++c) {
          queries[r * d + c] = static_cast<float>(q_row[c]);
          grads[r * d + c] = static_cast<float>(do_row[c]);
          row_delta += grads[r * d + c] * static_cast<float>(o_row[c]);
        }
        delta[r] = row_delta;
        // A row that saw no key has lse -inf; +inf makes its P exactly 0, so its gradients are 0.
        const float l = lse_data[b * lse_stride[0] + hq * lse_stride[1] + i * lse_stride[2]];
        lse[r] = l == -kInf ? kInf : l;
      }
      // P_rj and dS_rj = P_rj (dP_rj - delta_r) for query row r and key j, recomputed by each pass.
      auto probs = [&](int64_t r, int64_t j, float* ds) {
        const float p = std::exp(dot(&queries[r * d], &keys[j * d], d) * scale - lse[r]);
        *ds = p * (dot(&grads[r * d], &values[j * d], d) - delta[r]);
        return p;
      };
      // dQ: parallel over query rows.
      parallel_for(rows, [&](int64_t begin, int64_t end) {
        std::vector<float> acc(d);
        for (int64_t r = begin; r < end; ++r) {
          const int64_t hq = hk * group + r / s.seqlen_q, i = r % s.seqlen_q;
          std::fill(acc.begin(), acc.end(), 0.f);
          for (int64_t j = 0, seen = visible_keys(s, causal, i); j < seen; ++j) {
            float ds;
            probs(r, j, &ds);
            axpy(ds, &keys[j * d], acc.data(), d);
          }
          T* dq_row = dq.row(b, hq, i);
          for (int64_t c = 0; c < d; ++c) dq_row[c] = static_cast<T>(acc[c] * scale);
        }
      });
      // dK and dV: parallel over keys, summed over the group's query heads.
      parallel_for(s.seqlen_k, [&](int64_t begin, int64_t end) {
        std::vector<float> dk_acc(d), dv_acc(d);
        for (int64_t j = begin; j < end; ++j) {
          std::fill(dk_acc.begin(), dk_acc.end(), 0.f);
          std::fill(dv_acc.begin(), dv_acc.end(), 0.f);
          const int64_t first_query = first_query_seeing(s, causal, j);
          for (int64_t r = 0; r < rows; ++r) {
            if (r % s.seqlen_q < first_query) continue;
            float ds;
            const float p = probs(r, j, &ds);
            axpy(p, &grads[r * d], dv_acc.data(), d);
            axpy(ds, &queries[r * d], dk_acc.data(), d);
          }
          T* dk_row = dk.row(b, hk, j);
          T* dv_row = dv.row(b, hk, j);
          for (int64_t c = 0; c < d; ++c) {
            dk_row[c] = static_cast<T>(dk_acc[c] * scale);
            dv_row[c] = static_cast<T>(dv_acc[c]);
          }
        }
      });
    }
  }
}

}  // namespace

std::tuple<Tensor, Tensor> forward_cpu(const Tensor& q, const Tensor& k, const Tensor& v,
                                       std::optional<double> softmax_scale, bool causal) {
  const AttentionShape s = check_forward_inputs(q, k, v);
  const float scale = resolve_softmax_scale(softmax_scale, s.head_dim);
  ForwardOutputs o = allocate_forward_outputs(q, s);
  if (finish_trivial_forward(s, o)) return {o.out, o.lse};
  if (q.scalar_type() == ScalarType::Half) {
    forward_impl<torch::headeronly::Half>(q, k, v, o, s, scale, causal);
  } else {
    forward_impl<torch::headeronly::BFloat16>(q, k, v, o, s, scale, causal);
  }
  return {o.out, o.lse};
}

std::tuple<Tensor, Tensor, Tensor> backward_cpu(const Tensor& dout, const Tensor& q, const Tensor& k,
                                                const Tensor& v, const Tensor& out,
                                                const Tensor& softmax_lse,
                                                std::optional<double> softmax_scale, bool causal) {
  const AttentionShape s = check_backward_inputs(dout, q, k, v, out, softmax_lse);
  const float scale = resolve_softmax_scale(softmax_scale, s.head_dim);
  Gradients g = allocate_gradients(q, k, v);
  if (finish_trivial_backward(s, g)) return {g.dq, g.dk, g.dv};
  if (q.scalar_type() == ScalarType::Half) {
    backward_impl<torch::headeronly::Half>(dout, q, k, v, out, softmax_lse, g, s, scale, causal);
  } else {
    backward_impl<torch::headeronly::BFloat16>(dout, q, k, v, out, softmax_lse, g, s, scale, causal);
  }
  return {g.dq, g.dk, g.dv};
}

}  // namespace fa::torch_binding
