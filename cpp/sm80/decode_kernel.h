// The Ampere family's key-splitting decode kernel: fa.forward_kvcache when a kv head's group has
// at most 16 query rows (group · Sq <= 16; e.g. decoding one token with 4 query heads a kv head),
// or 32 at head dims up to 128 (e.g. 8 query heads a kv head with Sq 4).
//
// Why a kernel of its own. Decoding reads the K/V cache once and does little math per byte; what
// bounds it is how steadily the loads stream. fwd_kernel.h's decode tile stacks its warps along 64
// query rows, so with 4 real rows three warps compute rows that do not exist, every warp reads the
// whole K and V tile from shared memory, and a barrier each step ties the warps' loads together.
// Here the warps sit side by side along the keys (as FlashDecoding and cuDNN's decode kernel do):
//
// Tile plan. A CTA serves one kv head of one batch entry (one share of its keys with split-KV) and
// kRows (16 or 32) packed query rows (decode_rows.h). Each step covers kBlockN = kWarps · kWarpKeys keys; warp w
// owns keys [w · kWarpKeys, (w + 1) · kWarpKeys) of every step. A warp computes S = Q Kᵀ for its
// slice (kRows × kWarpKeys) with Q held in registers (read from shared memory each step where
// registers run out: 16 rows at D = 256, 32 rows at D > 64), folds it into its own online softmax,
// and accumulates its own O (kRows × D, fp32) from its slice of V.
//
// Pipeline and synchronisation. Each warp copies its own K and V slices with cp.async into its own
// kStages buffers, so the warps never wait for each other in the mainloop: step on key tile n,
// in buffer n % kStages, for each warp:
//   wait for this warp's slices of tile n (tiles n-1 … n-(kStages-2) may still fly); __syncwarp
//   issue tile n-(kStages-1)'s slices into tile n+1's buffer (this warp is done reading it)
//   S = Q K[n]ᵀ; mask (the last tiles); online softmax; O += P V[n]
// one commit group a tile (empty past the last), so the wait counts stay exact. Warp 0 also copies
// the query rows first (its own commit group); one barrier makes them visible before the mainloop.
//
// Merge. After the mainloop each warp normalises its O and computes its lse, and writes both to
// shared memory (over the K/V buffers, after a barrier). Then each thread merges 8 columns of a
// row over the warps, exactly as split-KV's combine does (common/split_kv.h):
// lse = log Σ_w exp(lse_w), O = Σ_w exp(lse_w - lse) O_w, and stores them: to out and lse, or, with
// split-KV, to the fp32 partial results for the combine pass.
//
// FP8 cache (Config::kFp8, fp8_kv.h). The slices land as bytes (1 a value: half the shared-memory
// traffic of a 16-bit cache, and no 16-bit copy of them is ever stored), and each lane builds its
// mma B fragments from them itself, converting in registers. The orders that makes cheap:
//   S = Q Kᵀ: a lane loads 16 bytes of one key row at once (head-dim values 16j … 16j + 15 of a
//     64-wide block, j = lane % 4), which are, 4 at a time, its B fragment's values of 4 k16
//     slices. The contraction order does not matter as long as Q's follows: Q's columns are
//     permuted the same way in shared memory once, before the mainloop (permute_query_block).
//   O += P V: P's keys stay in S's order; a lane's B fragment of V holds keys 2j, 2j+1, 2j+8, 2j+9
//     of a 16-key slice at one head-dim column, so it loads 4 bytes of each of those rows (4
//     columns) and pairs bytes with byte_perm. The output's columns come out permuted: an
//     accumulator column n holds head-dim column fp8_output_column(n), undone at the merge.
// S = Q Kᵀ runs in fp16 whatever q's dtype: a bf16 query is converted once, in shared memory, each
// row scaled by a power of two into fp16's range (fp8_kv.h), and the scores are multiplied by that
// row's factor back and the (batch, kv head)'s k_descale; the output by its v_descale.
//
// An FP8 cache's tile of 8 rows (DecodeConfig::kKeysOnM: at most 8 rows a kv head) transposes both
// products so that the keys sit on the mma's M side and the rows on its N = 8 (decode_keys_on_m.h):
// the same slices, pipeline and merge, its own fragments, softmax lanes and merge writes.
#pragma once

#include <cute/tensor.hpp>

#include "common/attention_mask.h"
#include "common/grid_dependency.h"
#include "common/online_softmax.h"
#include "common/sequence.h"
#include "common/softcap.h"
#include "fa/params.h"
#include "sm80/decode_keys_on_m.h"
#include "sm80/decode_rows.h"
#include "sm80/fp8_kv.h"
#include "sm80/fragments.h"
#include "sm80/gemm.h"
#include "sm80/tile_copy.h"

