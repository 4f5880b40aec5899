// The producer of the Hopper-family forward: one warp that loads Q, K and V with TMA.
//
// For each work tile of this CTA (tile_scheduler.h) it loads the Q tile once, into one of
// Config::kQStages buffers guarded by a transaction barrier (q_full), and streams the K and V
// tiles the query tile can see through two pipelines (kStages buffers each, PipelineTmaAsync: a
// full barrier the TMA completes with its byte count, an empty barrier every consumer thread
// arrives at when done with the buffer). Key tiles go from the last to the first, in the order the
// consumers use them: K[n] first, then K[n-1] before V[n], since the consumers start the next
// S = Q Kᵀ before this tile's O += P V. In a CTA pair (params.pair == 2, fwd_launch.h) both CTAs
// walk the same key tiles, and each loads its half of every K and V tile into both CTAs' buffers.
// Before exiting it then waits until every buffer has been released (both CTAs' consumers arrive
// at its empty barriers).
// Before a tile's Q, the warp waits for the consumers to be done with the tile that used its buffer
// before (Config::acquire_query: with one buffer, the previous tile, at the kQueryEmpty barrier;
// with two, the tile before it, at its q_empty mbarrier, long done by then).
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>

#include "common/attention_mask.h"
#include "common/sequence.h"
#include "sm90/fwd_config.h"
#include "sm90/named_barriers.h"
#include "sm90/tile_scheduler.h"
#include "sm90/transpose_v.h"

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

    // Rectangular: (S, D, H, B). Varlen: (total, D, H, 1), a sequence's tiles offset by its first row.
    const TensorExtents ext = TensorExtents::of(p);
    Tensor mQ = params.tma_q.get_tma_tensor(make_shape(ext.rows_q, p.head_dim, p.heads_q, ext.batches));
    Tensor mK = params.tma_k.get_tma_tensor(make_shape(ext.rows_k, p.head_dim, p.heads_kv, ext.batches));
    // FP8: V transposed, (Dv, S, H, B) (ForwardParams::v).
    Tensor mV = params.tma_v.get_tma_tensor([&] {
      if constexpr (Config::kFp8) {
        return make_shape(head_dim_v<Config>(p), int(p.v_stride.row), p.heads_kv, ext.batches);
      } else {
        return make_shape(ext.rows_k, head_dim_v<Config>(p), p.heads_kv, ext.batches);
      }
    }());
    // Whether tile t lies past its sequence's rows (varlen: the order covers the longest sequence).
    auto past_its_sequence = [&](int t) {
      const WorkTile w = TileScheduler::tile(params.scheduler, t);
      return w.m_block * Config::kBlockM >= Sequence::of(p, w.batch).seqlen_q;
    };
    Tensor sK = make_tensor(make_smem_ptr(smem.k.data()), typename Config::SmemLayoutKV{});
    Tensor sV = make_tensor(make_smem_ptr(smem.v.data()), typename Config::SmemLayoutV{});

    auto k_state = cutlass::make_producer_start_state<KVPipeline>();
    auto v_state = cutlass::make_producer_start_state<KVPipeline>();
    // K[n_blocks - 1], then K[n - 1] before V[n], V[0] last. A CTA pair (params.pair == 2,
    // non-causal only) loads each tile half by half, each CTA's half into both CTAs' buffers
    // (multicast: `mask...` is the pair's CTA mask); a buffer is refilled once both CTAs'
    // consumers are done with it (the pipelines count both).
    auto stream_kv = [&](int n_begin, int n_blocks, auto const& tma_k, auto const& tKgK, auto& tKsK, auto const& tma_v,
                         auto const& tVgV, auto& tVsV, auto... mask) {
      auto load = [&](KVPipeline& pipeline, auto& state, auto const& tma, auto const& src, auto& dst) {
        pipeline.producer_acquire(state);
        if (leader) copy(tma.with(*pipeline.producer_get_barrier(state), mask...), src, dst(_, state.index()));
        ++state;
      };
      int n = n_blocks - 1;
      load(pipeline_k, k_state, tma_k, tKgK(_, n), tKsK);
      for (; n > n_begin; --n) {
        load(pipeline_k, k_state, tma_k, tKgK(_, n - 1), tKsK);
        load(pipeline_v, v_state, tma_v, tVgV(_, n), tVsV);
      }
      load(pipeline_v, v_state, tma_v, tVgV(_, n_begin), tVsV);
    };

    int q_loads = 0;
    for (int t = blockIdx.x, handed = 0; t < params.scheduler.total; ++handed) {
      const WorkTile w = TileScheduler::tile(params.scheduler, t);
      const Sequence seq = Sequence::of(p, w.batch);
      const AttentionMask<kCausal> mask(seq.seqlen_q, seq.seqlen_k, p);
      // 0 past this sequence's rows (varlen: the order covers the longest), or where a window
      // leaves the tile no key: nothing to do.
      const int n_begin = Config::first_key_tile(mask, w.m_block);
      const int n_blocks = n_begin < Config::key_tiles(mask, seq.seqlen_q, w.m_block)
                               ? Config::key_tiles(mask, seq.seqlen_q, w.m_block) : 0;
      // The next tile is known as soon as this one's loads are issued (the consumers take it
      // from the hand-over when they finish this one).
      // With dynamic scheduling the tiles past their sequences are skipped here, so the consumers
      // are never handed one.
      auto advance = [&]() {
        t = TileScheduler::fetch_next(params.scheduler, t);
        if (params.scheduler.counter != nullptr) {
          if (p.cu_seqlens_q != nullptr) {
            while (t < params.scheduler.total && past_its_sequence(t)) {
              t = TileScheduler::fetch_next(params.scheduler, t);
            }
          }
          handoff.publish(t, handed == 0);
        }
      };
      if (n_blocks == 0) {  // the consumers write zeros (or skip the tile); nothing to load
        advance();
        continue;
      }

      const int b = ext.batch_index(w.batch);
      auto rows_from = [&](int first_row, auto const& m, int head) {
        return domain_offset(make_coord(first_row, _0{}), m(_, _, head, b));
      };
      auto q_rows = [&](auto const& m, int head) { return rows_from(seq.q_begin, m, head); };
      auto k_rows = [&](auto const& m, int head) { return rows_from(seq.k_begin, m, head); };
      Tensor gQ = local_tile(q_rows(mQ, w.head), typename Config::TileQ{}, make_coord(w.m_block, _0{}));
      Tensor gK = local_tile(k_rows(mK, w.head / group), typename Config::TileKV{},
                             make_coord(_, _0{}));  // (kBlockN, D, key tiles)
      Tensor gV = [&] {  // (kBlockN, Dv, key tiles), FP8 (Dv, kBlockN, key tiles)
        if constexpr (Config::kFp8) {
          Tensor keys = domain_offset(make_coord(_0{}, transposed_v_begin(p, w.batch)), mV(_, _, w.head / group, b));
          return local_tile(keys, typename Config::TileVLoad{}, make_coord(_0{}, _));
        } else {
          return local_tile(k_rows(mV, w.head / group), typename Config::TileV{}, make_coord(_, _0{}));
        }
      }();
      const int q_stage = q_loads % Config::kQStages;
      Tensor sQ = make_tensor(make_smem_ptr(Config::query_buffer(smem, q_stage)), typename Config::SmemLayoutQ{});
      auto [tQgQ, tQsQ] = tma_partition(params.tma_q, _0{}, Layout<_1>{}, group_modes<0, 2>(sQ),
                                        group_modes<0, 2>(gQ));
      auto [tKgK, tKsK] = tma_partition(params.tma_k, _0{}, Layout<_1>{}, group_modes<0, 2>(sK),
                                        group_modes<0, 2>(gK));
      auto [tVgV, tVsV] = tma_partition(params.tma_v, _0{}, Layout<_1>{}, group_modes<0, 2>(sV),
                                        group_modes<0, 2>(gV));

      Config::acquire_query(smem, q_loads++);
      if (leader) {
        cutlass::arch::ClusterTransactionBarrier::arrive_and_expect_tx(&smem.q_full[q_stage], Config::kQBytes);
        copy(params.tma_q.with(smem.q_full[q_stage]), tQgQ, tQsQ);
      }
      if constexpr (!kCausal && Config::kPairs) {
        if (params.pair > 1) {
          const int rank = static_cast<int>(cute::block_rank_in_cluster());
          auto [tKgK2, tKsK2] = tma_partition(params.tma_k_pair, rank, Layout<_2>{}, group_modes<0, 2>(sK),
                                              group_modes<0, 2>(gK));
          auto [tVgV2, tVsV2] = tma_partition(params.tma_v_pair, rank, Layout<_2>{}, group_modes<0, 2>(sV),
                                              group_modes<0, 2>(gV));
          stream_kv(n_begin, n_blocks, params.tma_k_pair, tKgK2, tKsK2, params.tma_v_pair, tVgV2, tVsV2, uint16_t(0b11));
          advance();
          continue;
        }
      }
      stream_kv(n_begin, n_blocks, params.tma_k, tKgK, tKsK, params.tma_v, tVgV, tVsV);
      advance();
    }
    if constexpr (!kCausal && Config::kPairs) {
      // The other CTA of a pair arrives at this CTA's empty barriers: this one may exit only once
      // it has (every buffer released).
      if (params.pair > 1) {
        pipeline_k.producer_tail(k_state);
        pipeline_v.producer_tail(v_state);
      }
    }
  }
};

}  // namespace fa::sm90
