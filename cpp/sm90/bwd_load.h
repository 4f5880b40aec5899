// The producer of the Hopper-family backward: one warp that, for each key tile its persistent CTA
// takes, loads K and V once, then streams each step's Q tile (with its rows' lse) and dO tile
// (with its rows' delta) through two pipelines.
//
// K and V come by TMA under one transaction barrier (kv_full), once the previous key tile's
// epilogue has stored dK and dV from their buffers (kv_empty). Q and dO come by TMA, the 4-byte
// lse and delta rows by 1-D bulk copies from the pre-pass's padded workspaces, each pair under its
// pipeline stage's full barrier (PipelineTmaAsync: kStages buffers, the consumers release a buffer
// once the GEMMs reading it are done). The pipelines run on from one key tile to the next: the
// next tile's first Q and dO are loaded while this tile's last steps and epilogue run.
#pragma once

#include <cute/tensor.hpp>
#include <cute/arch/copy_sm90_tma.hpp>
#include <cutlass/arch/barrier.h>

#include "common/attention_mask.h"
#include "common/backward_rows.h"
#include "common/bulk_reduce.h"
#include "common/dq_claims.h"
#include "common/grid_dependency.h"
#include "common/sequence.h"
#include "fa/params.h"
#include "sm90/bwd_config.h"
#include "sm90/named_barriers.h"
#include "sm90/tile_scheduler.h"

namespace fa::sm90 {

// The hand-over of a persistent CTA's next key tile from the producer warp to the consumers and
// warp 1: the dQ writer (kWriter) or, where there is none, the turn keeper of a deterministic call
// (`keeper`; BackwardTurnKeeper). One shared-memory slot, refilled once every reader has read it.
// The consumers wait and arrive on two named barriers with the producer warp, as TileHandoff
// (tile_scheduler.h); warp 1, which runs other code, on two mbarriers of one arrival each
// (writer_tile_full from the producer, writer_tile_empty from warp 1): every named barrier then
// has one place in the code that waits on it (compute-sanitizer's synccheck reports a barrier
// waited on at two places as divergent threads).
template <int kThreads, bool kWriter>
struct BackwardTileHandoff {
  int* slot;
  uint64_t* writer_full;
  uint64_t* writer_empty;
  bool keeper;  // !kWriter: warp 1 takes the hand-overs (a runtime choice: deterministic calls only)

  CUTE_DEVICE bool to_warp1() const { return kWriter || keeper; }

  // Producer warp, hand-over number `handed` (from 0). Before the first the slot is free; after
  // it, wait until the previous index is read.
  CUTE_DEVICE void publish(int next, int handed) const {
    if (handed > 0) {
      barrier_sync(BackwardBarrier::kTileEmpty, kThreads);
      if (to_warp1()) cutlass::arch::ClusterBarrier::wait(writer_empty, (handed - 1) % 2);
    }
    const bool leader = cute::elect_one_sync();
    if (leader) *slot = next;
    barrier_arrive(BackwardBarrier::kTileFull, kThreads);
    if (to_warp1()) {
      if (leader) cutlass::arch::ClusterBarrier::arrive(writer_full);
    }
  }

  // Consumer threads.
  CUTE_DEVICE int receive() const {
    barrier_sync(BackwardBarrier::kTileFull, kThreads);
    const int next = *slot;
    barrier_arrive(BackwardBarrier::kTileEmpty, kThreads);
    return next;
  }

