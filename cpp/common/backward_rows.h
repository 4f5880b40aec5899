// The backward's row-wise passes around the main kernel, shared by the kernel families.
//
// Pre-pass: delta_i = rowsum(dO_i ∘ O_i), the term every dS_ij of row i subtracts
//   (dS = P ∘ (dP - delta), since Σ_j P_ij dP_ij = dO_i · O_i), and zeroes the row of the fp32 dQ
//   workspace that the main kernel accumulates into with atomics (or, where the main kernel claims
//   the workspace's tiles, BackwardParams::dq_claims, their claims: common/dq_claims.h). For the
//   Hopper family it also writes lse in log2 units into a padded workspace
//   (BackwardParams::lse_log2), which the main kernel loads a tile at a time with bulk copies.
// Post-pass: dQ = scale · workspace, converted to the input dtype and stored with q's strides.
//
// The workspace rows of each (batch entry, query head) are padded to kBackwardRowPadding and lie
// where Sequence::workspace_row says (common/sequence.h); each holds kHeadDim fp32, in order, or
// with the 8-float (32-byte) units of each row permuted (kSwizzle, dq_workspace_col): a main kernel
// that stages a dQ tile in shared memory in that layout writes it without bank conflicts and adds
// it to global memory as one linear block.
//
// Both give each row a power-of-two group of threads (so its sum reduces with shuffles inside the
// group), each owning one 16-byte vector (8 elements) of it, and cover kRowsPerBlock rows of one
// (batch, head) per CTA. Rows past seqlen_q (the workspace is padded to a multiple of
// kRowsPerBlock) get delta 0 and are never converted.
#pragma once

#include <cuda_runtime_api.h>
#include <cutlass/array.h>
#include <cutlass/numeric_conversion.h>

#include "fa/kernels.h"
#include "common/dq_claims.h"
#include "common/grid_dependency.h"
#include "common/sequence.h"
#include "fa/params.h"

namespace fa {

// Where column col of workspace row row lies in that row. kSwizzle: its 32-byte unit XORed with
// the row index, inside the largest aligned group of 8 (or 4, for a head dim's last 4 units)
// units, so the 8 consecutive rows an mma.sync accumulator store covers fall on 8 different units.
template <int kHeadDim, bool kSwizzle>
__host__ __device__ __forceinline__ int dq_workspace_col(int row, int col) {
  if constexpr (!kSwizzle) {
    return col;
  } else {
    static_assert(kHeadDim % 32 == 0, "whole groups of 4 units");
    constexpr int kUnits = kHeadDim / 8;
    const int unit = col / 8;
    const int mask = unit < (kUnits & ~7) ? 7 : 3;
    return ((unit ^ (row & mask)) * 8) | (col % 8);
  }
}

template <int kHeadDim>
struct RowPassShape {
  static constexpr int kThreads = 256;
  static constexpr int kRowsPerBlock = kBackwardRowPadding;  // the workspaces' row padding
  static constexpr int kVector = 8;
  static constexpr int kThreadsPerRow = kHeadDim <= 32 ? 4 : kHeadDim <= 64 ? 8 : kHeadDim <= 128 ? 16 : 32;
  static constexpr int kRowsPerPass = kThreads / kThreadsPerRow;
  static constexpr int kPasses = kRowsPerBlock / kRowsPerPass;
  static_assert(kHeadDim % kVector == 0 && kHeadDim <= kThreadsPerRow * kVector && kPasses >= 1);
};

template <class Element, int kHeadDim>
__global__ void __launch_bounds__(RowPassShape<kHeadDim>::kThreads)
    backward_preprocess_kernel(const __grid_constant__ BackwardParams p) {
  using Shape = RowPassShape<kHeadDim>;
  using Vector = cutlass::Array<Element, Shape::kVector>;
  const int head = blockIdx.y, batch = blockIdx.z;
  // The Hopper family's main kernel may take the SMs this grid's last CTAs leave free (it waits
  // for this grid to complete before it reads what the pre-pass writes).
  allow_dependent_grid();
  // The main kernel's tile counter (Hopper family: its persistent CTAs take key tiles from it).
  if (p.tile_counter != nullptr && blockIdx.x == 0 && head == 0 && batch == 0 && threadIdx.x == 0) {
    *p.tile_counter = 0;
  }
  const Sequence seq = Sequence::of(p, batch);
  if (blockIdx.x * Shape::kRowsPerBlock >= seq.seqlen_q) return;
  const int col = (threadIdx.x % Shape::kThreadsPerRow) * Shape::kVector;
  const bool col_ok = col < p.head_dim;
  const auto* dout = static_cast<const Element*>(p.dout) + seq.q_offset(p.dout_stride, batch, head);
  const auto* out = static_cast<const Element*>(p.out) + seq.q_offset(p.out_stride, batch, head);
  const int64_t first_row = seq.workspace_row(p, batch, head);
  float* delta = p.delta + first_row;
  const float* lse = p.lse + seq.lse_offset(p, batch, head);
  float* lse_log2 = p.lse_log2 != nullptr ? p.lse_log2 + first_row : nullptr;
  float* accum = p.dq_accum + first_row * p.head_dim_rounded;
  // With claims (common/dq_claims.h) the workspace is not zeroed: the claims of this CTA's rows are.
  const bool zero_accum = p.dq_claims == nullptr;
  if (!zero_accum && threadIdx.x < Shape::kRowsPerBlock / kDqClaimRows) {
    p.dq_claims[(first_row + blockIdx.x * Shape::kRowsPerBlock) / kDqClaimRows + threadIdx.x] = kUnclaimed;
  }

  // The loads of kGroup passes are issued before any of their stores (the compiler cannot move
  // a load above a store that may alias it), so that a thread has that many rows' loads in flight
  // instead of one round trip to memory per pass (8 rows: the pre-pass 1–2% faster than with 4 at
  // D = 128 and 256 from 4096 rows, benchmarks/NOTES.md session 47).
  constexpr int kGroup = Shape::kPasses < 8 ? Shape::kPasses : 8;
  static_assert(Shape::kPasses % kGroup == 0);
  auto row_of = [&](int pass) {
    return blockIdx.x * Shape::kRowsPerBlock + pass * Shape::kRowsPerPass + threadIdx.x / Shape::kThreadsPerRow;
  };
  for (int first = 0; first < Shape::kPasses; first += kGroup) {
    Vector d[kGroup], o[kGroup];
    float l[kGroup];
    CUTLASS_PRAGMA_UNROLL
    for (int g = 0; g < kGroup; ++g) {
      const int row = row_of(first + g);
      d[g].clear();
      o[g].clear();
      if (row < seq.seqlen_q && col_ok) {
        d[g] = *reinterpret_cast<const Vector*>(dout + row * p.dout_stride.row + col);
        o[g] = *reinterpret_cast<const Vector*>(out + row * p.out_stride.row + col);
      }
      l[g] = lse_log2 != nullptr && col == 0 && row < seq.seqlen_q ? lse[row] : -INFINITY;
    }
    CUTLASS_PRAGMA_UNROLL
    for (int g = 0; g < kGroup; ++g) {
      const int row = row_of(first + g);
      float dot = 0.f;
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < Shape::kVector; ++i) dot += float(d[g][i]) * float(o[g][i]);
      for (int offset = Shape::kThreadsPerRow / 2; offset > 0; offset /= 2) {
        dot += __shfl_xor_sync(0xffffffffu, dot, offset);
      }
      if (col == 0) {
        delta[row] = dot;
        if (lse_log2 != nullptr) lse_log2[row] = l[g] == -INFINITY ? INFINITY : l[g] * float(M_LOG2E);
      }
      // The row's kHeadDim zeros in 16-byte stores, lane j of the row's group taking vectors j,
      // j + kThreadsPerRow, …: each store instruction of a warp covers whole rows' contiguous
      // bytes (with each lane's own 32 bytes, every instruction wrote half of each sector).
      if (zero_accum) {
        float4* accum_row = reinterpret_cast<float4*>(accum + int64_t(row) * p.head_dim_rounded);
        CUTLASS_PRAGMA_UNROLL
        for (int u = threadIdx.x % Shape::kThreadsPerRow; u < kHeadDim / 4; u += Shape::kThreadsPerRow) {
          accum_row[u] = make_float4(0.f, 0.f, 0.f, 0.f);
        }
      }
    }
  }
}

