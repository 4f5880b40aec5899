// The Ampere-family backward kernel: FlashAttention-2's backward on mma.sync, cp.async, ldmatrix.
//
// Algorithm. One CTA owns kBlockN keys of one (batch, kv head): its K and V tiles stay in shared
// memory while it walks every query tile that sees them, for each query head of the kv head's
// group in turn (grouped-query attention sums dK and dV over the group in registers, with no
// atomics and no extra memory). For each query tile it recomputes
//   S = Q Kᵀ,  P = exp(S·scale - lse)            (lse saved by the forward: P is never stored)
//   dP = dO Vᵀ,  dS = P ∘ (dP - delta)           (delta = rowsum(dO ∘ O), from the pre-pass)
// and accumulates dV += Pᵀ dO and dK += dSᵀ Q in registers; dQ += dS K goes to an fp32 workspace
// that other CTAs (the other key tiles) add to as well, which the post-pass scales and converts.
// On sm90 a step's dQ tile is staged in shared memory and added with one bulk reduction, issued by
// one thread at the start of the next step (Config::kDqReduce; dq_reduce.h); otherwise with
// per-element global reductions.
//
// Tile plan. kBlockM × kBlockN steps, three warp arrangements (bwd_config.h). P and dS go through
// shared memory in fp16/bf16: the dK/dV GEMMs read them transposed with ldmatrix.trans, as they
// read dO and Q; the dQ GEMM reads dS as it is and K transposed.
//
// Pipeline and synchronisation. Q and dO are double-buffered (dO single where kdOStages is 1).
// A step on query tile t:
//   wait all; __syncthreads   Q[t], dO[t] visible; every warp is done with step t-1 (its P, dS,
//                             and the Q and dO stages that step t+1 loads into)
//   issue Q[t+1] with its rows' lse and delta, dO[t+1]
//                             (single dO buffer: dO[t+1] waits for the dV GEMM, below)
//   S = Q Kᵀ; mask; P -> smem; dP = dO Vᵀ; dS -> smem
//   __syncthreads             P and dS visible to all warps
//   dV += Pᵀ dO
//   (single dO buffer: __syncthreads, every warp is done reading dO[t]; issue dO[t+1])
//   dQ = dS K -> global reductions, or -> dQ staging smem (bulk: thread 0 issued step t-1's
//                             reduction after the first barrier and waited for its reads before
//                             the second)
//   dK += dSᵀ Q
//
// Deterministic (BackwardParams::deterministic): the key tiles add their dQ partials to each query
// tile in turn, in the order of n_block (common/dq_claims.h), and walk their query tiles from the
// last down, so that they come to each in about that order (sm90/bwd_load.h's BackwardSteps says
// why). Thread 0 waits for a tile's turn before the barrier after which the tile is added (its
// bulk reduction, or every thread's reductions), and passes it on after the next barrier (bulk:
// once its reduction has completed).
#pragma once

#include <cute/tensor.hpp>

#include "common/attention_mask.h"
#include "common/backward_rows.h"
#include "common/dq_claims.h"
#include "common/sequence.h"
#include "common/softcap.h"
#include "fa/params.h"
#include "sm80/dq_reduce.h"
#include "sm80/fragments.h"
#include "sm80/gemm.h"
#include "sm80/tile_copy.h"

