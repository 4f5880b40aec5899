// Split-KV's second pass: each query row's output and lse from its splits' partial results.
//
// Split s of a row saw keys K_s and wrote O_s = Σ_{j∈K_s} exp(x_j - lse_s) v_j (normalised) and
// lse_s = log Σ_{j∈K_s} exp(x_j). Then lse = log Σ_s exp(lse_s) and O = Σ_s exp(lse_s - lse) O_s:
// exact, whatever the split. A split that saw no key (lse_s = -inf) weighs 0; a row no split saw a
// key for gets output 0 and lse -inf, as everywhere. A sink (ForwardParams::sinks) joins here
// alone, as one more term of lse without a value: the splits leave it out.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

#include "common/grid_dependency.h"
#include "common/sequence.h"
#include "fa/params.h"

namespace fa {

inline constexpr int kCombineThreads = 128;  // a CTA per query row; a thread per output column
inline constexpr int kCombineUnroll = 8;

// Shared-memory weights of a row: num_splits rounded up to the unroll factor, since the compiler
// may read a few weights past the last split in the unrolled loop (compute-sanitizer flagged such
// reads past a 5-split array) although it never uses them.
__host__ __device__ constexpr int combine_weight_count(int num_splits) {
  return (num_splits + kCombineUnroll - 1) / kCombineUnroll * kCombineUnroll;
}

// Latency-bound work (a few KB per row): warp 0 turns the splits' lse into weights in shared
// memory (combine_weight_count floats, dynamic), then each thread sums its column over the splits with the
// loads unrolled, so they are in flight together rather than one after another (a lane-per-split
// loop with exp and load in series took 12 µs for 16 splits and 28 µs for 33 on the H100).
// On sm90 and later it is a dependent launch (grid_dependency.h): its CTAs are scheduled while the
// split kernel's last CTAs run, and wait for that kernel's results before reading anything.
template <class Element>
__global__ void __launch_bounds__(kCombineThreads) combine_splits_kernel(const __grid_constant__ ForwardParams p) {
  wait_for_prior_grid();
  extern __shared__ float weights[];  // [combine_weight_count(num_splits)]
  const int row = blockIdx.x, head = blockIdx.y, batch = blockIdx.z;
  const int64_t split_stride = int64_t(p.batch) * p.heads_q * p.seqlen_q;  // rows per split
  const int64_t r = (int64_t(batch) * p.heads_q + head) * p.seqlen_q + row;
  const Sequence seq = Sequence::of(p, batch);

  if (threadIdx.x < 32) {
    const int lane = threadIdx.x;
    const float sink = p.sinks != nullptr ? p.sinks[head] : -INFINITY;
    float max_lse = sink;
    for (int s = lane; s < p.num_splits; s += 32) max_lse = fmaxf(max_lse, p.lse_accum[s * split_stride + r]);
    for (int offset = 16; offset > 0; offset /= 2) max_lse = fmaxf(max_lse, __shfl_xor_sync(0xffffffffu, max_lse, offset));
    float sum = 0.f;
    if (max_lse != -INFINITY) {
      if (lane == 0) sum = expf(sink - max_lse);
      for (int s = lane; s < p.num_splits; s += 32) sum += expf(p.lse_accum[s * split_stride + r] - max_lse);
    }
    for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
    const float lse = max_lse == -INFINITY ? -INFINITY : max_lse + logf(sum);
    // exp(-inf) = 0: a split that saw no key weighs nothing; with no key at all every weight is 0.
    // The padding (combine_weight_count) is zeroed: the unrolled loop below may read it.
    for (int s = lane; s < combine_weight_count(p.num_splits); s += 32) {
      weights[s] = s >= p.num_splits || lse == -INFINITY ? 0.f : expf(p.lse_accum[s * split_stride + r] - lse);
    }
    if (lane == 0) p.lse[seq.lse_offset(p, batch, head) + row] = lse;
  }
  __syncthreads();

  Element* out = static_cast<Element*>(p.out) + seq.q_offset(p.out_stride, batch, head) + int64_t(row) * p.out_stride.row;
  const float* partial = p.out_accum + r * p.head_dim_accum;
  const int64_t partial_stride = split_stride * p.head_dim_accum;  // from one split's row to the next's
  for (int col = threadIdx.x; col < p.head_dim_v; col += kCombineThreads) {
    float acc = 0.f;
#pragma unroll kCombineUnroll
    for (int s = 0; s < p.num_splits; ++s) acc += weights[s] * partial[s * partial_stride + col];
    out[col] = Element(acc);
  }
}

template <class Element>
cudaError_t launch_combine_splits(const ForwardParams& p, cudaStream_t stream) {
  const dim3 grid(p.seqlen_q, p.heads_q, p.batch);
  const size_t smem = combine_weight_count(p.num_splits) * sizeof(float);
  if (dependent_launch_exact<&combine_splits_kernel<Element>>()) {
    return launch_after_prior_grid(&combine_splits_kernel<Element>, grid, dim3(kCombineThreads), smem, stream, p);
  }
  combine_splits_kernel<Element><<<grid, kCombineThreads, smem, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace fa
