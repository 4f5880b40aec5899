// The Hopper-family backward kernel: FlashAttention's backward on wgmma, TMA and warp
// specialisation.
//
// Algorithm (as the Ampere family's, sm80/bwd_kernel.h): a key tile is kBlockN keys of one (batch,
// kv head); its CTA keeps K, V and the dK, dV accumulators, and walks every query tile that sees its
// keys, for each query head of the group (GQA: dK and dV summed in registers). Per query tile it recomputes
//   Sᵀ = K Qᵀ,  Pᵀ = exp2(Sᵀ·scale·log2e - lse·log2e)    (lse saved by the forward, P never stored)
//   dPᵀ = V dOᵀ,  dSᵀ = Pᵀ ∘ (dPᵀ - delta)              (delta = rowsum(dO ∘ O), from the pre-pass)
//   dV += Pᵀ dO,  dK += dSᵀ Q                           (Pᵀ, dSᵀ straight from registers)
//   dQ = dS K -> an fp32 workspace tile, added by a bulk reduction (cp.reduce.async.bulk)
// and the post-pass scales and converts dQ (bwd_launch.h).
//
// Persistent: about one CTA per SM, each taking key tiles in BackwardTileOrder's order (longest
// first when causal) from a counter the pre-pass zeroes, as SMs free up; the producer warp takes
// the next index and hands it to the other roles (BackwardTileHandoff). Between two key tiles the
// Q/dO pipelines run on (the next tile's first Q and dO load while this one's last steps run) and
// the next K and V load once this tile's epilogue has stored dK and dV from their buffers
// (kv_empty): no CTA launch, barrier set-up or first Q/dO latency per key tile (docs/tried.md,
// 774fef6: 7–8% faster at head dim 64, level at 128).
//
// Roles (bwd_config.h has the tile shapes):
//   warpgroup 0, warp 0   producer (bwd_load.h): K, V per key tile; Q + lse and dO + delta per step
//                         through two kStages-deep pipelines. 24 registers a thread.
//                warp 1   dQ writer (bwd_load.h): adds the consumers' staged dQ tiles to the
//                         workspace by bulk reductions (not above head dim 128, see below);
//                         above, in a deterministic call, the turn keeper (bwd_load.h).
//                warps 2, 3  where the pre-pass left units to the main kernel (D = 64 and 256:
//                         Config::kRowsInMainKernel, BackwardParams::unit_ready): prepare their
//                         rows (delta, lse_log2, the zeroed workspace or claims;
//                         common/backward_rows.h) while the consumers compute; the producer and
//                         the dQ writer wait for a unit's rows before its key tiles' loads and
//                         reductions.
//   warpgroups 1, 2       consumers: 64 keys each for Sᵀ, dPᵀ, dV, dK; half of dQ's columns each.
//                         240 registers a thread.
// A step of a consumer warpgroup: issue Sᵀ and dPᵀ; Pᵀ once Sᵀ is done; dSᵀ once dPᵀ is done;
// write dSᵀ to shared memory (double-buffered); issue dV += Pᵀ dO, then fence dSᵀ's stores; wait
// for the other warpgroup's half (kdSFull); issue dQ = dS K and dK += dSᵀ Q; once dV and dQ are
// done, release dO and stage dQ in shared memory for the dQ writer (whose bulk reduction runs on
// while dK and the next steps compute); with 64 query rows a step (D = 128) issue the next step's
// Sᵀ and dPᵀ behind dK and release Q once that Sᵀ is done (dK with it), else wait for dK and
// release Q.
//
// Above head dim 128 (Config::kSplitHeadDim, 80 or 96 keys a CTA) the consumers run another step:
// backward_mma_split (sm90/bwd_mma_split.h).
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/arch/reg_reconfig.h>
#include <cutlass/pipeline/sm90_pipeline.hpp>

