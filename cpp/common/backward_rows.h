// The backward's row-wise passes around the main kernel, shared by the kernel families.
//
// Pre-pass: delta_i = rowsum(dO_i ∘ O_i), the term every dS_ij of row i subtracts
//   (dS = P ∘ (dP - delta), since Σ_j P_ij dP_ij = dO_i · O_i), and zeroes the row of the fp32 dQ
//   workspace that the main kernel accumulates into with atomics (or, where the main kernel claims
//   the workspace's tiles, BackwardParams::dq_claims, their claims: common/dq_claims.h). For the
//   Hopper family it also writes lse in log2 units into a padded workspace
//   (BackwardParams::lse_log2), which the main kernel loads a tile at a time with bulk copies.
//   For the Hopper family's rectangular batches the pre-pass does this for the first units of the
//   main kernel's order only, and the main kernel's spare warps do it for the rest while its
//   GEMMs run (BackwardParams::unit_ready): a memory-bound pass under a compute-bound kernel
//   instead of before it.
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

template <int kHeadDim, int kThreads_ = 256>
struct RowPassShape {
  static constexpr int kThreads = kThreads_;
  static constexpr int kRowsPerBlock = kBackwardRowPadding;  // the workspaces' row padding
  static constexpr int kVector = 8;
  static constexpr int kThreadsPerRow = kHeadDim <= 32 ? 4 : kHeadDim <= 64 ? 8 : kHeadDim <= 128 ? 16 : 32;
  static constexpr int kRowsPerPass = kThreads / kThreadsPerRow;
  static constexpr int kPasses = kRowsPerBlock / kRowsPerPass;
  static_assert(kHeadDim % kVector == 0 && kHeadDim <= kThreadsPerRow * kVector && kPasses >= 1);
};

// The pre-pass's work on one block of kRowsPerBlock workspace rows of (batch, head), by kThreads
// threads (tid among them), in three parts that each keep few pointers live (the main kernel's
// spare warps run this in 24 registers): delta of each row; lse_log2 of each row; the block's
// zeros in the dQ workspace (its rows are contiguous), or its claims. kGroup: the rows whose loads
// a thread issues before any of their stores (the compiler cannot move a load above a store that
// may alias it), so that a thread has that many rows' loads in flight instead of one round trip to
// memory per row (8 rows: the pre-pass 1–2% faster than with 4 at D = 128 and 256 from 4096 rows;
// docs/tried.md, bd0e093).
template <class Element, int kHeadDim, int kThreads, int kGroup>
__device__ __forceinline__ void prepare_row_block(const BackwardParams& p, const Sequence& seq, int batch, int head,
                                                  int block, int tid) {
  using Shape = RowPassShape<kHeadDim, kThreads>;
  using Vector = cutlass::AlignedArray<Element, Shape::kVector>;  // one 16-byte load
  static_assert(Shape::kPasses % kGroup == 0);
  constexpr int kRows = Shape::kRowsPerBlock;
  const int first = block * kRows;  // the block's first row of the head
  const int64_t workspace_first = seq.workspace_row(p, batch, head) + first;
  {
    const int col = (tid % Shape::kThreadsPerRow) * Shape::kVector;
    const bool col_ok = col < p.head_dim_v;  // dO's and O's columns (v's head dim)
    const int row0 = first + tid / Shape::kThreadsPerRow;
    const auto* dout = static_cast<const Element*>(p.dout) + seq.q_offset(p.dout_stride, batch, head) + col;
    const auto* out = static_cast<const Element*>(p.out) + seq.q_offset(p.out_stride, batch, head) + col;
    float* delta = p.delta + workspace_first - first;
    for (int pass = 0; pass < Shape::kPasses; pass += kGroup) {
      Vector d[kGroup], o[kGroup];
      CUTLASS_PRAGMA_UNROLL
      for (int g = 0; g < kGroup; ++g) {
        const int row = row0 + (pass + g) * Shape::kRowsPerPass;
        d[g].clear();
        o[g].clear();
        if (row < seq.seqlen_q && col_ok) {
          d[g] = *reinterpret_cast<const Vector*>(dout + row * p.dout_stride.row);
          o[g] = *reinterpret_cast<const Vector*>(out + row * p.out_stride.row);
        }
      }
      CUTLASS_PRAGMA_UNROLL
      for (int g = 0; g < kGroup; ++g) {
        float dot = 0.f;
        CUTLASS_PRAGMA_UNROLL
        for (int i = 0; i < Shape::kVector; ++i) dot += float(d[g][i]) * float(o[g][i]);
        for (int offset = Shape::kThreadsPerRow / 2; offset > 0; offset /= 2) {
          dot += __shfl_xor_sync(0xffffffffu, dot, offset);
        }
        if (tid % Shape::kThreadsPerRow == 0) delta[row0 + (pass + g) * Shape::kRowsPerPass] = dot;
      }
    }
  }
  if (p.lse_log2 != nullptr) {
    const float* lse = p.lse + seq.lse_offset(p, batch, head);
    float* lse_log2 = p.lse_log2 + workspace_first - first;
    for (int row = first + tid; row < first + kRows; row += kThreads) {
      lse_log2[row] = row < seq.seqlen_q && lse[row] != -INFINITY ? lse[row] * float(M_LOG2E) : INFINITY;
    }
  }
  if (p.dq_claims == nullptr) {
    // 16-byte stores, each warp's covering 512 contiguous bytes.
    float4* accum = reinterpret_cast<float4*>(p.dq_accum + workspace_first * p.head_dim_rounded);
    for (int i = tid; i < kRows * p.head_dim_rounded / 4; i += kThreads) accum[i] = make_float4(0.f, 0.f, 0.f, 0.f);
  } else {
    // With claims (common/dq_claims.h) the workspace is not zeroed: the claims of this block's rows are.
    for (int i = tid; i < kRows / kDqClaimRows; i += kThreads) p.dq_claims[workspace_first / kDqClaimRows + i] = kUnclaimed;
    if (p.dq_claims_odd != nullptr) {  // the odd turns' counts (BackwardParams::dq_accum_odd)
      for (int i = tid; i < kRows / kDqClaimRows; i += kThreads) {
        p.dq_claims_odd[workspace_first / kDqClaimRows + i] = kUnclaimed;
      }
    }
  }
}

