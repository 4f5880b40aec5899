// Host-side launcher of the Ampere-family backward: the pre-pass, the main kernel, the post-pass.
#pragma once

#include <cuda_runtime_api.h>

#include "common/backward_rows.h"
#include "common/element.h"
#include "fa/kernels.h"
#include "fa/per_device.h"
#include "sm80/bwd_config.h"
#include "sm80/bwd_kernel.h"

namespace fa::sm80 {

// Tiles per head dim: query rows × keys per step, warps, and the warps along M of the S/dP GEMMs,
// along keys of the dK/dV GEMMs and along M of the dQ GEMM; dO buffers and how dQ is added.
// dK and dV accumulators (2 · kBlockN · D / threads floats) dominate the registers;
// docs/tried.md has the measurements. D = 256 has no shared memory left for a staged
// fp32 dQ tile (64 KB): it reduces column pairs straight from registers.
template <int kHeadDim>
struct BackwardTile;
template <> struct BackwardTile<32>  { static constexpr int kBlockM = 128, kBlockN = 128, kWarps = 8, kSdP = 4, kdKV = 4, kdQ = 4, kdOStages = 2; static constexpr DqReduce kReduce = DqReduce::kBulk; };
template <> struct BackwardTile<64>  { static constexpr int kBlockM = 128, kBlockN = 128, kWarps = 8, kSdP = 4, kdKV = 4, kdQ = 4, kdOStages = 2; static constexpr DqReduce kReduce = DqReduce::kBulk; };
template <> struct BackwardTile<96>  { static constexpr int kBlockM = 64,  kBlockN = 128, kWarps = 8, kSdP = 2, kdKV = 4, kdQ = 4, kdOStages = 2; static constexpr DqReduce kReduce = DqReduce::kBulk; };
template <> struct BackwardTile<128> { static constexpr int kBlockM = 64,  kBlockN = 128, kWarps = 8, kSdP = 2, kdKV = 4, kdQ = 2, kdOStages = 1; static constexpr DqReduce kReduce = DqReduce::kBulk; };
template <> struct BackwardTile<256> { static constexpr int kBlockM = 64,  kBlockN = 64,  kWarps = 8, kSdP = 4, kdKV = 2, kdQ = 2, kdOStages = 1; static constexpr DqReduce kReduce = DqReduce::kPairs; };

// Launches one backward configuration: pre-pass, main kernel, post-pass.
template <class Config, bool kCausal, bool kSoftcap>
cudaError_t launch_backward(const BackwardParams& params, cudaStream_t stream) {
  using Element = typename Config::Element;
  constexpr int kHeadDim = Config::kHeadDim;
  using RowPass = RowPassShape<kHeadDim>;
  static_assert(kBackwardRowPadding % Config::kBlockM == 0, "query tiles inside the padded workspaces");
  static_assert(Config::kSmemBytes <= 227 * 1024, "more shared memory than an H100 SM has");

  cudaError_t err = launch_backward_preprocess<Element, kHeadDim>(params, stream);
  if (err != cudaSuccess) return err;

  constexpr auto kernel = &backward_kernel<Config, kCausal, kSoftcap>;
  // Before sm90 the kernel reduces dQ from registers and never touches the staging buffer: leave
  // it out, so the rest fits an A100's 163 KB.
  int device = 0;
  err = cudaGetDevice(&device);
  if (err != cudaSuccess) return err;
  const int capability = device_capability(device);
  if (capability == 0) return cudaErrorInvalidDevice;
  const int smem = Config::kSmemBytes - (capability < 90 ? Config::kSmemdQBytes : 0);
  if (smem > 48 * 1024) {
    err = opt_in_shared_memory<kernel>(smem);
    if (err != cudaSuccess) return err;
  }
  const dim3 grid((params.seqlen_k + Config::kBlockN - 1) / Config::kBlockN, params.heads_kv, params.batch);
  kernel<<<grid, Config::kThreads, smem, stream>>>(params);
  err = cudaGetLastError();
  if (err != cudaSuccess) return err;

  backward_convert_dq_kernel<Element, kHeadDim, Config::kDqSwizzle, Config::kBlockM>
      <<<backward_row_grid(params), RowPass::kThreads, 0, stream>>>(params);
  return cudaGetLastError();
}

template <class Element, int kHeadDim, class T = BackwardTile<kHeadDim>>
using BackwardConfigFor = BackwardConfig<Element, kHeadDim, T::kBlockM, T::kBlockN, T::kWarps, T::kSdP, T::kdKV,
                                         T::kdQ, T::kdOStages, T::kReduce>;

template <class ElementTag, int kHeadDim, bool kCausal, bool kSoftcap>
cudaError_t run_backward(const BackwardParams& params, cudaStream_t stream) {
  return launch_backward<BackwardConfigFor<cutlass_element_t<ElementTag>, kHeadDim>, kCausal, kSoftcap>(params, stream);
}

}  // namespace fa::sm80
