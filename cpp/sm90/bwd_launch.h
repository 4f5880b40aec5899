// Host-side launcher of the Hopper-family backward: the pre-pass (shared with the Ampere family),
// the main kernel, and the post-pass that converts the dQ workspace.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>
#include <cute/tensor.hpp>
#include <cute/atom/copy_traits_sm90_tma.hpp>
#include <cutlass/numeric_conversion.h>

#include "common/backward_rows.h"
#include "common/element.h"
#include "fa/kernels.h"
#include "sm90/bwd_config.h"
#include "sm90/bwd_kernel.h"
#include "sm90/fwd_launch.h"  // tma_view

namespace fa::sm90 {

// Tiles per head dim (query rows per step × keys per CTA, Q/dO stages): FA3's choices for its
// causal kernels (../shared/HOPPER_NOTES.md). Measured (benchmarks/NOTES.md, Hopper backward): at
// D = 128, three Q/dO stages and 64 rows at D = 64 were no faster; D = 128 stays at 64 rows (the
// 80 rows FA3 uses when not causal are no multiple of the 64-element swizzle row).
template <int kHeadDim>
struct BackwardTile;
template <> struct BackwardTile<64>  { static constexpr int kBlockM = 128, kBlockN = 128, kStages = 2; };
template <> struct BackwardTile<128> { static constexpr int kBlockM = 64,  kBlockN = 128, kStages = 2; };

template <class Element, int kHeadDim, class T = BackwardTile<kHeadDim>>
using BackwardConfigFor = BackwardConfig<Element, kHeadDim, T::kBlockM, T::kBlockN, T::kStages>;

// dQ = scale · workspace, converted and stored with dq's strides. The workspace holds, per query
// tile, the main kernel's staged dQ tiles (Config::dq_staging_offset): each thread of this CTA
// reads back the registers of the consumer thread with its index and stores them where that
// thread's accumulator lies.
template <class Config>
__global__ void __launch_bounds__(Config::kMmaThreads)
    backward_convert_dq_kernel(const __grid_constant__ BackwardParams p) {
  using namespace cute;
  using Element = typename Config::Element;
  const int m_block = blockIdx.x, head = blockIdx.y, batch = blockIdx.z;
  const int row_begin = m_block * Config::kBlockM;
  const int tid = threadIdx.x;
  const Sequence seq = Sequence::of(p, batch);
  if (row_begin >= seq.seqlen_q) return;  // varlen: the grid covers the longest sequence
  const float* tile = p.dq_accum + (seq.workspace_row(p, batch, head) + row_begin) * Config::kHeadDim;
  Element* dq = static_cast<Element*>(p.dq) + seq.q_offset(p.dq_stride, batch, head);
  typename Config::TiledMmadQ mma_dq;
  Tensor coords = mma_dq.get_thread_slice(tid).partition_C(make_identity_tensor(typename Config::TileQ{}));
  static_assert(decltype(size<0, 0>(coords))::value == 2);  // column pairs
  CUTE_UNROLL
  for (int i = 0; i < size(coords); i += 4) {
    const float4 v = *reinterpret_cast<const float4*>(tile + Config::dq_staging_offset(tid, i));
    const float values[4] = {v.x, v.y, v.z, v.w};
    CUTE_UNROLL
    for (int j = 0; j < 4; j += 2) {
      const int row = row_begin + get<0>(coords(i + j)), col = get<1>(coords(i + j));
      if (row < seq.seqlen_q && col < p.head_dim) {
        cutlass::Array<Element, 2> pair;
        pair[0] = Element(values[j] * p.scale);
        pair[1] = Element(values[j + 1] * p.scale);
        *reinterpret_cast<cutlass::Array<Element, 2>*>(dq + int64_t(row) * p.dq_stride.row + col) = pair;
      }
    }
  }
}

template <class Config, bool kCausal>
cudaError_t launch_backward(const BackwardParams& p, cudaStream_t stream) {
  using namespace cute;
  using Element = typename Config::Element;
  constexpr int kHeadDim = Config::kHeadDim;
  static_assert(kBackwardRowPadding % Config::kBlockM == 0, "query tiles inside the padded workspaces");
  cudaError_t err = launch_backward_preprocess<Element, kHeadDim>(p, stream);
  if (err != cudaSuccess) return err;

  // A varlen batch's packed tensors as one batch entry of total rows (bwd_load.h offsets each
  // sequence's tiles); its dK and dV are not stored by TMA (bwd_kernel.h), tma_dk/dv then unused.
  const auto [rows_q, rows_k, batches] = TensorExtents::of(p);
  auto q_stage = take<0, 2>(typename Config::SmemLayoutQ{});
  auto tma_q = make_tma_copy(SM90_TMA_LOAD{},
                             tma_view<Element>(static_cast<const Element*>(p.q), p.q_stride, rows_q,
                                               p.head_dim, p.heads_q, batches),
                             q_stage, typename Config::TileQ{}, _1{});
  auto tma_do = make_tma_copy(SM90_TMA_LOAD{},
                              tma_view<Element>(static_cast<const Element*>(p.dout), p.dout_stride,
                                                rows_q, p.head_dim, p.heads_q, batches),
                              q_stage, typename Config::TileQ{}, _1{});
  auto kv_load = [&](const void* ptr, Strides s) {
    return make_tma_copy(SM90_TMA_LOAD{},
                         tma_view<Element>(static_cast<const Element*>(ptr), s, rows_k, p.head_dim,
                                           p.heads_kv, batches),
                         typename Config::SmemLayoutKV{}, typename Config::TileKV{}, _1{});
  };
  auto kv_store = [&](void* ptr, Strides s) {
    return make_tma_copy(SM90_TMA_STORE{},
                         tma_view<Element>(static_cast<Element*>(ptr), s, rows_k, p.head_dim,
                                           p.heads_kv, batches),
                         typename Config::SmemLayoutKV{}, typename Config::TileKV{}, _1{});
  };
  auto tma_k = kv_load(p.k, p.k_stride);
  auto tma_v = kv_load(p.v, p.v_stride);
  auto tma_dk = kv_store(p.dk, p.dk_stride);
  auto tma_dv = kv_store(p.dv, p.dv_stride);
  using Params = BackwardKernelParams<decltype(tma_q), decltype(tma_k), decltype(tma_dk)>;
  Params params{p, tma_q, tma_do, tma_k, tma_v, tma_dk, tma_dv};

  auto kernel = &backward_kernel<Config, kCausal, Params>;
  constexpr int kSmem = Config::kSmemBytes;
  err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
  if (err != cudaSuccess) return err;
  const dim3 grid((p.seqlen_k + Config::kBlockN - 1) / Config::kBlockN, p.heads_kv, p.batch);
  kernel<<<grid, Config::kThreads, kSmem, stream>>>(params);
  err = cudaGetLastError();
  if (err != cudaSuccess) return err;

  const dim3 tile_grid((p.seqlen_q + Config::kBlockM - 1) / Config::kBlockM, p.heads_q, p.batch);
  backward_convert_dq_kernel<Config><<<tile_grid, Config::kMmaThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

template <class ElementTag, int kHeadDim, bool kCausal>
cudaError_t run_backward(const BackwardParams& params, cudaStream_t stream) {
  return launch_backward<BackwardConfigFor<cutlass_element_t<ElementTag>, kHeadDim>, kCausal>(params, stream);
}

}  // namespace fa::sm90