  // Warp 1, hand-over number `received` (from 0).
  CUTE_DEVICE int receive_in_warp1(int received) const {
    cutlass::arch::ClusterBarrier::wait(writer_full, received % 2);
    const int next = *slot;
    __syncwarp();
    if (cute::elect_one_sync()) cutlass::arch::ClusterBarrier::arrive(writer_empty);
    return next;
  }
};

// The steps of one CTA (key tile n_block of kv head head_kv): for each query head of the kv head's
// group, the query tiles that see any of its keys. Producer and consumers walk the same list.
//
// Not causal, each key tile starts at its own query tile and wraps around: the CTAs that run at
// once (consecutive key tiles of one head) then read Q and dO and add their dQ partials at
// different query tiles, not all at the same one at once (measured 1-2.6% faster at D = 128, up
// to 1.8% at 64, level at 256). The start is n_block times a
// stride of ~0.62 of the count (mod the count), not n_block itself: measured 2.3% faster at
// (4, 64, 8192, 128), level on the other D = 128 rows (docs/tried.md, 610efe9). Likely why: the persistent
// CTAs start their key tiles staggered in time, about one step apart where the count is about
// the SMs' (128 query tiles, 132 SMs), and starts n_block steps apart undo that stagger, so a
// head's CTAs meet at the same query tiles again; the stride's starts are spread whether the
// CTAs run in lockstep or staggered. Causal key tiles start at their diagonals already.
//
// Deterministic (BackwardParams::deterministic), not causal: every key tile walks its query tiles
// from the last down: the key tiles of a head that run at once then come to each query tile in the
// order of their index, the order in which their dQ partials must be added (common/dq_claims.h),
// each a little behind the one before; from rotated starts, a key tile would come to most query
// tiles before the ones it must wait for. Causal calls of many key tiles (`from_last`:
// BackwardTileOrder's shortest_first) walk up from their diagonals as in the default mode, and
// the partials are added from the last key tile down (dq_turn_from_last): at every query tile the
// key tile before one in that order is the next shorter, two steps ahead of it (at 64-row query
// tiles and 128-key tiles) where both started together; from the last query tile down, all would
// come to it together and wait in a chain, and under GQA each of a group's later heads would put a
// key tile further behind the one it waits for.
template <int kBlockM, int kBlockN, bool kCausal>
struct BackwardSteps {
  int head0;    // first query head of the group
  int count;    // query tiles · group
  int first;    // the first step's query tile
  int wrap;     // one past the last query tile in the walk's direction: it goes on from restart
  int restart;
  int dir;      // +1 or -1

  CUTE_DEVICE BackwardSteps(const BackwardParams& p, const Sequence& seq, int n_block, int head_kv, bool from_last) {
    const AttentionMask<kCausal> mask(seq.seqlen_q, seq.seqlen_k, p);
    const int m_end = (cute::min(seq.seqlen_q, mask.rows_end_seeing((n_block + 1) * kBlockN)) + kBlockM - 1) / kBlockM;
    // The query tiles that see a key of the tile (from the first, up to a window's left bound).
    const int m_begin = cute::min(mask.first_row_seeing(n_block * kBlockN) / kBlockM, m_end);
    const int m_tiles = m_end - m_begin;
    const int group = p.heads_q / p.heads_kv;
    head0 = head_kv * group;
    count = m_tiles * group;
    if (p.deterministic && !from_last) {
      first = m_end - 1;
      wrap = m_begin - 1;
      restart = m_end - 1;
      dir = -1;
    } else {
      int rotate = 0;
      if (!kCausal && m_tiles > 0) {
        const int64_t stride = (int64_t(m_tiles) * 79 / 128) | 1;
        rotate = int(int64_t(n_block) * stride % m_tiles);
      }
      first = m_begin + rotate;
      wrap = m_end;
      restart = m_begin;
      dir = 1;
    }
  }
  // A step: its index t, query head and query tile, walked one step at a time (first, advance)
  // by every role, without a division and remainder by the tile count in the loop (~25
  // instructions, a MUFU.RCP among them): measured 3-4% faster at D = 64 causal and
  // (2, 64, 4096, 128) causal, level on the other rows, for the D <= 128 consumers; at D = 256
  // (bwd_mma_split.h) level to 1.5% faster once the division no longer held back a GEMM's issue
  // (docs/tried.md: e5d052a, 84708e1).
  struct Step {
    int t;
    int head;
    int m_block;
  };
  CUTE_DEVICE Step first_step() const { return {0, head0, first}; }
  CUTE_DEVICE void advance(Step& s) const {
    ++s.t;
    s.m_block += dir;
    if (s.m_block == wrap) s.m_block = restart;
    if (s.m_block == first) ++s.head;  // back at the first query tile: the next head
  }
  // The step's first row in the workspaces' row space (lse_log2, delta, dQ).
  CUTE_DEVICE int64_t workspace_row(const BackwardParams& p, const Sequence& seq, int batch, Step const& s) const {
    return seq.workspace_row(p, batch, s.head) + s.m_block * kBlockM;
  }
};

// Deterministic: the turn of key tile n_block at the query tile of rows from row_begin, in the
// order from the last key tile that sees it where from_last (BackwardSteps says why), else from the
// first.
template <int kBlockM, int kBlockN, class Mask>
CUTE_DEVICE int backward_dq_turn(Mask const& mask, int n_block, int row_begin, bool from_last) {
  return from_last ? dq_turn_from_last(mask, n_block, row_begin + kBlockM, kBlockN)
                   : dq_turn(mask, n_block, row_begin, kBlockN);
}

// Tile `tile` (along the rows, from row `first_row`) of head `head` of batch `batch` of a TMA
// tensor m (rows, D, heads, batches), partitioned for a TMA copy to or from the shared-memory tile s
// (which may have a trailing stage mode): (global, shared). A varlen sequence's tiles start at its
// first row of the packed tensor (batch 0).
template <class Tile, class Tma, class GlobalTensor, class SharedTensor>
CUTE_DEVICE auto tma_tile(Tma const& tma, GlobalTensor const& m, SharedTensor const& s, int tile, int head,
                          int batch, int first_row) {
  using namespace cute;
  Tensor g = local_tile(domain_offset(make_coord(first_row, _0{}), m(_, _, head, batch)), Tile{},
                        make_coord(tile, _0{}));
  return tma_partition(tma, _0{}, Layout<_1>{}, group_modes<0, 2>(s), group_modes<0, 2>(g));
}

template <class Config, bool kCausal>
struct BackwardLoad {
  using Pipeline = typename Config::Pipeline;
  using PipelinedO = typename Config::PipelinedO;

