// Host-side launcher of the Hopper-family backward: the pre-pass (shared with the Ampere family),
// the main kernel, and the post-pass that converts the dQ workspace.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdlib>

#include <cuda_runtime_api.h>
#include <cute/tensor.hpp>
#include <cute/atom/copy_traits_sm90_tma.hpp>
#include <cutlass/numeric_conversion.h>

#include "common/backward_rows.h"
#include "common/dq_claims.h"
#include "common/grid_dependency.h"
#include "common/element.h"
#include "fa/kernels.h"
#include "fa/per_device.h"
#include "sm90/bwd_config.h"
#include "sm90/bwd_kernel.h"
#include "sm90/fwd_launch.h"  // tma_view, current_device_sms
#include "sm90/row_store.h"

namespace fa::sm90 {

// Tiles per head dim (query rows per step × keys per CTA, Q/dO stages): FA3's choices for its
// causal kernels. Measured (docs/tried.md, Hopper backward): at
// D = 128, three Q/dO stages and 64 rows at D = 64 were no faster; D = 128 stays at 64 rows (the
// 80 rows FA3 uses when not causal are no multiple of the 64-element swizzle row).
template <int kHeadDim>
struct BackwardTile;
template <> struct BackwardTile<64>  { static constexpr int kBlockM = 128, kBlockN = 128, kStages = 2; };
template <> struct BackwardTile<128> { static constexpr int kBlockM = 64,  kBlockN = 128, kStages = 2; };
static_assert(BackwardTile<128>::kBlockM == 64 && kLateTurnSteps == 32,
              "sm90_backward_odd_turns (fa/kernels.h) counts these steps");
// D = 256: 80 keys a CTA, the warpgroups split the head dim, dQ is added from registers, one dO
// buffer (bwd_config.h, bwd_mma_split.h).
template <> struct BackwardTile<256> { static constexpr int kBlockM = 64,  kBlockN = 80,  kStages = 2; };
// D = 192 (v's head dim 128: FA_HEAD_DIM_PAIRS), split as D = 256, on FA3's 96 keys: 1.5-3.7%
// faster than 80 and 1.19x deterministic (docs/performance.md); three Q/dO stages no faster. At
// 112 keys ptxas spills 888 bytes and serialises the wgmma (C7512).
template <> struct BackwardTile<192> { static constexpr int kBlockM = 64,  kBlockN = 96,  kStages = 2; };

template <class Element, int kHeadDim, int kHeadDimV = kHeadDim, class T = BackwardTile<kHeadDim>>
using BackwardConfigFor = BackwardConfig<Element, kHeadDim, T::kBlockM, T::kBlockN, T::kStages, kHeadDimV>;

// dQ = scale · workspace, converted and stored with dq's strides. The workspace holds, per query
// tile, the main kernel's staged dQ tiles (Config::dq_staging_offset): each thread of this CTA
// reads back the accumulator registers of the consumer thread with its index (16-byte loads, each
// warp's 512 contiguous bytes), as that thread's accumulator fragment. Written from there to global
// memory, a thread's values would be 4-byte pairs scattered over 16 rows (half of each 32-byte
// sector written, measured 3x slower than reading and writing at full rate); instead they go through
// shared memory as the forward's output does (stmatrix into the 128-byte swizzle) and leave as
// 16-byte row pieces, each warp writing whole rows.
template <class Config>
__global__ void __launch_bounds__(Config::kdQThreads)
    backward_convert_dq_kernel(const __grid_constant__ BackwardParams p) {
  using namespace cute;
  using Element = typename Config::Element;
  using TileQ = typename Config::TileQ;
  using SmemLayoutdQ = decltype(tile_to_shape(typename Config::SmemAtom{}, TileQ{}));
  __shared__ alignas(1024) Element smem_dq[cosize_v<SmemLayoutdQ>];
  const int m_block = blockIdx.x, head = blockIdx.y, batch = blockIdx.z;
  const int row_begin = m_block * Config::kBlockM;
  const int tid = threadIdx.x;
  wait_for_prior_grid();  // the main kernel's dQ sums
  const Sequence seq = Sequence::of(p, batch);
  if (row_begin >= seq.seqlen_q) return;  // varlen: the grid covers the longest sequence
  const int64_t row = seq.workspace_row(p, batch, head) + row_begin;
  const float* tile = p.dq_accum + row * Config::kHeadDim;
  // The odd turns' sum (BackwardParams::dq_accum_odd), where any key tile added to it.
  const float* odd = p.dq_claims_odd != nullptr && p.dq_claims_odd[row / kDqClaimRows] != kUnclaimed
                         ? p.dq_accum_odd + row * Config::kHeadDim
                         : nullptr;

  typename Config::TiledMmadQ mma_dq;
  Tensor acc_dq = partition_fragment_C(mma_dq, TileQ{});
  // A claimed workspace's tile that no key tile wrote (its rows see no key) holds no zeros.
  if (p.dq_claims != nullptr && p.dq_claims[row / kDqClaimRows] == kUnclaimed) {
    clear(acc_dq);
  } else {
    CUTE_UNROLL
    for (int i = 0; i < size(acc_dq); i += 4) {
      float4 v = *reinterpret_cast<const float4*>(tile + Config::dq_staging_offset(tid, i));
      if (odd != nullptr) {
        const float4 w = *reinterpret_cast<const float4*>(odd + Config::dq_staging_offset(tid, i));
        v = make_float4(v.x + w.x, v.y + w.y, v.z + w.z, v.w + w.w);
      }
      acc_dq(i) = v.x * p.scale;
      acc_dq(i + 1) = v.y * p.scale;
      acc_dq(i + 2) = v.z * p.scale;
      acc_dq(i + 3) = v.w * p.scale;
    }
  }
  Tensor rdQ = convert_fragment<Element>(acc_dq);
  Tensor sdQ = make_tensor(make_smem_ptr(smem_dq), SmemLayoutdQ{});
  auto copy_dq = make_tiled_copy_C(Copy_Atom<SM90_U32x4_STSM_N, Element>{}, mma_dq);
  auto thr_copy = copy_dq.get_thread_slice(tid);
  copy(copy_dq, thr_copy.retile_S(rdQ), thr_copy.partition_D(sdQ));
  __syncthreads();
  Element* dq = static_cast<Element*>(p.dq) + seq.q_offset(p.dq_stride, batch, head) +
                int64_t(row_begin) * p.dq_stride.row;
  store_rows<Config::kBlockM, Config::kHeadDim>(sdQ, dq, p.dq_stride.row, seq.seqlen_q - row_begin,
                                                p.head_dim, tid, Config::kdQThreads);
}

template <class Config, bool kCausal, bool kSoftcap>
cudaError_t launch_backward(const BackwardParams& call, cudaStream_t stream) {
  using namespace cute;
  using Element = typename Config::Element;
  constexpr int kHeadDim = Config::kHeadDim;
  static_assert(kBackwardRowPadding % Config::kBlockM == 0, "query tiles inside the padded workspaces");
  // dQ's workspace tiles are claimed (common/dq_claims.h) where Config::kdQClaims says so, or
  // Config::kdQClaimsAtRunTime and a row sees at most kdQClaimsMaxKeys keys on average, and taken
  // in turns where the call is deterministic; else the pre-pass zeroes the workspace.
  BackwardParams p = call;
  // The keys a row sees on average (estimated only where a choice below depends on it), and a
  // threshold's default or the environment variable that overrides it at each call.
  auto row_keys = [&] {
    return kCausal ? mean_visible_keys(p.seqlen_q, p.seqlen_k, p.window_left, p.window_right) : int64_t(p.seqlen_k);
  };
  auto keys_from_env = [](const char* name, int keys) {
    const char* value = std::getenv(name);
    return value != nullptr ? std::atoi(value) : keys;
  };
  bool claims = Config::kdQClaims;
  if constexpr (Config::kdQClaimsAtRunTime) {
    claims = row_keys() <= keys_from_env("FA_BWD_DQ_CLAIMS_MAX_KEYS", Config::kdQClaimsMaxKeys);
  }
  if (!claims && !p.deterministic) p.dq_claims = nullptr;
  // The rows of later units prepared by the main kernel's spare warps only where a row sees
  // enough keys (Config::kRowsInMainKernelMinKeys, or FA_BWD_ROWS_MIN_KEYS).
  if constexpr (Config::kRowsInMainKernel) {
    if (row_keys() < keys_from_env("FA_BWD_ROWS_MIN_KEYS", Config::kRowsInMainKernelMinKeys)) p.unit_ready = nullptr;
  } else {
    p.unit_ready = nullptr;
  }

  const int n_blocks = (p.seqlen_k + Config::kBlockN - 1) / Config::kBlockN;
  const int64_t key_tiles = int64_t(n_blocks) * p.heads_kv * p.batch;
  if (key_tiles > INT32_MAX) return cudaErrorInvalidConfiguration;  // a 1-D grid
  // Persistent: about one CTA per SM, each taking key tiles of the order until none is left.
  int sms = 0;
  cudaError_t err = current_device_sms(sms);
  if (err != cudaSuccess) return err;
  // Deterministic, the order is in sections even where not causal, and shortest first where
  // causal with enough waves of key tiles (tile_scheduler.h says why).
  const bool sectioned = kCausal || p.deterministic;
  const bool shortest_first = kCausal && p.deterministic && key_tiles >= int64_t(kShortestFirstWaves) * sms;

  // What one (batch, kv head) streams through L2: Q and dO of its query heads and their dQ
  // workspace rows; for a varlen batch at its sequences' mean length (at the longest one's, a
  // section held fewer units than the budget allows: docs/tried.md). The sections fill at most
  // Config::l2_section_budget of the H100's 50 MB (by head dim, determinism, order and memory bus),
  // or FA_BWD_L2_BUDGET_MB (a tuning knob for timing sections of other sizes).
  int bus_bits = 0;
  err = current_device_memory_bus_bits(bus_bits);
  if (err != cudaSuccess) return err;
  int64_t l2_budget = Config::l2_section_budget(p.deterministic, shortest_first, bus_bits);
  if (const char* mb = std::getenv("FA_BWD_L2_BUDGET_MB")) l2_budget = int64_t(std::max(0, std::atoi(mb))) << 20;
  const int group = p.heads_q / p.heads_kv;
  const int64_t unit_rows =
      p.cu_seqlens_q != nullptr ? (int64_t(p.total_q) + p.batch - 1) / p.batch : int64_t(p.seqlen_q_rounded);
  const int64_t unit_bytes = int64_t(group) * unit_rows *
                             ((kHeadDim + Config::kHeadDimV) * sizeof(Element) + kHeadDim * sizeof(float));
  const auto order =
      BackwardTileOrder::make(n_blocks, p.heads_kv, p.batch, sectioned, shortest_first, unit_bytes, l2_budget);
  const int64_t grid = std::max<int64_t>(1, std::min<int64_t>(order.size(), sms));
  // Where Config::kRowsInMainKernel, the pre-pass prepares the rows of the units that the first
  // two waves of key tiles need (whole sections of the order) and the main kernel's spare warps
  // the rest, under its GEMMs (BackwardParams::unit_ready; the binding sets it for rectangular
  // batches): a call then waits for a fraction of the pre-pass's time.
  if (p.unit_ready != nullptr) {
    const Sections& s = order.order;
    const int64_t last = std::min<int64_t>(order.size(), 2 * grid) - 1;
    const int64_t units = std::min<int64_t>(s.units, (last / (int64_t(s.section) * s.per_unit) + 1) * s.section);
    if (units >= s.units || units * group > 65535) {
      p.unit_ready = nullptr;
    } else {
      p.prepared_units = int(units);
    }
  }
  err = launch_backward_preprocess<Element, kHeadDim>(p, stream);
  if (err != cudaSuccess) return err;

  // A varlen batch's packed tensors as one batch entry of total rows (bwd_load.h offsets each
  // sequence's tiles); its dK and dV are not stored by TMA (bwd_kernel.h), tma_dk/dv then unused.
  const auto [rows_q, rows_k, batches] = TensorExtents::of(p);
  // Q, K, dK at q's head dim; dO, V, dV at v's (the same but in a pair's kernels).
  auto tma_q = make_tma_copy(SM90_TMA_LOAD{},
                             tma_view<Element>(static_cast<const Element*>(p.q), p.q_stride, rows_q,
                                               p.head_dim, p.heads_q, batches),
                             take<0, 2>(typename Config::SmemLayoutQ{}), typename Config::TileQ{}, _1{});
  auto tma_do = make_tma_copy(SM90_TMA_LOAD{},
                              tma_view<Element>(static_cast<const Element*>(p.dout), p.dout_stride,
                                                rows_q, p.head_dim_v, p.heads_q, batches),
                              take<0, 2>(typename Config::SmemLayoutdO{}), typename Config::TileDO{}, _1{});
  auto kv_tma = [&, keys = rows_k, entries = batches](auto op, auto layout, auto tile, const void* ptr, Strides s,
                                                     int cols) {
    return make_tma_copy(op,
                         tma_view<Element>(static_cast<Element*>(const_cast<void*>(ptr)), s, keys, cols, p.heads_kv,
                                           entries),
                         layout, tile, _1{});
  };
  using SmemK = typename Config::SmemLayoutK;
  using SmemV = typename Config::SmemLayoutV;
  using TileK = typename Config::TileK;
  using TileV = typename Config::TileV;
  auto tma_k = kv_tma(SM90_TMA_LOAD{}, SmemK{}, TileK{}, p.k, p.k_stride, p.head_dim);
  auto tma_v = kv_tma(SM90_TMA_LOAD{}, SmemV{}, TileV{}, p.v, p.v_stride, p.head_dim_v);
  auto tma_dk = kv_tma(SM90_TMA_STORE{}, SmemK{}, TileK{}, p.dk, p.dk_stride, p.head_dim);
  auto tma_dv = kv_tma(SM90_TMA_STORE{}, SmemV{}, TileV{}, p.dv, p.dv_stride, p.head_dim_v);
  using Params = BackwardKernelParams<decltype(tma_q), decltype(tma_do), decltype(tma_k), decltype(tma_v),
                                      decltype(tma_dk), decltype(tma_dv)>;
  Params params{p, order, tma_q, tma_do, tma_k, tma_v, tma_dk, tma_dv};

  constexpr auto kernel = &backward_kernel<Config, kCausal, kSoftcap, Params>;
  constexpr int kSmem = Config::kSmemBytes;
  err = opt_in_shared_memory<kernel>(kSmem);
  if (err != cudaSuccess) return err;
  // Both kernels after the pre-pass start as the kernel ahead of them drains (grid_dependency.h).
  err = launch_after_prior_grid(kernel, dim3(unsigned(grid)), dim3(Config::kThreads), kSmem, stream, params);
  if (err != cudaSuccess) return err;

  const dim3 tile_grid((p.seqlen_q + Config::kBlockM - 1) / Config::kBlockM, p.heads_q, p.batch);
  return launch_after_prior_grid(&backward_convert_dq_kernel<Config>, tile_grid, dim3(Config::kdQThreads), 0,
                                 stream, p);
}

template <class ElementTag, int kHeadDim, bool kCausal, bool kSoftcap>
cudaError_t run_backward(const BackwardParams& params, cudaStream_t stream) {
  return launch_backward<BackwardConfigFor<cutlass_element_t<ElementTag>, kHeadDim>, kCausal, kSoftcap>(params, stream);
}

// v's head dim kHeadDimV below q's and k's kHeadDim (FA_HEAD_DIM_PAIRS; kHeadDim above 128, kHeadDimV
// a multiple of 128: bwd_config.h).
template <class ElementTag, int kHeadDim, int kHeadDimV, bool kCausal, bool kSoftcap>
cudaError_t run_backward_dv(const BackwardParams& params, cudaStream_t stream) {
  return launch_backward<BackwardConfigFor<cutlass_element_t<ElementTag>, kHeadDim, kHeadDimV>, kCausal, kSoftcap>(
      params, stream);
}

}  // namespace fa::sm90
