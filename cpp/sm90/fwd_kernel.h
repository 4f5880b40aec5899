// The Hopper-family forward kernel: FlashAttention on wgmma, TMA and warp specialisation.
//
// Algorithm: as in the Ampere family (sm80/fwd_kernel.h), one query tile of kBlockM rows walks the
// key tiles it can see from the last to the first with the online softmax; S and P stay in
// registers. What Hopper changes is who does what:
//
//   warpgroup 0, warp 0   producer (fwd_load.h): TMA loads of Q, and of K and V through two
//                         kStages-deep mbarrier pipelines. 24 registers a thread (setmaxnreg; 32
//                         with three consumer warpgroups).
//   warpgroups 1 .. W     consumers (fwd_mainloop.h), W = 2 or 3: 64 query rows each; S = Q Kᵀ and
//                         O += P V on wgmma, the softmax in between, taking turns at the tensor
//                         cores (ping-pong) and overlapping each tile's softmax with the previous
//                         tile's O GEMM. 240 registers a thread (160 when W = 3; 104 with two CTAs
//                         an SM). Then the epilogue (fwd_epilogue.h).
//
// The grid is persistent: about one CTA per SM (two for the narrow-window tile: ForwardConfig::
// kCtasPerSm), each walking its share of the work tiles in the scheduler's order
// (tile_scheduler.h: longest first for causal, heads grouped so K and V stay in L2; causal tiles
// handed out one at a time from a global counter). Non-causal dense batches run on CTA pairs
// where they can (fwd_launch.h: clusters of two CTAs on adjacent query tiles of one head, each
// loading half of every K and V tile into both). Synchronisation: q_full (TMA
// transaction barriers, one per Q buffer) hands Q to the consumers; the K and V pipelines'
// full/empty barriers hand each buffer back and forth; q_empty (two Q buffers) or the kQueryEmpty
// named barrier (one) tells the producer that a Q buffer is free again (ForwardConfig::kQStages);
// named barriers order the ping-pong, the epilogue and the hand-over of the next tile's index
// (named_barriers.h).
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/arch/reg_reconfig.h>
#include <cutlass/pipeline/sm90_pipeline.hpp>

#include "common/attention_mask.h"
#include "common/online_softmax.h"
#include "common/sequence.h"
#include "fa/params.h"
#include "sm90/fwd_epilogue.h"
#include "sm90/fwd_load.h"
#include "sm90/fwd_mainloop.h"
#include "sm90/pipeline.h"
#include "sm90/tile_scheduler.h"