namespace fa::sm80 {

template <class Config, bool kCausal, bool kSoftcap>
__global__ void __launch_bounds__(Config::kThreads, 1)
    backward_kernel(const __grid_constant__ BackwardParams params) {
  using namespace cute;
  using Element = typename Config::Element;
  constexpr int kBlockM = Config::kBlockM;
  constexpr int kBlockN = Config::kBlockN;
  constexpr int kHeadDim = Config::kHeadDim;
  using QTile = Shape<Int<kBlockM>, Int<kHeadDim>>;
  using KVTile = Shape<Int<kBlockN>, Int<kHeadDim>>;
  using STile = Shape<Int<kBlockM>, Int<kBlockN>>;

  extern __shared__ __align__(128) char smem[];
  const int tid = threadIdx.x;
  const int n_block = blockIdx.x;
  const int head_kv = blockIdx.y;
  const int batch = blockIdx.z;
  const int group = params.heads_q / params.heads_kv;
  const int key_begin = n_block * kBlockN;
  const Sequence seq = Sequence::of(params, batch);
  const int keys_left = seq.seqlen_k - key_begin;
  if (keys_left <= 0) return;  // varlen: the grid covers the longest sequence
  const AttentionMask<kCausal> mask(seq.seqlen_q, seq.seqlen_k, params);

  // The query tiles that see these keys.
  const int m_end = (min(seq.seqlen_q, mask.rows_end_seeing(key_begin + kBlockN)) + kBlockM - 1) / kBlockM;
  const int m_begin = mask.first_row_seeing(key_begin) / kBlockM;
  const int m_tiles = max(0, m_end - m_begin);
  const int steps = m_tiles * group;

  auto kv_rows = [&](auto* base, Strides s) {  // base: const Element* (K, V) or Element* (dK, dV)
    Tensor m = make_tensor(make_gmem_ptr(base + seq.k_offset(s, batch, head_kv)),
                           make_shape(seq.seqlen_k, Int<kHeadDim>{}), make_stride(s.row, _1{}));
    return local_tile(m, KVTile{}, make_coord(n_block, 0));
  };
  typename Config::GmemCopyStore gmem_store;
  auto gmem_thr_store = gmem_store.get_thread_slice(tid);
  Tensor tKVc = gmem_thr_store.partition_D(make_identity_tensor(KVTile{}));
  const auto col_ok = column_predicates(tKVc, params.head_dim);

  if (steps == 0) {  // no query sees these keys: dK = dV = 0
    Tensor zeros = make_tensor<Element>(shape(tKVc));
    clear(zeros);
    store_tile_predicated(gmem_store, zeros, gmem_thr_store.partition_D(kv_rows(static_cast<Element*>(params.dk), params.dk_stride)),
                          tKVc, col_ok, keys_left);
    store_tile_predicated(gmem_store, zeros, gmem_thr_store.partition_D(kv_rows(static_cast<Element*>(params.dv), params.dv_stride)),
                          tKVc, col_ok, keys_left);
    return;
  }

  // Shared memory: Q stages, dO stages, K, V, P, dS.
  Element* smem_q = reinterpret_cast<Element*>(smem);
  Element* smem_do = smem_q + Config::kQStages * Config::kSmemQ;
  Element* smem_k = smem_do + Config::kdOStages * Config::kSmemQ;
  Element* smem_v = smem_k + Config::kSmemKV;
  Element* smem_p = smem_v + Config::kSmemKV;
  Element* smem_ds = smem_p + Config::kSmemPdS;
  float* smem_rows = reinterpret_cast<float*>(smem_ds + Config::kSmemPdS);  // [stage][lse, delta][kBlockM]
  float* smem_dq = smem_rows + Config::kSmemRowBytes / sizeof(float);       // kBulk only
  auto sQ = [&](int stage) {
    return make_tensor(make_smem_ptr(smem_q + stage * Config::kSmemQ), typename Config::SmemLayoutQ{});
  };
  auto sQt = [&](int stage) {
    return make_tensor(make_smem_ptr(smem_q + stage * Config::kSmemQ), typename Config::SmemLayoutQt{});
  };
  auto sdO = [&](int stage) {
    return make_tensor(make_smem_ptr(smem_do + stage * Config::kSmemQ), typename Config::SmemLayoutQ{});
  };
  auto sdOt = [&](int stage) {
    return make_tensor(make_smem_ptr(smem_do + stage * Config::kSmemQ), typename Config::SmemLayoutQt{});
  };
  Tensor sK = make_tensor(make_smem_ptr(smem_k), typename Config::SmemLayoutKV{});
  Tensor sKt = make_tensor(make_smem_ptr(smem_k), typename Config::SmemLayoutKVt{});
  Tensor sV = make_tensor(make_smem_ptr(smem_v), typename Config::SmemLayoutKV{});
  Tensor sP = make_tensor(make_smem_ptr(smem_p), typename Config::SmemLayoutPdS{});
  Tensor sPt = make_tensor(make_smem_ptr(smem_p), typename Config::SmemLayoutPdSt{});
  Tensor sdS = make_tensor(make_smem_ptr(smem_ds), typename Config::SmemLayoutPdS{});
  Tensor sdSt = make_tensor(make_smem_ptr(smem_ds), typename Config::SmemLayoutPdSt{});

  // Step t works on query head head_kv·group + t / m_tiles, query tile m_begin + t % m_tiles
  // (deterministic: m_end - 1 - t % m_tiles).
  const bool deterministic = params.deterministic;
  const int tile_first = deterministic ? m_end - 1 : m_begin, tile_dir = deterministic ? -1 : 1;
  auto step_head = [&](int t) { return head_kv * group + t / m_tiles; };
  auto step_tile = [&](int t) { return tile_first + tile_dir * (t % m_tiles); };
  auto q_rows = [&](const void* base, Strides s, int t) {
    Tensor m = make_tensor(make_gmem_ptr(static_cast<const Element*>(base) + seq.q_offset(s, batch, step_head(t))),
                           make_shape(seq.seqlen_q, Int<kHeadDim>{}), make_stride(s.row, _1{}));
    return local_tile(m, QTile{}, make_coord(step_tile(t), 0));
  };

  typename Config::GmemCopyLoad gmem_load;
  auto gmem_thr_load = gmem_load.get_thread_slice(tid);
  Tensor tQc = gmem_thr_load.partition_S(make_identity_tensor(QTile{}));
  Tensor tKVc_load = gmem_thr_load.partition_S(make_identity_tensor(KVTile{}));
  auto load_q = [&](int t, int stage) {
    copy_tile_zero_fill<true>(gmem_load, gmem_thr_load.partition_S(q_rows(params.q, params.q_stride, t)),
                              gmem_thr_load.partition_D(sQ(stage)), tQc, col_ok,
                              seq.seqlen_q - step_tile(t) * kBlockM);
  };
  auto load_do = [&](int t, int stage) {
    copy_tile_zero_fill<true>(gmem_load, gmem_thr_load.partition_S(q_rows(params.dout, params.dout_stride, t)),
                              gmem_thr_load.partition_D(sdO(stage)), tQc, col_ok,
                              seq.seqlen_q - step_tile(t) * kBlockM);
  };

  // Row index of step t's first row in the row space of the delta and dQ workspaces.
  auto workspace_row = [&](int t) {
    return seq.workspace_row(params, batch, step_head(t)) + step_tile(t) * kBlockM;
  };

  // The lse and delta of step t's rows, into smem_rows[stage] by 4-byte cp.async (with Q: they
  // are waited for together). Rows past seqlen_q are not loaded (lse has no padding); the reader
  // gives them +inf.
  using RowCopy = SM80_CP_ASYNC_CACHEALWAYS<float>;
  auto load_rows = [&](int t, int stage) {
    const int r = tid % kBlockM;
    float& dst = smem_rows[(stage * 2 + tid / kBlockM) * kBlockM + r];
    if (tid < kBlockM) {
      const int row = step_tile(t) * kBlockM + r;
      if (row < seq.seqlen_q) {
        RowCopy::copy(params.lse[seq.lse_offset(params, batch, step_head(t)) + row], dst);
      }
    } else if (tid < 2 * kBlockM) {
      RowCopy::copy(params.delta[workspace_row(t) + r], dst);
    }
  };

  copy_tile_zero_fill<true>(gmem_load, gmem_thr_load.partition_S(kv_rows(static_cast<const Element*>(params.k), params.k_stride)),
                            gmem_thr_load.partition_D(sK), tKVc_load, col_ok, keys_left);
  copy_tile_zero_fill<true>(gmem_load, gmem_thr_load.partition_S(kv_rows(static_cast<const Element*>(params.v), params.v_stride)),
                            gmem_thr_load.partition_D(sV), tKVc_load, col_ok, keys_left);
  load_q(0, 0);
  load_rows(0, 0);
  load_do(0, 0);
  cp_async_fence();

  // S = Q Kᵀ and dP = dO Vᵀ.
  typename Config::TiledMmaSdP mma_sdp;
  auto thr_sdp = mma_sdp.get_thread_slice(tid);
  Tensor tSrQ = thr_sdp.partition_fragment_A(sQ(0));
  Tensor tSrK = thr_sdp.partition_fragment_B(sK);
  Tensor tdPrdO = thr_sdp.partition_fragment_A(sdO(0));
  Tensor tdPrV = thr_sdp.partition_fragment_B(sV);
  auto copy_a_sdp = make_tiled_copy_A(typename Config::SmemCopyAtom{}, mma_sdp);
  auto thr_copy_a_sdp = copy_a_sdp.get_thread_slice(tid);
  auto copy_b_sdp = make_tiled_copy_B(typename Config::SmemCopyAtom{}, mma_sdp);
  auto thr_copy_b_sdp = copy_b_sdp.get_thread_slice(tid);
  Tensor tSsK = thr_copy_b_sdp.partition_S(sK);
  Tensor tdPsV = thr_copy_b_sdp.partition_S(sV);
  auto store_pds = make_tiled_copy_C(typename Config::SmemCopyAtomStore{}, mma_sdp);
  auto thr_store_pds = store_pds.get_thread_slice(tid);
  Tensor tPsP = thr_store_pds.partition_D(sP);
  Tensor tdSsdS = thr_store_pds.partition_D(sdS);
  Tensor tScS = thr_sdp.partition_C(make_identity_tensor(STile{}));  // (row, key) of each score
  Tensor score_coords = rowcol_view(tScS);
  constexpr int kRows = decltype(size<0>(score_coords))::value;

  // dV += Pᵀ dO and dK += dSᵀ Q.
  typename Config::TiledMmadKV mma_dkv;
  auto thr_dkv = mma_dkv.get_thread_slice(tid);
  Tensor tdVrPt = thr_dkv.partition_fragment_A(sPt);
  Tensor tdVrdOt = thr_dkv.partition_fragment_B(sdOt(0));
  Tensor tdKrdSt = thr_dkv.partition_fragment_A(sdSt);
  Tensor tdKrQt = thr_dkv.partition_fragment_B(sQt(0));
  auto copy_at_dkv = make_tiled_copy_A(typename Config::SmemCopyAtomTransposed{}, mma_dkv);
  auto thr_copy_at_dkv = copy_at_dkv.get_thread_slice(tid);
  auto copy_bt_dkv = make_tiled_copy_B(typename Config::SmemCopyAtomTransposed{}, mma_dkv);
  auto thr_copy_bt_dkv = copy_bt_dkv.get_thread_slice(tid);
  Tensor tdVsPt = thr_copy_at_dkv.partition_S(sPt);
  Tensor tdKsdSt = thr_copy_at_dkv.partition_S(sdSt);
  Tensor acc_dk = partition_fragment_C(mma_dkv, KVTile{});
  Tensor acc_dv = partition_fragment_C(mma_dkv, KVTile{});
  clear(acc_dk);
  clear(acc_dv);

  // dQ += dS K.
  typename Config::TiledMmadQ mma_dq;
  auto thr_dq = mma_dq.get_thread_slice(tid);
  Tensor tdQrdS = thr_dq.partition_fragment_A(sdS);
  Tensor tdQrKt = thr_dq.partition_fragment_B(sKt);
  auto copy_a_dq = make_tiled_copy_A(typename Config::SmemCopyAtom{}, mma_dq);
  auto thr_copy_a_dq = copy_a_dq.get_thread_slice(tid);
  auto copy_bt_dq = make_tiled_copy_B(typename Config::SmemCopyAtomTransposed{}, mma_dq);
  auto thr_copy_bt_dq = copy_bt_dq.get_thread_slice(tid);
  Tensor tdQsdS = thr_copy_a_dq.partition_S(sdS);
  Tensor tdQsKt = thr_copy_bt_dq.partition_S(sKt);
  Tensor tdQc = thr_dq.partition_C(make_identity_tensor(QTile{}));
  constexpr bool kBulk = Config::kDqReduce == DqReduce::kBulk && kArchHasBulkReduce;
  auto dq_tile = [&](int t) { return params.dq_accum + workspace_row(t) * kHeadDim; };  // step t's rows
  // Deterministic: step t's turn and its count (common/dq_claims.h); one arrival a turn.
  auto turn = [&](int t) { return dq_turn(mask, n_block, step_tile(t) * kBlockM, kBlockN); };
  auto turn_count = [&](int t) { return params.dq_claims + workspace_row(t) / kDqClaimRows; };
  // Bulk (thread 0): step t's staged dQ tile added to the workspace; deterministic, in its turn.
  auto add_staged_dq = [&](int t) {
    if (deterministic) {
      const int tt = turn(t);
      dq_turn_wait(turn_count(t), tt);
      fence_view_async_global();  // the bulk operation after the acquire
      if (tt == 0) {
        bulk_store(dq_tile(t), smem_dq, Config::kSmemdQBytes);
        return;
      }
    }
    bulk_reduce_add(dq_tile(t), smem_dq, Config::kSmemdQBytes);
  };

  for (int t = 0; t < steps; ++t) {
    const int row_begin = step_tile(t) * kBlockM;
    const int stage = t % Config::kQStages;
    const int do_stage = t % Config::kdOStages;
    cp_async_wait<0>();
    __syncthreads();
    if constexpr (kBulk) {
      if (tid == 0 && t > 0) add_staged_dq(t - 1);
    } else {
      if (deterministic && tid == 0 && t > 0) dq_turn_pass(turn_count(t - 1));  // every thread's additions done
    }
    if (t + 1 < steps) {
      load_q(t + 1, (t + 1) % Config::kQStages);
      load_rows(t + 1, (t + 1) % Config::kQStages);
      if constexpr (Config::kdOStages == 2) load_do(t + 1, (t + 1) % 2);
      cp_async_fence();
    }

    // This thread's rows: their lse (a row that saw no key, or lies past seqlen_q, gets +inf so its
    // P is exactly 0) in log2 units, and their delta, from shared memory.
    const float* tile_lse = smem_rows + stage * 2 * kBlockM;
    const float* tile_delta = tile_lse + kBlockM;
    float lse_log2[kRows], row_delta[kRows];
    CUTE_UNROLL
    for (int r = 0; r < kRows; ++r) {
      const int row_in_tile = get<0>(score_coords(r, 0));
      const float l = row_begin + row_in_tile < seq.seqlen_q ? tile_lse[row_in_tile] : INFINITY;
      lse_log2[r] = (l == -INFINITY ? INFINITY : l) * float(M_LOG2E);
      row_delta[r] = tile_delta[row_in_tile];
    }

    // P = exp(S·scale - lse), written to shared memory for dV.
    Tensor acc_s = partition_fragment_C(mma_sdp, STile{});
    clear(acc_s);
    gemm_smem_smem(acc_s, tSrQ, thr_copy_a_sdp.retile_D(tSrQ), thr_copy_a_sdp.partition_S(sQ(stage)), copy_a_sdp,
                   tSrK, thr_copy_b_sdp.retile_D(tSrK), tSsK, copy_b_sdp, mma_sdp);
    if constexpr (kSoftcap) softcap_scores(acc_s, params.softcap_scale);
    if (mask.tile_needs_mask(row_begin, kBlockM, key_begin, kBlockN)) mask.apply(acc_s, tScS, row_begin, key_begin);
    Tensor probs = rowcol_view(acc_s);
    // Soft-capped: P into rP as it goes, and P · (1 - t²) into probs, so that dS is the raw score's
    // gradient (common/softcap.h).
    Tensor rP = make_tensor<Element>(acc_s.layout());
    Tensor p_rows = rowcol_view(rP);
    CUTE_UNROLL
    for (int r = 0; r < kRows; ++r) {
      CUTE_UNROLL
      for (int c = 0; c < size<1>(probs); ++c) {
        if constexpr (kSoftcap) {
          probs(r, c) = capped_probability(probs(r, c), params.scale_log2, lse_log2[r], p_rows(r, c));
        } else {
          probs(r, c) = exp2f(probs(r, c) * params.scale_log2 - lse_log2[r]);
        }
      }
    }
    if constexpr (!kSoftcap) rP = convert_fragment<Element>(acc_s);
    copy(store_pds, thr_store_pds.retile_S(rP), tPsP);

    // dS = P ∘ (dO Vᵀ - delta).
    Tensor acc_dp = partition_fragment_C(mma_sdp, STile{});
    clear(acc_dp);
    gemm_smem_smem(acc_dp, tdPrdO, thr_copy_a_sdp.retile_D(tdPrdO), thr_copy_a_sdp.partition_S(sdO(do_stage)), copy_a_sdp,
                   tdPrV, thr_copy_b_sdp.retile_D(tdPrV), tdPsV, copy_b_sdp, mma_sdp);
    Tensor dscores = rowcol_view(acc_dp);
    CUTE_UNROLL
    for (int r = 0; r < kRows; ++r) {
      CUTE_UNROLL
      for (int c = 0; c < size<1>(dscores); ++c) {
        dscores(r, c) = probs(r, c) * (dscores(r, c) - row_delta[r]);
      }
    }

    Tensor rdS = convert_fragment<Element>(acc_dp);
    copy(store_pds, thr_store_pds.retile_S(rdS), tdSsdS);
    if constexpr (kBulk) {
      // The dQ staging buffer is free again (deterministic: the addition complete, its turn passed).
      if (tid == 0) {
        if (deterministic && t > 0) dq_turn_pass_bulk(turn_count(t - 1));
        else bulk_reduce_wait_read();
      }
    } else {
      if (deterministic && tid == 0) dq_turn_wait(turn_count(t), turn(t));  // the other threads add after the barrier
    }
    __syncthreads();

    gemm_smem_smem(acc_dv, tdVrPt, thr_copy_at_dkv.retile_D(tdVrPt), tdVsPt, copy_at_dkv,
                   tdVrdOt, thr_copy_bt_dkv.retile_D(tdVrdOt), thr_copy_bt_dkv.partition_S(sdOt(do_stage)),
                   copy_bt_dkv, mma_dkv);
    if constexpr (Config::kdOStages == 1) {
      __syncthreads();
      if (t + 1 < steps) {
        load_do(t + 1, 0);
        cp_async_fence();
      }
    }

    // dQ: the other key tiles' CTAs add to the same workspace rows. Workspace column of (r, c):
    // dq_workspace_col(r, c), with r the row inside the tile (tiles start at multiples of 8 rows).
    Tensor acc_dq = partition_fragment_C(mma_dq, QTile{});
    clear(acc_dq);
    gemm_smem_smem(acc_dq, tdQrdS, thr_copy_a_dq.retile_D(tdQrdS), tdQsdS, copy_a_dq,
                   tdQrKt, thr_copy_bt_dq.retile_D(tdQrKt), tdQsKt, copy_bt_dq, mma_dq);
    static_assert(decltype(size<0>(acc_dq))::value == 4);  // (c0, c1), (c2, c3): column pairs
    auto dq_offset = [&](int i) {
      const int r = get<0>(tdQc(i));
      return r * kHeadDim + dq_workspace_col<kHeadDim, Config::kDqSwizzle>(r, get<1>(tdQc(i)));
    };
    if constexpr (kBulk) {
      CUTE_UNROLL
      for (int i = 0; i < size(acc_dq); i += 2) {
        store_shared_pair(smem_dq + dq_offset(i), acc_dq(i), acc_dq(i + 1));
      }
      fence_shared_for_bulk_copy();  // thread 0 adds the tile after the next barrier
    } else {
      // Deterministic: the tile's first addition (its turn 0) stores.
      float* dq_accum = dq_tile(t);
      const bool store = deterministic && turn(t) == 0;
      if constexpr (Config::kDqReduce == DqReduce::kBulk || Config::kDqReduce == DqReduce::kPairs) {
        CUTE_UNROLL
        for (int i = 0; i < size(acc_dq); i += 2) add_or_store_pair(dq_accum + dq_offset(i), store, acc_dq(i), acc_dq(i + 1));
      } else if constexpr (Config::kDqReduce == DqReduce::kScalar) {
        CUTE_UNROLL
        for (int i = 0; i < size(acc_dq); ++i) {
          if (store) dq_accum[dq_offset(i)] = acc_dq(i);
          else atomicAdd(dq_accum + dq_offset(i), acc_dq(i));
        }
      }
    }

    gemm_smem_smem(acc_dk, tdKrdSt, thr_copy_at_dkv.retile_D(tdKrdSt), tdKsdSt, copy_at_dkv,
                   tdKrQt, thr_copy_bt_dkv.retile_D(tdKrQt), thr_copy_bt_dkv.partition_S(sQt(stage)),
                   copy_bt_dkv, mma_dkv);
  }

  // Epilogue: dK = scale · dSᵀ Q; stage dK and dV through K's and V's shared memory, store them.
  CUTE_UNROLL
  for (int i = 0; i < size(acc_dk); ++i) acc_dk(i) *= params.scale;
  Tensor rdK = convert_fragment<Element>(acc_dk);
  Tensor rdV = convert_fragment<Element>(acc_dv);
  auto store_dkv = make_tiled_copy_C(typename Config::SmemCopyAtomStore{}, mma_dkv);
  auto thr_store_dkv = store_dkv.get_thread_slice(tid);
  __syncthreads();  // every warp is done reading K and V (and has staged its last dQ tile)
  if (tid == 0) {
    if constexpr (kBulk) {
      add_staged_dq(steps - 1);
      if (deterministic) dq_turn_pass_bulk(turn_count(steps - 1));
      else bulk_reduce_wait_complete();
    } else {
      if (deterministic) dq_turn_pass(turn_count(steps - 1));
    }
  }
  copy(store_dkv, thr_store_dkv.retile_S(rdK), thr_store_dkv.partition_D(sK));
  copy(store_dkv, thr_store_dkv.retile_S(rdV), thr_store_dkv.partition_D(sV));
  __syncthreads();
  Tensor rK = make_tensor<Element>(shape(tKVc));
  copy(gmem_store, gmem_thr_store.partition_S(sK), rK);
  store_tile_predicated(gmem_store, rK, gmem_thr_store.partition_D(kv_rows(static_cast<Element*>(params.dk), params.dk_stride)), tKVc,
                        col_ok, keys_left);
  copy(gmem_store, gmem_thr_store.partition_S(sV), rK);
  store_tile_predicated(gmem_store, rK, gmem_thr_store.partition_D(kv_rows(static_cast<Element*>(params.dv), params.dv_stride)), tKVc,
                        col_ok, keys_left);
}

}  // namespace fa::sm80