#include "common/attention_mask.h"
#include "common/backward_rows.h"
#include "common/fragment_convert.h"
#include "common/grid_dependency.h"
#include "common/sequence.h"
#include "common/softcap.h"
#include "fa/params.h"
#include "sm90/bwd_epilogue.h"
#include "sm90/bwd_load.h"
#include "sm90/bwd_mma_split.h"
#include "sm90/fragments.h"
#include "sm90/named_barriers.h"
#include "sm90/pipeline.h"
#include "sm90/row_store.h"
#include "sm90/tile_scheduler.h"
#include "sm90/wgmma.h"

namespace fa::sm90 {

template <class TmaQ, class TmadO, class TmaK, class TmaV, class TmadK, class TmadV>
struct BackwardKernelParams {
  BackwardParams attn;
  BackwardTileOrder order;  // which key tile each CTA takes (tile_scheduler.h)
  TmaQ tma_q;
  TmadO tma_do;
  TmaK tma_k;
  TmaV tma_v;
  TmadK tma_dk;
  TmadV tma_dv;
};

// The consumers up to head dim 128 (64 keys a warpgroup). kSoftcap: soft-capped scores
// (common/softcap.h).
template <class Config, bool kCausal, bool kSoftcap, class Params, class Storage, class Handoff>
CUTE_DEVICE void backward_mma_keys(Params const& params, Storage& smem, typename Config::Pipeline& pipeline_q,
                                   typename Config::PipelinedO& pipeline_do, Handoff const& handoff) {
  using namespace cute;
  using Element = typename Config::Element;
  using Pipeline = typename Config::Pipeline;
  constexpr int kBlockM = Config::kBlockM;
  constexpr int kBlockN = Config::kBlockN;
  const BackwardParams& p = params.attn;
  const int mma_tid = threadIdx.x - 128;
  const int wg = cutlass::canonical_warp_group_idx() - 1;  // consumer warpgroup 0 or 1 (warp-uniform)

  const BackwardSmemTensors<Config> sm(smem);

  // Sᵀ = K Qᵀ and dPᵀ = V dOᵀ.
  typename Config::TiledMmaSdP mma_sdp;
  auto thr_sdp = mma_sdp.get_thread_slice(mma_tid);
  auto wg_sdp = warpgroup_slice(mma_sdp, /*first_warpgroup=*/1);  // for descriptors (wgmma.h)
  Tensor tSrK = wg_sdp.partition_fragment_A(sm.k);      // descriptors (MMA, MMA_M, MMA_K)
  Tensor tSrQ = wg_sdp.partition_fragment_B(sm.q);      // (MMA, MMA_N, MMA_K, stages)
  Tensor tdPrV = wg_sdp.partition_fragment_A(sm.v);
  Tensor tdPrdO = wg_sdp.partition_fragment_B(sm.dout);
  Tensor tScS = thr_sdp.partition_C(make_identity_tensor(typename Config::TileSt{}));  // (key, query)
  auto score_coords = rowcol_view(tScS);
  // A step's per-query values (lse, delta) at this thread's columns of Sᵀ.
  constexpr int kScoreCols = decltype(size<1>(score_coords))::value;
  auto read_columns = [&](const float* values, float (&out)[kScoreCols]) {
    CUTE_UNROLL
    for (int c = 0; c < kScoreCols; ++c) out[c] = values[get<1>(score_coords(0, c))];
  };
  constexpr bool kRowsEarly = kScoreCols <= 16;
  // Column c's value: read early into `early`, or now from shared memory.
  auto column = [&](const float (&early)[kScoreCols], const float* values, int c) {
    if constexpr (kRowsEarly) return early[c];
    else return values[get<1>(score_coords(0, c))];
  };
  // dV += Pᵀ dO and dK += dSᵀ Q.
  typename Config::TiledMmadKV mma_dkv;
  auto wg_dkv = warpgroup_slice(mma_dkv, 1);
  Tensor tdVrdOt = wg_dkv.partition_fragment_B(sm.doutt);  // (MMA, MMA_N, MMA_K, stages)
  Tensor tdKrQt = wg_dkv.partition_fragment_B(sm.qt);
  // dQ = dS K.
  typename Config::TiledMmadQ mma_dq;
  auto wg_dq = warpgroup_slice(mma_dq, 1);
  Tensor tdQrdS = wg_dq.partition_fragment_A(sm.ds);    // (MMA, MMA_M, MMA_K, 2 buffers)
  Tensor tdQrKt = wg_dq.partition_fragment_B(sm.kt);
  // dSᵀ: registers -> shared memory with stmatrix.
  auto copy_ds = make_tiled_copy_C(Copy_Atom<SM90_U32x4_STSM_N, Element>{}, mma_sdp);
  auto thr_copy_ds = copy_ds.get_thread_slice(mma_tid);
  Tensor tdSsdS = thr_copy_ds.partition_D(sm.dst);      // (CPY, CPY_M, CPY_N, 2 buffers)

  typename Pipeline::PipelineState q_state;  // run on from one key tile to the next
  typename Pipeline::PipelineState q_release_state;  // trails q_state by the step whose dK runs
  typename Config::PipelinedO::PipelineState do_state;
  int kv_tiles = 0;  // key tiles whose K and V this CTA has used
  for (int tile_index = blockIdx.x; tile_index < params.order.size(); tile_index = handoff.receive()) {
    const auto tile = params.order.tile(tile_index);
    const int n_block = tile.n_block, head_kv = tile.head_kv, batch = tile.batch;
    const Sequence seq = Sequence::of(p, batch);
    // Varlen: the order covers the longest sequence's keys; a key tile past this one's has no work.
    if (n_block * kBlockN >= seq.seqlen_k) continue;
    const BackwardSteps<kBlockM, kBlockN, kCausal> steps(p, seq, n_block, head_kv, params.order.shortest_first);
    const AttentionMask<kCausal> mask(seq.seqlen_q, seq.seqlen_k, p);
    const int key_begin = n_block * kBlockN;
    Tensor acc_dk = partition_fragment_C(mma_dkv, typename Config::TileKV{});
    Tensor acc_dv = partition_fragment_C(mma_dkv, typename Config::TileKV{});
    clear(acc_dk);
    clear(acc_dv);
    // Waited for even with no step: the epilogue reuses K's and V's buffers.
    cutlass::arch::ClusterBarrier::wait(&smem.kv_full, kv_tiles % 2);

    // dQ of a step, staged in shared memory in the layout of Config::dq_staging_offset (once the dQ
    // writer says that its reduction from kdQStages steps back has read the buffer) and handed to
    // the writer (bwd_load.h), which adds it to the workspace tile of (batch, head, m_block).
    auto add_dq = [&](int t, auto const& acc_dq) {
      constexpr int kWriterThreads = BackwardDqWriter<Config, kCausal>::kBarrierThreads;
      float* staging = smem.dq.data() + Config::dq_staging_buffer(t);
      barrier_sync(BackwardBarrier::kdQEmpty, kWriterThreads, wg);
      CUTE_UNROLL
      for (int i = 0; i < size(acc_dq); i += 4) {
        *reinterpret_cast<float4*>(staging + Config::dq_staging_offset(mma_tid, i)) =
            make_float4(acc_dq(i), acc_dq(i + 1), acc_dq(i + 2), acc_dq(i + 3));
      }
      cutlass::arch::fence_view_async_shared();  // generic-proxy writes, read by the bulk reduction
      barrier_arrive(BackwardBarrier::kdQFull, kWriterThreads, wg);
    };

    // Where dK may run on into the next step (kDkIntoNextStep: at 64 query rows a step), the oldest
    // Q buffer still held (the step before's) is released once its dK is done; the next step's Q
    // must then be in another buffer. At 128 rows (D = 64) the next step's Sᵀ and dPᵀ accumulators
    // (2 × 64 registers) beside dK's register operand leave ptxas too few registers: it serialises
    // every wgmma (C7512), so there the step waits for its dK.
    constexpr bool kDkIntoNextStep = kBlockM <= 64;
    static_assert(!kDkIntoNextStep || Config::kStages >= 2, "a step's dK holds its Q buffer into the next step");
    auto release_q = [&] {
      pipeline_q.consumer_release(q_release_state);
      ++q_release_state;
    };

    for (auto step = steps.first_step(); step.t < steps.count; steps.advance(step)) {
      const int t = step.t;
      const int row_begin = step.m_block * kBlockM;
      const int q_stage = q_state.index(), do_stage = do_state.index();

      Tensor acc_s = partition_fragment_C(mma_sdp, typename Config::TileSt{});
      Tensor acc_dp = partition_fragment_C(mma_sdp, typename Config::TileSt{});
      // The lse and delta values of this thread's query columns are read from shared memory before
      // the waits for Sᵀ and dPᵀ (lse while Sᵀ runs, delta while dPᵀ does): read after them,
      // their latency (behind the tensor cores' shared-memory traffic) sat between each GEMM and
      // the math on its result (Nsight Compute's source view: the first use of lse was the
      // kernel's most stalled instruction). Not both at once; and where a thread has 32 query
      // columns (kBlockM = 128, D = 64) after the waits as before: 32 more live registers spill.
      const float* lse_log2 = smem.lse_log2.data() + q_stage * kBlockM;
      const float* delta = smem.delta.data() + do_stage * kBlockM;
      float row_lse[kScoreCols], row_delta[kScoreCols];
      pipeline_q.consumer_wait(q_state);
      gemm_async</*kZeroInit=*/true, /*kRegisterA=*/false>(mma_sdp, tSrK, tSrQ(_, _, _, q_stage), acc_s);
      if constexpr (kRowsEarly) read_columns(lse_log2, row_lse);
      pipeline_do.consumer_wait(do_state);
      gemm_async</*kZeroInit=*/true, /*kRegisterA=*/false>(mma_sdp, tdPrV, tdPrdO(_, _, _, do_stage), acc_dp);

      // Pᵀ = exp2(Sᵀ·scale·log2e - lse·log2e); the pre-pass stored lse·log2e, +inf for rows that
      // see no key or lie past seqlen_q (their P is 0). Masked: keys past seqlen_k (K there is
      // zero-filled or, varlen, the next sequence's; exp2(-lse) could overflow) and, causal, keys
      // after a row's diagonal.
      gemm_wait<1>(acc_s);
      // The previous step's dK (issued before this Sᵀ, and wgmma groups complete in order) is done:
      // its Q buffer may take the next load.
      if (kDkIntoNextStep && t > 0) release_q();
      if constexpr (kSoftcap) softcap_scores(acc_s, p.softcap_scale);
      if (mask.tile_needs_mask(row_begin, kBlockM, key_begin, kBlockN)) {
        mask.apply_transposed(acc_s, tScS, row_begin, key_begin);
      }
      auto probs = rowcol_view(acc_s);
      // Soft-capped: Pᵀ into rP as it goes, and Pᵀ · (1 - t²) into probs, so that dS is the raw
      // score's gradient (common/softcap.h).
      Tensor rP = make_tensor<Element>(acc_s.layout());
      Tensor p_rows = rowcol_view(rP);
      CUTE_UNROLL
      for (int c = 0; c < size<1>(probs); ++c) {
        CUTE_UNROLL
        for (int r = 0; r < size<0>(probs); ++r) {
          const float lse = column(row_lse, lse_log2, c);
          if constexpr (kSoftcap) {
            probs(r, c) = capped_probability(probs(r, c), p.scale_log2, lse, p_rows(r, c));
          } else {
            probs(r, c) = exp2f(probs(r, c) * p.scale_log2 - lse);
          }
        }
      }
      if constexpr (!kSoftcap) rP = convert_fragment<Element>(acc_s);
      if constexpr (kRowsEarly) read_columns(delta, row_delta);

      // dSᵀ = Pᵀ ∘ (dPᵀ - delta).
      gemm_wait<0>(acc_dp);
      auto dscores = rowcol_view(acc_dp);
      CUTE_UNROLL
      for (int c = 0; c < size<1>(dscores); ++c) {
        CUTE_UNROLL
        for (int r = 0; r < size<0>(dscores); ++r) {
          dscores(r, c) = probs(r, c) * (dscores(r, c) - column(row_delta, delta, c));
        }
      }
      Tensor rdS = convert_fragment<Element>(acc_dp);

      // dSᵀ to shared memory (buffer t % 2: its previous readers, step t - 2's GEMMs, finished
      // before both warpgroups passed step t - 1's kdSFull), then dQ = dS K over all keys.
      const int ds_buffer = t % 2;
      copy(copy_ds, thr_copy_ds.retile_S(rdS), tdSsdS(_, _, _, ds_buffer));
      // dV += Pᵀ dO is issued only now, after dSᵀ's store (FA3's order): issued as soon as Pᵀ was
      // converted, it ran beside the dS math, but the dSᵀ store and so the kdSFull barrier came
      // later; measured 4.6-5.9% faster at D = 64 this way, level at D = 128 (docs/tried.md, e94ca21).
      // Issued before the fence that makes dSᵀ visible to the other warpgroup's dQ GEMM (dV reads
      // none of it), so that the tensor cores start on it while the fence drains.
      Tensor tdVrP = make_tensor(rP.data(), accumulator_as_a_operand(acc_s.layout()));
      gemm_async</*kZeroInit=*/false, /*kRegisterA=*/true>(mma_dkv, tdVrP, tdVrdOt(_, _, _, do_stage), acc_dv);
      cutlass::arch::fence_view_async_shared();  // generic-proxy writes, read by wgmma (async proxy)
      barrier_sync(BackwardBarrier::kdSFull, Config::kMmaThreads);
      Tensor acc_dq = partition_fragment_C(mma_dq, typename Config::TileQ{});
      Tensor tdQrdS_buffer = tdQrdS(_, _, _, ds_buffer);
      gemm_async</*kZeroInit=*/true, /*kRegisterA=*/false>(mma_dq, tdQrdS_buffer, tdQrKt, acc_dq);
      // dK behind dQ; dQ is staged for the dQ writer while dK runs.
      Tensor tdKrdS = make_tensor(rdS.data(), accumulator_as_a_operand(acc_dp.layout()));
      gemm_async</*kZeroInit=*/false, /*kRegisterA=*/true>(mma_dkv, tdKrdS, tdKrQt(_, _, _, q_stage), acc_dk);
      gemm_wait<1>(acc_dq);  // dV and dQ done
      pipeline_do.consumer_release(do_state);  // dV was dO's last reader: its next load may start
      add_dq(t, acc_dq);
      ++q_state;
      ++do_state;
      if constexpr (kDkIntoNextStep) {
        // dK runs on into the next step, whose Sᵀ and dPᵀ are issued behind it without waiting
        // for it (no gap in the tensor cores' queue); Q is released once the next Sᵀ is done.
        warpgroup_fence_operand(acc_dk);
      } else {
        gemm_wait<0>(acc_dk);
        release_q();
      }
    }
    if constexpr (kDkIntoNextStep) {
      gemm_wait<0>(acc_dk);
      if (steps.count > 0) release_q();
    }

    // Epilogue (bwd_epilogue.h): dK and dV through K's and V's buffers (stmatrix), once both
    // warpgroups' last dQ GEMMs have read K.
    CUTE_UNROLL
    for (int i = 0; i < size(acc_dk); ++i) acc_dk(i) *= p.scale;
    Tensor rdK = convert_fragment<Element>(acc_dk);
    Tensor rdV = convert_fragment<Element>(acc_dv);
    auto copy_dkv = make_tiled_copy_C(Copy_Atom<SM90_U32x4_STSM_N, Element>{}, mma_dkv);
    store_dkv<Config>(params, smem, [&](int epilogue_tid) {
      stage_fragment(copy_dkv, rdK, sm.k, epilogue_tid);
      stage_fragment(copy_dkv, rdV, sm.v, epilogue_tid);
    }, n_block, head_kv, batch);
    ++kv_tiles;
  }
}

template <class Config, bool kCausal, bool kSoftcap, class Params>
__global__ void __launch_bounds__(Config::kThreads, 1)
    backward_kernel(const __grid_constant__ Params params) {
  using namespace cute;
  using Pipeline = typename Config::Pipeline;
  using PipelinedO = typename Config::PipelinedO;
  using Storage = typename Config::SharedStorage;
  extern __shared__ char smem_raw[];
  Storage& smem = *reinterpret_cast<Storage*>(smem_raw);
  const int warp = cutlass::canonical_warp_idx_sync();
  const int warpgroup = cutlass::canonical_warp_group_idx();

  if (warp == 0 && elect_one_sync()) {
    cutlass::arch::ClusterTransactionBarrier::init(&smem.kv_full, 1);
    cutlass::arch::ClusterBarrier::init(&smem.kv_empty, 1);
    cutlass::arch::ClusterBarrier::init(&smem.writer_tile_full, 1);
    cutlass::arch::ClusterBarrier::init(&smem.writer_tile_empty, 1);
  }
  // A Q (dO) stage completes with its tile and its rows' lse (delta).
  Pipeline pipeline_q(smem.pipeline_q,
                      tma_pipeline_params<Pipeline>(Config::kQBytes + Config::kRowBytes, Config::kMmaThreads),
                      Shape<_1, _1, _1>{});
  PipelinedO pipeline_do(smem.pipeline_do,
                         tma_pipeline_params<PipelinedO>(Config::kdOBytes + Config::kRowBytes, Config::kMmaThreads),
                         Shape<_1, _1, _1>{});
  __syncthreads();  // barriers initialised before any role uses them
  // Launched behind the pre-pass (bwd_launch.h): every role reads or adds to what it writes (the
  // tile counter, lse, delta, the zeroed dQ workspace), so waits for it here; the producer warp
  // in BackwardLoad::run, once it has issued its first tile's K, V and Q. The dQ conversion may
  // take this grid's SMs as its CTAs exit.
  if (warp != 0) wait_for_prior_grid();
  allow_dependent_grid();
  // The next key tile's index, from the producer warp to the consumers and warp 1 (the dQ writer,
  // or the turn keeper of a deterministic call).
  const bool keeper = Config::kdQFromRegisters && params.attn.deterministic;
  const BackwardTileHandoff<32 + Config::kMmaThreads, !Config::kdQFromRegisters> handoff{
      &smem.next_tile, &smem.writer_tile_full, &smem.writer_tile_empty, keeper};

  if (warpgroup == 0) {
    cutlass::arch::warpgroup_reg_dealloc<Config::kProducerRegisters>();
    if (warp == 0) BackwardLoad<Config, kCausal>::run(params, smem, pipeline_q, pipeline_do, handoff);
    if constexpr (!Config::kdQFromRegisters) {
      if (warp == 1) BackwardDqWriter<Config, kCausal>::run(params, smem, handoff);
    } else {
      if (warp == 1 && keeper) BackwardTurnKeeper<Config, kCausal>::run(params, handoff);
    }
    // Warps 2 and 3 prepare the rows of the units the pre-pass left (BackwardParams::unit_ready).
    if constexpr (Config::kRowsInMainKernel) {
      if (warp >= 2 && params.attn.unit_ready != nullptr) {
        prepare_rows_in_warp<typename Config::Element, Config::kHeadDim>(params.attn);
      }
    }
    return;
  }

  cutlass::arch::warpgroup_reg_alloc<Config::kMmaRegisters>();
  if constexpr (Config::kSplitHeadDim) {
    if (params.attn.deterministic) {
      backward_mma_split<Config, kCausal, kSoftcap, true>(params, smem, pipeline_q, pipeline_do, handoff);
    } else {
      backward_mma_split<Config, kCausal, kSoftcap, false>(params, smem, pipeline_q, pipeline_do, handoff);
    }
  } else {
    backward_mma_keys<Config, kCausal, kSoftcap>(params, smem, pipeline_q, pipeline_do, handoff);
  }
}

}  // namespace fa::sm90
