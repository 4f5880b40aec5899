// The consumers of the Hopper-family forward: one query tile's attention on wgmma.
//
// Each consumer warpgroup owns 64 rows of the tile and walks the key tiles it can see from the last
// to the first (the few that need a mask come first). For key tile n:
//   S = Q K[n]ᵀ        wgmma, K from shared memory, Q from registers where they allow (else from
//                      shared memory too: Config::kQInRegisters), fp32 accumulator in registers
//   softmax(S)         online: running row max and sum (common/online_softmax.h; soft-capped bf16
//                      up to D = 128: a fixed reference), P in registers
//   O += P V[n]        wgmma with P from registers (converted to fp16/bf16 in place; FP8: to e4m3,
//                      gathered across the quad into the operand's layout, fragments.h)
// Overlap inside a warpgroup: step n issues S[n] = Q K[n]ᵀ and O += P[n+1] V[n+1] back to back and
// runs the softmax of S[n] while O's GEMM is still on the tensor cores; O is rescaled once that GEMM
// is done. Overlap between the two warpgroups (ping-pong): each issues its GEMMs only on its turn
// (named_barriers.h), so while one computes its softmax the other's GEMMs fill the tensor cores.
// K and V buffers are released to the producer as soon as the GEMM reading them has completed.
#pragma once

#include <cute/tensor.hpp>

#include "common/attention_mask.h"
#include "common/online_softmax.h"
#include "common/softcap.h"
#include "fa/params.h"
#include "sm90/fragments.h"
#include "sm90/named_barriers.h"
#include "sm90/pipeline.h"
#include "sm90/tile_scheduler.h"
#include "sm90/wgmma.h"

namespace fa::sm90 {

// kSoftcap: the scores are soft-capped (common/softcap.h) before the mask and the softmax.
template <class Config, bool kCausal, bool kSoftcap>
struct ForwardMainloop {
  using Element = typename Config::Element;
  using KVPipeline = typename Config::KVPipeline;
  using PipelineState = typename KVPipeline::PipelineState;
  static constexpr int kBlockM = Config::kBlockM;
  static constexpr int kBlockN = Config::kBlockN;
  enum : int { kUnmasked, kMasked, kLeftMasked };  // a key tile's mask (softmax_of)
  // The rows whose exponentials precede the wait for O's GEMM (Config::kRowsBeforeOWait, below):
  // none where soft-capping's tanh joins the step at D = 256 (with one row ptxas spilled 72 bytes
  // there, with no fence 32, with none 8).
  static constexpr int kRowsBeforeOWait = kSoftcap && Config::kHeadDim == 256 ? 0 : Config::kRowsBeforeOWait;
  // Whether a warpgroup skips the key tiles left of its own rows' window (run(), below): not at
  // D = 256, where ptxas then spilled 4 bytes more (8 -> 12) for a few % at a 1024-key window.
  static constexpr bool kSkipLeft = kCausal && Config::kHeadDim < 256;

  // The first of this consumer warpgroup's 64 rows, within the tile. Read through
  // canonical_warp_group_idx() (a warp shuffle), which the compiler knows to be warp-uniform: the
  // loop bounds that depend on it, and with them the pipeline states, then stay in uniform
  // registers (from the thread index, every barrier address went through R2UR).
  CUTE_DEVICE static int warpgroup_row() { return (cutlass::canonical_warp_group_idx() - 1) * 64; }

  // Key tiles this warpgroup's rows of tile m_block see (0 when they lie past the sequence's end).
  // With a causal mask the warpgroups of a tile's first rows often see fewer key tiles than the
  // tile does: at D = 64 (192 × 128) the first one never sees the tile's last key tile. And a
  // sequence that ends inside a tile leaves whole warpgroups past its last row. Together: 10% of
  // the GEMM work of the causal D = 64 forward at 2048 rows (docs/tried.md, acaca1c).
  CUTE_DEVICE static int own_blocks(const AttentionMask<kCausal>& mask, int seqlen_q, int m_block) {
    return Config::key_tiles_of_rows(mask, seqlen_q, m_block * kBlockM + warpgroup_row(), 64);
  }

