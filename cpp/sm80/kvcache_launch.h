// Host-side launcher of the Ampere family's KV-cache forward (fa.forward_kvcache): which kernel
// and tile serve a call, by the query rows a kv head's group has and the shared memory the device
// allows. It is the Ampere family's on every GPU (decoding is bound by memory bandwidth).
//
// The mask (causal, a window, or none) is a run-time parameter here (params.window_left/right;
// common/attention_mask.h): one instantiation per dtype and head dim serves all, in a translation unit of its own
// (cmake/FaKernels.cmake). Compiled once a causal choice inside the forward's units, these five
// kernels took about a quarter of a full build's compile time (docs/tried.md, 2289563).
#pragma once

#include <cstdlib>

#include <cuda_runtime_api.h>

#include "common/element.h"
#include "common/split_kv.h"
#include "fa/kernels.h"
#include "fa/per_device.h"
#include "sm80/decode_kernel.h"
#include "sm80/fwd_config.h"
#include "sm80/fwd_kernel.h"
#include "sm80/fwd_launch.h"

namespace fa::sm80 {

// The KV-cache (decode) tile: few query rows (a group's heads × a few positions), so 16 rows a warp
// (a tile of 128 would double the matrix and exp work per key byte for rows that do not exist), and
// 64-key tiles three deep, two in flight while one is used. Measured on the H100 against 64 × 4
// deep, 128 × 3 and 128 × 2 (docs/tried.md, decoding): the best or level on every decode
// row. At D = 256 two buffers of 32 keys (three would leave one CTA an SM).
template <int kHeadDim>
struct DecodeTile {
  static constexpr int kBlockM = kDecodeBlockM, kWarps = 4;
  static constexpr int kBlockN = kHeadDim <= 128 ? 64 : 32;
  static constexpr int kStages = kHeadDim <= 128 ? 3 : 2;
};

// The key-splitting decode kernel's slices (decode_kernel.h), for kRows packed rows. 16 rows: 4 warps
// of kWarpKeys keys a step, so that a warp's K and V slices are 16 KB a buffer at D = 64, 128 and
// 256 (12 KB at 96, 8 KB at 32), two buffers a warp: at most 136 KB of shared memory, one CTA an SM
// (and it fits an A100). Measured on the H100 at D = 128 (docs/tried.md, decoding) against
// three buffers of 32 keys (196 KB), three or four of 16 keys (100 KB, two CTAs an SM; 132 KB) and
// 8 warps of 16 keys: the fastest on every decode row it serves but B8 paged 16, where three
// buffers of 16 keys read 0.3-1.3% faster. 32 rows: half the keys a warp, so that S and P take
// the registers they take at 16 rows (with 32 keys at D = 128 ptxas spilled 12 bytes), three
// buffers deep (at most 104 KB: two CTAs an SM, which the registers allow too).
template <int kHeadDim, int kRows>
struct DecodeSplitTile {
  static constexpr int kWarps = 4, kStages = kRows == 16 ? 2 : 3;
  static constexpr int kWarpKeys = (kHeadDim <= 64 ? 64 : kHeadDim <= 128 ? 32 : 16) * 16 / kRows;
};
template <class Element, int kHeadDim, int kRows>
using DecodeConfigFor = DecodeConfig<Element, kHeadDim, kRows, DecodeSplitTile<kHeadDim, kRows>::kWarps,
                                     DecodeSplitTile<kHeadDim, kRows>::kWarpKeys,
                                     DecodeSplitTile<kHeadDim, kRows>::kStages>;

// The key-splitting decode kernel: a CTA per kv head and kRows packed rows, kWarps warps along the keys.
template <class Config>
cudaError_t launch_decode(const ForwardParams& params, cudaStream_t stream) {
  const int rows = params.seqlen_q * (params.heads_q / params.heads_kv);
  const dim3 grid((rows + Config::kRows - 1) / Config::kRows, params.heads_kv, params.batch * params.num_splits);
  return launch_with_smem<typename Config::Element, Config::kSmemBytes, true, &decode_kernel<Config>>(
      grid, Config::kThreads, params, stream);
}

// The shared memory a CTA may opt in to on this device (227 KB on the H100, 163 KB on the A100,
// 99 KB on sm86/sm89), or less where the environment variable FA_MAX_SHARED_MEMORY (bytes) says
// so: the KV-cache dispatch then picks the tiles a GPU with that much would get, which is how the
// tests run an RTX 30/40's choice on a larger GPU. 0 where the runtime cannot say. The device's
// figure is asked of the runtime once per device (fa/per_device.h).
inline int smem_optin_bytes() {
  int optin = once_per_device([](int device) {
    int bytes = 0;
    return cudaDeviceGetAttribute(&bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) == cudaSuccess ? bytes : 0;
  });
  if (const char* cap = std::getenv("FA_MAX_SHARED_MEMORY")) {
    const long bytes = std::strtol(cap, nullptr, 10);
    if (bytes > 0 && bytes < optin) optin = int(bytes);
  }
  return optin;
}

// The least shared memory a CTA may opt in to on a GPU the Ampere family runs on (sm86/sm89):
// every head dim has a KV-cache tile that fits in it.
inline constexpr int kLeastOptinSmemBytes = 99 * 1024;

// The key-splitting kernel (ConfigFor<Element, kHeadDim, rows>) with 16 rows, or 32 up to D = 128
// (at 256, 32 rows' O accumulators would not fit the registers), where the call's packed rows and
// the device's shared memory allow one; cudaErrorNotSupported where neither tile serves the call.
template <template <class, int, int> class ConfigFor, class Element, int kHeadDim>
cudaError_t launch_key_splitting(const ForwardParams& params, cudaStream_t stream, int smem) {
  const int rows = params.seqlen_q * (params.heads_q / params.heads_kv);
  using Rows16 = ConfigFor<Element, kHeadDim, 16>;
  if (rows <= 16 && Rows16::kSmemBytes <= smem) return launch_decode<Rows16>(params, stream);
  if constexpr (kHeadDim <= 128) {
    using Rows32 = ConfigFor<Element, kHeadDim, 32>;
    if (rows <= 32 && Rows32::kSmemBytes <= smem) return launch_decode<Rows32>(params, stream);
  }
  return cudaErrorNotSupported;
}

template <class ElementTag, int kHeadDim>
cudaError_t run_forward_kvcache(const ForwardParams& params, cudaStream_t stream) {
  using Element = cutlass_element_t<ElementTag>;
  // The key-splitting kernel; the 64-row tile for more rows, or where shared memory is short: with
  // two K/V buffers where three do not fit (sm86/sm89 at D = 128: 112 KB against 99 KB).
  const int smem = smem_optin_bytes();
  const cudaError_t err = launch_key_splitting<DecodeConfigFor, Element, kHeadDim>(params, stream, smem);
  if (err != cudaErrorNotSupported) return err;
  // The 64-row tile: forward_kernel's KV-cache variant, instantiated causal and without kSoftcap
  // (its mask reads the window bounds, its soft-capping params.softcap_scale).
  using Tile = DecodeTile<kHeadDim>;
  using Config = ForwardConfig<Element, kHeadDim, Tile::kBlockM, Tile::kBlockN, Tile::kWarps, Tile::kStages>;
  if (Config::kSmemBytes <= smem) return launch_forward<Config, true, false, true>(params, stream);
  using TwoBuffers = ForwardConfig<Element, kHeadDim, Tile::kBlockM, Tile::kBlockN, Tile::kWarps, 2>;
  static_assert(TwoBuffers::kSmemBytes <= kLeastOptinSmemBytes, "a KV-cache tile for sm86/sm89");
  if (TwoBuffers::kSmemBytes <= smem) return launch_forward<TwoBuffers, true, false, true>(params, stream);
  return cudaErrorLaunchOutOfResources;  // no tile fits this device's shared memory
}

// An FP8 (e4m3) cache's decode kernels: the key-splitting kernel with bytes in its K/V buffers and
// one buffer more than a 16-bit cache's (the same bytes in flight): 100 KB at 16 rows up to D = 128
// (two CTAs an SM), 104 KB at D = 256, 72 KB at 32 rows (D = 128). Where the 16-row tile does not fit
// (sm86/sm89's 99 KB) the 32-row one serves up to 16 rows too (D <= 128). Eight warps of half the
// keys each at 16 rows took 1-20% longer (H200; docs/tried.md). Up to 8 rows (a decoding step of up
// to 8 query heads a kv head), the 16-row tile's slices with the keys on the mma's M side
// (decode_keys_on_m.h): half the mma's and exponentials, 167 registers at D = 128 (ptxas, sm_90a),
// so with two buffers (67 KB, which sm86/sm89's 99 KB hold too) three CTAs an SM (measured on the
// H100 against three buffers, two CTAs: level or up to 2.4% faster; docs/tried.md).
template <int kHeadDim, int kRows>
struct DecodeFp8Tile {
  static constexpr int kWarps = DecodeSplitTile<kHeadDim, kRows>::kWarps;
  static constexpr int kWarpKeys = DecodeSplitTile<kHeadDim, kRows>::kWarpKeys;
  static constexpr int kStages = DecodeSplitTile<kHeadDim, kRows>::kStages + 1;
};
template <int kHeadDim>
struct DecodeFp8Tile<kHeadDim, 8> {  // the 16-row tile's slices, two buffers: three CTAs an SM
  static constexpr int kWarps = DecodeFp8Tile<kHeadDim, 16>::kWarps;
  static constexpr int kWarpKeys = DecodeFp8Tile<kHeadDim, 16>::kWarpKeys;
  static constexpr int kStages = 2;
};
template <class Element, int kHeadDim, int kRows>
using DecodeFp8ConfigFor =
    DecodeConfig<Element, kHeadDim, kRows, DecodeFp8Tile<kHeadDim, kRows>::kWarps, DecodeFp8Tile<kHeadDim, kRows>::kWarpKeys,
                 DecodeFp8Tile<kHeadDim, kRows>::kStages, cutlass::float_e4m3_t>;

template <class ElementTag, int kHeadDim>
cudaError_t run_forward_kvcache_fp8(const ForwardParams& params, cudaStream_t stream) {
  using Element = cutlass_element_t<ElementTag>;
  static_assert(fp8_kvcache_max_rows(kHeadDim) == (kHeadDim <= 128 ? 32 : 16), "the key-splitting tiles' rows");
  if constexpr (kHeadDim <= 128) {  // (a D = 256 tile of 32 rows is not a valid configuration)
    static_assert(DecodeFp8ConfigFor<Element, kHeadDim, 32>::kSmemBytes <= kLeastOptinSmemBytes,
                  "an FP8 KV-cache tile for sm86/sm89");
  }
  const int rows = params.seqlen_q * (params.heads_q / params.heads_kv);
  const int smem = smem_optin_bytes();
  using Rows8 = DecodeFp8ConfigFor<Element, kHeadDim, 8>;
  if (rows <= 8 && Rows8::kSmemBytes <= smem) return launch_decode<Rows8>(params, stream);
  const cudaError_t err = launch_key_splitting<DecodeFp8ConfigFor, Element, kHeadDim>(params, stream, smem);
  if (err != cudaErrorNotSupported) return err;
  return rows > fp8_kvcache_max_rows(kHeadDim) ? cudaErrorInvalidValue : cudaErrorLaunchOutOfResources;
}

}  // namespace fa::sm80
