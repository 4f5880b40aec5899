// Host-side launcher of the Ampere-family forward: the tile each head dim runs with, the grid, and
// the shared-memory opt-in. The KV-cache forward (sm80/kvcache_launch.h) launches through it too.
#pragma once

#include <cuda_runtime_api.h>

#include "common/element.h"
#include "common/split_kv.h"
#include "fa/kernels.h"
#include "fa/per_device.h"
#include "sm80/fwd_config.h"
#include "sm80/fwd_kernel.h"

namespace fa::sm80 {

// Tiles per head dim (query rows × keys per step, warps, K/V buffers), from
// tools/tile_sweep.cu on H100 (docs/tried.md, Ampere family). The O accumulator (kBlockM·D / threads
// floats) and the S tile (kBlockM·kBlockN / threads) share 255 registers a thread; these tiles are
// the fastest that ptxas compiles without spilling (D = 128: 128×64 is faster but spills 80–90
// bytes). D = 128 double-buffers K and V (one barrier a step, each tile loading during a whole
// step): 2–6% faster than one buffer; at D = 64 a second buffer measures level or slower, at
// D = 256 level (and 192 KB would not fit an A100). D = 256 uses 8 warps of 16 rows: 15% faster
// than 64×32 with 4 warps. The kernels compile with --split-compile=0 (cmake/FaKernels.cmake), as
// tools/tile_sweep.cu does: without it ptxas spills 8 bytes in that one.
template <int kHeadDim>
struct ForwardTile;
template <> struct ForwardTile<32>  { static constexpr int kBlockM = 128, kBlockN = 64, kWarps = 4, kStages = 1; };
template <> struct ForwardTile<64>  { static constexpr int kBlockM = 128, kBlockN = 64, kWarps = 4, kStages = 1; };
template <> struct ForwardTile<96>  { static constexpr int kBlockM = 128, kBlockN = 32, kWarps = 4, kStages = 1; };
template <> struct ForwardTile<128> { static constexpr int kBlockM = 128, kBlockN = 32, kWarps = 4, kStages = 2; };
template <> struct ForwardTile<256> { static constexpr int kBlockM = 128, kBlockN = 64, kWarps = 8, kStages = 1; };

// Launches kKernel with kSmem bytes of dynamic shared memory (opting in above 48 KB, once per
// device) and, with kCombine (a KV-cache call) split among CTAs, split-KV's combine pass after it.
template <class Element, int kSmem, bool kCombine, auto kKernel>
cudaError_t launch_with_smem(dim3 grid, int threads, const ForwardParams& params, cudaStream_t stream) {
  if constexpr (kSmem > 48 * 1024) {
    const cudaError_t err = opt_in_shared_memory<kKernel>(kSmem);
    if (err != cudaSuccess) return err;
  }
  kKernel<<<grid, threads, kSmem, stream>>>(params);
  cudaError_t err = cudaGetLastError();
  if constexpr (kCombine) {
    if (err == cudaSuccess && params.num_splits > 1) err = launch_combine_splits<Element>(params, stream);
  }
  return err;
}

// Launches one forward configuration: the grid, and the shared-memory opt-in above 48 KB.
// kDecode: the KV-cache variant (a grid of batch · num_splits along z; split-KV's combine pass).
template <class Config, bool kCausal, bool kSoftcap, bool kDecode = false>
cudaError_t launch_forward(const ForwardParams& params, cudaStream_t stream) {
  // kDecode: a CTA per kv head, its rows the group's query heads × positions (fwd_kernel.h).
  const int rows = kDecode ? params.seqlen_q * (params.heads_q / params.heads_kv) : params.seqlen_q;
  const dim3 grid((rows + Config::kBlockM - 1) / Config::kBlockM, kDecode ? params.heads_kv : params.heads_q,
                  params.batch * (kDecode ? params.num_splits : 1));
  return launch_with_smem<typename Config::Element, Config::kSmemBytes, kDecode,
                          &forward_kernel<Config, kCausal, kSoftcap, kDecode>>(grid, Config::kThreads, params, stream);
}

template <class Element, int kHeadDim>
using ForwardConfigFor = ForwardConfig<Element, kHeadDim, ForwardTile<kHeadDim>::kBlockM,
                                       ForwardTile<kHeadDim>::kBlockN, ForwardTile<kHeadDim>::kWarps,
                                       ForwardTile<kHeadDim>::kStages>;

template <class ElementTag, int kHeadDim, bool kCausal, bool kSoftcap>
cudaError_t run_forward(const ForwardParams& params, cudaStream_t stream) {
  return launch_forward<ForwardConfigFor<cutlass_element_t<ElementTag>, kHeadDim>, kCausal, kSoftcap>(params, stream);
}

}  // namespace fa::sm80
