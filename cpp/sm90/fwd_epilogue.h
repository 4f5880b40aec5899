// The epilogue of the Hopper-family forward: the output tile and the row log-sum-exps.
//
// lse goes from registers straight to global memory (one lane per row). O is converted to
// fp16/bf16 (the FP8 forward's too), written to shared memory with stmatrix in the layout the TMA
// reads, and stored by TMA
// (rows past the query's end and columns past the head dim are clipped by the copy engine); in a
// variable-length batch, where the rows past a sequence's end belong to the next sequence, by the
// warpgroup's threads with 16-byte writes. Each
// consumer warpgroup stores its own 64 rows, synchronising only its own threads (the kEpilogue + w
// barrier), so neither waits for the other's last step. Where O is staged in Q's buffer, the
// producer may load the next Q only after both halves' stores have read it.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>

#include "common/sequence.h"
#include "fa/params.h"
#include "sm90/fragments.h"
#include "sm90/fwd_config.h"
#include "sm90/named_barriers.h"
#include "sm90/row_store.h"
#include "sm90/tile_scheduler.h"

namespace fa::sm90 {

template <class Config>
struct ForwardEpilogue {
  using Element = typename Config::ElementOut;
  static constexpr int kBlockM = Config::kBlockM;

  // O in the output's dtype: Element, or for the FP8 forward bf16 or fp16 (p.out_fp16) in
  // Element's 16-bit registers.
  template <class AccO>
  CUTE_DEVICE static auto output_fragment(const ForwardParams& p, AccO const& acc_o) {
    using namespace cute;
    if constexpr (Config::kFp8) {
      Tensor out = make_tensor<Element>(acc_o.layout());
      if (p.out_fp16) {
        out = convert_fragment<cutlass::half_t>(acc_o);
      } else {
        Tensor bf16 = convert_fragment<cutlass::bfloat16_t>(acc_o);
        CUTE_UNROLL
        for (int i = 0; i < size(out); ++i) out(i) = cutlass::half_t::bitcast(bf16(i).raw());
      }
      return out;
    } else {
      return convert_fragment<Element>(acc_o);
    }
  }

  // (row, column) within the tile of each accumulator element of this thread, as rows × columns.
  CUTE_DEVICE static auto output_coords(int mma_tid) {
    using namespace cute;
    typename Config::TiledMmaO mma_o;
    return rowcol_view(mma_o.get_thread_slice(mma_tid).partition_C(
        make_identity_tensor(typename Config::TileO{})));
  }

  template <int kRows>
  CUTE_DEVICE static void store_lse(const ForwardParams& p, const Sequence& seq, int mma_tid,
                                    const WorkTile& w, const float (&row_lse)[kRows]) {
    using namespace cute;
    auto coords = output_coords(mma_tid);
    static_assert(decltype(size<0>(coords))::value == kRows);
    if (get<1>(coords(0, 0)) != 0) return;  // the lane holding column 0 of its rows writes them
    const int rows_left = seq.seqlen_q - w.m_block * kBlockM;
    float* lse = p.lse + seq.lse_offset(p, w.batch, w.head) + w.m_block * kBlockM;
    CUTE_UNROLL
    for (int r = 0; r < kRows; ++r) {
      const int row = get<0>(coords(r, 0));
      if (row < rows_left) lse[row] = row_lse[r];
    }
  }

