// The plain structs that cross from the torch binding into the kernels.
//
// Nothing here knows torch or CUTLASS: pointers, element strides and sizes only, so the kernel
// translation units compile without torch headers and the binding compiles without CUDA device code.
#pragma once

#include <cstdint>

namespace fa {

// Element-type tags. The binding names the dtype with these; each kernel family maps them onto its
// own numeric types (cutlass::half_t, cutlass::bfloat16_t).
struct Float16 {};
struct BFloat16 {};

// A paged KV cache's page size is a multiple of this many rows (the binding checks it), so a page
// holds whole 16-key groups of the kernels' key tiles.
inline constexpr int kPageRows = 16;

// Strides in elements of a (batch, heads, seqlen, head_dim) tensor; head_dim always has stride 1.
struct Strides {
  int64_t batch = 0;
  int64_t head = 0;
  int64_t row = 0;
};

// softmax(Q Kᵀ · scale) V for q (B, Hq, Sq, D) and k, v (B, Hk, Sk, D).
struct ForwardParams {
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  void* out = nullptr;    // (B, Hq, Sq, D), q's dtype
  float* lse = nullptr;   // (B, Hq, Sq): natural-log log-sum-exp of each row's scaled scores
  Strides q_stride, k_stride, v_stride, out_stride;
  int64_t lse_batch_stride = 0;  // lse rows are contiguous
  int64_t lse_head_stride = 0;

  int batch = 0;
  int heads_q = 0;
  int heads_kv = 0;      // heads_q % heads_kv == 0; query head h reads kv head h / (heads_q / heads_kv)
  int seqlen_q = 0;
  int seqlen_k = 0;
  int head_dim = 0;      // the real D; the kernel's tile may be wider (columns past D are zero-filled)

  float scale = 0.f;       // applied to Q Kᵀ
  float scale_log2 = 0.f;  // scale · log2(e), so that exp(x · scale) == exp2(x · scale_log2)

  // The Hopper family's causal or varlen forward hands out work tiles from this counter (one int,
  // zeroed by the caller before each launch); other kernels ignore it.
  int* tile_counter = nullptr;

  // Variable-length batches (fa.forward_varlen), else null. Sequence b's queries are rows
  // [cu_seqlens_q[b], cu_seqlens_q[b + 1]) of packed (total_q, H, D) tensors (batch strides 0, row
  // strides the packed tensors'), its keys likewise through cu_seqlens_k; lse is (Hq, total_q).
  // seqlen_q and seqlen_k are then the maxima over the batch and only size the grid.
  // common/sequence.h turns these into one batch entry's rows.
  const int* cu_seqlens_q = nullptr;
  const int* cu_seqlens_k = nullptr;
  int total_q = 0;  // varlen: rows of the packed q (and out); the Hopper family's TMA spans them
  int total_k = 0;  // varlen: rows of the packed k and v

  // KV cache (fa.forward_kvcache; the Ampere family's forward), else null / defaults.
  // Batch entry b sees keys [0, seqused_k[b]) of its cache; seqlen_k is then the cache's capacity.
  const int* seqused_k = nullptr;
  // Left-padded contiguous caches (cache_leftpad), else null: entry b's keys are then
  // [leftpad_k[b], seqused_k[b]) of its cache, and its first key is the first of that range.
  const int* leftpad_k = nullptr;
  // Paged K/V: k and v are (num_pages, page_size, Hk, D), k_stride.batch / v_stride.batch the page
  // stride; key j of batch entry b lies in page page_table[b · page_table_stride + j / page_size],
  // row j % page_size. page_size is a multiple of kPageRows.
  const int* page_table = nullptr;
  int64_t page_table_stride = 0;
  int page_size = 0;
  // Split-KV: the key tiles of each query tile are divided among num_splits CTAs (blockIdx.z =
  // batch · num_splits + split), each writing its normalised fp32 output and lse to out_accum
  // ((num_splits, B, Hq, seqlen_q, head_dim_rounded)) and lse_accum ((num_splits, B, Hq,
  // seqlen_q)); a combine kernel merges them into out and lse. With num_splits 1 the kernel
  // writes out and lse itself.
  int num_splits = 1;
  float* out_accum = nullptr;
  float* lse_accum = nullptr;
  int head_dim_accum = 0;  // head_dim_rounded of out_accum
  // A key's visibility by the query's position: query i sees key j iff
  //   i' - window_left <= j <= i' + window_right,   i' = i + seqlen_k - seqlen_q
  // (bottom-right aligned), -1 meaning unbounded on that side; causal is window_right = 0. The
  // kernels instantiated for causal (and the KV-cache kernels, which take every mask at run time)
  // read these bounds; the binding sets window_right = 0 for a causal call and sends every call
  // with a bound to those kernels (common/attention_mask.h).
  int window_left = -1;
  int window_right = -1;
  // v's and the output's head dim (set for every call). The dense kernels with one head dim read
  // head_dim for it; those with two (the Hopper forward's FA_HEAD_DIM_PAIRS), the KV-cache kernels
  // and split-KV's combine this, which may differ from head_dim.
  int head_dim_v = 0;
  // Sink logits, float32 (heads_q,), else null: query head h's rows add exp(sinks[h]) to their
  // softmax denominator (a key with no value); lse includes it.
  const float* sinks = nullptr;
  // Soft-capping (common/softcap.h): scale / softcap, else 0. With it, scale and scale_log2 are
  // the softmax's on the capped scores (softcap, softcap · log2 e); the backward keeps scale as the
  // call's own (dQ and dK are scaled by it).
  float softcap_scale = 0.f;
  // An FP8 KV cache (fa.forward_kvcache with float8_e4m3fn k and v; the Ampere family's decode
  // kernel): the factors each (batch entry, kv head)'s keys and values are multiplied by, float32
  // (B, Hk) at these element strides (batch, head), else null (1).
  // The FP8 forward (sm90::run_forward_fp8: float8_e4m3fn q, k, v) reads these too, and q_descale
  // likewise: scores are (q · q_descale) · (k · k_descale), the output P (v · v_descale).
  const float* k_descale = nullptr;
  const float* v_descale = nullptr;
  int64_t k_descale_stride[2] = {0, 0};
  int64_t v_descale_stride[2] = {0, 0};
  const float* q_descale = nullptr;
  int64_t q_descale_stride[2] = {0, 0};
  // The FP8 forward: v transposed, (B, Hk, Dv, keys) with the keys contiguous (v_stride: batch,
  // head, and `row` the stride between head-dim rows: the keys a row holds, a multiple of 16), written by
  // run_forward_fp8 from v_rows (v's own layout, at v_rows_stride) into the buffer at v, which the
  // caller allocates (fp8_transposed_v_keys keys a row; sm90/transpose_v.h). The output (out) is float16 where out_fp16, else bfloat16.
  const void* v_rows = nullptr;
  Strides v_rows_stride;
  bool out_fp16 = false;
};

// Gradients of the forward above. The forward's pointers are read again (out as dO's partner).
struct BackwardParams : ForwardParams {
  const void* dout = nullptr;
  void* dq = nullptr;
  void* dk = nullptr;
  void* dv = nullptr;
  Strides dout_stride, dq_stride, dk_stride, dv_stride;

