// Split-KV's second pass: each query row's output and lse from its splits' partial results.
//
// Split s of a row saw keys K_s and wrote O_s = Σ_{j∈K_s} exp(x_j - lse_s) v_j (normalised) and
// lse_s = log Σ_{j∈K_s} exp(x_j). Then lse = log Σ_s exp(lse_s) and O = Σ_s exp(lse_s - lse) O_s:
// exact, whatever the split. A split that saw no key (lse_s = -inf) weighs 0; a row no split saw a
// key for gets output 0 and lse -inf, as everywhere.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

#include "common/sequence.h"
#include "fa/params.h"

namespace fa {

inline constexpr int kCombineWarps = 4;  // rows per CTA of the combine pass, a warp each

template <class Element>
__global__ void __launch_bounds__(kCombineWarps * 32)
    combine_splits_kernel(const __grid_constant__ ForwardParams p) {
  const int lane = threadIdx.x % 32;
  const int row = blockIdx.x * kCombineWarps + threadIdx.x / 32;
  const int head = blockIdx.y, batch = blockIdx.z;
  if (row >= p.seqlen_q) return;
  const int64_t split_stride = int64_t(p.batch) * p.heads_q * p.seqlen_q;  // rows per split
  const int64_t r = (int64_t(batch) * p.heads_q + head) * p.seqlen_q + row;
  auto split_lse = [&](int s) { return p.lse_accum[s * split_stride + r]; };

  float max_lse = -INFINITY;
  for (int s = lane; s < p.num_splits; s += 32) max_lse = fmaxf(max_lse, split_lse(s));
  for (int offset = 16; offset > 0; offset /= 2) max_lse = fmaxf(max_lse, __shfl_xor_sync(0xffffffffu, max_lse, offset));
  float sum = 0.f;
  if (max_lse != -INFINITY) {
    for (int s = lane; s < p.num_splits; s += 32) sum += expf(split_lse(s) - max_lse);  // exp(-inf) = 0
  }
  for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
  const float lse = max_lse == -INFINITY ? -INFINITY : max_lse + logf(sum);

  const Sequence seq = Sequence::of(p, batch);
  Element* out = static_cast<Element*>(p.out) + seq.q_offset(p.out_stride, batch, head) + int64_t(row) * p.out_stride.row;
  for (int col = lane; col < p.head_dim; col += 32) {
    float acc = 0.f;
    if (lse != -INFINITY) {
      for (int s = 0; s < p.num_splits; ++s) {
        const float weight = expf(split_lse(s) - lse);
        if (weight != 0.f) acc += weight * p.out_accum[(s * split_stride + r) * p.head_dim_accum + col];
      }
    }
    out[col] = Element(acc);
  }
  if (lane == 0) p.lse[seq.lse_offset(p, batch, head) + row] = lse;
}

template <class Element>
cudaError_t launch_combine_splits(const ForwardParams& p, cudaStream_t stream) {
  const dim3 grid((p.seqlen_q + kCombineWarps - 1) / kCombineWarps, p.heads_q, p.batch);
  combine_splits_kernel<Element><<<grid, kCombineWarps * 32, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace fa
