// Host-side launcher of the Hopper-family forward: the tile each head dim runs with, the TMA
// descriptors, the persistent grid and the shared-memory opt-in.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdlib>

#include <cuda_runtime_api.h>
#include <cute/tensor.hpp>
#include <cute/atom/copy_traits_sm90_tma.hpp>

#include "common/element.h"
#include "common/sequence.h"
#include "fa/kernels.h"
#include "fa/per_device.h"
#include "sm90/fwd_config.h"
#include "sm90/fwd_kernel.h"
#include "sm90/tile_scheduler.h"
#include "sm90/transpose_v.h"

namespace fa::sm90 {

// Tiles per head dim and causality (query rows × keys per step, K/V stages), each measured
// (docs/tried.md, Hopper forward): 64 rows per consumer
// warpgroup. D = 64: 192 × 128, three consumer warpgroups, so that two warpgroups' GEMMs cover each
// one's softmax (at D = 64 the GEMMs are short next to the softmax). Wider key tiles amortise each
// step's softmax and barriers over more tensor-core work; causal tiles stay narrower, since every
// query tile's diagonal tile is masked and partly wasted. D = 128: 128 × 160 (the widest whose Q, K/V stages and separate output tile
// fit in 224 KB) measured slower than 128 × 128, which also divides the usual sequence lengths
// (128 × 144 serves long key sequences: LongKeyTile below). Causal D = 128: 192 × 80, three
// consumer warpgroups: a step receives a third fewer K and V bytes per FLOP than on 128 × 128, and
// at the power limit the forward's time is the energy of the bytes each SM receives. Measured
// (docs/tried.md, 555b122): 3–7% less energy a call, 4–5% faster at the power limit from
// 4096 rows; 192 × 64 level with 128 × 128, 192 × 96 spills.
// D = 256: 128 × 80 with two stages fills shared memory (the output tile then reuses Q's buffer).
template <int kHeadDim, bool kCausal>
struct ForwardTile;
template <bool kCausal> struct ForwardTile<64, kCausal> {
  static constexpr int kBlockM = 192, kBlockN = 128, kStages = 2;
};
template <> struct ForwardTile<128, false> { static constexpr int kBlockM = 128, kBlockN = 128, kStages = 2; };
template <> struct ForwardTile<128, true>  { static constexpr int kBlockM = 192, kBlockN = 80, kStages = 2; };
template <bool kCausal> struct ForwardTile<256, kCausal> {
  static constexpr int kBlockM = 128, kBlockN = 80, kStages = 2;
};

// A second tile for short query lengths, where the first one's rows are mostly padding or
// masked: D = 64 causal takes 128 × 128 (two consumer warpgroups) below 2048 query rows. Measured
// (docs/tried.md, Hopper forward): at 1024 rows 192 × 128 is 11% slower than 128 × 128, at 2048
// rows 1–2% faster, at 4096 5% faster.
template <int kHeadDim, bool kCausal>
struct ShortQueryTile {
  static constexpr int kBelowRows = 0;  // none
};
template <> struct ShortQueryTile<64, true> {
  static constexpr int kBelowRows = 2048, kBlockM = 128, kBlockN = 128, kStages = 2;
};

// A tile for narrow windows, where a row sees at most kMaxKeys keys (window_left + 1 +
// window_right, both bounded): most of a wide key tile's pairs would be masked. Under a 128-key
// window each consumer warpgroup (64 rows) computes 2 key tiles of 128 (256 keys a row for 128
// seen) or 3 tiles of 64 (192 keys), and a query tile is a few steps long, so its fixed costs (Q's
// wait, the first softmax, the epilogue) weigh as much as its steps. D = 64 causal without
// soft-capping (gpt-oss's 128-key windows) takes 128 × 64 with two CTAs an SM up to 256 keys: one
// CTA's fixed costs run under the other's steps. Measured (docs/tried.md, narrow windows), against
// 192 × 128 at (4, 64/8, 8192): 192 × 64 1.07× at window (127, 0), 1.02× at (255, 0), 0.97× at
// (511, 0), 128 × 64 and 128 × 128 (one CTA an SM) slower; 128 × 64 with two CTAs an SM (its
// consumers spill 128 bytes, and ptxas serialises their wgmma: C7512, docs/performance.md)
// 1.06–1.08× 192 × 64's at (127, 0) with and without sinks, 1.02× at (255, 0), 1.01–1.12× below
// 2048 query rows, where 192 × 64 was 1.04–1.24× the short-query 128 × 128 (both dtypes).
template <int kHeadDim, bool kCausal>
struct NarrowWindowTile {
  static constexpr int kMaxKeys = 0;  // none
};
template <> struct NarrowWindowTile<64, true> {
  static constexpr int kMaxKeys = 256, kBlockM = 128, kBlockN = 64, kStages = 2, kCtasPerSm = 2;
};

// A second tile for long key sequences, where a wider key tile spreads each step's softmax and
// barriers over more tensor-core work and its last, partial tile costs little: D = 128 non-causal
// takes 128 × 144 from 8192 keys on, the widest tile whose consumers still hold Q in registers
// (ForwardConfig::kQInRegisters; one Q buffer beside the output's). Measured (docs/tried.md):
// FA3's 128 × 176 (Q from shared memory) 2–3% faster than 128 × 128 at 8192–32768 keys and 6%
// slower at 4096 (1c01966); 128 × 144 with Q in registers 0.7–1.5% fewer cycles a call than
// 128 × 176 at the power limit (d28484a).
template <int kHeadDim, bool kCausal>
struct LongKeyTile {
  static constexpr int kFromKeys = 0;  // none
};
template <> struct LongKeyTile<128, false> {
  static constexpr int kFromKeys = 8192, kBlockM = 128, kBlockN = 144, kStages = 2;
};

// The configuration of one of the tiles above.
template <class Element, int kHeadDim, class Tile>
using ForwardConfigOf = ForwardConfig<Element, kHeadDim, Tile::kBlockM, Tile::kBlockN, Tile::kStages>;

// A mode of extent 1 is never stepped along, so its stride (which the caller may leave at any value)
// is replaced by one TMA accepts: 16 bytes, in elements.
template <class Element>
int64_t tma_stride(int64_t stride, int extent) {
  return extent > 1 ? stride : int64_t(16 / sizeof(Element));
}

// A (B, H, S, D) tensor as TMA sees it: (S, D, H, B), D contiguous.
template <class Element, class Pointer>
auto tma_view(Pointer ptr, Strides s, int seqlen, int head_dim, int heads, int batch) {
  using namespace cute;
  return make_tensor(make_gmem_ptr(ptr), make_shape(seqlen, head_dim, heads, batch),
                     make_stride(tma_stride<Element>(s.row, seqlen), _1{}, tma_stride<Element>(s.head, heads),
                                 tma_stride<Element>(s.batch, batch)));
}

// The FP8 forward's transposed V, (B, H, D, S) with S contiguous, as TMA sees it: (D, S, H, B).
template <class Element, class Pointer>
auto transposed_tma_view(Pointer ptr, Strides s, int head_dim, int keys, int heads, int batch) {
  using namespace cute;
  return make_tensor(make_gmem_ptr(ptr), make_shape(head_dim, keys, heads, batch),
                     make_stride(s.row, _1{}, tma_stride<Element>(s.head, heads), tma_stride<Element>(s.batch, batch)));
}

// Host-side facts asked of the CUDA runtime once per device (fa/per_device.h: each runtime call
// costs host time at every launch, and small calls are bound by it).

// The current device's SM count: the persistent kernels (forward and backward) launch about one
// CTA per SM.
inline cudaError_t current_device_sms(int& sms) {
  int device = 0;
  const cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return err;
  sms = device_sm_count(device);
  return sms != 0 ? cudaSuccess : cudaErrorInvalidDevice;
}

// The current device's memory bus width in bits (H100 SXM: 5120, HBM3 at 3.35 TB/s; H200: 6144,
// HBM3e at 4.8 TB/s): the deterministic backward's L2 sections at head dim 256 (bwd_config.h).
inline cudaError_t current_device_memory_bus_bits(int& bits) {
  bits = once_per_device([](int device) {
    int v = 0;
    return cudaDeviceGetAttribute(&v, cudaDevAttrGlobalMemoryBusWidth, device) == cudaSuccess ? v : 0;
  });
  return bits != 0 ? cudaSuccess : cudaErrorInvalidDevice;
}

// CTA pairs (the non-causal forward at D ≥ 128 over dense batches whose heads have an even number
// of query tiles): the kernel is launched in clusters of two CTAs. With the static schedule CTAs 2c and
// 2c + 1 take tiles t and t + 1 of the order, adjacent query tiles of one head, which read the same
// K and V tiles; each CTA of the pair loads half of every tile into both (TMA multicast,
// fwd_load.h), so K and V are read from L2 once per pair. Measured 2–3% faster from 8192 keys at
// D = 128, 0.5–1.3% at D = 256, level at 4096 keys and below; at D = 64 (192-row tiles, K and V
// read by more rows) level, so not used there (ForwardConfig::kPairs; docs/tried.md, 5e9c995).
// FA_SM90_FWD_PAIRS=0 launches single CTAs instead.
//
// Sets config's cluster attribute (in `attribute`) and returns in `pairs` how many pairs fit on
// the device at once (0: none; asked once per device and Config).
template <class Config, class Kernel>
cudaError_t max_cta_pairs(Kernel kernel, cudaLaunchConfig_t& config, cudaLaunchAttribute (&attribute)[1], int& pairs) {
  attribute[0].id = cudaLaunchAttributeClusterDimension;
  attribute[0].val.clusterDim.x = 2;
  attribute[0].val.clusterDim.y = 1;
  attribute[0].val.clusterDim.z = 1;
  config.attrs = attribute;
  config.numAttrs = 1;
  cudaError_t err = cudaSuccess;
  const int known_pairs = once_per_device([&](int) {  // pairs + 1; 0: not known
    const dim3 grid = config.gridDim;
    config.gridDim = dim3(2, 1, 1);
    int v = 0;
    err = cudaOccupancyMaxActiveClusters(&v, kernel, &config);
    config.gridDim = grid;
    return err == cudaSuccess ? v + 1 : 0;
  });
  pairs = std::max(known_pairs - 1, 0);
  return err;
}

template <class Config, bool kCausal, bool kSoftcap>
cudaError_t launch_forward(const ForwardParams& p, cudaStream_t stream) {
  using namespace cute;
  using Element = typename Config::Element;
  const auto* q = static_cast<const Element*>(p.q);
  const auto* k = static_cast<const Element*>(p.k);
  const auto* v = static_cast<const Element*>(p.v);
  auto* out = static_cast<typename Config::ElementOut*>(p.out);
  auto kv_stage = take<0, 2>(typename Config::SmemLayoutKV{});
  auto v_stage = take<0, 2>(typename Config::SmemLayoutV{});
  const int dv = head_dim_v<Config>(p);
  // A varlen batch's packed tensors are one batch entry of total rows (fwd_load.h offsets each
  // sequence's tiles); its output is not stored by TMA (fwd_epilogue.h), tma_o is then unused.
  const auto [rows_q, rows_k, batches] = TensorExtents::of(p);
  auto tma_q = make_tma_copy(SM90_TMA_LOAD{},
                             tma_view<Element>(q, p.q_stride, rows_q, p.head_dim, p.heads_q, batches),
                             typename Config::SmemLayoutQ{}, typename Config::TileQ{}, _1{});
  const auto k_view = tma_view<Element>(k, p.k_stride, rows_k, p.head_dim, p.heads_kv, batches);
  // FP8: V transposed, (Dv, S, H, B) with S contiguous (ForwardParams::v), over the whole rows
  // (transpose_v.h writes zeros past each entry's keys).
  const auto v_view = [&](int keys, int batch) {
    if constexpr (Config::kFp8) {
      return transposed_tma_view<Element>(v, p.v_stride, dv, keys, p.heads_kv, batch);
    } else {
      return tma_view<Element>(v, p.v_stride, keys, dv, p.heads_kv, batch);
    }
  }(Config::kFp8 ? int(p.v_stride.row) : rows_k, batches);
  auto tma_k = make_tma_copy(SM90_TMA_LOAD{}, k_view, kv_stage, typename Config::TileKV{}, _1{});
  auto tma_v = make_tma_copy(SM90_TMA_LOAD{}, v_view, v_stage, typename Config::TileVLoad{}, _1{});
  // Half of a K or V tile each, multicast to both CTAs of a pair (fwd_load.h): encoded only where
  // pairs launch (below), left empty otherwise.
  auto pair_copy = [&](auto const& view) {
    return make_tma_copy(SM90_TMA_LOAD_MULTICAST{}, view, kv_stage, typename Config::TileKV{}, _2{});
  };
  using PairCopy = decltype(pair_copy(k_view));
  auto tma_o = make_tma_copy(SM90_TMA_STORE{},
                             tma_view<typename Config::ElementOut>(out, p.out_stride, rows_q, dv, p.heads_q, batches),
                             typename Config::SmemLayoutOWarpgroup{}, typename Config::TileOWarpgroup{}, _1{});

  int sms = 0;
  cudaError_t err = current_device_sms(sms);
  if (err != cudaSuccess) return err;

  using Params = ForwardKernelParams<decltype(tma_q), decltype(tma_k), decltype(tma_v), decltype(tma_o),
                                     PairCopy>;
  // Causal tiles differ in length, and so do a varlen batch's: CTAs then take tiles from a counter.
  const bool dynamic = kCausal || p.cu_seqlens_q != nullptr;
  const int m_blocks = (p.seqlen_q + Config::kBlockM - 1) / Config::kBlockM;
  const int64_t kv_bytes_per_head =
      int64_t(p.seqlen_k) * (Config::kHeadDim + Config::kHeadDimV) * sizeof(Element) / (p.heads_q / p.heads_kv);
  Params params{p,
                TileScheduler::make_params(m_blocks, p.heads_q, p.batch, kCausal, kv_bytes_per_head,
                                           dynamic ? p.tile_counter : nullptr),
                tma_q, tma_k, tma_v, tma_o, 1, PairCopy{}, PairCopy{}};

  constexpr auto kernel = &forward_kernel<Config, kCausal, kSoftcap, Params>;
  constexpr int kSmem = Config::kSmemBytes;
  err = opt_in_shared_memory<kernel>(kSmem, /*max_carveout=*/Config::kCtasPerSm > 1);
  if (err != cudaSuccess) return err;
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(TileScheduler::grid_size(params.scheduler, sms * Config::kCtasPerSm), 1, 1);
  config.blockDim = dim3(Config::kThreads, 1, 1);
  config.dynamicSmemBytes = kSmem;
  config.stream = stream;
  cudaLaunchAttribute cluster[1];
  if constexpr (Config::kPairs) {  // one head dim: V's tiles are K's shape
    const char* pairs_env = std::getenv("FA_SM90_FWD_PAIRS");
    if (!dynamic && m_blocks % 2 == 0 && !(pairs_env != nullptr && pairs_env[0] == '0')) {
      int pairs = 0;
      err = max_cta_pairs<Config>(kernel, config, cluster, pairs);
      if (err != cudaSuccess) return err;
      if (pairs > 0) {
        params.pair = 2;
        params.tma_k_pair = pair_copy(k_view);
        params.tma_v_pair = pair_copy(v_view);
        config.gridDim.x = std::max(2, std::min<int>(config.gridDim.x, 2 * pairs) / 2 * 2);
      } else {
        config.numAttrs = 0;
      }
    }
  }
  return cudaLaunchKernelEx(&config, kernel, params);
}

template <class ElementTag, int kHeadDim, bool kCausal, bool kSoftcap>
cudaError_t run_forward(const ForwardParams& params, cudaStream_t stream) {
  using Element = cutlass_element_t<ElementTag>;
  using Short = ShortQueryTile<kHeadDim, kCausal>;
  using Long = LongKeyTile<kHeadDim, kCausal>;
  using Narrow = NarrowWindowTile<kHeadDim, kCausal>;
  if constexpr (Narrow::kMaxKeys > 0 && !kSoftcap) {
    if (params.window_left >= 0 && params.window_right >= 0 &&
        int64_t(params.window_left) + 1 + params.window_right <= Narrow::kMaxKeys) {
      using Config = ForwardConfig<Element, kHeadDim, Narrow::kBlockM, Narrow::kBlockN, Narrow::kStages, kHeadDim,
                                   Narrow::kCtasPerSm>;
      return launch_forward<Config, kCausal, kSoftcap>(params, stream);
    }
  }
  if constexpr (Short::kBelowRows > 0) {
    if (params.seqlen_q < Short::kBelowRows) {
      return launch_forward<ForwardConfigOf<Element, kHeadDim, Short>, kCausal, kSoftcap>(params, stream);
    }
  }
  if constexpr (Long::kFromKeys > 0) {
    if (params.seqlen_k >= Long::kFromKeys) {  // a varlen batch's max_seqlen_k
      return launch_forward<ForwardConfigOf<Element, kHeadDim, Long>, kCausal, kSoftcap>(params, stream);
    }
  }
  return launch_forward<ForwardConfigOf<Element, kHeadDim, ForwardTile<kHeadDim, kCausal>>, kCausal, kSoftcap>(
      params, stream);
}

// Two head dims (kHeadDimV < kHeadDim: FA_HEAD_DIM_PAIRS, DeepSeek's 192/128): 128 × 128 with two
// stages where it fits (at 192/128, with the output tile in Q's buffer: 208 KB), else 128 × 80.
// Q is read from shared memory (ForwardConfig::kQInRegisters: at most head dim 128).
template <class Element, int kHeadDim, int kHeadDimV>
struct ForwardTileDv {
  static constexpr int kBlockM = 128, kStages = 2;
  static constexpr int kBlockN =
      (kBlockM * kHeadDim + kStages * 128 * (kHeadDim + kHeadDimV)) * int(sizeof(Element)) + 1024 <= kMaxSmemBytes ? 128 : 80;
};

// The FP8 forward's tiles. Dv = 128 with D = 128 or a pair up to 192/128 (DeepSeek's): 192 × 96 with
// two stages (three consumer warpgroups), causal or not: a step receives a third fewer K and V bytes
// per FLOP than on 128 × 192 (as the 16-bit causal tile above). Measured on the H100 (docs/tried.md):
// 2.5–5.7% faster than 128 × 192 on the six D = 128 rows of the FP8 suite and 3.7 / 4.7% at 192/128;
// three stages level or slower; 192 × 128 spills. Other head dims (64; pairs not measured): 128 × 192
// with two stages (two consumer warpgroups), on the H200 0.2–4.9% faster than 128 × 128 at D = 128
// and than FlashAttention-3's 128 × 224 on five rows of six (224: 2% faster on one); 128 × 256 spills.
template <int kHeadDim, int kHeadDimV>
struct Fp8ForwardTile {
  static constexpr bool kThreeWarpgroups = kHeadDimV == 128 && kHeadDim <= 192;
  static constexpr int kBlockM = kThreeWarpgroups ? 192 : 128, kBlockN = kThreeWarpgroups ? 96 : 192, kStages = 2;
};

// kHeadDimV below kHeadDim: FA_FP8_HEAD_DIM_PAIRS (192/128 by default).
template <int kHeadDim, bool kCausal, int kHeadDimV>
cudaError_t run_forward_fp8(const ForwardParams& params, cudaStream_t stream) {
  cudaError_t err = transpose_v_fp8<kHeadDimV>(params, stream);
  if (err != cudaSuccess) return err;
  using Tile = Fp8ForwardTile<kHeadDim, kHeadDimV>;
  using Config = ForwardConfig<cutlass::float_e4m3_t, kHeadDim, Tile::kBlockM, Tile::kBlockN, Tile::kStages, kHeadDimV>;
  return launch_forward<Config, kCausal, false>(params, stream);
}

template <class ElementTag, int kHeadDim, int kHeadDimV, bool kCausal, bool kSoftcap>
cudaError_t run_forward_dv(const ForwardParams& params, cudaStream_t stream) {
  using Element = cutlass_element_t<ElementTag>;
  using Tile = ForwardTileDv<Element, kHeadDim, kHeadDimV>;
  return launch_forward<ForwardConfig<Element, kHeadDim, Tile::kBlockM, Tile::kBlockN, Tile::kStages, kHeadDimV>,
                        kCausal, kSoftcap>(params, stream);
}

}  // namespace fa::sm90