  template <class Params, class Storage, class Handoff>
  CUTE_DEVICE static void run(Params const& params, Storage& smem, Pipeline& pipeline_q,
                              PipelinedO& pipeline_do, Handoff const& handoff) {
    using namespace cute;
    const BackwardParams& p = params.attn;
    const bool leader = elect_one_sync();

    const TensorExtents ext = TensorExtents::of(p);
    Tensor mQ = params.tma_q.get_tma_tensor(make_shape(ext.rows_q, p.head_dim, p.heads_q, ext.batches));
    Tensor mdO = params.tma_do.get_tma_tensor(make_shape(ext.rows_q, p.head_dim_v, p.heads_q, ext.batches));
    Tensor mK = params.tma_k.get_tma_tensor(make_shape(ext.rows_k, p.head_dim, p.heads_kv, ext.batches));
    Tensor mV = params.tma_v.get_tma_tensor(make_shape(ext.rows_k, p.head_dim_v, p.heads_kv, ext.batches));
    const BackwardSmemTensors<Config> sm(smem);

    auto q_state = cutlass::make_producer_start_state<Pipeline>();
    auto do_state = cutlass::make_producer_start_state<PipelinedO>();
    int kv_tiles = 0;  // key tiles whose K and V this CTA has loaded
    int handed = 0;    // next-tile indices handed over
    // The wait for the pre-pass (grid_dependency.h) comes after the first tile's K, V and Q loads
    // (inputs, complete before the pre-pass started) and before its step 0's lse, which the
    // pre-pass writes: measured 3-4 µs a call faster at (1, 64, 1024, 128) (docs/tried.md,
    // 4993c4c).
    bool waited = false;
    auto wait_once = [&]() {
      if (!waited) wait_for_prior_grid();
      waited = true;
    };
    for (int tile_index = blockIdx.x; tile_index < params.order.size();) {
      const auto tile = params.order.tile(tile_index);
      const int n_block = tile.n_block, head_kv = tile.head_kv, batch = tile.batch;
      const Sequence seq = Sequence::of(p, batch);
      const bool has_keys = n_block * Config::kBlockN < seq.seqlen_k;  // else varlen: no work
      const int b = ext.batch_index(batch);
      const BackwardSteps<Config::kBlockM, Config::kBlockN, kCausal> steps(p, seq, n_block, head_kv,
                                                                        params.order.shortest_first);
      const int count = has_keys ? steps.count : 0;
      // A unit the main kernel prepares (BackwardParams::unit_ready): its rows' lse_log2 and delta
      // once they are written, before any of this tile's loads (whose barriers the consumers wait
      // on: that orders their reads, and at D = 256 their dQ reductions into the zeroed
      // workspace, after the rows' writes too), then the async proxy's view.
      const int unit = batch * p.heads_kv + head_kv;
      if (Config::kRowsInMainKernel && count > 0 && p.unit_ready != nullptr && unit >= p.prepared_units) {
        wait_once();
        wait_unit_prepared(p, unit);
        fence_view_async_global();
      }

      // K and V, once the previous key tile's dK and dV have left their buffers.
      auto load_kv = [&]() {
        if (kv_tiles > 0) cutlass::arch::ClusterBarrier::wait(&smem.kv_empty, (kv_tiles - 1) % 2);
        if (leader) {
          auto [tKgK, tKsK] = tma_tile<typename Config::TileK>(params.tma_k, mK, sm.k, n_block, head_kv, b, seq.k_begin);
          auto [tVgV, tVsV] = tma_tile<typename Config::TileV>(params.tma_v, mV, sm.v, n_block, head_kv, b, seq.k_begin);
          cutlass::arch::ClusterTransactionBarrier::arrive_and_expect_tx(&smem.kv_full, Config::kKVBytes);
          copy(params.tma_k.with(smem.kv_full), tKgK, tKsK);
          copy(params.tma_v.with(smem.kv_full), tVgV, tVsV);
        }
        ++kv_tiles;
      };
      // A tile by TMA and its rows' values (lse_log2 or delta) by a 1-D bulk copy, both completing
      // on the stage's full barrier.
      using Step = typename decltype(steps)::Step;
      auto load = [&](Step const& step, auto tile_shape, auto& pipeline, auto& state, auto const& tma, auto const& m,
                      auto& s, float* rows_smem, const float* rows_gmem) {
        pipeline.producer_acquire(state);
        if (leader) {
          auto [tg, ts] = tma_tile<decltype(tile_shape)>(tma, m, s, step.m_block, step.head, b, seq.q_begin);
          uint64_t* barrier = pipeline.producer_get_barrier(state);
          copy(tma.with(*barrier), tg, ts(_, state.index()));
        }
        wait_once();  // lse_log2 and delta are the pre-pass's
        if (leader) {
          const int64_t row = steps.workspace_row(p, seq, batch, step);
          uint64_t* barrier = pipeline.producer_get_barrier(state);
          SM90_BULK_COPY_G2S::copy(rows_gmem + row, barrier, rows_smem + state.index() * Config::kBlockM,
                                   Config::kRowBytes);
        }
        ++state;
      };
      // Step 0's Q and dO first: their buffers free up as the previous tile's last steps finish,
      // K's and V's only after its epilogue. The next tile's index is handed over once K and V
      // are loaded (the consumers and the dQ writer read it at this tile's end).
      const bool kv_first = !waited && count > 0;  // the CTA's first tile: K and V before the wait
      if (kv_first) load_kv();
      for (auto step = steps.first_step(); step.t < count; steps.advance(step)) {
        load(step, typename Config::TileQ{}, pipeline_q, q_state, params.tma_q, mQ, sm.q, smem.lse_log2.data(),
             p.lse_log2);
        load(step, typename Config::TileDO{}, pipeline_do, do_state, params.tma_do, mdO, sm.dout, smem.delta.data(),
             p.delta);
        if (step.t == 0 && !kv_first) load_kv();
      }
      if (has_keys && count == 0) load_kv();  // no step: the epilogue still stores zeros from K's and V's buffers
      wait_once();  // the tile counter is the pre-pass's
      const int next = next_tile_from(p.tile_counter, tile_index);
      handoff.publish(next, handed++);
      tile_index = next;
    }
  }
};

// Warp 1's walk over its CTA's key tiles (the dQ writer's and the turn keeper's), as the hand-over
// gives them: fn(tile, seq, steps, count, mask) for each, count 0 where a varlen sequence has no key
// in the tile.
template <class Config, bool kCausal, class Params, class Handoff, class Fn>
CUTE_DEVICE void for_each_key_tile_in_warp1(Params const& params, Handoff const& handoff, Fn&& fn) {
  const BackwardParams& p = params.attn;
  int received = 0;
  for (int tile_index = blockIdx.x; tile_index < params.order.size();
       tile_index = handoff.receive_in_warp1(received++)) {
    const auto tile = params.order.tile(tile_index);
    const Sequence seq = Sequence::of(p, tile.batch);
    const BackwardSteps<Config::kBlockM, Config::kBlockN, kCausal> steps(
        p, seq, tile.n_block, tile.head_kv, params.order.shortest_first);
    const int count = tile.n_block * Config::kBlockN < seq.seqlen_k ? steps.count : 0;
    const AttentionMask<kCausal> mask(seq.seqlen_q, seq.seqlen_k, p);
    fn(tile, seq, steps, count, mask);
  }
}

// The dQ writer (warp 1 of the producer warpgroup): adds each consumer warpgroup's staged dQ tile
// of each step to the fp32 workspace with one bulk reduction (cp.reduce.async.bulk), so that the
// consumers only write their tile and arrive (bar.arrive) instead of waiting for the reduction's
// issue, and the workspace address is computed here. Per consumer warpgroup w, two named barriers
// of its 128 threads and this warp:
//   kdQFull + w   consumers arrive once their tile of step t is in shared memory; the writer waits;
//   kdQEmpty + w  the writer arrives once the buffer of step t + 1 (the one step t + 1 -
//                 kdQStages used) has been read by its reduction; the consumers wait before
//                 writing into it.
// Config::kdQClaims (or kdQClaimsAtRunTime and BackwardParams::dq_claims set): the workspace is
// not zeroed; the first key tile to come to a query tile stores its partial, and the others add to
// it once that store is complete (common/dq_claims.h).
// Deterministic: the key tiles add in turn, the first in the order storing (common/dq_claims.h);
// the writer waits for its turn, and passes it on at its next step (or the tile's end), once its
// additions have completed: in a tile of kLateTurnSteps steps or fewer before waiting for the next
// step's turn; in a longer one after issuing the next step's additions, so that the writer does not
// wait for the L2 to finish a step's additions while the consumers wait for their staging buffers
// (bulk reductions have no completion test but the wait). Passing late puts each key tile a step
// behind the one before it in a query tile's order, once at its start: what a long tile amortises.
// Measured (H200, bf16, deterministic / default): (2, 16, 16384, 128) 0.89 -> 0.91 (0.93 causal),
// (4, 64, 8192, 128) causal 0.90 -> 0.97; (1, 64, 1024, 128) (16 steps a tile) passing late 0.93 ->
// 0.77 causal.
inline constexpr int kLateTurnSteps = 32;

template <class Config, bool kCausal>
struct BackwardDqWriter {
  static constexpr int kBarrierThreads = 128 + 32;
  static_assert(Config::kBlockM % kDqClaimRows == 0, "a query tile is whole claims");

