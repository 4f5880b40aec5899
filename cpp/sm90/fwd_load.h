// The producer of the Hopper-family forward: one warp that loads Q, K and V with TMA.
//
// For each work tile of this CTA (tile_scheduler.h) it loads the Q tile once, into a buffer guarded
// by the transaction barrier q_full, and streams the K and V tiles the query tile can see through
// two pipelines (kStages buffers each, PipelineTmaAsync: a full barrier the TMA completes with its
// byte count, an empty barrier every consumer thread arrives at when done with the buffer). Key
// tiles go from the last to the first, in the order the consumers use them: K[n] first, then
// K[n-1] before V[n], since the consumers start the next S = Q Kᵀ before this tile's O += P V.
// Before the next tile's Q, the warp waits at the kQueryEmpty barrier for the consumers to be done
// with the previous one.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>

#include "common/attention_mask.h"
#include "sm90/named_barriers.h"
#include "sm90/tile_scheduler.h"

namespace fa::sm90 {

template <class Config, bool kCausal>
struct ForwardLoad {
  using Element = typename Config::Element;
  using KVPipeline = typename Config::KVPipeline;

  template <class Params, class Storage, class Handoff>
  CUTE_DEVICE static void run(Params const& params, Storage& smem, KVPipeline& pipeline_k,
                              KVPipeline& pipeline_v, Handoff const& handoff) {
    using namespace cute;
    const ForwardParams& p = params.attn;
    const bool leader = elect_one_sync();
    const int group = p.heads_q / p.heads_kv;

    Tensor mQ = params.tma_q.get_tma_tensor(make_shape(p.seqlen_q, p.head_dim, p.heads_q, p.batch));
    Tensor mK = params.tma_k.get_tma_tensor(make_shape(p.seqlen_k, p.head_dim, p.heads_kv, p.batch));
    Tensor mV = params.tma_v.get_tma_tensor(make_shape(p.seqlen_k, p.head_dim, p.heads_kv, p.batch));
    Tensor sQ = make_tensor(make_smem_ptr(smem.q.data()), typename Config::SmemLayoutQ{});
    Tensor sK = make_tensor(make_smem_ptr(smem.k.data()), typename Config::SmemLayoutKV{});
    Tensor sV = make_tensor(make_smem_ptr(smem.v.data()), typename Config::SmemLayoutKV{});

    auto load_kv = [&](KVPipeline& pipeline, auto& state, auto const& tma, auto const& src,
                       auto& dst) {
      pipeline.producer_acquire(state);
      if (leader) copy(tma.with(*pipeline.producer_get_barrier(state)), src, dst(_, state.index()));
      ++state;
    };

    auto k_state = cutlass::make_producer_start_state<KVPipeline>();
    auto v_state = cutlass::make_producer_start_state<KVPipeline>();
    const AttentionMask<kCausal> mask(p.seqlen_q, p.seqlen_k);
    int q_loads = 0;
    for (int t = blockIdx.x, handed = 0; t < params.scheduler.total; ++handed) {
      const WorkTile w = TileScheduler::tile(params.scheduler, t);
      const int n_blocks = Config::key_tiles(mask, p.seqlen_q, w.m_block);
      // The next tile is known as soon as this one's loads are issued (the consumers take it
      // from the hand-over when they finish this one).
      auto advance = [&]() {
        t = TileScheduler::fetch_next(params.scheduler, t);
        if (params.scheduler.counter != nullptr) handoff.publish(t, handed == 0);
      };
      if (n_blocks == 0) {  // the consumers write zeros; nothing to load
        advance();
        continue;
      }

      Tensor gQ = local_tile(mQ(_, _, w.head, w.batch), typename Config::TileQ{},
                             make_coord(w.m_block, _0{}));
      Tensor gK = local_tile(mK(_, _, w.head / group, w.batch), typename Config::TileKV{},
                             make_coord(_, _0{}));  // (kBlockN, D, key tiles)
      Tensor gV = local_tile(mV(_, _, w.head / group, w.batch), typename Config::TileKV{},
                             make_coord(_, _0{}));
      auto [tQgQ, tQsQ] = tma_partition(params.tma_q, _0{}, Layout<_1>{}, group_modes<0, 2>(sQ),
                                        group_modes<0, 2>(gQ));
      auto [tKgK, tKsK] = tma_partition(params.tma_k, _0{}, Layout<_1>{}, group_modes<0, 2>(sK),
                                        group_modes<0, 2>(gK));
      auto [tVgV, tVsV] = tma_partition(params.tma_v, _0{}, Layout<_1>{}, group_modes<0, 2>(sV),
                                        group_modes<0, 2>(gV));

      if (q_loads++ > 0) barrier_sync(ForwardBarrier::kQueryEmpty, Config::kMmaThreads + 32);
      if (leader) {
        cutlass::arch::ClusterTransactionBarrier::arrive_and_expect_tx(&smem.q_full, Config::kQBytes);
        copy(params.tma_q.with(smem.q_full), tQgQ, tQsQ);
      }
      int n = n_blocks - 1;
      load_kv(pipeline_k, k_state, params.tma_k, tKgK(_, n), tKsK);
      for (; n > 0; --n) {
        load_kv(pipeline_k, k_state, params.tma_k, tKgK(_, n - 1), tKsK);
        load_kv(pipeline_v, v_state, params.tma_v, tVgV(_, n), tVsV);
      }
      load_kv(pipeline_v, v_state, params.tma_v, tVgV(_, 0), tVsV);
      advance();
    }
  }
};

}  // namespace fa::sm90