namespace fa::sm80 {

// FP8 caches: the head-dim column an O accumulator column n holds (see above): in each 32-column
// group, the n8 tiles 4g + i hold columns 32g + 4r + i for r = n % 8.
CUTE_HOST_DEVICE constexpr int fp8_output_column(int n) { return n / 32 * 32 + n % 8 * 4 + n / 8 % 4; }

// FP8 caches: a query row's 64-column block b of 16-bit values (in 8-value pieces at piece(m), m
// = 0..7) permuted in place into the order the keys' B fragments take: slice c's values 2j, 2j+1
// are columns 16j + 4c, + 1 and its values 8 + 2j, 9 + 2j columns 16j + 4c + 2, + 3. In 32-bit
// pairs: out pair 8c + 4h + j = in pair 8j + 2c + h, i.e. out piece m = in pairs m, 8 + m, 16 + m,
// 24 + m.
template <class PieceAddress>
CUTE_DEVICE void permute_query_block(PieceAddress&& piece) {
  uint32_t in[32];
  CUTE_UNROLL
  for (int m = 0; m < 8; ++m) {
    const uint4 v = *reinterpret_cast<const uint4*>(piece(m));
    in[4 * m] = v.x, in[4 * m + 1] = v.y, in[4 * m + 2] = v.z, in[4 * m + 3] = v.w;
  }
  CUTE_UNROLL
  for (int m = 0; m < 8; ++m) *reinterpret_cast<uint4*>(piece(m)) = make_uint4(in[m], in[8 + m], in[16 + m], in[24 + m]);
}

// The mask (causal or a window, bottom-right aligned over the positions; or none) is read at run
// time (common/attention_mask.h).
template <class Config>
__global__ void __launch_bounds__(Config::kThreads)
    decode_kernel(const __grid_constant__ ForwardParams params) {
  using namespace cute;
  using Element = typename Config::Element;
  using ElementKV = typename Config::ElementKV;
  using ElementQK = typename Config::ElementQK;
  using ElementPV = typename Config::ElementPV;
  constexpr bool kFp8 = Config::kFp8;
  constexpr int kRows = Config::kRows;
  constexpr int kWarps = Config::kWarps;
  constexpr int kWarpKeys = Config::kWarpKeys;
  constexpr int kBlockN = Config::kBlockN;
  constexpr int kHeadDim = Config::kHeadDim;
  constexpr int kStages = Config::kStages;
  using QTile = Shape<Int<kRows>, Int<kHeadDim>>;
  using KVTile = Shape<Int<kWarpKeys>, Int<kHeadDim>>;
  using STile = Shape<Int<kRows>, Int<kWarpKeys>>;

  extern __shared__ __align__(128) char smem[];
  // Split-KV's combine pass (a dependent launch: grid_dependency.h) may be scheduled as soon as
  // every CTA of this grid is: it waits for this grid's results anyway.
  allow_dependent_grid();
  const int tid = threadIdx.x;
  const int warp = tid / 32, lane = tid % 32;
  const int batch = blockIdx.z / params.num_splits;
  const int split = blockIdx.z % params.num_splits;
  const Sequence seq = Sequence::of(params, batch);
  const DecodeRows<Element> tile_rows{params, batch, int(blockIdx.y), split, params.heads_q / params.heads_kv,
                                      seq.seqlen_q, int(blockIdx.x) * kRows};
  const int rows_left = tile_rows.group * seq.seqlen_q - tile_rows.row_begin;

  const AttentionMask<true> mask(seq.seqlen_q, seq.seqlen_k, params);
  // The tile holds every position, so it sees the keys from the first position's first (a window's
  // left bound) to the last one's last; this CTA walks the key tiles [tile_begin, tile_end), all
  // of them or its split's share. A CTA with none still runs the merge: its rows get output 0 and
  // lse -inf (or their sink's logit).
  const int window_begin = mask.first_visible_tile(0, kBlockN);
  const int n_tiles = max(0, mask.visible_tiles(seq.seqlen_q, kBlockN) - window_begin);
  const int per_split = (n_tiles + params.num_splits - 1) / params.num_splits;
  const int tile_begin = window_begin + min(n_tiles, split * per_split);
  const int tile_end = min(window_begin + n_tiles, tile_begin + per_split);

  // Shared memory: the query rows, then each warp's kStages K buffers and kStages V buffers.
  constexpr int kKVElems = Config::kKVInBytes / int(sizeof(ElementKV));
  Tensor sQ = make_tensor(make_smem_ptr(reinterpret_cast<Element*>(smem)), typename Config::SmemLayoutQ{});
  // The query rows as S = Q Kᵀ reads them: fp16 with an FP8 cache (a bf16 query is converted in place).
  Tensor sQk = make_tensor(make_smem_ptr(reinterpret_cast<ElementQK*>(smem)), typename Config::SmemLayoutQ{});
  char* warp_smem = smem + Config::kQBytes + warp * Config::kWarpBytes;
  ElementKV* warp_kv = reinterpret_cast<ElementKV*>(warp_smem);
  Tensor sK = make_tensor(make_smem_ptr(warp_kv), typename Config::SmemLayoutKVIn{});  // buffer 0's
  Tensor sV = make_tensor(make_smem_ptr(warp_kv + kStages * kKVElems), typename Config::SmemLayoutKVIn{});
  // Buffer 0's K and V as the 16-bit GEMMs read them (an FP8 cache's: only their shapes are used).
  Tensor sKg = make_tensor(make_smem_ptr(reinterpret_cast<ElementQK*>(warp_smem)), typename Config::SmemLayoutKV{});
  Tensor sVt = make_tensor(make_smem_ptr(reinterpret_cast<ElementPV*>(warp_smem + Config::kKVInBytes * kStages)),
                           typename Config::SmemLayoutVt{});
  // A view of buffer `stage` (buffer 0's layout, a whole number of swizzle periods further on). The
  // index is a run-time value: the kernel holds one copy of the step, not one a buffer (the mainloop).
  auto pick = [](int stage, auto const& buffer0) {
    return make_tensor(buffer0.data() + stage * kKVElems, buffer0.layout());
  };

  typename Config::GmemCopy gmem_copy;  // the query rows
  auto gmem_thr = gmem_copy.get_thread_slice(lane);
  Tensor tQcQ = gmem_thr.partition_S(make_identity_tensor(QTile{}));
  const auto col_ok_q = column_predicates(tQcQ, params.head_dim);
  typename Config::GmemCopyKV gmem_copy_kv;  // the K and V slices
  auto gmem_thr_kv = gmem_copy_kv.get_thread_slice(lane);
  Tensor tKVcKV = gmem_thr_kv.partition_S(make_identity_tensor(KVTile{}));
  const auto col_ok = column_predicates(tKVcKV, params.head_dim);
  const auto col_ok_v = column_predicates(tKVcKV, params.head_dim_v);  // v's head dim may differ
  Tensor tKsK = gmem_thr_kv.partition_D(sK);
  Tensor tVsV = gmem_thr_kv.partition_D(sV);

  auto rows_of = [&](const void* base, int64_t offset, Strides s) {
    return make_tensor(make_gmem_ptr(static_cast<const ElementKV*>(base) + offset),
                       make_shape(seq.seqlen_k, Int<kHeadDim>{}), make_stride(s.row, _1{}));
  };
  // (kWarpKeys, D, slices): slice n · kWarps + warp is this warp's share of key tile n.
  Tensor tKgK = gmem_thr_kv.partition_S(local_tile(
      rows_of(params.k, seq.k_offset(params.k_stride, batch, tile_rows.head_kv), params.k_stride), KVTile{},
      make_coord(_, 0)));
  Tensor tVgV = gmem_thr_kv.partition_S(local_tile(
      rows_of(params.v, seq.k_offset(params.v_stride, batch, tile_rows.head_kv), params.v_stride), KVTile{},
      make_coord(_, 0)));
  // This warp's slice of key tile n into buffer `stage`; only the last tile can be partial
  // (check_rows). A paged cache's rows are gathered through the page table. An FP8 cache's tiles
  // look up each group of kPageRows keys once (a page holds whole groups), for K's rows and V's;
  // a 16-bit cache's each row (docs/tried.md: with the group look-up and O's rescale as a branch,
  // the 16-bit tiles' paged-16 row ran 8% slower).
  auto load_slice = [&](int n, int stage, auto check_rows) {
    const int slice = n * kWarps + warp;
    const int keys_left = seq.seqlen_k - slice * kWarpKeys;
    if (params.page_table != nullptr) {
      const int* pages = params.page_table + batch * params.page_table_stride;
      constexpr int kGroups = kFp8 ? kWarpKeys / kPageRows : 1;
      static_assert(kWarpKeys % kPageRows == 0);
      int group_page[kGroups], group_row[kGroups];  // (FP8) each group's page and its first key's row there
      if constexpr (kFp8) {
        CUTE_UNROLL
        for (int g = 0; g < kGroups; ++g) {
          // A group past the cache's end zero-fills: its page must still be in the table.
          const int key = min(slice * kWarpKeys + g * kPageRows, seq.seqlen_k - 1);
          group_page[g] = pages[key / params.page_size];
          group_row[g] = key % params.page_size;
        }
      }
      auto gather = [&](const void* base, const Strides& s, auto const& cols, auto&& dst) {
        const ElementKV* head_base = static_cast<const ElementKV*>(base) + tile_rows.head_kv * s.head;
        if constexpr (kFp8) {
          // The lane's rows are row0 + kStep · m (Fp8RowCopy: kHeadDim / 16 lanes a row), kStep
          // dividing kPageRows: copy m's group and its row there are compile-time constants, so
          // each group's address is computed once and a row's is that plus a constant number of
          // rows. A row past the cache's end zero-fills from the slice's first row's address.
          constexpr int kStep = 32 / (kHeadDim / 16);
          static_assert(kPageRows % kStep == 0);
          const int row0 = get<0>(tKVcKV(0, 0, 0));
          const ElementKV* group_base[kGroups];
          CUTE_UNROLL
          for (int g = 0; g < kGroups; ++g) {
            group_base[g] = head_base + int64_t(group_page[g]) * s.batch + int64_t(group_row[g] + row0) * s.row;
          }
          const ElementKV* first_row = head_base + int64_t(group_page[0]) * s.batch + int64_t(group_row[0]) * s.row;
          CUTE_UNROLL
          for (int m = 0; m < size<1>(dst); ++m) {
            const bool row_ok = row0 + kStep * m < keys_left;
            const ElementKV* row =
                row_ok ? group_base[kStep * m / kPageRows] + kStep * m % kPageRows * s.row : first_row;
            CUTE_UNROLL
            for (int k = 0; k < size<2>(dst); ++k) {
              Tensor src = make_tensor(make_gmem_ptr(row + get<1>(tKVcKV(0, m, k))), make_layout(shape(dst(_, m, k))));
              copy(gmem_copy_kv.with(row_ok && cols(k)), src, dst(_, m, k));
            }
          }
        } else {
          copy_rows_zero_fill(gmem_copy_kv, [&](int row) {  // (a row past the end: row 0's address)
            // A slice past the cache's end zero-fills: its first row's page must still be in the table.
            const int key = min(slice * kWarpKeys + row, seq.seqlen_k - 1);
            return head_base + int64_t(pages[key / params.page_size]) * s.batch +
                   int64_t(key % params.page_size) * s.row;
          }, dst, tKVcKV, cols, keys_left);
        }
      };
      gather(params.k, params.k_stride, col_ok, pick(stage, tKsK));
      gather(params.v, params.v_stride, col_ok_v, pick(stage, tVsV));
      return;
    }
    constexpr bool kCheck = decltype(check_rows)::value;
    copy_tile_zero_fill<kCheck>(gmem_copy_kv, tKgK(_, _, _, slice), pick(stage, tKsK), tKVcKV, col_ok, keys_left);
    copy_tile_zero_fill<kCheck>(gmem_copy_kv, tVgV(_, _, _, slice), pick(stage, tVsV), tKVcKV, col_ok_v, keys_left);
  };
  // Warp 0 copies the query rows (zero-filling those past the group's), as a commit group of its own.
  if (warp == 0) {
    copy_rows_zero_fill(gmem_copy, [&](int r) { return tile_rows.q_row(r); }, gmem_thr.partition_D(sQ), tQcQ,
                        col_ok_q, rows_left);
    cp_async_fence();
  }
  // Tiles n … n-(kStages-2), a commit group each (empty where there is no tile).
  int n = tile_end - 1;
  if (n >= tile_begin) load_slice(n, n % kStages, true_type{});
  cp_async_fence();
  CUTE_UNROLL
  for (int ahead = 1; ahead <= kStages - 2; ++ahead) {
    if (n - ahead >= tile_begin) load_slice(n - ahead, (n - ahead) % kStages, false_type{});
    cp_async_fence();
  }

  // FP8: the scores' factor (k_descale; with a bf16 query, times its row's factor below) and the output's.
  float k_factor = 1.f, v_factor = 1.f;  // (k_factor in each row's factor, in shared memory)
  if constexpr (kFp8) {
    const int hk = tile_rows.head_kv;
    if (params.k_descale) k_factor = params.k_descale[batch * params.k_descale_stride[0] + hk * params.k_descale_stride[1]];
    if (params.v_descale) v_factor = params.v_descale[batch * params.v_descale_stride[0] + hk * params.v_descale_stride[1]];
  }

  // The query rows (warp 0's oldest group) have landed: visible to every warp after the barrier.
  cp_async_wait<kStages - 1>();
  __syncthreads();
  // FP8: a bf16 query into fp16, each row scaled by a power of two (fp8_kv.h), a 16-byte piece a
  // thread; then Q's columns in the order of the keys' fragments, each 64-column block of a row.
  // Each row's scores take the factor row_factor[row] (after the query rows): k_factor, times the
  // power of two back for a bf16 query. (The 16- and 32-row tiles read it each step: in registers
  // the factors made the 32-row tile spill. A lane of the 8-row tile keeps its two rows'.)
  constexpr bool kBf16Query = kFp8 && !std::is_same_v<Element, cutlass::half_t>;
  float* row_factor = reinterpret_cast<float*>(smem + Config::kQTileBytes);
  if constexpr (kFp8 && !kBf16Query) {
    for (int row = tid; row < kRows; row += Config::kThreads) row_factor[row] = k_factor;
  }
  if constexpr (kBf16Query) {
    constexpr int kPieces = kHeadDim / 8;  // a row's pieces: lanes side by side in one warp
    static_assert((kRows * kPieces) % 32 == 0 && kPieces <= 32);
    for (int u = tid; u < kRows * kPieces; u += Config::kThreads) {  // whole warps in or out
      const int row = u / kPieces;
      uint4* piece = reinterpret_cast<uint4*>(&sQ(row, u % kPieces * 8));
      uint4 w = *piece;
      float max_abs = fmaxf(fmaxf(bf16x2_max_abs(w.x), bf16x2_max_abs(w.y)),
                            fmaxf(bf16x2_max_abs(w.z), bf16x2_max_abs(w.w)));
      CUTE_UNROLL
      for (int lanes = 1; lanes < kPieces; lanes *= 2) max_abs = fmaxf(max_abs, __shfl_xor_sync(0xffffffffu, max_abs, lanes));
      const int shift = fp16_row_shift(max_abs);
      const float scale = exact_exp2(shift);
      w = make_uint4(bf16x2_to_scaled_half2(w.x, scale), bf16x2_to_scaled_half2(w.y, scale),
                     bf16x2_to_scaled_half2(w.z, scale), bf16x2_to_scaled_half2(w.w, scale));
      *piece = w;
      if (u % kPieces == 0) row_factor[row] = k_factor * exact_exp2(-shift);
    }
    __syncthreads();
  }
  if constexpr (kFp8) {
    for (int u = tid; u < kRows * (kHeadDim / 64); u += Config::kThreads) {
      const int row = u / (kHeadDim / 64), block = u % (kHeadDim / 64);
      permute_query_block([&](int m) { return &sQ(row, 64 * block + 8 * m); });
    }
    __syncthreads();
  }
  // The start of every step on key tile n (in buffer `stage`): wait for this warp's slices of it,
  // and issue tile n-(kStages-1)'s into tile n+1's buffer, which this warp is done with.
  auto next_slices = [&](int n, int stage) {
    cp_async_wait<kStages - 2>();
    __syncwarp();
    if (n - (kStages - 1) >= tile_begin) {
      load_slice(n - (kStages - 1), stage + 1 == kStages ? 0 : stage + 1, false_type{});
    }
    cp_async_fence();
  };
  // The mainloop: step(n, masked, stage) on the key tiles from the last to the first, tile n in
  // buffer n % kStages. The tile may hold position 0, which sees the fewest keys, and the last
  // position, which a left bound hides the most keys from: the tiles of the first and third runs
  // of common/attention_mask.h are masked. Both `masked` and the buffer are run-time values, so
  // the step is compiled once: a decode call is short and runs between a model's other kernels,
  // which leave its code out of the caches, and a copy of the step for each buffer and mask (4–6)
  // made the kernel 148–235 KB of code, fetched anew at each call (docs/performance.md).
  const int first_masked = mask.first_masked_tile(0, kBlockN);
  const int left_masked = mask.left_masked_tiles(seq.seqlen_q, kBlockN);
  auto walk = [&](auto&& step) {
    for (; n >= tile_begin; --n) {
      const bool masked = n >= first_masked || n < left_masked;
      step(n, masked, n % kStages);
    }
  };
  // Merge: each warp's normalised output and lse into shared memory, over the K/V buffers (once
  // every warp is done reading them), then combined over the warps.
  float* merge_o = reinterpret_cast<float*>(smem + Config::kQBytes);  // [warp][row][kMergeStride]
  float* merge_lse = merge_o + kWarps * kRows * Config::kMergeStride;  // [warp][row]

  if constexpr (Config::kKeysOnM) {  // at most 8 rows, FP8 (decode_keys_on_m.h)
    using Tile = KeysOnM<kHeadDim, kWarpKeys>;
    Tile tile(lane);
    tile.load_query(sQk);
    const float row_factors[2] = {row_factor[2 * tile.t], row_factor[2 * tile.t + 1]};
    Tensor acc_o = make_tensor<float>(typename Tile::OutLayout{});
    clear(acc_o);
    OnlineSoftmax<2, 0, Tile::kRowLanes> softmax;
    const auto layout = typename Config::SmemLayoutKVIn{};
    walk([&](int n, bool masked, int stage) {
      next_slices(n, stage);
      Tensor scores = make_tensor<float>(typename Tile::ScoreLayout{});
      tile.scores(reinterpret_cast<const uint8_t*>(raw_pointer_cast(pick(stage, sK).data())), layout, scores);
      CUTE_UNROLL
      for (int i = 0; i < size(scores); ++i) scores.data()[i] *= row_factors[i % 2];
      if (params.softcap_scale != 0.f) softcap_scores(scores, params.softcap_scale);
      if (masked) {
        const int key0 = (n * kWarps + warp) * kWarpKeys;
        CUTE_UNROLL
        for (int i = 0; i < size(scores); ++i) {
          if (mask.hides(tile_rows.position_of(tile.row_of(i)), key0 + tile.key_of(i))) scores.data()[i] = -INFINITY;
        }
      }
      softmax.rescale_scores(scores, params.scale_log2);
      softmax.template rescale_output<true>(acc_o);
      tile.values(scores, reinterpret_cast<const uint8_t*>(raw_pointer_cast(pick(stage, sV).data())), layout, acc_o);
    });
    float row_lse[2];
    softmax.finalize(acc_o, params.scale, row_lse);
    cp_async_wait<0>();  // only empty groups can be left; no copy may land in the merge area
    __syncthreads();      // every warp is done reading its buffers
    CUTE_UNROLL
    for (int r = 0; r < 2; ++r) {  // the lane's D/8 consecutive values of rows 2t, 2t + 1
      float* dst = merge_o + (warp * kRows + tile.row_of(r)) * Config::kMergeStride;
      CUTE_UNROLL
      for (int i = 0; i < size(acc_o); i += 4) {
        *reinterpret_cast<float2*>(dst + tile.column_of(i)) = make_float2(acc_o.data()[i + r], acc_o.data()[i + 2 + r]);
      }
      if (tile.g == 0) merge_lse[warp * kRows + tile.row_of(r)] = row_lse[r];
    }
  } else {
    typename Config::TiledMma mma;
    auto thr_mma = mma.get_thread_slice(lane);
    typename Config::TiledMmaO mma_o;  // the same layouts (ElementPV: fp16 for an FP8 cache)
    auto thr_mma_o = mma_o.get_thread_slice(lane);
    Tensor tSrQ = thr_mma.partition_fragment_A(sQk);  // (MMA, MMA_M, MMA_K)
    Tensor tSrK = thr_mma.partition_fragment_B(sKg);
    Tensor tOrVt = thr_mma_o.partition_fragment_B(sVt);
    Tensor acc_o = partition_fragment_C(mma_o, QTile{});
    clear(acc_o);
    Tensor tScS = thr_mma.partition_C(make_identity_tensor(STile{}));

    auto smem_copy_q = make_tiled_copy_A(typename Config::SmemCopyAtom{}, mma);
    auto smem_thr_q = smem_copy_q.get_thread_slice(lane);
    Tensor tSsQ = smem_thr_q.partition_S(sQk);
    auto smem_copy_k = make_tiled_copy_B(typename Config::SmemCopyAtom{}, mma);
    auto smem_thr_k = smem_copy_k.get_thread_slice(lane);
    auto smem_copy_v = make_tiled_copy_B(typename Config::SmemCopyAtomTransposed{}, mma_o);
    auto smem_thr_v = smem_copy_v.get_thread_slice(lane);
    Tensor tSsK = smem_thr_k.partition_S(sKg);
    Tensor tOsVt = smem_thr_v.partition_S(sVt);
    // FP8: S = Q Kᵀ and O += P V of key tile n in buffer `stage`, their B fragments built from the
    // bytes (see the top). The identity partitions of lane 0 give each fragment's key (S) or output
    // column (O) less this lane's lane / 4, as compile-time constants.
    auto thr0 = mma.get_thread_slice(0);
    Tensor tSiK = thr0.partition_B(make_identity_tensor(Shape<Int<kWarpKeys>, Int<kHeadDim>>{}));   // (key, d)
    Tensor tOiV = mma_o.get_thread_slice(0).partition_B(make_identity_tensor(Shape<Int<kHeadDim>, Int<kWarpKeys>>{}));
    auto fp8_scores = [&](auto& acc_s, int stage) {
      const uint8_t* k8 = reinterpret_cast<const uint8_t*>(raw_pointer_cast(pick(stage, sK).data()));
      const auto layout = typename Config::SmemLayoutKVIn{};
      const int j = lane % 4, r = lane / 4;
      CUTE_UNROLL
      for (int b = 0; b < kHeadDim / 64; ++b) {
        CUTE_UNROLL
        for (int nu = 0; nu < size<1>(tSrK); ++nu) {
          const int key = get<0>(tSiK(0, nu, 0)) + r;
          const uint4 w = *reinterpret_cast<const uint4*>(k8 + layout(key, 64 * b + 16 * j));
          const uint32_t words[4] = {w.x, w.y, w.z, w.w};
          CUTE_UNROLL
          for (int c = 0; c < 4; ++c) {
            uint32_t* frag = reinterpret_cast<uint32_t*>(&tSrK(0, nu, 4 * b + c));
            frag[0] = e4m3x2_to_half2(words[c] & 0xFFFFu);
            frag[1] = e4m3x2_to_half2(words[c] >> 16);
          }
        }
        CUTE_UNROLL
        for (int c = 0; c < 4; ++c) {
          if constexpr (!Config::kQInRegisters) copy(smem_copy_q, tSsQ(_, _, 4 * b + c), smem_thr_q.retile_D(tSrQ)(_, _, 4 * b + c));
          gemm(mma, tSrQ(_, _, 4 * b + c), tSrK(_, _, 4 * b + c), acc_s);
        }
      }
    };
    auto fp8_values = [&](auto const& tOrP, int stage) {
      const uint8_t* v8 = reinterpret_cast<const uint8_t*>(raw_pointer_cast(pick(stage, sV).data()));
      const auto layout = typename Config::SmemLayoutKVIn{};
      const int j = lane % 4, r = lane / 4;
      CUTE_UNROLL
      for (int q = 0; q < kWarpKeys / 16; ++q) {
        const int key = 16 * q + 2 * j;  // and key + 1, key + 8, key + 9
        uint32_t w[kHeadDim / 32][4];
        CUTE_UNROLL
        for (int g = 0; g < kHeadDim / 32; ++g) {
          const int col = 32 * g + 4 * r;
          w[g][0] = *reinterpret_cast<const uint32_t*>(v8 + layout(key, col));
          w[g][1] = *reinterpret_cast<const uint32_t*>(v8 + layout(key + 1, col));
          w[g][2] = *reinterpret_cast<const uint32_t*>(v8 + layout(key + 8, col));
          w[g][3] = *reinterpret_cast<const uint32_t*>(v8 + layout(key + 9, col));
        }
        CUTE_UNROLL
        for (int nu = 0; nu < size<1>(tOrVt); ++nu) {
          const int tile = get<0>(tOiV(0, nu, 0)) / 8;  // the n8 tile: columns 32g + 4r + i
          const int g = tile / 4, i = tile % 4;
          const uint32_t select = i | ((4 + i) << 4);  // byte i of the first word, then of the second
          uint32_t* frag = reinterpret_cast<uint32_t*>(&tOrVt(0, nu, q));
          frag[0] = e4m3x2_to_half2(__byte_perm(w[g][0], w[g][1], select));
          frag[1] = e4m3x2_to_half2(__byte_perm(w[g][2], w[g][3], select));
        }
        gemm(mma_o, tOrP(_, _, q), tOrVt(_, _, q), acc_o);
      }
    };

    constexpr int kThreadRows = decltype(size<0>(rowcol_layout(acc_o.layout())))::value;
    if constexpr (Config::kQInRegisters) copy(smem_copy_q, tSsQ, smem_thr_q.retile_D(tSrQ));

    OnlineSoftmax<kThreadRows> softmax;

    // One step on key tile n, held in buffer `stage`.
    auto step = [&](int n, bool masked, int stage) {
      next_slices(n, stage);

      Tensor acc_s = partition_fragment_C(mma, STile{});
      clear(acc_s);
      if constexpr (kFp8) {
        fp8_scores(acc_s, stage);
        auto score_rows = rowcol_view(acc_s);
        CUTE_UNROLL
        for (int r = 0; r < kThreadRows; ++r) {
          const float factor = row_factor[get<0>(rowcol_view(tScS)(r, 0))];
          CUTE_UNROLL
          for (int c = 0; c < size<1>(score_rows); ++c) score_rows(r, c) *= factor;
        }
      } else if constexpr (Config::kQInRegisters) {
        gemm_regs_smem(acc_s, tSrQ, tSrK, smem_thr_k.retile_D(tSrK), pick(stage, tSsK), smem_copy_k, mma);
      } else {
        gemm_smem_smem(acc_s, tSrQ, smem_thr_q.retile_D(tSrQ), tSsQ, smem_copy_q, tSrK, smem_thr_k.retile_D(tSrK),
                       pick(stage, tSsK), smem_copy_k, mma);
      }
      // Soft-capping at run time: one instantiation serves every variant (common/softcap.h).
      if (params.softcap_scale != 0.f) softcap_scores(acc_s, params.softcap_scale);
      if (masked) {  // packed rows: each row's position, not its index
        const int key0 = (n * kWarps + warp) * kWarpKeys;
        CUTE_UNROLL
        for (int i = 0; i < size(acc_s); ++i) {
          if (mask.hides(tile_rows.position_of(get<0>(tScS(i))), key0 + get<1>(tScS(i)))) acc_s(i) = -INFINITY;
        }
      }
      auto out_rows = rowcol_view(acc_o);
      auto scores = rowcol_view(acc_s);
      // A masked slice may hide every key of a row (past the cache's end, or its diagonal).
      if constexpr (kFp8) {  // O's rescale behind a branch, not predicated (online_softmax.h)
        softmax.rescale_scores(scores, params.scale_log2);
        softmax.template rescale_output<true>(out_rows);
      } else {
        softmax.update(scores, out_rows, params.scale_log2);
      }

      Tensor probs = convert_fragment<ElementPV>(acc_s);
      Tensor tOrP = make_tensor(probs.data(), accumulator_as_a_operand(probs.layout()));
      if constexpr (kFp8) {
        fp8_values(tOrP, stage);
      } else {
        gemm_regs_smem(acc_o, tOrP, tOrVt, smem_thr_v.retile_D(tOrVt), pick(stage, tOsVt), smem_copy_v, mma_o);
      }
    };

    walk(step);

    float row_lse[kThreadRows];
    auto out_rows = rowcol_view(acc_o);
    softmax.finalize(out_rows, params.scale, row_lse);
    cp_async_wait<0>();  // only empty groups can be left; no copy may land in the merge area
    __syncthreads();      // every warp is done reading its buffers
    Tensor acc_coords = rowcol_view(thr_mma.partition_C(make_identity_tensor(QTile{})));
    CUTE_UNROLL
    for (int r = 0; r < kThreadRows; ++r) {
      const int row = get<0>(acc_coords(r, 0));
      float* dst = merge_o + (warp * kRows + row) * Config::kMergeStride;
      CUTE_UNROLL
      for (int c = 0; c < size<1>(out_rows); c += 2) {  // a thread's two adjacent columns: one 8-byte store
        const int col = get<1>(acc_coords(r, c));
        if constexpr (kFp8) {  // columns permuted (fp8_output_column)
          dst[fp8_output_column(col)] = out_rows(r, c);
          dst[fp8_output_column(col + 1)] = out_rows(r, c + 1);
        } else {
          *reinterpret_cast<float2*>(dst + col) = make_float2(out_rows(r, c), out_rows(r, c + 1));
        }
      }
      if (get<1>(acc_coords(r, 0)) == 0) merge_lse[warp * kRows + row] = row_lse[r];
    }
  }
  __syncthreads();

  // Each thread: 8 columns of a row, over the warps.
  constexpr int kChunks = kHeadDim / 8;
  const bool to_accum = params.num_splits > 1;
  for (int i = tid; i < kRows * kChunks; i += Config::kThreads) {
    const int row = i / kChunks, col = i % kChunks * 8;
    if (row >= rows_left || col >= params.head_dim_v) continue;
    // A sink joins here, as one more term without a value (a split's partial result leaves it to
    // the combine).
    const float sink = params.sinks != nullptr && !to_accum ? params.sinks[tile_rows.head_of(row)] : -INFINITY;
    float lse_max = sink;
    CUTE_UNROLL
    for (int w = 0; w < kWarps; ++w) lse_max = fmaxf(lse_max, merge_lse[w * kRows + row]);
    float sum = lse_max == -INFINITY ? 0.f : __expf(sink - lse_max);
    CUTE_UNROLL
    for (int w = 0; w < kWarps; ++w) sum += lse_max == -INFINITY ? 0.f : __expf(merge_lse[w * kRows + row] - lse_max);
    // exp(-inf) = 0: a warp that saw no key of the row weighs nothing; with none at all, all do.
    const float lse = lse_max == -INFINITY ? -INFINITY : lse_max + __logf(sum);
    float acc[8] = {};
    CUTE_UNROLL
    for (int w = 0; w < kWarps; ++w) {
      const float weight = lse == -INFINITY ? 0.f : __expf(merge_lse[w * kRows + row] - lse);
      const float4* src = reinterpret_cast<const float4*>(merge_o + (w * kRows + row) * Config::kMergeStride + col);
      const float4 a = src[0], b = src[1];
      acc[0] += weight * a.x; acc[1] += weight * a.y; acc[2] += weight * a.z; acc[3] += weight * a.w;
      acc[4] += weight * b.x; acc[5] += weight * b.y; acc[6] += weight * b.z; acc[7] += weight * b.w;
    }
    if constexpr (kFp8) {
      CUTE_UNROLL
      for (int c = 0; c < 8; ++c) acc[c] *= v_factor;
    }
    if (to_accum) {  // split-KV: this split's normalised output and lse, in fp32
      float4* dst = reinterpret_cast<float4*>(params.out_accum + tile_rows.accum_row(row) * params.head_dim_accum + col);
      dst[0] = make_float4(acc[0], acc[1], acc[2], acc[3]);
      dst[1] = make_float4(acc[4], acc[5], acc[6], acc[7]);
      if (col == 0) params.lse_accum[tile_rows.accum_row(row)] = lse;
    } else {
      alignas(16) Element out[8];
      CUTE_UNROLL
      for (int c = 0; c < 8; ++c) out[c] = Element(acc[c]);
      *reinterpret_cast<uint4*>(tile_rows.out_row(row) + col) = *reinterpret_cast<const uint4*>(out);
      if (col == 0) tile_rows.lse_at(row) = lse;
    }
  }
}

}  // namespace fa::sm80