  template <class Params, class Storage, class Handoff>
  CUTE_DEVICE static void run(Params const& params, Storage& smem, Handoff const& handoff) {
    constexpr int kWarpgroups = Config::kMmaWarpgroups;
    constexpr int kFloats = Config::kdQWarpgroupFloats;
    const BackwardParams& p = params.attn;
    const bool leader = cute::elect_one_sync();
    // Claims instead of a zeroed workspace (the launcher leaves dq_claims set where it chose them).
    const bool claiming =
        Config::kdQClaims || (Config::kdQClaimsAtRunTime && p.dq_claims != nullptr && !p.deterministic);
    int* pending = nullptr;  // the leader's: a tile it stored whose claim (turn) it has not published (passed)
    auto publish = [&] {
      if (pending != nullptr) {
        if (p.deterministic) dq_turn_pass_bulk(pending);
        else dq_claim_publish(pending);
      }
      pending = nullptr;
    };
    for_each_key_tile_in_warp1<Config, kCausal>(params, handoff, [&](auto const& tile, Sequence const& seq,
                                                                      auto const& steps, int count, auto const& mask) {
      // A unit the main kernel prepares: its workspace rows zeroed (or claims) before the first
      // reduction (or claim), which runs in the async proxy.
      if (Config::kRowsInMainKernel && count > 0 && p.unit_ready != nullptr) {
        wait_unit_prepared(p, tile.batch * p.heads_kv + tile.head_kv);
        fence_view_async_global();
      }
      if (count > 0) {
        for (int w = 0; w < kWarpgroups; ++w) barrier_arrive(BackwardBarrier::kdQEmpty, kBarrierThreads, w);
      }
      const bool pass_late = p.deterministic && count > kLateTurnSteps;
      for (auto step = steps.first_step(); step.t < count; steps.advance(step)) {
        const int t = step.t;
        const float* staging = smem.dq.data() + Config::dq_staging_buffer(t);
        const int64_t row = steps.workspace_row(p, seq, tile.batch, step);
        float* dq_tile = p.dq_accum + row * Config::kHeadDim;
        int* claim = p.dq_claims != nullptr ? p.dq_claims + row / kDqClaimRows : nullptr;
        int state = kWritten;
        if (p.deterministic) {
          if (leader) {
            if (!pass_late) publish();  // the step before's turn, before waiting for this one
            int turn = backward_dq_turn<Config::kBlockM, Config::kBlockN>(
                mask, tile.n_block, step.m_block * Config::kBlockM, params.order.shortest_first);
            if (p.dq_accum_odd != nullptr) {  // two orders: the even turns' and the odd turns'
              if (turn % 2 != 0) {
                dq_tile = p.dq_accum_odd + row * Config::kHeadDim;
                claim = p.dq_claims_odd + row / kDqClaimRows;
              }
              turn /= 2;
            }
            dq_turn_wait(claim, turn);
            fence_view_async_global();  // the bulk operations after the acquire
            state = turn == 0 ? kUnclaimed : kWritten;
          }
        } else if (claiming) {
          if (leader) {
            publish();  // the step before's store (if first there) has had a step to complete
            state = dq_claim(claim);
          }
        }
        CUTE_UNROLL
        for (int w = 0; w < kWarpgroups; ++w) {
          barrier_sync(BackwardBarrier::kdQFull, kBarrierThreads, w);
          if (leader) {
            if (state == kUnclaimed) {
              bulk_store(dq_tile + w * kFloats, staging + w * kFloats, kFloats * int(sizeof(float)));
            } else {
              if (claiming && w == 0) {
                if (state == kClaimed) dq_claim_wait_written(claim);  // this CTA holds no unpublished claim
                fence_view_async_global();  // the bulk reduction after the acquire
              }
              bulk_reduce_add(dq_tile + w * kFloats, staging + w * kFloats, kFloats * int(sizeof(float)));
            }
            // Warpgroup w's copy of step t + 1 - kdQStages has read its buffer once at most the
            // newer ones (kWarpgroups a step since) are pending.
            bulk_reduce_wait_read<kWarpgroups * (Config::kdQStages - 1)>();
          }
          __syncwarp();
          if (t + 1 < count) barrier_arrive(BackwardBarrier::kdQEmpty, kBarrierThreads, w);
        }
        if (leader && pass_late && pending != nullptr) {
          dq_turn_pass_bulk<kWarpgroups>(pending);  // the step before's, once only this step's are pending
          pending = nullptr;
        }
        if (leader && (state == kUnclaimed || p.deterministic)) pending = claim;
      }
      // Every copy of the tile has read its buffer before the next tile's first step writes into
      // them (and before the CTA exits); their additions in L2 complete on their own (as a TMA
      // store's do), visible to the next kernel. A store still unpublished is published here.
      if (leader) {
        if (pending != nullptr) publish();
        else bulk_reduce_wait_read();
      }
      __syncwarp();
    });
  }
};

// The turn keeper (warp 1 of the producer warpgroup where the consumers add dQ from registers,
// Config::kdQFromRegisters, and there is no dQ writer; deterministic calls only). Per step it waits
// until the step's dQ tile has counted the turns of the key tiles before this one
// (common/dq_claims.h), while the consumers compute the step; tells them (kTurnReady: they wait
// only where the turn has not come); and once they have added their partial (kTurnDone, arrived
// at as they go on) passes the turn. The consumers' 8 warps neither spin on the count in global
// memory nor release it, and the wait for the next step's turn starts as soon as this one is
// passed.
template <class Config, bool kCausal>
struct BackwardTurnKeeper {
  static constexpr int kBarrierThreads = Config::kMmaThreads + 32;

