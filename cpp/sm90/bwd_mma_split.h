// The consumers of the Hopper-family backward above head dim 128 (Config::kSplitHeadDim): a CTA
// owns kBlockN keys (80; 96 at D = 192); per step of 64 queries each consumer warpgroup
//   issues S = Q Kᵀ for its half of them (wgmma N = kBlockN / 2, both operands in shared memory),
//   adds the step before's last dQ slice to the workspace under it, then issues dP = dO Vᵀ (the
//   same shape);
//   P = exp2(S·scale·log2e - lse·log2e), dS = P ∘ (dP - delta), converted, to shared memory as Pᵀ
//   and dSᵀ (keys × queries: stmatrix .trans), buffer t % 2;
//   after both warpgroups' (kdSFull), issues dVᵀ += dOᵀ P, dQ's first slice, dKᵀ += Qᵀ dS (its
//   128 rows of the head dim, all the keys);
//   once dV is done, releases dO (one buffer: the producer loads the next step's while the rest
//   of this one runs); once the slice is done, adds it to the workspace from registers (16-byte
//   reductions); then the next slice (behind dK), kept for the next step; then releases Q.
// Why this tile (80 or 96 keys rather than 64), and what it costs, in bwd_config.h and docs/tried.md.
// At D = 192 (v's head dim 128) warpgroup 0 computes dQ's slices 0 and 2 and warpgroup 1 slice 1
// and dKᵀ's last 64 rows (kAsymmetric, bwd_config.h): each adds its first slice within the step
// (warpgroup 1: none) and its last in the next one.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/pipeline/sm90_pipeline.hpp>

#include "common/attention_mask.h"
#include "common/dq_claims.h"
#include "common/fragment_convert.h"
#include "common/sequence.h"
#include "common/softcap.h"
#include "fa/params.h"
#include "sm90/bwd_epilogue.h"
#include "sm90/bwd_load.h"
#include "sm90/fragments.h"
#include "sm90/named_barriers.h"
#include "sm90/wgmma.h"