  template <class Params, class Storage, class AccO, int kRows>
  CUTE_DEVICE static void store(Params const& params, Storage& smem, int mma_tid, const WorkTile& w,
                                const Sequence& seq, AccO const& acc_o, const float (&row_lse)[kRows]) {
    using namespace cute;
    const ForwardParams& p = params.attn;
    store_lse(p, seq, mma_tid, w, row_lse);

    const int warpgroup = mma_tid / 128;
    const bool issuer = mma_tid % 128 == 0;  // the thread of this warpgroup that issues its stores
    Tensor sO = local_tile(
        make_tensor(make_smem_ptr(Config::output_buffer(smem)), typename Config::SmemLayoutO{}),
        typename Config::TileOWarpgroup{}, make_coord(warpgroup, _0{}));  // this warpgroup's rows
    if constexpr (!Config::kOutputAliasesQ) {
      // The previous tile's store must have read the buffer before it is written again.
      if (issuer) tma_store_wait<0>();
      barrier_sync(ForwardBarrier::kEpilogue, 128, warpgroup);
    }
    typename Config::TiledMmaOWarpgroup mma_o;
    Tensor rO = output_fragment(p, acc_o);
    auto copy_o = make_tiled_copy_C(Copy_Atom<SM90_U32x4_STSM_N, Element>{}, mma_o);
    auto thr_copy = copy_o.get_thread_slice(mma_tid % 128);
    copy(copy_o, thr_copy.retile_S(rO), thr_copy.partition_D(sO));
    // stmatrix writes through the generic proxy, the TMA store reads through the async proxy.
    cutlass::arch::fence_view_async_shared();
    barrier_sync(ForwardBarrier::kEpilogue, 128, warpgroup);
    if (p.cu_seqlens_q != nullptr) {
      // Varlen: the warpgroup's threads store its rows (row_store.h). The next write of the buffer
      // (the next tile's epilogue, or Q's load) comes after a barrier these threads reach once
      // their reads are done.
      const int first_row = w.m_block * kBlockM + warpgroup * 64;
      Element* out = static_cast<Element*>(p.out) + seq.q_offset(p.out_stride, w.batch, w.head) +
                     int64_t(first_row) * p.out_stride.row;
      store_rows<64, Config::kHeadDimV>(sO, out, p.out_stride.row, seq.seqlen_q - first_row,
                                        head_dim_v<Config>(p), mma_tid % 128, 128);
    } else if (issuer) {
      Tensor mO = params.tma_o.get_tma_tensor(make_shape(p.seqlen_q, head_dim_v<Config>(p), p.heads_q, p.batch));
      Tensor gO = local_tile(mO(_, _, w.head, w.batch), typename Config::TileOWarpgroup{},
                             make_coord(w.m_block * Config::kMmaWarpgroups + warpgroup, _0{}));
      auto [tOgO, tOsO] = tma_partition(params.tma_o, _0{}, Layout<_1>{}, group_modes<0, 2>(sO),
                                        group_modes<0, 2>(gO));
      copy(params.tma_o, tOsO, tOgO);
      tma_store_arrive();
      if constexpr (Config::kOutputAliasesQ) tma_store_wait<0>();
    }
    if constexpr (Config::kOutputAliasesQ) Config::release_query(smem, 0);  // one Q buffer
  }

  // A tile none of whose rows sees a key (causal with seqlen_q > seqlen_k): output 0, lse -inf,
  // written straight to global memory (rare; shared memory may hold the next tile's Q).
  template <int kRows>
  CUTE_DEVICE static void store_empty(const ForwardParams& p, const Sequence& seq, int mma_tid,
                                      const WorkTile& w) {
    using namespace cute;
    float row_lse[kRows];
    CUTE_UNROLL
    for (int r = 0; r < kRows; ++r) row_lse[r] = p.sinks != nullptr ? p.sinks[w.head] : -INFINITY;
    store_lse(p, seq, mma_tid, w, row_lse);
    auto coords = output_coords(mma_tid);
    const int rows_left = seq.seqlen_q - w.m_block * kBlockM;
    Element* out = static_cast<Element*>(p.out) + seq.q_offset(p.out_stride, w.batch, w.head) +
                   int64_t(w.m_block) * kBlockM * p.out_stride.row;
    CUTE_UNROLL
    for (int i = 0; i < size(coords); ++i) {
      const int row = get<0>(coords(i)), col = get<1>(coords(i));
      if (row < rows_left && col < head_dim_v<Config>(p)) out[row * p.out_stride.row + col] = Element(0.f);
    }
  }

  // Before the CTA exits: the last TMA stores must have read shared memory.
  CUTE_DEVICE static void finish(int mma_tid) {
    if (mma_tid % 128 == 0) cute::tma_store_wait<0>();
  }
};

}  // namespace fa::sm90