  template <class Params, class Handoff>
  CUTE_DEVICE static void run(Params const& params, Handoff const& handoff) {
    const BackwardParams& p = params.attn;
    const bool leader = cute::elect_one_sync();
    for_each_key_tile_in_warp1<Config, kCausal>(params, handoff, [&](auto const& tile, Sequence const& seq,
                                                                      auto const& steps, int count, auto const& mask) {
      // A unit the main kernel prepares: its turn counts zeroed before the first wait on them.
      if (Config::kRowsInMainKernel && count > 0) wait_unit_prepared(p, tile.batch * p.heads_kv + tile.head_kv);
      for (auto step = steps.first_step(); step.t < count; steps.advance(step)) {
        int* const turns = p.dq_claims + steps.workspace_row(p, seq, tile.batch, step) / kDqClaimRows;
        if (leader) {
          dq_turn_wait(turns, backward_dq_turn<Config::kBlockM, Config::kBlockN>(
                                  mask, tile.n_block, step.m_block * Config::kBlockM, params.order.shortest_first));
        }
        __syncwarp();
        barrier_arrive(BackwardBarrier::kTurnReady, kBarrierThreads);
        barrier_sync(BackwardBarrier::kTurnDone, kBarrierThreads);
        if (leader) dq_turn_pass(turns);  // release: the consumers' additions, ordered by the barrier
      }
    });
  }
};

}  // namespace fa::sm90
