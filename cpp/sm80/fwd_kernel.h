// The Ampere-family forward kernel: FlashAttention-2 on mma.sync, cp.async and ldmatrix.
//
// Algorithm. One CTA owns kBlockM query rows of one (batch, head). It walks the key tiles those
// rows can see from the last to the first (only the last few can need a mask, so the masked steps
// come first and the rest of the loop is mask-free), computes S = Q Kᵀ on the tensor cores, folds
// S into the online softmax (running row max and sum, in registers; soft-capped bf16 up to D = 128:
// a fixed reference, common/online_softmax.h), and accumulates O += P V with
// P converted to fp16/bf16 in registers. After the last tile O is divided by the row sums and
// written once; S and P never leave registers.
//
// Tile plan. kWarps warps stack along M: each owns 16-row slabs of the query tile and all keys of
// a step, so row statistics reduce within a quad of lanes. Shared memory holds Q (kBlockM × D) and
// kStages K and V tiles (kBlockN × D each), swizzled (fwd_config.h); Q and K fragments are read
// with ldmatrix, V with ldmatrix.trans.
//
// Pipeline and synchronisation. All threads issue cp.async for their 16-byte pieces of each tile
// (zero-filling the rows past the keys and the columns past the head dim). With one buffer each
// (kStages = 1), a step on key tile n:
//   wait K[n]; __syncthreads    K[n] visible to all; every warp is done reading V[n+1]
//   issue V[n]                  lands while S = Q K[n]ᵀ runs
//   S = Q K[n]ᵀ; mask
//   wait V[n]; __syncthreads    V[n] visible; every warp is done reading K[n]
//   issue K[n-1]                lands while the softmax and O += P V[n] run
//   online softmax; O += P V[n]
// so each tile's load overlaps one of the two GEMMs. With two buffers each (kStages = 2), tile n in
// buffer n % 2:
//   wait K[n], V[n]; __syncthreads    visible to all; every warp is done with step n+1's buffer
//   issue K[n-1], V[n-1]              into that buffer; they land while all of this step runs
//   S = Q K[n]ᵀ; mask; online softmax; O += P V[n]
// one barrier a step. With three (kStages = 3, the KV-cache tile), tile n in buffer n % 3:
//   wait K[n], V[n] (K[n-1], V[n-1] may still fly); __syncthreads
//   issue K[n-2], V[n-2]              into step n+1's buffer; they land during two steps
//   S = Q K[n]ᵀ; mask; online softmax; O += P V[n]
// one commit group a tile (empty past the last), so the wait counts stay exact. The output is staged through Q's shared memory (after a barrier that every
// warp reaches once its last S = Q Kᵀ is done) and stored with 16-byte writes.
#pragma once

#include <cute/tensor.hpp>

#include "common/attention_mask.h"
#include "common/grid_dependency.h"
#include "common/online_softmax.h"
#include "common/sequence.h"
#include "common/softcap.h"
#include "fa/params.h"
#include "sm80/decode_rows.h"
#include "sm80/fragments.h"
#include "sm80/gemm.h"
#include "sm80/tile_copy.h"