// The pre-pass's grid: kRowsPerBlock rows of one (batch, query head) per CTA, blockIdx.y + gridDim.y
// · blockIdx.z = batch · heads_q + head. Every head's rows (backward_row_grid), or, where the
// Hopper family's main kernel prepares the rest (BackwardParams::unit_ready), those of the first
// prepared_units (batch, kv head) units: the first prepared_units · (heads_q / heads_kv) heads.
template <class Element, int kHeadDim>
__global__ void __launch_bounds__(RowPassShape<kHeadDim>::kThreads)
    backward_preprocess_kernel(const __grid_constant__ BackwardParams p) {
  using Shape = RowPassShape<kHeadDim>;
  const int bh = blockIdx.y + gridDim.y * blockIdx.z;
  const int head = bh % p.heads_q, batch = bh / p.heads_q;
  // The Hopper family's main kernel may take the SMs this grid's last CTAs leave free (it waits
  // for this grid to complete before it reads what the pre-pass writes).
  allow_dependent_grid();
  // The main kernel's counters (Hopper family: its persistent CTAs take key tiles from the first,
  // its spare warps row blocks to prepare from the second), and the units' prepared row blocks.
  if (p.tile_counter != nullptr && blockIdx.x == 0 && bh == 0 && threadIdx.x < 2) {
    p.tile_counter[threadIdx.x] = 0;
  }
  if (p.unit_ready != nullptr) {
    const int64_t threads = int64_t(gridDim.x) * gridDim.y * gridDim.z * Shape::kThreads;
    const int64_t units = int64_t(p.batch) * p.heads_kv;
    for (int64_t i = ((int64_t(blockIdx.z) * gridDim.y + blockIdx.y) * gridDim.x + blockIdx.x) * Shape::kThreads +
                     threadIdx.x;
         i < units; i += threads) {
      p.unit_ready[i] = 0;
    }
  }
  const Sequence seq = Sequence::of(p, batch);
  if (blockIdx.x * Shape::kRowsPerBlock >= seq.seqlen_q) return;
  constexpr int kGroup = Shape::kPasses < 8 ? Shape::kPasses : 8;
  prepare_row_block<Element, kHeadDim, Shape::kThreads, kGroup>(p, seq, batch, head, blockIdx.x, threadIdx.x);
}