namespace fa::sm90 {

// Slice s of the N mode of a wgmma operand or accumulator partition (MMA, MMA_N, ...) split into
// kSlices: the same tensor with that mode of size MMA_N / kSlices.
template <int kSlices, class Tensor>
CUTE_HOST_DEVICE auto n_slice(Tensor&& t, int s) {
  using namespace cute;
  return logical_divide(t, Shape<Underscore, Int<kSlices>>{})(_, make_coord(s, _), _);
}

// 16 bytes added to global memory at base + kOffsetBytes (an immediate of the instruction). No
// memory clobber: nothing else in the kernel reads or writes the dQ workspace (the post-pass reads
// it after the kernel).
template <int kOffsetBytes>
CUTE_DEVICE void red_add_f32x4(float* base, float a, float b, float c, float d) {
  asm volatile("red.relaxed.gpu.global.add.v4.f32 [%0+%5], {%1, %2, %3, %4};"
               :: "l"(base), "f"(a), "f"(b), "f"(c), "f"(d), "n"(kOffsetBytes));
}

// The same, or where `store` a store of the 16 bytes (the first addition to a tile in the
// deterministic order, common/dq_claims.h): one of two predicated instructions, no branch.
template <int kOffsetBytes>
CUTE_DEVICE void red_or_store_f32x4(float* base, bool store, float a, float b, float c, float d) {
  asm volatile(
      "{\n .reg .pred s;\n setp.ne.b32 s, %6, 0;\n"
      " @s st.global.v4.f32 [%0+%5], {%1, %2, %3, %4};\n"
      " @!s red.relaxed.gpu.global.add.v4.f32 [%0+%5], {%1, %2, %3, %4};\n}"
      :: "l"(base), "f"(a), "f"(b), "f"(c), "f"(d), "n"(kOffsetBytes), "r"(int(store)));
}

// Gives every register of a fragment a new, unspecified value (an empty asm that only writes them):
// the old values are dead from their last real use on, although the fragment is used again.
template <class Tensor>
CUTE_DEVICE void forget_values(Tensor& t) {
  CUTE_UNROLL
  for (int i = 0; i < cute::size(t); ++i) asm volatile("" : "=f"(t(i)));
}

// kDeterministic: BackwardParams::deterministic, as two instances of this loop that the kernel
// chooses between at run time (with the turns' branches inside one loop, the default backward's
// schedule moved and its causal rows ran 1.2-1.4% slower: docs/tried.md).
template <class Config, bool kCausal, bool kSoftcap, bool kDeterministic, class Params, class Storage, class Handoff>
CUTE_DEVICE void backward_mma_split(Params const& params, Storage& smem, typename Config::Pipeline& pipeline_q,
                                    typename Config::PipelinedO& pipeline_do, Handoff const& handoff) {
  static_assert(Config::kSplitHeadDim && Config::kdQFromRegisters);
  using namespace cute;
  using Element = typename Config::Element;
  constexpr int kBlockM = Config::kBlockM;
  constexpr int kBlockN = Config::kBlockN;
  constexpr int kSlices = Config::kdQSlices;
  static_assert(kSlices >= 2, "the first slice is added within its step, the last in the next one");
  const BackwardParams& p = params.attn;
  const int mma_tid = threadIdx.x - 128;

  const BackwardSmemTensors<Config> sm(smem);
  // Pᵀ (keys × queries, two buffers, as dSᵀ), and the same bytes seen as P.
  Tensor sPt = make_tensor(make_smem_ptr(smem.pt.data()), typename Config::SmemLayoutdSt{});
  Tensor sP = make_tensor(make_smem_ptr(smem.pt.data()), typename Config::SmemLayoutdS{});

  // S = Q Kᵀ and dP = dO Vᵀ.
  typename Config::TiledMmaSdP mma_sdp;
  auto thr_sdp = mma_sdp.get_thread_slice(mma_tid);
  auto wg_sdp = warpgroup_slice(mma_sdp, /*first_warpgroup=*/1);
  Tensor tSrQ = wg_sdp.partition_fragment_A(sm.q);    // (MMA, MMA_M, MMA_K, stages)
  Tensor tSrK = wg_sdp.partition_fragment_B(sm.k);    // (MMA, MMA_N, MMA_K)
  Tensor tdPrdO = wg_sdp.partition_fragment_A(sm.dout);
  Tensor tdPrV = wg_sdp.partition_fragment_B(sm.v);
  Tensor tScS = thr_sdp.partition_C(make_identity_tensor(typename Config::TileS{}));  // (query, key)
  auto score_coords = rowcol_view(tScS);
  constexpr int kRows = decltype(size<0>(score_coords))::value;  // query rows of this thread
  // dVᵀ += dOᵀ P and dKᵀ += Qᵀ dS (its lead rows; the tail's below).
  typename Config::TiledMmadKV mma_dkv;
  auto wg_dkv = warpgroup_slice(mma_dkv, 1);
  Tensor tdVrdOt = wg_dkv.partition_fragment_A(sm.doutt);  // (MMA, MMA_M, MMA_K, stages)
  Tensor tdVrPt = wg_dkv.partition_fragment_B(sPt);    // (MMA, MMA_N, MMA_K, 2 buffers)
  // kAsymmetric (D = 192, Config::kdQAsymmetric): warpgroup 1 also computes dKᵀ's tail rows (Qᵀ's
  // last 64, all keys), and the warpgroups share dQ's three slices out (0 and 2, and 1).
  constexpr bool kAsymmetric = Config::kdQAsymmetric;
  const int wg = cutlass::canonical_warp_group_idx() - 1;  // consumer warpgroup 0 or 1 (warp-uniform)
  auto qt_lead = [&] {
    if constexpr (kAsymmetric) return make_tensor(make_smem_ptr(smem.q.data()), typename Config::SmemLayoutQtLead{});
    else return sm.qt;
  }();
  Tensor tdKrQt = wg_dkv.partition_fragment_A(qt_lead);
  Tensor tdKrdSt = wg_dkv.partition_fragment_B(sm.dst);
  typename Config::TiledMmadKTail mma_dk_tail;
  auto wg_dk_tail = mma_dk_tail.get_slice(0);  // one warpgroup's TiledMma
  Tensor tdKrQtTail = wg_dk_tail.partition_fragment_A(
      make_tensor(make_smem_ptr(smem.q.data() + Config::kQTailOffset), typename Config::SmemLayoutQtTail{}));
  Tensor tdKrdStTail = wg_dk_tail.partition_fragment_B(sm.dst);
  // dQ = dS K, slice by slice of the head dim: the first (dq_first) within the step, the last
  // (dq_last) in the next one.
  typename Config::TiledMmadQ mma_dq;
  auto wg_dq = kAsymmetric ? mma_dq.get_slice(0) : warpgroup_slice(mma_dq, 1);
  Tensor tdQrdS = wg_dq.partition_fragment_A(sm.ds);     // (MMA, MMA_M, MMA_K, 2 buffers)
  Tensor tdQrKt = wg_dq.partition_fragment_B(sm.kt);     // (MMA, kSlices, MMA_K)
  static_assert(decltype(size<1>(tdQrKt))::value == kSlices);
  const int dq_first = kAsymmetric ? wg : 0;
  const int dq_last = kAsymmetric ? 2 - wg : kSlices - 1;
  const int dq_tid = kAsymmetric ? mma_tid % 128 : mma_tid;  // the thread of TiledMmadQ
  // P and dS: registers -> shared memory, transposed (each 8 × 8 block by stmatrix .trans).
  auto copy_pds = make_tiled_copy_C(Copy_Atom<SM90_U16x4_STSM_T, Element>{}, mma_sdp);
  auto thr_copy_pds = copy_pds.get_thread_slice(mma_tid);
  Tensor tPsP = thr_copy_pds.partition_D(sP);          // (CPY, CPY_M, CPY_N, 2 buffers)
  Tensor tdSsdS = thr_copy_pds.partition_D(sm.ds);

  // dQ's slice s added to its workspace tile in the layout of Config::dq_staging_offset (the slices
  // are the N repeats of the whole tile's accumulator, which the post-pass reads): one address a
  // thread and slice, the vectors at immediate offsets from it.
  // store: the tile's first addition in the deterministic order (common/dq_claims.h).
  auto add_dq = [&](float* dq_tile, int s, auto const& acc_dq, bool store) {
    constexpr int kVectors = decltype(size(acc_dq))::value / 4;
    float* first = dq_tile + Config::dq_staging_offset(dq_tid, s * size(acc_dq));
    for_each(make_int_sequence<kVectors>{}, [&](auto v) {
      constexpr int i = decltype(v)::value * 4;
      // The vector's offset from the slice's first, the same for every thread (and every slice).
      constexpr int kOffset = Config::dq_staging_offset(0, i) - Config::dq_staging_offset(0, 0);
      static_assert(kOffset == Config::dq_staging_offset(Config::kMmaThreads - 1, i) -
                                   Config::dq_staging_offset(Config::kMmaThreads - 1, 0));
      red_or_store_f32x4<kOffset * int(sizeof(float))>(first, store, acc_dq(i), acc_dq(i + 1), acc_dq(i + 2),
                                                       acc_dq(i + 3));
    });
  };
  // Deterministic (common/dq_claims.h): the turn keeper (warp 1, bwd_load.h) says when a step's dQ
  // tile is this key tile's turn (kTurnReady), and passes the turn on once every consumer thread
  // has arrived at kTurnDone after its additions (an asm statement, as the additions are: the
  // compiler keeps their order).
  constexpr int kKeeperThreads = BackwardTurnKeeper<Config, kCausal>::kBarrierThreads;

  typename Config::Pipeline::PipelineState q_state;   // run on from one key tile to the next
  typename Config::PipelinedO::PipelineState do_state;
  int kv_tiles = 0;  // key tiles whose K and V this CTA has used
  for (int tile_index = blockIdx.x; tile_index < params.order.size(); tile_index = handoff.receive()) {
    const auto tile = params.order.tile(tile_index);
    const int n_block = tile.n_block, head_kv = tile.head_kv, batch = tile.batch;
    const Sequence seq = Sequence::of(p, batch);
    if (n_block * kBlockN >= seq.seqlen_k) continue;  // varlen: past this sequence's keys
    const BackwardSteps<kBlockM, kBlockN, kCausal> steps(p, seq, n_block, head_kv, params.order.shortest_first);
    const AttentionMask<kCausal> mask(seq.seqlen_q, seq.seqlen_k, p);
    const int key_begin = n_block * kBlockN;
    Tensor acc_dk = partition_fragment_C(mma_dkv, typename Config::TileKtLead{});  // head dim × keys
    Tensor acc_dv = partition_fragment_C(mma_dkv, typename Config::TileVt{});
    Tensor acc_dk_tail = partition_fragment_C(mma_dk_tail, typename Config::TileKtTail{});  // warpgroup 1's
    clear(acc_dk);
    clear(acc_dv);
    if constexpr (kAsymmetric) clear(acc_dk_tail);
    // Waited for even with no step: the epilogue reuses K's and V's buffers.
    cutlass::arch::ClusterBarrier::wait(&smem.kv_full, kv_tiles % 2);

    // dQ, one slice of the head dim after the other, all in these registers (a slice's GEMM then
    // follows the reductions of the one before in the PTX, which ptxas keeps: with a fragment a
    // slice it moved the first slice's reductions past the second's GEMM and serialised every
    // wgmma, C7512). A step's last slice is added to its tile (dq_tile_last) in the next step,
    // under its S = Q Kᵀ: the reductions then drain while the tensor cores run that GEMM, not
    // between the steps with the tensor cores idle.
    Tensor acc_dq = partition_fragment_C(mma_dq, typename Config::TileQSlice{});
    float* dq_tile_last = nullptr;
    bool store_last = false;  // dq_tile_last's first addition (deterministic)
    for (auto step = steps.first_step(); step.t < steps.count; steps.advance(step)) {
      const int t = step.t;
      const int q_stage = q_state.index(), do_stage = do_state.index();
      const float* lse_log2 = smem.lse_log2.data() + q_stage * kBlockM;
      const float* delta = smem.delta.data() + do_stage * kBlockM;
      Tensor acc_s = partition_fragment_C(mma_sdp, typename Config::TileS{});
      Tensor acc_dp = partition_fragment_C(mma_sdp, typename Config::TileS{});
      float row_lse[kRows], row_delta[kRows];
      pipeline_q.consumer_wait(q_state);
      gemm_async</*kZeroInit=*/true, /*kRegisterA=*/false>(mma_sdp, tSrQ(_, _, _, q_stage), tSrK, acc_s);
      // ptxas waits for this S before dP is issued (C7517: dP's accumulator takes registers these
      // reductions read); the drain runs under S all the same.
      if (t > 0) {
        add_dq(dq_tile_last, dq_last, acc_dq, store_last);
        if constexpr (kDeterministic) barrier_arrive(BackwardBarrier::kTurnDone, kKeeperThreads);
      }
      CUTE_UNROLL
      for (int r = 0; r < kRows; ++r) row_lse[r] = lse_log2[get<0>(score_coords(r, 0))];
      pipeline_do.consumer_wait(do_state);
      gemm_async</*kZeroInit=*/true, /*kRegisterA=*/false>(mma_sdp, tdPrdO(_, _, _, do_stage), tdPrV, acc_dp);
      CUTE_UNROLL
      for (int r = 0; r < kRows; ++r) row_delta[r] = delta[get<0>(score_coords(r, 0))];
      // The step's query tile only once S and dP are issued, and its dQ tile (a 64-bit address)
      // once the GEMMs after kdSFull are: ptxas keeps such work where it is written, and a warp
      // issues in order, so before a GEMM's issue a dependent chain held the GEMM back (the query
      // tile, when it took a division by m_tiles, at the step's top, after the tensor cores had
      // drained: 1.3-4% of the D = 256 backward; docs/tried.md, 84708e1).
      const int row_begin = step.m_block * kBlockM;

      // P = exp2(S·scale·log2e - lse·log2e) (lse·log2e is +inf for rows that see no key or lie
      // past seqlen_q: P = 0); masked: keys past seqlen_k and, causal, after a row's diagonal.
      gemm_wait<1>(acc_s);
      auto probs = rowcol_view(acc_s);
      if constexpr (kSoftcap) softcap_scores(acc_s, p.softcap_scale);
      if (mask.tile_needs_mask(row_begin, kBlockM, key_begin, kBlockN)) {
        mask.apply_rows(probs, score_coords, row_begin, key_begin);
      }
      // Soft-capped: P into rP as it goes, and P · (1 - t²) into probs, so that dS is the raw
      // score's gradient (common/softcap.h).
      Tensor rP = make_tensor<Element>(acc_s.layout());
      Tensor p_rows = rowcol_view(rP);
      CUTE_UNROLL
      for (int r = 0; r < size<0>(probs); ++r) {
        CUTE_UNROLL
        for (int c = 0; c < size<1>(probs); ++c) {
          if constexpr (kSoftcap) {
            probs(r, c) = capped_probability(probs(r, c), p.scale_log2, row_lse[r], p_rows(r, c));
          } else {
            probs(r, c) = exp2f(probs(r, c) * p.scale_log2 - row_lse[r]);
          }
        }
      }
      if constexpr (!kSoftcap) rP = convert_fragment<Element>(acc_s);
      // dS = P ∘ (dP - delta).
      gemm_wait<0>(acc_dp);
      auto dscores = rowcol_view(acc_dp);
      CUTE_UNROLL
      for (int r = 0; r < size<0>(dscores); ++r) {
        CUTE_UNROLL
        for (int c = 0; c < size<1>(dscores); ++c) dscores(r, c) = probs(r, c) * (dscores(r, c) - row_delta[r]);
      }
      Tensor rdS = convert_fragment<Element>(acc_dp);

      // P and dS to buffer t % 2 (its previous readers, step t - 2's GEMMs, finished before both
      // warpgroups passed step t - 1's kdSFull); every key's is needed by the GEMMs below.
      const int buffer = t % 2;
      copy(copy_pds, thr_copy_pds.retile_S(rP), tPsP(_, _, _, buffer));
      copy(copy_pds, thr_copy_pds.retile_S(rdS), tdSsdS(_, _, _, buffer));
      cutlass::arch::fence_view_async_shared();  // generic-proxy writes, read by wgmma (async proxy)
      barrier_sync(BackwardBarrier::kdSFull, Config::kMmaThreads);

      Tensor tdQrdS_buffer = tdQrdS(_, _, _, buffer);
      gemm_async</*kZeroInit=*/false, /*kRegisterA=*/false>(mma_dkv, tdVrdOt(_, _, _, do_stage),
                                                             tdVrPt(_, _, _, buffer), acc_dv);
      forget_values(acc_dq);  // the last slice's values are dead once added: not live through S, dP, P and dS
      gemm_async</*kZeroInit=*/true, /*kRegisterA=*/false>(mma_dq, tdQrdS_buffer, n_slice<kSlices>(tdQrKt, dq_first),
                                                            acc_dq);
      if constexpr (kAsymmetric) {
        // dK's lead and (warpgroup 1) tail rows in one commit group: the waits below count the same.
        warpgroup_fence_operand(acc_dk);
        warpgroup_fence_operand(acc_dk_tail);
        if (wg == 1) {
          warpgroup_arrive();
          gemm_issue</*kZeroInit=*/false>(mma_dkv, tdKrQt(_, _, _, q_stage), tdKrdSt(_, _, _, buffer), acc_dk);
          gemm_issue</*kZeroInit=*/false>(mma_dk_tail, tdKrQtTail(_, _, _, q_stage), tdKrdStTail(_, _, _, buffer),
                                          acc_dk_tail);
          warpgroup_commit_batch();
        } else {
          warpgroup_arrive();
          gemm_issue</*kZeroInit=*/false>(mma_dkv, tdKrQt(_, _, _, q_stage), tdKrdSt(_, _, _, buffer), acc_dk);
          warpgroup_commit_batch();
        }
        warpgroup_fence_operand(acc_dk);
        warpgroup_fence_operand(acc_dk_tail);
      } else {
        gemm_async</*kZeroInit=*/false, /*kRegisterA=*/false>(mma_dkv, tdKrQt(_, _, _, q_stage),
                                                               tdKrdSt(_, _, _, buffer), acc_dk);
      }
      float* dq_tile = p.dq_accum + steps.workspace_row(p, seq, batch, step) * Config::kHeadDim;
      gemm_wait<2>(acc_dv);  // dV done: dO's buffer is free for the next step's
      pipeline_do.consumer_release(do_state);
      ++do_state;
      gemm_wait<1>(acc_dq);  // dQ's first slice done
      bool store = false;
      if constexpr (kDeterministic) {  // wait for the tile's turn
        store = backward_dq_turn<kBlockM, kBlockN>(mask, n_block, row_begin, params.order.shortest_first) == 0;
        barrier_sync(BackwardBarrier::kTurnReady, kKeeperThreads);
      }
      if constexpr (kAsymmetric) {
        if (wg == 0) {  // slice 0 added, slice 2 computed (added in the next step)
          add_dq(dq_tile, 0, acc_dq, store);
          gemm_async</*kZeroInit=*/true, /*kRegisterA=*/false>(mma_dq, tdQrdS_buffer, n_slice<kSlices>(tdQrKt, 2),
                                                                acc_dq);
        }
        gemm_wait<0>(acc_dk);  // (warpgroup 1: its slice 1 is added in the next step)
        warpgroup_fence_operand(acc_dq);
        warpgroup_fence_operand(acc_dk_tail);
      } else {
        add_dq(dq_tile, 0, acc_dq, store);
        CUTE_UNROLL
        for (int s = 1; s < kSlices; ++s) {
          gemm_async</*kZeroInit=*/true, /*kRegisterA=*/false>(mma_dq, tdQrdS_buffer, n_slice<kSlices>(tdQrKt, s),
                                                                acc_dq);
          gemm_wait<0>(acc_dq);
          if (s < kSlices - 1) add_dq(dq_tile, s, acc_dq, store);
        }
      }
      dq_tile_last = dq_tile;
      store_last = store;
      warpgroup_fence_operand(acc_dk);
      pipeline_q.consumer_release(q_state);
      ++q_state;
    }
    if (steps.count > 0) {
      add_dq(dq_tile_last, dq_last, acc_dq, store_last);
      if constexpr (kDeterministic) barrier_arrive(BackwardBarrier::kTurnDone, kKeeperThreads);
    }

    // dKᵀ and dVᵀ to K's and V's buffers through their transposed views (stmatrix .trans).
    CUTE_UNROLL
    for (int i = 0; i < size(acc_dk); ++i) acc_dk(i) *= p.scale;
    Tensor rdK = convert_fragment<Element>(acc_dk);
    Tensor rdV = convert_fragment<Element>(acc_dv);
    auto copy_dkv = make_tiled_copy_C(Copy_Atom<SM90_U16x8_STSM_T, Element>{}, mma_dkv);
    if constexpr (kAsymmetric) {
      CUTE_UNROLL
      for (int i = 0; i < size(acc_dk_tail); ++i) acc_dk_tail(i) *= p.scale;
      Tensor rdKTail = convert_fragment<Element>(acc_dk_tail);
      auto copy_tail = make_tiled_copy_C(Copy_Atom<SM90_U16x8_STSM_T, Element>{}, mma_dk_tail);
      store_dkv<Config>(params, smem, [&](int epilogue_tid) {
        stage_fragment(copy_dkv, rdK, make_tensor(make_smem_ptr(smem.k.data()), typename Config::SmemLayoutKtLead{}),
                       epilogue_tid);
        if (epilogue_tid >= 128) {
          stage_fragment(copy_tail, rdKTail,
                         make_tensor(make_smem_ptr(smem.k.data() + Config::kKTailOffset),
                                     typename Config::SmemLayoutKtTail{}),
                         epilogue_tid - 128);
        }
        stage_fragment(copy_dkv, rdV, sm.vt, epilogue_tid);
      }, n_block, head_kv, batch);
    } else {
      store_dkv<Config>(params, smem, [&](int epilogue_tid) {
        stage_fragment(copy_dkv, rdK, sm.kt, epilogue_tid);
        stage_fragment(copy_dkv, rdV, sm.vt, epilogue_tid);
      }, n_block, head_kv, batch);
    }
    ++kv_tiles;
  }
}

}  // namespace fa::sm90