namespace fa::sm80 {

// kDecode: the KV-cache variant (fa.forward_kvcache): keys through a page table when
// params.page_table is set, split-KV (params.num_splits > 1: this CTA walks one share of the key
// tiles and writes fp32 partial results for common/split_kv.h to combine), and its mask (causal,
// window or none) entirely at run time, so it is instantiated with kCausal = true alone; so is its
// soft-capping (params.softcap_scale != 0), where the others have kSoftcap (common/softcap.h).
template <class Config, bool kCausal, bool kSoftcap, bool kDecode = false>
__global__ void __launch_bounds__(Config::kThreads)
    forward_kernel(const __grid_constant__ ForwardParams params) {
  using namespace cute;
  static_assert(kCausal || !kDecode, "the KV-cache variant's mask is read at run time: instantiate it causal");
  static_assert(!(kSoftcap && kDecode), "the KV-cache variant's soft-capping is read at run time");
  using Element = typename Config::Element;
  constexpr int kBlockM = Config::kBlockM;
  constexpr int kBlockN = Config::kBlockN;
  constexpr int kHeadDim = Config::kHeadDim;
  using QTile = Shape<Int<kBlockM>, Int<kHeadDim>>;
  using KVTile = Shape<Int<kBlockN>, Int<kHeadDim>>;
  using STile = Shape<Int<kBlockM>, Int<kBlockN>>;

  extern __shared__ __align__(128) char smem[];
  if constexpr (kDecode) allow_dependent_grid();  // split-KV's combine pass (common/split_kv.h)
  const int tid = threadIdx.x;
  // Causal tiles late in the sequence see the most keys: launch them first so they don't finish last.
  const int m_block = gridDim.x - 1 - blockIdx.x;
  const int group = params.heads_q / params.heads_kv;
  // kDecode: a CTA serves one kv head, and its rows are the group's query heads × positions (packed
  // row R: head head_kv · group + R / seqlen_q, position R % seqlen_q), so the whole group shares
  // each K/V tile load. Otherwise a CTA serves one query head's rows.
  const int head = kDecode ? 0 : blockIdx.y;
  const int head_kv = kDecode ? blockIdx.y : head / group;
  const int batch = kDecode ? blockIdx.z / params.num_splits : blockIdx.z;
  const int split = kDecode ? blockIdx.z % params.num_splits : 0;
  const int row_begin = m_block * kBlockM;
  const Sequence seq = Sequence::of(params, batch);
  // Rows of this tile inside the query (kDecode: inside the packed rows).
  const int rows_left = (kDecode ? group * seq.seqlen_q : seq.seqlen_q) - row_begin;
  const bool to_accum = kDecode && params.num_splits > 1;
  if (rows_left <= 0) return;  // varlen: the grid covers the longest sequence
  // kDecode: the packed rows' heads, positions and addresses (decode_rows.h).
  const DecodeRows<Element> rows{params, batch, head_kv, split, group, seq.seqlen_q, row_begin};

  const AttentionMask<kCausal> mask(seq.seqlen_q, seq.seqlen_k, params);
  // kDecode: a tile may hold every position, so it sees the keys from the first position's first
  // to the last one's last.
  const int row_end = kDecode ? seq.seqlen_q : min(row_begin + kBlockM, seq.seqlen_q);
  const int window_begin = mask.first_visible_tile(kDecode ? 0 : row_begin, kBlockN);
  const int window_end = mask.visible_tiles(row_end, kBlockN);
  const int n_tiles = max(0, window_end - window_begin);
  // This CTA's key tiles [tile_begin, tile_end): all of them, or its split's share.
  int tile_begin = window_begin, tile_end = window_begin + n_tiles;
  if constexpr (kDecode) {
    const int per_split = (n_tiles + params.num_splits - 1) / params.num_splits;
    tile_begin = window_begin + min(n_tiles, split * per_split);
    tile_end = min(window_begin + n_tiles, tile_begin + per_split);
  }
  // Sinks (a split's partial result leaves them to the combine): each row's head's logit.
  auto sink_of_row = [&](int r) {
    if (params.sinks == nullptr || to_accum) return -INFINITY;
    return params.sinks[kDecode ? rows.head_of(r) : head];
  };
  auto q_row = [&](int r) { return rows.q_row(r); };
  auto out_row = [&](int r) { return rows.out_row(r); };

  auto rows_of = [&](const void* base, int64_t offset, Strides s, int rows) {
    return make_tensor(make_gmem_ptr(static_cast<const Element*>(base) + offset),
                       make_shape(rows, Int<kHeadDim>{}), make_stride(s.row, _1{}));
  };
  Tensor gQ = local_tile(rows_of(params.q, seq.q_offset(params.q_stride, batch, head), params.q_stride, seq.seqlen_q),
                         QTile{}, make_coord(m_block, 0));
  Tensor gK = local_tile(rows_of(params.k, seq.k_offset(params.k_stride, batch, head_kv), params.k_stride, seq.seqlen_k),
                         KVTile{}, make_coord(_, 0));  // (kBlockN, kHeadDim, key tiles)
  Tensor gV = local_tile(rows_of(params.v, seq.k_offset(params.v_stride, batch, head_kv), params.v_stride, seq.seqlen_k),
                         KVTile{}, make_coord(_, 0));
  // The output tile and its copy are built where they are used (the early exit and the epilogue),
  // so their 64-bit addresses are not held in registers across the mainloop.
  auto output_tile = [&]() {
    Tensor mO = make_tensor(make_gmem_ptr(static_cast<Element*>(params.out) +
                                          seq.q_offset(params.out_stride, batch, head)),
                            make_shape(seq.seqlen_q, Int<kHeadDim>{}),
                            make_stride(params.out_stride.row, _1{}));
    return local_tile(mO, QTile{}, make_coord(m_block, 0));
  };
  auto lse_rows = [&]() {
    return params.lse + seq.lse_offset(params, batch, head) + row_begin;
  };
  typename Config::GmemCopyO gmem_copy_o;
  auto gmem_thr_o = gmem_copy_o.get_thread_slice(tid);
  Tensor tOcO = gmem_thr_o.partition_D(make_identity_tensor(QTile{}));
  const auto col_ok = column_predicates(tOcO, params.head_dim);
  // v's and the output's columns: a KV-cache call's v may have a head dim apart from q's and k's
  // (the tile holds both); the dense forward's calls have one.
  const auto col_ok_v = column_predicates(tOcO, kDecode ? params.head_dim_v : params.head_dim);

  if (to_accum && tile_begin == tile_end) {  // no key tile in this split: partial output 0, lse -inf
    for (int r = tid; r < min(kBlockM, rows_left); r += Config::kThreads) {
      params.lse_accum[rows.accum_row(r)] = -INFINITY;
      float* out = params.out_accum + rows.accum_row(r) * params.head_dim_accum;
      for (int c = 0; c < params.head_dim_v; ++c) out[c] = 0.f;
    }
    return;
  }
  if (n_tiles == 0) {  // no row of this tile sees a key: output 0, lse -inf
    Tensor zeros = make_tensor<Element>(shape(tOcO));
    clear(zeros);
    if constexpr (kDecode) {
      store_rows_predicated(gmem_copy_o, zeros, out_row, tOcO, col_ok_v, rows_left);
      for (int r = tid; r < min(kBlockM, rows_left); r += Config::kThreads) rows.lse_at(r) = sink_of_row(r);
    } else {
      store_tile_predicated(gmem_copy_o, zeros, gmem_thr_o.partition_D(output_tile()), tOcO, col_ok,
                            rows_left);
      float* lse = lse_rows();
      for (int r = tid; r < min(kBlockM, rows_left); r += Config::kThreads) lse[r] = sink_of_row(r);
    }
    return;
  }

  // Shared memory: Q, then kStages K buffers, then kStages V buffers. Key tile n lives in buffer
  // n % kStages; the buffer index reaches the code below as a compile-time constant, so every
  // shared-memory address is a register plus an immediate.
  constexpr int kStages = Config::kStages;
  constexpr int kKVElems = decltype(cosize(typename Config::SmemLayoutKV{}))::value;
  Tensor sQ = make_tensor(make_smem_ptr(reinterpret_cast<Element*>(smem)), typename Config::SmemLayoutQ{});
  auto sK_at = [&](auto stage) {
    return make_tensor(sQ.data() + size(sQ) + stage * kKVElems, typename Config::SmemLayoutKV{});
  };
  auto sV_at = [&](auto stage) {
    return make_tensor(sQ.data() + size(sQ) + (kStages + stage) * kKVElems, typename Config::SmemLayoutKV{});
  };
  auto sVt_at = [&](auto stage) {
    return make_tensor(sV_at(stage).data(), typename Config::SmemLayoutVt{});
  };
  Tensor sK = sK_at(_0{});    // buffer 0, for the shapes of the register fragments
  Tensor sVt = sVt_at(_0{});

  typename Config::GmemCopyQKV gmem_copy;
  auto gmem_thr = gmem_copy.get_thread_slice(tid);
  Tensor tQgQ = gmem_thr.partition_S(gQ);
  Tensor tQsQ = gmem_thr.partition_D(sQ);
  Tensor tKgK = gmem_thr.partition_S(gK);  // (CPY, CPY_N, CPY_K, key tiles)
  Tensor tVgV = gmem_thr.partition_S(gV);
  Tensor tQcQ = gmem_thr.partition_S(make_identity_tensor(QTile{}));
  Tensor tKVcKV = gmem_thr.partition_S(make_identity_tensor(KVTile{}));
  static_assert(decltype(size<2>(tKVcKV))::value == decltype(size<2>(tOcO))::value);

  typename Config::TiledMma mma;
  auto thr_mma = mma.get_thread_slice(tid);
  Tensor tSrQ = thr_mma.partition_fragment_A(sQ);   // (MMA, MMA_M, MMA_K)
  Tensor tSrK = thr_mma.partition_fragment_B(sK);   // (MMA, MMA_N, MMA_K)
  Tensor tOrVt = thr_mma.partition_fragment_B(sVt);
  Tensor acc_o = partition_fragment_C(mma, QTile{});  // (MMA, MMA_M, MMA_K)
  clear(acc_o);
  Tensor tScS = thr_mma.partition_C(make_identity_tensor(STile{}));  // (row, key) of each score

  auto smem_copy_q = make_tiled_copy_A(typename Config::SmemCopyAtom{}, mma);
  auto smem_thr_q = smem_copy_q.get_thread_slice(tid);
  Tensor tSsQ = smem_thr_q.partition_S(sQ);
  auto smem_copy_k = make_tiled_copy_B(typename Config::SmemCopyAtom{}, mma);
  auto smem_thr_k = smem_copy_k.get_thread_slice(tid);
  auto smem_copy_v = make_tiled_copy_B(typename Config::SmemCopyAtomTransposed{}, mma);
  auto smem_thr_v = smem_copy_v.get_thread_slice(tid);

  // The copies' views of each buffer, by buffer index (a compile-time constant).
  Tensor tKsK = gmem_thr.partition_D(sK_at(_0{}));  // buffer 0's; buffer b's lies kKVElems · b further
  Tensor tVsV = gmem_thr.partition_D(sV_at(_0{}));
  Tensor tSsK = smem_thr_k.partition_S(sK_at(_0{}));
  Tensor tOsVt = smem_thr_v.partition_S(sVt_at(_0{}));
  // A view of buffer `stage` (a compile-time constant: an immediate offset). The offset is a whole
  // number of swizzle periods, so the swizzled layout holds in every buffer.
  auto pick = [](auto stage, auto const& buffer0) {
    return make_tensor(buffer0.data() + decltype(stage)::value * kKVElems, buffer0.layout());
  };
  // Tile n's K (or V) into its buffer, its columns where `cols` holds; only the last tile (loaded
  // first) can be partial. A paged cache's rows are gathered through the page table, row by row.
  auto load_tile = [&](auto const& tXgX, auto const& cols, auto&& tXsX, int n, auto check_rows) {
    if constexpr (kDecode) {
      if (params.page_table != nullptr) {
        const bool is_k = &tXgX == &tKgK;  // which of the two tensors; resolved where it is inlined
        const Strides& s = is_k ? params.k_stride : params.v_stride;
        const Element* base = static_cast<const Element*>(is_k ? params.k : params.v) + head_kv * s.head;
        const int* pages = params.page_table + batch * params.page_table_stride;
        copy_rows_zero_fill(gmem_copy, [&](int row) {
          const int key = n * kBlockN + row;
          return base + int64_t(pages[key / params.page_size]) * s.batch + int64_t(key % params.page_size) * s.row;
        }, tXsX, tKVcKV, cols, seq.seqlen_k - n * kBlockN);
        return;
      }
    }
    copy_tile_zero_fill<decltype(check_rows)::value>(gmem_copy, tXgX(_, _, _, n), tXsX,
                                                     tKVcKV, cols, seq.seqlen_k - n * kBlockN);
  };

  // Calls fn with the buffer of key tile n (n % kStages) as a compile-time constant.
  auto in_buffer_of = [](int n, auto&& fn) {
    if constexpr (kStages == 1) {
      fn(_0{});
    } else {
      const int buffer = n % kStages;
      if (kStages > 3 && buffer == 3) fn(Int<(kStages > 3 ? 3 : 0)>{});
      else if (kStages > 2 && buffer == 2) fn(Int<(kStages > 2 ? 2 : 0)>{});
      else if (buffer == 1) fn(_1{});
      else fn(_0{});
    }
  };

  int n = tile_end - 1;
  if constexpr (kDecode) {
    copy_rows_zero_fill(gmem_copy, q_row, tQsQ, tQcQ, col_ok, rows_left);
  } else {
    copy_tile_zero_fill<true>(gmem_copy, tQgQ, tQsQ, tQcQ, col_ok, rows_left);
  }
  in_buffer_of(n, [&](auto stage) {
    load_tile(tKgK, col_ok, pick(stage, tKsK), n, true_type{});
    if constexpr (kStages >= 2) load_tile(tVgV, col_ok_v, pick(stage, tVsV), n, true_type{});
  });
  cp_async_fence();
  if constexpr (kStages >= 3) {  // and tiles n-1 … n-(kStages-2): kStages-1 tiles in flight from here on
    CUTE_UNROLL
    for (int ahead = 1; ahead <= kStages - 2; ++ahead) {
      if (n - ahead >= tile_begin) {
        in_buffer_of(n - ahead, [&](auto stage) {
          load_tile(tKgK, col_ok, pick(stage, tKsK), n - ahead, false_type{});
          load_tile(tVgV, col_ok_v, pick(stage, tVsV), n - ahead, false_type{});
        });
      }
      cp_async_fence();  // one commit group per tile, empty or not, so that step n can wait for its own
    }
  }

  OnlineSoftmax<decltype(size<0>(rowcol_layout(acc_o.layout())))::value> softmax;

  // One step on key tile n, held in buffer `stage`; `fixed`: the softmax holds a fixed reference.
  auto step = [&](int n, auto masked, auto stage, auto fixed) __attribute__((always_inline)) {
    constexpr bool kMasked = decltype(masked)::value;
    Tensor acc_s = partition_fragment_C(mma, STile{});
    clear(acc_s);
    if constexpr (kStages >= 3) {
      cp_async_wait<kStages - 2>();  // tile n; tiles n-1 … n-(kStages-2) may still be in flight
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    if constexpr (kStages == 1) {
      load_tile(tVgV, col_ok_v, pick(stage, tVsV), n, masked);  // lands while S = Q K[n]ᵀ runs
      cp_async_fence();
    } else if constexpr (kStages >= 3) {  // tile n-(kStages-1), into tile n+1's buffer
      if (n - (kStages - 1) >= tile_begin) {
        using Next = Int<(decltype(stage)::value + 1) % kStages>;
        load_tile(tKgK, col_ok, pick(Next{}, tKsK), n - (kStages - 1), false_type{});
        load_tile(tVgV, col_ok_v, pick(Next{}, tVsV), n - (kStages - 1), false_type{});
      }
      cp_async_fence();
    } else if (n > tile_begin) {  // tile n-1 lands while this whole step runs
      constexpr int kNext = 1 - decltype(stage)::value;
      load_tile(tKgK, col_ok, pick(Int<kNext>{}, tKsK), n - 1, false_type{});
      load_tile(tVgV, col_ok_v, pick(Int<kNext>{}, tVsV), n - 1, false_type{});
      cp_async_fence();
    }

    gemm_smem_smem(acc_s, tSrQ, smem_thr_q.retile_D(tSrQ), tSsQ, smem_copy_q,
                   tSrK, smem_thr_k.retile_D(tSrK), pick(stage, tSsK), smem_copy_k, mma);
    if (kSoftcap || (kDecode && params.softcap_scale != 0.f)) softcap_scores(acc_s, params.softcap_scale);
    if constexpr (kMasked && kDecode) {  // packed rows: each row's position, not its index
      CUTE_UNROLL
      for (int i = 0; i < size(acc_s); ++i) {
        if (mask.hides(rows.position_of(get<0>(tScS(i))), n * kBlockN + get<1>(tScS(i)))) acc_s(i) = -INFINITY;
      }
    } else if constexpr (kMasked) {
      mask.apply(acc_s, tScS, row_begin, n * kBlockN);
    }

    if constexpr (kStages == 1) {
      cp_async_wait<0>();
      __syncthreads();
      if (n > tile_begin) {
        // lands while the softmax and O += P V run
        load_tile(tKgK, col_ok, pick(stage, tKsK), n - 1, false_type{});
        cp_async_fence();
      }
    }

    auto scores = rowcol_view(acc_s);
    auto out_rows = rowcol_view(acc_o);
    if constexpr (!decltype(fixed)::value) {
      softmax.update(scores, out_rows, params.scale_log2);
    } else if constexpr (kMasked) {
      softmax.settle_scores(scores, params.scale_log2);
    } else {
      softmax.floor_scores(scores, params.scale_log2);
    }

    Tensor probs = convert_fragment<Element>(acc_s);
    Tensor tOrP = make_tensor(probs.data(), accumulator_as_a_operand(probs.layout()));
    gemm_regs_smem(acc_o, tOrP, tOrVt, smem_thr_v.retile_D(tOrVt), pick(stage, tOsVt),
                   smem_copy_v, mma);
  };

  // kDecode: the tile may hold position 0, which sees the fewest keys, and its last position, which
  // a left bound hides the most keys from. The three runs of common/attention_mask.h.
  const int first_masked = mask.first_masked_tile(kDecode ? 0 : row_begin, kBlockN);
  const int left_masked = mask.left_masked_tiles(row_end, kBlockN);
  auto walk = [&](auto fixed) __attribute__((always_inline)) {
    for (; n >= max(first_masked, tile_begin); --n) in_buffer_of(n, [&](auto stage) { step(n, true_type{}, stage, fixed); });
    for (; n >= max(left_masked, tile_begin); --n) in_buffer_of(n, [&](auto stage) { step(n, false_type{}, stage, fixed); });
    for (; n >= tile_begin; --n) in_buffer_of(n, [&](auto stage) { step(n, true_type{}, stage, fixed); });
  };
  // Soft-capped bf16 up to D = 128 with a cap up to 63.7: no running max (common/online_softmax.h).
  if constexpr (kSoftcap && kHoldsFixedReference<Element, kHeadDim>) {
    softmax.walk_with_reference(params.scale_log2, walk);
  } else {
    walk(false_type{});
  }
  // With one barrier a step, another warp may still be reading Q in the last step's S = Q Kᵀ.
  if constexpr (kStages >= 2) __syncthreads();

  // Epilogue: normalise, write lse, stage O through shared memory, store it with 16-byte writes.
  constexpr int kRows = decltype(size<0>(rowcol_layout(acc_o.layout())))::value;
  float row_lse[kRows];
  auto out_rows = rowcol_view(acc_o);
  Tensor acc_coords = rowcol_view(thr_mma.partition_C(make_identity_tensor(QTile{})));
  float row_sinks[kRows];
  CUTE_UNROLL
  for (int r = 0; r < kRows; ++r) row_sinks[r] = sink_of_row(min(get<0>(acc_coords(r, 0)), rows_left - 1));
  softmax.finalize(out_rows, params.scale, row_lse, row_sinks);

  if (to_accum) {  // split-KV: this split's normalised output and lse, in fp32
    CUTE_UNROLL
    for (int r = 0; r < kRows; ++r) {
      const int row = get<0>(acc_coords(r, 0));
      if (row >= rows_left) continue;
      if (get<1>(acc_coords(r, 0)) == 0) params.lse_accum[rows.accum_row(row)] = row_lse[r];
      float* out = params.out_accum + rows.accum_row(row) * params.head_dim_accum;
      CUTE_UNROLL
      for (int c = 0; c < size<1>(out_rows); ++c) {
        const int col = get<1>(acc_coords(r, c));
        if (col < params.head_dim_v) out[col] = out_rows(r, c);
      }
    }
    return;
  }
  if (get<1>(acc_coords(0, 0)) == 0) {  // the lane holding column 0 of its rows
    if constexpr (kDecode) {
      CUTE_UNROLL
      for (int r = 0; r < kRows; ++r) {
        const int row = get<0>(acc_coords(r, 0));
        if (row < rows_left) rows.lse_at(row) = row_lse[r];
      }
    } else {
      float* lse = lse_rows();
      CUTE_UNROLL
      for (int r = 0; r < kRows; ++r) {
        const int row = get<0>(acc_coords(r, 0));
        if (row < rows_left) lse[row] = row_lse[r];
      }
    }
  }

  Tensor rO = convert_fragment<Element>(acc_o);
  Tensor sO = make_tensor(sQ.data(), typename Config::SmemLayoutO{});
  auto smem_copy_o = make_tiled_copy_C(typename Config::SmemCopyAtomO{}, mma);
  auto smem_thr_o = smem_copy_o.get_thread_slice(tid);
  copy(smem_copy_o, smem_thr_o.retile_S(rO), smem_thr_o.partition_D(sO));
  __syncthreads();

  Tensor tOrO = make_tensor<Element>(shape(tOcO));
  copy(gmem_copy_o, gmem_thr_o.partition_S(sO), tOrO);
  if constexpr (kDecode) {
    store_rows_predicated(gmem_copy_o, tOrO, out_row, tOcO, col_ok_v, rows_left);
  } else {
    store_tile_predicated(gmem_copy_o, tOrO, gmem_thr_o.partition_D(output_tile()), tOcO, col_ok,
                          rows_left);
  }
}

}  // namespace fa::sm80