// The Hopper family's main kernel, dense batches (BackwardParams::unit_ready): one warp preparing
// row blocks of the units from prepared_units on, in the units' order, taking each from the
// counter tile_counter[1], and counting each finished block in its unit's unit_ready.
template <class Element, int kHeadDim>
__device__ __forceinline__ void prepare_rows_in_warp(const BackwardParams& p) {
  const int lane = threadIdx.x % 32;
  const int blocks = p.seqlen_q_rounded / kBackwardRowPadding;  // a head's row blocks
  const int group = p.heads_q / p.heads_kv;
  const int first_head = p.prepared_units * group;  // flattened batch · heads_q + head
  const int total = (p.batch * p.heads_q - first_head) * blocks;
  const Sequence seq = Sequence::of(p, 0);  // dense: every entry's
  for (;;) {
    int task = 0;
    if (lane == 0) task = atomicAdd(p.tile_counter + 1, 1);
    task = __shfl_sync(0xffffffffu, task, 0);
    if (task >= total) break;
    const int bh = first_head + task / blocks, block = task % blocks;
    const int head = bh % p.heads_q, batch = bh / p.heads_q;
    prepare_row_block<Element, kHeadDim, 32, 1>(p, seq, batch, head, block, lane);
    // The block's writes, then the count (as a grid barrier's arrival: the warp's threads synced,
    // one of them fences at gpu scope and adds).
    __syncwarp();
    if (lane == 0) {
      __threadfence();
      atomicAdd(p.unit_ready + bh / group, 1);
    }
  }
}

// Waits (spinning) until the main kernel's warps have prepared every row block of `unit`, with
// acquire semantics; a unit below prepared_units the pre-pass prepared (the caller has waited for
// it). The row blocks of a unit: heads_q / heads_kv heads of seqlen_q_rounded / kBackwardRowPadding.
__device__ __forceinline__ void wait_unit_prepared(const BackwardParams& p, int unit) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (p.unit_ready == nullptr || unit < p.prepared_units) return;
  const int expected = p.heads_q / p.heads_kv * (p.seqlen_q_rounded / kBackwardRowPadding);
  for (;;) {
    int ready;
    asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(ready) : "l"(p.unit_ready + unit) : "memory");
    if (ready >= expected) break;
    __nanosleep(128);
  }
#endif
}

// The row passes' grid over every head's rows (the pre-pass's, unless the main kernel prepares
// some units): kRowsPerBlock (= kBackwardRowPadding) rows of one (batch, head) per CTA.
inline dim3 backward_row_grid(const BackwardParams& p) {
  return dim3(p.seqlen_q_rounded / kBackwardRowPadding, p.heads_q, p.batch);
}

template <class Element, int kHeadDim>
cudaError_t launch_backward_preprocess(const BackwardParams& p, cudaStream_t stream) {
  const dim3 grid = p.unit_ready == nullptr
                        ? backward_row_grid(p)
                        : dim3(p.seqlen_q_rounded / kBackwardRowPadding, p.prepared_units * (p.heads_q / p.heads_kv), 1);
  backward_preprocess_kernel<Element, kHeadDim><<<grid, RowPassShape<kHeadDim>::kThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

// kTileRows: the main kernel's query tile, whose first claim (BackwardParams::dq_claims, where
// set) says whether any key tile wrote its rows.
template <class Element, int kHeadDim, bool kSwizzle, int kTileRows>
__global__ void __launch_bounds__(RowPassShape<kHeadDim>::kThreads)
    backward_convert_dq_kernel(const __grid_constant__ BackwardParams p) {
  static_assert(kTileRows % kDqClaimRows == 0);
  using Shape = RowPassShape<kHeadDim>;
  const int head = blockIdx.y, batch = blockIdx.z;
  const Sequence seq = Sequence::of(p, batch);
  const int col = (threadIdx.x % Shape::kThreadsPerRow) * Shape::kVector;
  if (col >= p.head_dim || blockIdx.x * Shape::kRowsPerBlock >= seq.seqlen_q) return;
  const int64_t first_row = seq.workspace_row(p, batch, head);
  const float* accum = p.dq_accum + first_row * p.head_dim_rounded;
  auto* dq = static_cast<Element*>(p.dq) + seq.q_offset(p.dq_stride, batch, head);
  cutlass::NumericArrayConverter<Element, float, Shape::kVector> convert;
  for (int pass = 0; pass < Shape::kPasses; ++pass) {
    const int row = blockIdx.x * Shape::kRowsPerBlock + pass * Shape::kRowsPerPass +
                    threadIdx.x / Shape::kThreadsPerRow;
    if (row >= seq.seqlen_q) break;
    cutlass::Array<float, Shape::kVector> values = *reinterpret_cast<const cutlass::Array<float, Shape::kVector>*>(
        accum + int64_t(row) * p.head_dim_rounded + dq_workspace_col<kHeadDim, kSwizzle>(row, col));
    // With claims, a tile no key tile wrote (its rows see no key) holds no zeros.
    if (p.dq_claims != nullptr && p.dq_claims[(first_row + row / kTileRows * kTileRows) / kDqClaimRows] == kUnclaimed) {
      values.clear();
    }
    for (int i = 0; i < Shape::kVector; ++i) values[i] *= p.scale;
    *reinterpret_cast<cutlass::Array<Element, Shape::kVector>*>(dq + row * p.dq_stride.row + col) = convert(values);
  }
}

}  // namespace fa
