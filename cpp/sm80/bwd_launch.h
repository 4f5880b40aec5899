// Host-side launcher of the Ampere-family backward: the pre-pass, the main kernel, the post-pass.
#pragma once

#include <cuda_runtime_api.h>

#include "common/backward_rows.h"
#include "common/element.h"
#include "fa/kernels.h"
#include "sm80/bwd_config.h"
#include "sm80/bwd_kernel.h"

namespace fa::sm80 {

// Tiles per head dim: query rows × keys per step, warps, and the warps along M of the S/dP GEMMs,
// along keys of the dK/dV GEMMs and along M of the dQ GEMM. dK and dV accumulators
// (2 · kBlockN · D / threads floats) dominate the registers; benchmarks/NOTES.md has the measurements.
template <int kHeadDim>
struct BackwardTile;
template <> struct BackwardTile<32>  { static constexpr int kBlockM = 128, kBlockN = 128, kWarps = 8, kSdP = 4, kdKV = 4, kdQ = 4; };
template <> struct BackwardTile<64>  { static constexpr int kBlockM = 128, kBlockN = 128, kWarps = 8, kSdP = 4, kdKV = 4, kdQ = 4; };
template <> struct BackwardTile<96>  { static constexpr int kBlockM = 64,  kBlockN = 128, kWarps = 8, kSdP = 2, kdKV = 4, kdQ = 4; };
template <> struct BackwardTile<128> { static constexpr int kBlockM = 64,  kBlockN = 128, kWarps = 8, kSdP = 2, kdKV = 4, kdQ = 2; };
template <> struct BackwardTile<256> { static constexpr int kBlockM = 64,  kBlockN = 64,  kWarps = 8, kSdP = 4, kdKV = 2, kdQ = 2; };

// Launches one backward configuration: pre-pass, main kernel, post-pass.
template <class Config, bool kCausal>
cudaError_t launch_backward(const BackwardParams& params, cudaStream_t stream) {
  using Element = typename Config::Element;
  constexpr int kHeadDim = Config::kHeadDim;
  using RowPass = RowPassShape<kHeadDim>;
  static_assert(RowPass::kRowsPerBlock == kBackwardRowPadding && kBackwardRowPadding % Config::kBlockM == 0);

  const dim3 row_grid(params.seqlen_q_rounded / RowPass::kRowsPerBlock, params.heads_q, params.batch);
  backward_preprocess_kernel<Element, kHeadDim><<<row_grid, RowPass::kThreads, 0, stream>>>(params);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;

  auto kernel = &backward_kernel<Config, kCausal>;
  constexpr int kSmem = Config::kSmemBytes;
  if constexpr (kSmem > 48 * 1024) {
    err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
    if (err != cudaSuccess) return err;
  }
  const dim3 grid((params.seqlen_k + Config::kBlockN - 1) / Config::kBlockN, params.heads_kv, params.batch);
  kernel<<<grid, Config::kThreads, kSmem, stream>>>(params);
  err = cudaGetLastError();
  if (err != cudaSuccess) return err;

  backward_convert_dq_kernel<Element, kHeadDim><<<row_grid, RowPass::kThreads, 0, stream>>>(params);
  return cudaGetLastError();
}

template <class Element, int kHeadDim>
using BackwardConfigFor =
    BackwardConfig<Element, kHeadDim, BackwardTile<kHeadDim>::kBlockM, BackwardTile<kHeadDim>::kBlockN,
                   BackwardTile<kHeadDim>::kWarps, BackwardTile<kHeadDim>::kSdP, BackwardTile<kHeadDim>::kdKV,
                   BackwardTile<kHeadDim>::kdQ>;

template <class ElementTag, int kHeadDim, bool kCausal>
cudaError_t run_backward(const BackwardParams& params, cudaStream_t stream) {
  return launch_backward<BackwardConfigFor<cutlass_element_t<ElementTag>, kHeadDim>, kCausal>(params, stream);
}

}  // namespace fa::sm80