// The grid of both row passes: kRowsPerBlock (= kBackwardRowPadding) rows of one (batch, head) per CTA.
inline dim3 backward_row_grid(const BackwardParams& p) {
  return dim3(p.seqlen_q_rounded / kBackwardRowPadding, p.heads_q, p.batch);
}

template <class Element, int kHeadDim>
cudaError_t launch_backward_preprocess(const BackwardParams& p, cudaStream_t stream) {
  backward_preprocess_kernel<Element, kHeadDim>
      <<<backward_row_grid(p), RowPassShape<kHeadDim>::kThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

template <class Element, int kHeadDim, bool kSwizzle>
__global__ void __launch_bounds__(RowPassShape<kHeadDim>::kThreads)
    backward_convert_dq_kernel(const __grid_constant__ BackwardParams p) {
  using Shape = RowPassShape<kHeadDim>;
  const int head = blockIdx.y, batch = blockIdx.z;
  const Sequence seq = Sequence::of(p, batch);
  const int col = (threadIdx.x % Shape::kThreadsPerRow) * Shape::kVector;
  if (col >= p.head_dim || blockIdx.x * Shape::kRowsPerBlock >= seq.seqlen_q) return;
  const float* accum = p.dq_accum + seq.workspace_row(p, batch, head) * p.head_dim_rounded;
  auto* dq = static_cast<Element*>(p.dq) + seq.q_offset(p.dq_stride, batch, head);
  cutlass::NumericArrayConverter<Element, float, Shape::kVector> convert;
  for (int pass = 0; pass < Shape::kPasses; ++pass) {
    const int row = blockIdx.x * Shape::kRowsPerBlock + pass * Shape::kRowsPerPass +
                    threadIdx.x / Shape::kThreadsPerRow;
    if (row >= seq.seqlen_q) break;
    cutlass::Array<float, Shape::kVector> values = *reinterpret_cast<const cutlass::Array<float, Shape::kVector>*>(
        accum + int64_t(row) * p.head_dim_rounded + dq_workspace_col<kHeadDim, kSwizzle>(row, col));
    for (int i = 0; i < Shape::kVector; ++i) values[i] *= p.scale;
    *reinterpret_cast<cutlass::Array<Element, Shape::kVector>*>(dq + row * p.dq_stride.row + col) = convert(values);
  }
}

}  // namespace fa