  // Workspaces, float32 and owned by the caller, written by the pre-pass. Their rows: those of
  // each (batch, query head) padded to a multiple of kBackwardRowPadding (fa/kernels.h), at
  // workspace_rows (below); dQ's rows hold head_dim_rounded floats.
  float* dq_accum = nullptr;   // zeroed by the pre-pass, unless dq_claims
  // Where the Hopper family's backward claims (sm90::BackwardConfig::kdQClaims) or the call is
  // deterministic (else null): one int per kDqClaimRows workspace rows, zeroed by the pre-pass in
  // dq_accum's place; the first key tile to add to a query tile stores instead
  // (common/dq_claims.h).
  int* dq_claims = nullptr;
  // dQ, dK, dV bit-identical from run to run: every query tile's dQ partials are added in one
  // order, the key tiles' (common/dq_claims.h, "turns"), counted in dq_claims. dK and dV are
  // deterministic in every mode (each key tile's CTA sums its group's query heads in registers).
  bool deterministic = false;
  // Deterministic, where the binding gives the odd turns their own sums (else null; the Hopper
  // family's dQ writer: sm90_backward_odd_turns in fa/kernels.h): the key tiles of odd turns add
  // into dq_accum_odd, counted in dq_claims_odd (laid out as dq_accum and dq_claims), those of even
  // turns into dq_accum (common/dq_claims.h); the post-pass adds the two.
  float* dq_accum_odd = nullptr;
  int* dq_claims_odd = nullptr;
  float* delta = nullptr;      // rowsum(dO ∘ O)
  // Hopper family only (else null): lse · log2(e) with +inf for a row that sees no key or lies
  // past seqlen_q, so that exp2(s · scale_log2 - lse_log2) is P (0 there).
  float* lse_log2 = nullptr;
  // Hopper family, rectangular batches, where its launcher so decides (else null): the pre-pass
  // prepares (delta, lse_log2, the zeroed workspace or claims) only the rows of the first
  // prepared_units (batch, kv head) units, unit = batch · heads_kv + kv head, which the main
  // kernel's first key tiles need; spare warps of the main kernel prepare the others while its
  // consumers compute, counting each unit's finished row blocks in unit_ready (one int per unit,
  // zeroed by the pre-pass), which every role waits on before it reads or adds to that unit's rows
  // (common/backward_rows.h).
  int* unit_ready = nullptr;
  int prepared_units = 0;
  int seqlen_q_rounded = 0;   // seqlen_q (the maximum, for varlen) rounded up to the padding
  int head_dim_rounded = 0;
  // Varlen only: the workspaces are (Hq, workspace_head_rows), workspace_head_rows =
  // total_q + B · kBackwardRowPadding rounded up to the padding, each sequence at its own padded
  // offset (common/sequence.h).
  // Otherwise they are (B, Hq, seqlen_q_rounded).
  int64_t workspace_head_rows = 0;
};

}  // namespace fa