namespace fa::sm90 {

// What the kernel receives: the attention problem, the scheduler's order, and the TMA descriptors
// (built on the host from the real strides; passed by value as __grid_constant__).
template <class TmaQ, class TmaK, class TmaV, class TmaO, class TmaPair>
struct ForwardKernelParams {
  ForwardParams attn;
  TileScheduler::Params scheduler;
  TmaQ tma_q;
  TmaK tma_k;
  TmaV tma_v;
  TmaO tma_o;
  // CTA pairs (non-causal, static schedule; launched as clusters of two): each CTA of a pair loads
  // half of every K and V tile into both CTAs' shared memory (TMA multicast). 1 or 2.
  int pair = 1;
  TmaPair tma_k_pair;
  TmaPair tma_v_pair;
};

// The roles of a forward CTA (above), once its barriers are initialised.
template <class Config, bool kCausal, bool kSoftcap, class Params, class Storage, class KVPipeline>
CUTE_DEVICE void run_roles(Params const& params, Storage& smem, KVPipeline& pipeline_k, KVPipeline& pipeline_v) {
  using namespace cute;
  const ForwardParams& p = params.attn;
  const int warp = cutlass::canonical_warp_idx_sync();
  const int warpgroup = cutlass::canonical_warp_group_idx();

  const TileHandoff<ForwardBarrier::kTileFull, ForwardBarrier::kTileEmpty, Config::kMmaWarpgroups>
      handoff{smem.next_tile};

  if (warpgroup == 0) {
    cutlass::arch::warpgroup_reg_dealloc<Config::kProducerRegisters>();
    if (warp == 0) ForwardLoad<Config, kCausal>::run(params, smem, pipeline_k, pipeline_v, handoff);
    return;
  }

  cutlass::arch::warpgroup_reg_alloc<Config::kMmaRegisters>();
  // Read again past the register reallocation, rather than carried across it (where ptxas spilled
  // it at D = 256).
  const int consumer = cutlass::canonical_warp_group_idx() - 1;
  using Mainloop = ForwardMainloop<Config, kCausal, kSoftcap>;
  using Epilogue = ForwardEpilogue<Config>;
  const int mma_tid = threadIdx.x - 128;
  const WarpgroupTurns<Config::kMmaWarpgroups> turns(consumer);
  typename KVPipeline::PipelineState k_state, v_state;
  typename Config::TiledMmaO mma_o;
  Tensor acc_o = partition_fragment_C(mma_o, typename Config::TileO{});
  constexpr int kRows = decltype(size<0>(rowcol_layout(acc_o.layout())))::value;

  int q_loads = 0;
  for (int t = blockIdx.x; t < params.scheduler.total;
       t = TileScheduler::receive_next(params.scheduler, t, handoff, consumer)) {
    const WorkTile w = TileScheduler::tile(params.scheduler, t);
    const Sequence seq = Sequence::of(p, w.batch);
    if (w.m_block * Config::kBlockM >= seq.seqlen_q) continue;  // varlen: past this sequence's rows
    const AttentionMask<kCausal> mask(seq.seqlen_q, seq.seqlen_k, p);
    const int n_begin = Config::first_key_tile(mask, w.m_block);
    const int n_blocks = Config::key_tiles(mask, seq.seqlen_q, w.m_block);
    if (n_blocks <= n_begin) {  // no row sees a key (the producer loads nothing either)
      Epilogue::template store_empty<kRows>(p, seq, mma_tid, w);
      continue;
    }
    // The thread's index, opaque to the compiler once a tile: what it derives (shared-memory
    // offsets of the swizzled layouts) is recomputed per tile instead of held across the loop.
    int tid = mma_tid;
    asm volatile("" : "+r"(tid));
    const int q_stage = q_loads % Config::kQStages;
    cutlass::arch::ClusterBarrier::wait(&smem.q_full[q_stage], (q_loads++ / Config::kQStages) & 1);
    // FP8: P carries a factor 2^8 (common/online_softmax.h), and the tile's descales scale the
    // scores (q's and k's) and the output (v's).
    OnlineSoftmax<kRows, Config::kFp8 ? 8 : 0> softmax;
    float scale = p.scale, scale_log2 = p.scale_log2, v_descale = 1.f;
    if constexpr (Config::kFp8) {
      const int b = w.batch, kv_head = w.head / (p.heads_q / p.heads_kv);
      auto at = [&](const float* t, const int64_t(&stride)[2]) {
        return t != nullptr ? t[b * stride[0] + kv_head * stride[1]] : 1.f;
      };
      const float qk = at(p.q_descale, p.q_descale_stride) * at(p.k_descale, p.k_descale_stride);
      scale *= qk;
      scale_log2 *= qk;
      v_descale = at(p.v_descale, p.v_descale_stride);
    }
    // The mainloop counts the key tiles from n_begin (ptxas spilled at D = 256 with n_begin kept
    // through the loop beside its bounds; docs/tried.md).
    int own_blocks = Mainloop::own_blocks(mask, seq.seqlen_q, w.m_block);
    if constexpr (kCausal) own_blocks = max(0, own_blocks - n_begin);
    auto mainloop = [&](auto fixed) __attribute__((always_inline)) {
      Mainloop::template run<decltype(fixed)::value>(p, smem, q_stage, pipeline_k, pipeline_v, k_state, v_state,
                                                     turns, tid, w, mask.shifted(n_begin * Config::kBlockN),
                                                     n_blocks - n_begin, own_blocks, acc_o, softmax, params.pair,
                                                     scale_log2);
    };
    // Soft-capped bf16 up to D = 128 with a cap up to 63.7: no running max (common/online_softmax.h).
    if constexpr (kSoftcap && kHoldsFixedReference<typename Config::Element, Config::kHeadDim>) {
      softmax.walk_with_reference(scale_log2, mainloop);
    } else {
      mainloop(cute::false_type{});
    }
    float row_lse[kRows], row_sinks[kRows];
    CUTE_UNROLL
    for (int r = 0; r < kRows; ++r) row_sinks[r] = p.sinks != nullptr ? p.sinks[w.head] : -INFINITY;
    auto out_rows = rowcol_view(acc_o);
    softmax.finalize(out_rows, scale, row_lse, row_sinks);
    if constexpr (Config::kFp8) {
      CUTE_UNROLL
      for (int i = 0; i < size(acc_o); ++i) acc_o(i) *= v_descale;
    }
    Epilogue::store(params, smem, tid, w, seq, acc_o, row_lse);
  }
  Epilogue::finish(mma_tid);
}

template <class Config, bool kCausal, bool kSoftcap, class Params>
__global__ void __launch_bounds__(Config::kThreads, Config::kCtasPerSm)
    forward_kernel(const __grid_constant__ Params params) {
  using namespace cute;
  using KVPipeline = typename Config::KVPipeline;
  using Storage = typename Config::SharedStorage;
  extern __shared__ char smem_raw[];
  Storage& smem = *reinterpret_cast<Storage*>(smem_raw);
  const int warp = cutlass::canonical_warp_idx_sync();

  if (warp == 0 && elect_one_sync()) {
    for (int stage = 0; stage < Config::kQStages; ++stage) {
      cutlass::arch::ClusterTransactionBarrier::init(&smem.q_full[stage], 1);
      // One Q buffer: the consumers free it through the kQueryEmpty named barrier instead.
      if constexpr (Config::kQStages > 1) cutlass::arch::ClusterBarrier::init(&smem.q_empty[stage], Config::kMmaThreads);
    }
  }
  const auto k_params = tma_pipeline_params<KVPipeline>(Config::kKTileBytes, Config::kMmaThreads);
  auto v_params = k_params;  // V's tiles are kHeadDimV wide
  v_params.transaction_bytes = Config::kVTileBytes;
  if constexpr (kCausal) {
    KVPipeline pipeline_k(smem.pipeline_k, k_params, Shape<_1, _1, _1>{});
    KVPipeline pipeline_v(smem.pipeline_v, v_params, Shape<_1, _1, _1>{});
    __syncthreads();  // barriers initialised before any role uses them
    run_roles<Config, kCausal, kSoftcap>(params, smem, pipeline_k, pipeline_v);
  } else {
    // A CTA pair's K/V buffers are filled by both CTAs and released by both CTAs' consumers (the
    // empty barriers then count one arrival per consumer warpgroup of the pair: pipeline.h).
    const int arrivals = params.pair == 1 ? Config::kMmaThreads : 2 * Config::kMmaWarpgroups;
    init_pipeline_barriers<KVPipeline>(smem.pipeline_k, arrivals);
    init_pipeline_barriers<KVPipeline>(smem.pipeline_v, arrivals);
    KVPipeline pipeline_k(smem.pipeline_k, k_params, Shape<_1, _1, _1>{}, cute::false_type{});
    KVPipeline pipeline_v(smem.pipeline_v, v_params, Shape<_1, _1, _1>{}, cute::false_type{});
    cute::cluster_arrive_relaxed();  // both CTAs' barriers initialised before either uses them
    cute::cluster_wait();
    run_roles<Config, kCausal, kSoftcap>(params, smem, pipeline_k, pipeline_v);
  }
}

}  // namespace fa::sm90
