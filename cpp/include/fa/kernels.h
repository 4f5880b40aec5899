// Entry points of the kernel families: the only functions the binding calls.
//
// Each is explicitly instantiated in one generated translation unit per
// (family, direction, dtype, head dim, causal, soft-capping); cmake/FaKernels.cmake holds the table
// of what ships. kCausal: the mask of common/attention_mask.h with its bounds read at run time
// (causal or a window; it serves a call without bounds too); kSoftcap: soft-capped scores
// (common/softcap.h), instantiated with kCausal alone.
#pragma once

#include <cuda_runtime_api.h>

#include "fa/params.h"

namespace fa {

// Rows of the query tile the backward's workspaces (dQ, delta, lse_log2) are padded to: a multiple
// of every family's backward query tile.
inline constexpr int kBackwardRowPadding = 128;
// Workspace rows per dQ claim (BackwardParams::dq_claims, common/dq_claims.h): a divisor of the
// padding and of the Hopper backward's query tiles.
inline constexpr int kDqClaimRows = 64;
static_assert(kBackwardRowPadding % kDqClaimRows == 0);

// Deterministic backward calls of the Hopper family at head dim 128 on the kernels without a mask
// (causal_kernels false: no causal mask, window or soft-capping; Variant::causal_kernels) whose key
// tiles walk more than 32 query tiles (of 64 rows, for each query head of the kv head: the tiles that
// pass their turns late, sm90/bwd_load.h kLateTurnSteps) add their odd turns' dQ partials into a
// second workspace (BackwardParams::dq_accum_odd), so that a key tile waits for the one two turns
// before it. Measured (H100, bf16, 2026-12-06): (2, 16, 16384, 128) 549-560 -> 567-588 TFLOP/s,
// (4, 64, 8192, 128) 551-555 -> 565-569; causal calls 7-19% slower, non-causal ones of 16 query
// tiles 6.5% slower (docs/tried.md).
constexpr bool sm90_backward_odd_turns(int head_dim, bool causal_kernels, long long seqlen_q, long long group) {
  return head_dim == 128 && !causal_kernels && (seqlen_q + 63) / 64 * group > 32;
}

// Query rows of the Ampere family's KV-cache (decode) tile: a CTA serves one kv head, its rows the
// group's query heads × positions (sm80/fwd_launch.h DecodeTile). The binding sizes split-KV by it.
inline constexpr int kDecodeBlockM = 64;
// The query rows of a decode CTA for `rows` packed rows (group · seqlen_q); the binding sizes
// split-KV by it. Up to 16 rows, or 32 at head dims up to 128, the key-splitting decode kernel
// (sm80/decode_kernel.h) serves the call with a 16- or 32-row tile where the device's shared memory
// allows it; where the 64-row tile serves up to 32 rows instead, the CTA count is the same.
constexpr int decode_block_m(long long rows) { return rows <= 16 ? 16 : rows <= 32 ? 32 : kDecodeBlockM; }
// The query rows (group · seqlen_q) a KV-cache call with float8_e4m3fn caches may have at kernel
// head dim head_dim: only the key-splitting decode kernel reads FP8 caches (sm80/kvcache_launch.h).
constexpr int fp8_kvcache_max_rows(int head_dim) { return head_dim <= 128 ? 32 : 16; }

// Keys a row of the FP8 forward's transposed V holds (ForwardParams::v) for `keys` keys, a multiple
// of 16 so that every row starts 16-byte aligned as TMA needs and ends on a whole block of the
// transpose's key order (sm90/transpose_v.h, fp8_v_key_of_slot); in a varlen batch of `sequences`,
// 16 more a sequence, each starting at a 16-byte aligned key (sm90/transpose_v.h,
// transposed_v_begin).
constexpr long long fp8_transposed_v_keys(long long keys, long long sequences = 0) {
  return (keys + 16 * sequences + 15) / 16 * 16;
}

namespace sm80 {

// Ampere family (mma.sync, cp.async, ldmatrix): sm80 and newer.
template <class ElementTag, int kHeadDim, bool kCausal, bool kSoftcap>
cudaError_t run_forward(const ForwardParams& params, cudaStream_t stream);

// The KV-cache forward (params.seqused_k set); its mask is params.window_left/right alone, its
// soft-capping params.softcap_scale.
template <class ElementTag, int kHeadDim>
cudaError_t run_forward_kvcache(const ForwardParams& params, cudaStream_t stream);

// The same with float8_e4m3fn k and v caches (params.k_descale, v_descale): the key-splitting
// decode kernel, up to 32 query rows a kv head (group · seqlen_q) at head dims up to 128, 16 at
// 256 (cudaErrorInvalidValue beyond).
template <class ElementTag, int kHeadDim>
cudaError_t run_forward_kvcache_fp8(const ForwardParams& params, cudaStream_t stream);

template <class ElementTag, int kHeadDim, bool kCausal, bool kSoftcap>
cudaError_t run_backward(const BackwardParams& params, cudaStream_t stream);

}  // namespace sm80

namespace sm90 {

// Hopper family (wgmma, TMA, warp specialisation): sm90a only. Native head dims 64, 128, 256.
template <class ElementTag, int kHeadDim, bool kCausal, bool kSoftcap>
cudaError_t run_forward(const ForwardParams& params, cudaStream_t stream);

// q and k with head dim kHeadDim, v and the output with kHeadDimV < kHeadDim (params.head_dim_v):
// the pairs of FA_HEAD_DIM_PAIRS (DeepSeek's 192/128).
template <class ElementTag, int kHeadDim, int kHeadDimV, bool kCausal, bool kSoftcap>
cudaError_t run_forward_dv(const ForwardParams& params, cudaStream_t stream);

// The FP8 forward: float8_e4m3fn q, k and v (params.v_rows), descales (params.q_descale, ...),
// output bf16 or fp16 (params.out_fp16); it first writes v transposed into params.v. v's and the
// output's head dim kHeadDimV: kHeadDim, or below it (FA_FP8_HEAD_DIM_PAIRS).
template <int kHeadDim, bool kCausal, int kHeadDimV>
cudaError_t run_forward_fp8(const ForwardParams& params, cudaStream_t stream);

// Native head dims 64, 128 and 256; params.lse_log2 must be set, and the dQ workspace is laid out in
// the kernel's own tile order (sm90/bwd_config.h), not row-major.
template <class ElementTag, int kHeadDim, bool kCausal, bool kSoftcap>
cudaError_t run_backward(const BackwardParams& params, cudaStream_t stream);

// The backward with v's head dim kHeadDimV below q's and k's kHeadDim: the pairs of
// FA_HEAD_DIM_PAIRS with kHeadDim above 128 and kHeadDimV a multiple of 128.
template <class ElementTag, int kHeadDim, int kHeadDimV, bool kCausal, bool kSoftcap>
cudaError_t run_backward_dv(const BackwardParams& params, cudaStream_t stream);

}  // namespace sm90
}  // namespace fa