  // Runs the key tiles [0, n_blocks) of work tile w into acc_o (cleared here) and softmax (fresh).
  // The tiles are counted from the first the work tile sees (a window's left bound: the caller
  // passes n_blocks, own_blocks and the mask shifted by its first tile, AttentionMask::shifted).
  // Q must be in shared memory, in buffer q_stage (the caller waited on its q_full). This
  // warpgroup computes only the tiles its own 64 rows see, [0, own_blocks) (own_blocks(), above),
  // from its rows' first visible tile where kSkipLeft; it takes its turn for the others and hands
  // their buffers back unread.
  // scale_log2: the tile's softmax scale (p.scale_log2; FP8: times the tile's q and k descales).
  // kFixed: the softmax holds a fixed reference (common/online_softmax.h; the caller started it).
  template <bool kFixed = false, class Storage, class AccO, class Softmax>
  CUTE_DEVICE static void run(const ForwardParams& p, Storage& smem, int q_stage, KVPipeline& pipeline_k,
                              KVPipeline& pipeline_v, PipelineState& k_state, PipelineState& v_state,
                              WarpgroupTurns<Config::kMmaWarpgroups> const& turns, int mma_tid,
                              const WorkTile& w, const AttentionMask<kCausal>& mask, int n_blocks,
                              int own_blocks, AccO& acc_o, Softmax& softmax, int pair, float scale_log2) {
    using namespace cute;
    Tensor sQ = make_tensor(make_smem_ptr(Config::query_buffer(smem, q_stage)), typename Config::SmemLayoutQ{});
    Tensor sK = make_tensor(make_smem_ptr(smem.k.data()), typename Config::SmemLayoutKV{});
    Tensor sVt = make_tensor(make_smem_ptr(smem.v.data()), typename Config::SmemLayoutVt{});

    typename Config::TiledMmaS mma_s;
    auto thr_s = mma_s.get_thread_slice(mma_tid);
    auto wg_s = warpgroup_slice(mma_s, /*first_warpgroup=*/1);
    Tensor tSrK = wg_s.partition_fragment_B(sK);  // (MMA, MMA_N, MMA_K, stages)
    // Q: wgmma descriptors of its buffer, or (Config::kQInRegisters) this thread's share of its
    // warpgroup's 64 rows, loaded with ldmatrix now (the caller waited for Q's buffer).
    Tensor tSrQ = [&] {  // (MMA, MMA_M, MMA_K)
      if constexpr (Config::kQInRegisters) {
        Tensor q = thr_s.partition_fragment_A(sQ);
        auto q_copy = make_tiled_copy_A(Copy_Atom<SM75_U32x4_LDSM_N, Element>{}, mma_s);
        auto thr_q = q_copy.get_thread_slice(mma_tid);
        copy(q_copy, thr_q.partition_S(sQ), thr_q.retile_D(q));
        return q;
      } else {
        return wg_s.partition_fragment_A(sQ);
      }
    }();
    typename Config::TiledMmaO mma_o;
    Tensor tOrVt = warpgroup_slice(mma_o, 1).partition_fragment_B(sVt);  // (MMA, MMA_N, MMA_K, stages)

    Tensor acc_s = partition_fragment_C(mma_s, typename Config::TileS{});
    Tensor tScS = thr_s.partition_C(make_identity_tensor(typename Config::TileS{}));
    // P as O += P V's A operand: acc_s converted in place (16-bit), or an e4m3 fragment of its own.
    Tensor probs = make_tensor<Element>(acc_s.layout());
    Tensor tOrP = [&] {
      if constexpr (Config::kFp8) {
        return make_tensor<Element>(Layout<Shape<Shape<_4, _2, _2>, _1, Int<kBlockN / 32>>>{});
      } else {
        return make_tensor(probs.data(), accumulator_as_a_operand(acc_s.layout()));
      }
    }();
    auto convert_probs = [&]() {
      if constexpr (Config::kFp8) {
        fp8_probs_as_a_operand(acc_s, tOrP);
      } else {
        probs = convert_fragment<Element>(acc_s);
      }
    };

    const int row0 = w.m_block * kBlockM;
    // The three runs of common/attention_mask.h, for this warpgroup's rows.
    const int first_masked = mask.first_masked_tile(row0 + warpgroup_row(), kBlockN);
    auto left_masked = [&] { return mask.left_masked_tiles(row0 + warpgroup_row() + 64, kBlockN); };
    // The softmax of S = Q K[n]ᵀ in acc_s (masked: kMasked where the tile needs the mask, kLeftMasked
    // where it needs only the left bound's: the left run of common/attention_mask.h), in
    // place: the new row maxima and the probabilities of the first first_rows rows (all by default;
    // OnlineSoftmax::rescale_scores_other_rows does the others).
    auto softmax_of = [&](int n, auto masked, auto first_rows) {
      constexpr int kFirstRows = decltype(first_rows)::value;
      auto scores = rowcol_view(acc_s);
      if constexpr (kSoftcap) softcap_scores(acc_s, p.softcap_scale);
      if constexpr (decltype(masked)::value == kMasked) {
        mask.apply_rows(scores, rowcol_view(tScS), row0, n * kBlockN);
      } else if constexpr (decltype(masked)::value == kLeftMasked) {
        mask.template apply_rows</*kEnd=*/false, /*kBegin=*/true>(scores, rowcol_view(tScS), row0, n * kBlockN);
      }
      if constexpr (!kFixed) {
        softmax.template rescale_scores<kFirstRows>(scores, scale_log2);
      } else if constexpr (decltype(masked)::value == kUnmasked) {
        softmax.template floor_scores<kFirstRows>(scores, scale_log2);
      } else {
        softmax.template settle_scores<kFirstRows>(scores, scale_log2);
      }
    };
    using AllRows = cute::Int<Softmax::kRowCount>;
    // K[n] is waited for before the turn: a warpgroup that holds the turn while its K tile is still
    // in flight would keep the other warpgroup's GEMMs off the tensor cores.
    auto wait_k = [&]() { pipeline_k.consumer_wait(k_state); };
    auto s_gemm = [&]() {
      gemm_async</*kZeroInit=*/true, Config::kQInRegisters>(mma_s, tSrQ, tSrK(_, _, _, k_state.index()), acc_s);
    };
    auto o_gemm = [&]() {
      pipeline_v.consumer_wait(v_state);
      gemm_async</*kZeroInit=*/false, /*kRegisterA=*/true>(mma_o, tOrP, tOrVt(_, _, _, v_state.index()), acc_o);
    };
    // A CTA pair (non-causal; fwd_launch.h) releases each buffer to both CTAs' producers.
    auto release = [&](KVPipeline& pipeline, auto& barriers, PipelineState& state) {
      if (!kCausal && Config::kPairs && pair > 1) {
        release_to_pair(barriers, state.index(), mma_tid % 128);
      } else {
        pipeline.consumer_release(state);
      }
      ++state;
    };

    // Once every S = Q Kᵀ of this tile is done, Q's buffer may take another tile (unless the
    // output tile is staged in it).
    auto done_with_query = [&]() {
      if constexpr (!Config::kOutputAliasesQ) Config::release_query(smem, q_stage);
    };
    clear(acc_o);
    // The key tiles past this warpgroup's last visible key (causal: the tile's last key tile for
    // the warpgroups of its first rows; rows past the sequence's end: all of them). The turn is still
    // taken, so that the warpgroups' rotation stays in step, and the buffers go back unread in the
    // producer's order (K[n], then V[n + 1]): with two stages, V[n + 1] waited for only after
    // later K tiles would deadlock against a producer that needs its buffer for V[n - 1].
    auto release_unread_v = [&]() {
      pipeline_v.consumer_wait(v_state);
      release(pipeline_v, smem.pipeline_v, v_state);
    };
    // Where kSkipLeft, the key tiles before this warpgroup's first visible key (a window's left
    // bound: the tile's first key tile is that of its first rows, and the later warpgroups' rows
    // see later keys) are skipped too, after its last O GEMM, in the same way. Recomputed where
    // needed rather than held through the loop (as left_masked).
    auto own_first = [&] { return kSkipLeft ? mask.first_visible_tile(row0 + warpgroup_row(), kBlockN) : 0; };
    if (kSkipLeft && own_first() >= own_blocks) own_blocks = 0;  // its rows see no key
    int n = n_blocks - 1;
#pragma unroll 1
    for (; n >= own_blocks; --n) {
      wait_k();
      turns.wait();
      turns.pass();
      release(pipeline_k, smem.pipeline_k, k_state);
      if (n < n_blocks - 1) release_unread_v();  // V[n + 1]
    }
    if (own_blocks == 0) {
      release_unread_v();  // V[0]
      done_with_query();
      return;
    }
    wait_k();
    turns.wait();
    s_gemm();
    turns.pass();
    gemm_wait<0>(acc_s);
    release(pipeline_k, smem.pipeline_k, k_state);
    if (own_blocks < n_blocks) release_unread_v();  // V[own_blocks], loaded after K[own_blocks - 1]
    if (n >= first_masked || n < left_masked()) {
      softmax_of(n, cute::Int<kMasked>{}, AllRows{});
    } else {
      softmax_of(n, cute::Int<kUnmasked>{}, AllRows{});
    }
    convert_probs();

    // One step of the loop. The masked steps (the few at the diagonal or the keys' end, which come
    // first) and the unmasked ones run as two loops, so that no step tests for the mask: the
    // softmax, the wait for O's GEMM and P's conversion then form one block of straight-line code,
    // which the compiler schedules together (the exponentials, bound by MUFU throughput, interleave
    // with the rest). Measured up to 5% faster at D = 64, level to 3% faster at D = 128
    // (docs/tried.md, 52ce3b1).
    //
    // Where the wait for O's GEMM goes: P's conversion overwrites the registers that GEMM reads,
    // and ptxas interleaves the conversions with the exponentials and so hoists the wait above
    // every exponential: the warpgroup's softmax then never runs under its own O GEMM. With
    // kRowsBeforeOWait = r ≥ 0, the wait follows a test of the first r rows' sums, so their
    // exponentials come first. The test is never true (a sum of exponentials is not -1, and NaN
    // compares unequal) and warp-uniform (a vote): every thread of the warpgroup reaches the wait
    // at the same instruction, as wgmma.wait_group's .aligned requires.
    auto wait_o_after = [&](float row_sums) {
      if (!__all_sync(0xffffffffu, row_sums != -1.f)) __trap();
      gemm_wait<0>(acc_o);
    };
    // always_inline: without it ptxas keeps one of the causal FP8 forward's step runs as a call
    // (1.36 KB stack frame, spills, wgmma serialised across the call: C7520).
    auto step = [&](int n, auto masked) __attribute__((always_inline)) {
      wait_k();
      turns.wait();
      s_gemm();  // S[n] = Q K[n]ᵀ ...
      o_gemm();  // ... and O += P[n+1] V[n+1] behind it
      turns.pass();
      gemm_wait<1>(acc_s);  // S[n] done; O's GEMM may still run
      release(pipeline_k, smem.pipeline_k, k_state);
      if constexpr (kRowsBeforeOWait < 0) {
        softmax_of(n, masked, AllRows{});
        gemm_wait<0>(acc_o);
      } else {
        constexpr int kFirst = kRowsBeforeOWait;
        softmax_of(n, masked, cute::Int<kFirst>{});
        float sums = 0.f;
        CUTE_UNROLL
        for (int r = 0; r < kFirst; ++r) sums += softmax.row_sum[r];
        wait_o_after(sums);
        auto scores = rowcol_view(acc_s);
        softmax.template rescale_scores_other_rows<kFirst>(scores, scale_log2);
      }
      release(pipeline_v, smem.pipeline_v, v_state);
      convert_probs();
      if constexpr (!kFixed) {
        auto out_rows = rowcol_view(acc_o);
        softmax.rescale_output(out_rows);
      }
    };
    // The runs of common/attention_mask.h (where left_masked > first_masked, a narrow window, the
    // unmasked run is empty). The left run needs a mask with a position (kCausal) only.
    // The unmasked steps need no tile index: that run is counted down instead, so that neither the
    // index nor the left run's bound is held through it (the D = 256 causal forward spilled them).
    for (--n; n >= first_masked; --n) step(n, cute::Int<kMasked>{});
    int unmasked = n + 1 - left_masked();
#pragma unroll 1
    for (; unmasked > 0; --unmasked) step(0, cute::Int<kUnmasked>{});
    if constexpr (kCausal) {
      const int first = own_first();
      for (n = cute::min(n, left_masked() - 1); n >= first; --n) step(n, cute::Int<kLeftMasked>{});
    }
    done_with_query();
    o_gemm();
    gemm_wait<0>(acc_o);
    release(pipeline_v, smem.pipeline_v, v_state);
    if constexpr (kSkipLeft) {
      // The left tiles this warpgroup does not see: its turns, and K[n] then V[n] back unread (the
      // producer loads V[n] after K[n - 1], whose buffer the other warpgroups free at turns that
      // come before this one's).
#pragma unroll 1
      for (n = own_first() - 1; n >= 0; --n) {
        wait_k();
        turns.wait();
        turns.pass();
        release(pipeline_k, smem.pipeline_k, k_state);
        release_unread_v();
      }
    }
  }
};

}  // namespace fa::sm90
