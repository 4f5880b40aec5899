// The Hopper-family forward's configuration: tile shape, shared-memory layouts, the two wgmma
// GEMMs, the register split between producer and consumers, and the shared-memory plan.
#pragma once

#include <type_traits>

#include <cute/tensor.hpp>
#include <cutlass/pipeline/sm90_pipeline.hpp>

#include "common/transposed_layout.h"
#include "fa/params.h"
#include "sm90/mma_ops.h"
#include "sm90/named_barriers.h"

namespace fa::sm90 {

// Shared memory of an sm90 SM (228 KB), and what one CTA may use of it: the rest less the 1 KB the
// runtime reserves a CTA (227 KB for a CTA alone).
inline constexpr int kSmemPerSm = 233472;
constexpr int smem_per_cta(int ctas_per_sm) { return kSmemPerSm / ctas_per_sm - 1024; }
inline constexpr int kMaxSmemBytes = smem_per_cta(1);

// The K-major shared-memory atom for rows of kExtent elements: the widest swizzle (128, 64 or 32
// bytes) whose row the extent fills, so that wgmma and TMA both read it without bank conflicts.
// 16-bit head dims (multiples of 64) take the 128-byte one; FP8 rows of 64 bytes the 64-byte one.
template <class Element, int kExtent>
using KMajorAtom = std::conditional_t<
    kExtent * sizeof(Element) % 128 == 0, cute::GMMA::Layout_K_SW128_Atom<Element>,
    std::conditional_t<kExtent * sizeof(Element) % 64 == 0, cute::GMMA::Layout_K_SW64_Atom<Element>,
                       cute::GMMA::Layout_K_SW32_Atom<Element>>>;

// kHeadDimV: v's and the output's head dim, where it is smaller than q's and k's (DeepSeek's
// 192/128: FA_HEAD_DIM_PAIRS); the two GEMMs then have their own widths, and V its own buffers.
//
// Element float_e4m3_t: the FP8 forward (run_forward_fp8). Both operands of an e4m3 wgmma are
// K-major, so V comes transposed ((head dim, keys), keys contiguous: ForwardParams::v), and P
// enters O += P V as e4m3 in registers, permuted across each quad (fragments.h). The output is
// 16-bit: ElementOut's bytes, filled with bf16 or fp16 (ForwardParams::out_fp16).
//
// kCtasPerSm_ = 2: two CTAs share an SM (two consumer warpgroups each), each with half the
// registers and at most half the shared memory, so that one CTA's fixed costs a tile (Q's wait,
// the first softmax, the epilogue) run under the other's steps (fwd_launch.h, NarrowWindowTile).
template <class Element_, int kHeadDim_, int kBlockM_, int kBlockN_, int kStages_, int kHeadDimV_ = kHeadDim_,
          int kCtasPerSm_ = 1>
struct ForwardConfig {
  using Element = Element_;
  static constexpr bool kFp8 = sizeof(Element) == 1;
  using ElementOut = std::conditional_t<kFp8, cutlass::half_t, Element>;
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kHeadDimV = kHeadDimV_;
  static constexpr int kBlockM = kBlockM_;  // query rows of a tile: 64 per consumer warpgroup
  static constexpr int kBlockN = kBlockN_;  // keys per step
  static constexpr int kStages = kStages_;  // K and V buffers each
  static constexpr int kCtasPerSm = kCtasPerSm_;
  static constexpr int kSmemBudget = smem_per_cta(kCtasPerSm);  // the shared memory a CTA may use

  static constexpr int kMmaWarpgroups = kBlockM / 64;
  static constexpr int kMmaThreads = kMmaWarpgroups * 128;
  static constexpr int kThreads = kMmaThreads + 128;  // + the producer warpgroup (one warp loads)
  // setmaxnreg: the producer warpgroup gives registers to the consumers (64K registers a CTA):
  // 24 + 2 x 240, or 32 + 3 x 160 with three consumer warpgroups. Two CTAs an SM start with 80
  // registers a thread each (__launch_bounds__: 384 threads, two CTAs), 24 + 2 x 104 after.
  static_assert(kMmaWarpgroups == 2 || kMmaWarpgroups == 3, "two or three consumer warpgroups");
  static_assert(kCtasPerSm == 1 || (kCtasPerSm == 2 && kMmaWarpgroups == 2),
                "two CTAs an SM: two consumer warpgroups each");
  static constexpr int kProducerRegisters = kMmaWarpgroups == 2 ? 24 : 32;
  static constexpr int kMmaRegisters = kCtasPerSm == 2 ? 104 : kMmaWarpgroups == 2 ? 240 : 160;
  static_assert((kProducerRegisters * 128 + kMmaRegisters * kMmaThreads) * kCtasPerSm <= 65536);

  // How many of a thread's two rows of S have their exponentials computed before the wait for
  // the previous step's O GEMM (fwd_mainloop.h); -1: no fence, the compiler places the wait.
  // Measured (docs/tried.md, 65077cd): one row with two consumer warpgroups (D = 128: 0.5–3% faster
  // than no fence, D = 256 level to 2% faster; both rows lose at D = 128); none with three (D = 64:
  // one row 2–4.5% slower; the causal D = 128 tile, 192 × 80, takes the same, not measured there).
  static constexpr int kRowsBeforeOWait = kMmaWarpgroups == 2 ? 1 : -1;

  using TileQ = cute::Shape<cute::Int<kBlockM>, cute::Int<kHeadDim>>;
  using TileKV = cute::Shape<cute::Int<kBlockN>, cute::Int<kHeadDim>>;
  using TileV = cute::Shape<cute::Int<kBlockN>, cute::Int<kHeadDimV>>;
  using TileO = cute::Shape<cute::Int<kBlockM>, cute::Int<kHeadDimV>>;
  using TileS = cute::Shape<cute::Int<kBlockM>, cute::Int<kBlockN>>;

  // Rows of 64 elements (128 bytes) in the 128-byte swizzle that wgmma and TMA both read
  // without bank conflicts; the head dims are multiples of 64. The output may be staged in Q's
  // buffer (below), so it is no wider than Q.
  static_assert(kHeadDim % 64 == 0 && kHeadDimV % 64 == 0 && kHeadDimV <= kHeadDim);
  using SmemAtom = KMajorAtom<Element, kHeadDim>;
  using SmemLayoutQ = decltype(cute::tile_to_shape(SmemAtom{}, TileQ{}));
  // The output tile (Q's layout where the head dims are one); each consumer warpgroup stores its
  // 64 rows on its own, so the TMA store sees one 64-row slice of that layout.
  using SmemLayoutO = decltype(cute::tile_to_shape(KMajorAtom<ElementOut, kHeadDimV>{}, TileO{}));
  using TileOWarpgroup = cute::Shape<cute::_64, cute::Int<kHeadDimV>>;
  using SmemLayoutOWarpgroup = decltype(cute::composition(
      SmemLayoutO{}, cute::make_layout(TileOWarpgroup{}, cute::Stride<cute::_1, cute::Int<kBlockM>>{})));
  using SmemLayoutKV = decltype(cute::tile_to_shape(
      SmemAtom{}, cute::Shape<cute::Int<kBlockN>, cute::Int<kHeadDim>, cute::Int<kStages>>{}));
  // V's buffers as TMA fills them: (keys, head dim) rows, or FP8's transposed V (head dim, keys).
  using SmemLayoutV = std::conditional_t<
      kFp8,
      decltype(cute::tile_to_shape(KMajorAtom<Element, kBlockN>{},
                                   cute::Shape<cute::Int<kHeadDimV>, cute::Int<kBlockN>, cute::Int<kStages>>{})),
      decltype(cute::tile_to_shape(SmemAtom{},
                                   cute::Shape<cute::Int<kBlockN>, cute::Int<kHeadDimV>, cute::Int<kStages>>{}))>;
  using TileVLoad = std::conditional_t<kFp8, cute::Shape<cute::Int<kHeadDimV>, cute::Int<kBlockN>>, TileV>;
  // V as the B operand of O += P V: (head dim, keys), the same bytes read with head dim as the
  // contiguous (MN-major) mode; FP8's as they are (K-major).
  using SmemLayoutVt = std::conditional_t<kFp8, SmemLayoutV, TransposedLayout<SmemLayoutV>>;

  // S = Q Kᵀ with K from shared memory and Q from registers where they allow (kQInRegisters),
  // else from shared memory too; O += P V with P from registers. Each consumer warpgroup owns 64
  // rows of the tile.
  //
  // Q in registers is loaded once a tile with ldmatrix: wgmma then reads only K from shared memory
  // for S, a third less of S's reads and a fifth of all the consumers' shared-memory reads a step.
  // Where the registers allow: two consumer warpgroups (240 registers) on steps of at most 144 keys
  // at D ≤ 128 — at D = 128 and 128 keys Q's 32 registers a thread beside S's 64, P's 32 and O's
  // 64. (ptxas spills with three warpgroups, 160 registers, at D = 64, on 160- or 176-key D = 128
  // tiles, and with two CTAs an SM.) Measured at D = 128 (docs/tried.md, b14956e): 0.7–1.1% fewer
  // cycles a call at the power limit on the 128-key tiles, 1–3% faster in bench.py; the 144-key
  // tile with Q in registers 0.7–1.5% fewer cycles than 176 keys without.
  static constexpr bool kQInRegisters =
      !kFp8 && kCtasPerSm == 1 && kMmaWarpgroups == 2 && kHeadDim <= 128 && kBlockN <= 144;
  using MmaWarpgroups = cute::Layout<cute::Shape<cute::Int<kMmaWarpgroups>, cute::_1, cute::_1>>;
  using MmaSShape = cute::Shape<cute::_64, cute::Int<kBlockN>, cute::Int<kHeadDim>>;
  using MmaSAtom = std::conditional_t<kQInRegisters, decltype(rs_op<Element, MmaSShape>()),
                                      decltype(ss_op<Element, MmaSShape>())>;
  using TiledMmaS = decltype(cute::make_tiled_mma(MmaSAtom{}, MmaWarpgroups{}));
  using MmaOAtom = decltype(rs_op<Element, cute::Shape<cute::_64, cute::Int<kHeadDimV>, cute::Int<kBlockN>>,
                                  cute::GMMA::Major::K, kFp8 ? cute::GMMA::Major::K : cute::GMMA::Major::MN>());
  using TiledMmaO = decltype(cute::make_tiled_mma(MmaOAtom{}, MmaWarpgroups{}));
  // One warpgroup's share of O += P V: the same per-thread accumulator layout as TiledMmaO, over
  // 64 rows (the epilogue partitions one warpgroup's half of the output tile with it).
  using TiledMmaOWarpgroup = decltype(cute::make_tiled_mma(MmaOAtom{}));

  using KVPipeline = cutlass::PipelineTmaAsync<kStages>;
  // Whether the non-causal kernel can run on CTA pairs that share K and V (fwd_launch.h): at
  // D = 64 (192-row tiles) they measured no faster, and the kernel leaves their code out.
  // Not with two head dims (their kernels are launched without pairs).
  // Not FP8 (its transposed V's tiles are not K's shape).
  static constexpr bool kPairs = !kFp8 && kHeadDim >= 128 && kHeadDimV == kHeadDim;

  static constexpr int kQBytes = kBlockM * kHeadDim * sizeof(Element);
  static constexpr int kOBytes = kBlockM * kHeadDimV * sizeof(ElementOut);
  static constexpr int kKTileBytes = kBlockN * kHeadDim * sizeof(Element);
  static constexpr int kVTileBytes = kBlockN * kHeadDimV * sizeof(Element);
  static constexpr int kQElems = decltype(cute::cosize(SmemLayoutQ{}))::value;
  static constexpr int kOElems = decltype(cute::cosize(SmemLayoutO{}))::value;
  static constexpr int kKVElems = decltype(cute::cosize(SmemLayoutKV{}))::value;
  static constexpr int kVElems = decltype(cute::cosize(SmemLayoutV{}))::value;

  // The output tile is staged in shared memory for its TMA store. Where Q, the K/V stages and a
  // separate output tile fit, it has its own buffer (the next tile's Q can load while this one's
  // output is written); otherwise it reuses Q's, which is free once the last S = Q Kᵀ is done.
  static constexpr int kKVBytes = kStages * (kKTileBytes + kVTileBytes);
  static constexpr bool kOutputAliasesQ = kQBytes + kOBytes + kKVBytes + 1024 > kSmemBudget;
  static_assert(!(kFp8 && kOutputAliasesQ), "the FP8 output tile is wider than Q's buffer");
  // Q's buffers: two where a second one fits beside the output tile (the next tile's Q then loads
  // while this tile runs, and the producer goes on to the next tile's K and V at once; with one,
  // both wait until this tile's last S = Q Kᵀ is done), else one.
  static constexpr int kQStages = !kOutputAliasesQ && 2 * kQBytes + kOBytes + kKVBytes + 1024 <= kSmemBudget ? 2 : 1;

  struct Empty {};
  struct SharedStorage {
    cute::array_aligned<Element, kQElems * kQStages, 1024> q;
    cute::array_aligned<Element, kKVElems, 1024> k;
    cute::array_aligned<Element, kVElems, 1024> v;
    std::conditional_t<kOutputAliasesQ, Empty, cute::array_aligned<ElementOut, kOElems, 1024>> o;
    typename KVPipeline::SharedStorage pipeline_k;
    typename KVPipeline::SharedStorage pipeline_v;
    uint64_t q_full[kQStages];   // transaction barrier of each Q buffer
    uint64_t q_empty[kQStages];  // with two Q buffers: every consumer thread is done with it
    int next_tile[kMmaWarpgroups];  // dynamic scheduling: the next tile index, one slot a warpgroup
  };
  static constexpr int kSmemBytes = sizeof(SharedStorage);
  static_assert(kSmemBytes <= kSmemBudget, "tile does not fit in shared memory");

  // Key tiles that query rows [row_begin, row_begin + rows) see (0: none of them sees a key, or
  // they all lie past seqlen_q).
  template <class Mask>
  CUTE_DEVICE static int key_tiles_of_rows(const Mask& mask, int seqlen_q, int row_begin, int rows) {
    if (row_begin >= seqlen_q) return 0;
    return mask.visible_tiles(cute::min(row_begin + rows, seqlen_q), kBlockN);
  }
  // The key tiles [first_key_tile, key_tiles) the query tile m_block sees (none when the first is
  // not below the end); the producer and the consumers both count them.
  template <class Mask>
  CUTE_DEVICE static int key_tiles(const Mask& mask, int seqlen_q, int m_block) {
    return key_tiles_of_rows(mask, seqlen_q, m_block * kBlockM, kBlockM);
  }
  template <class Mask>
  CUTE_DEVICE static int first_key_tile(const Mask& mask, int m_block) {
    return mask.first_visible_tile(m_block * kBlockM, kBlockN);
  }

  CUTE_DEVICE static Element* query_buffer(SharedStorage& s, int stage) {
    return s.q.data() + stage * kQElems;
  }

  // Producer: before the Q tile of the load-th loaded work tile (0, 1, …) goes into its buffer
  // (load % kQStages), wait until the consumers are done with the tile that used it before.
  CUTE_DEVICE static void acquire_query(SharedStorage& s, int load) {
    if (load < kQStages) return;
    if constexpr (kQStages == 1) {
      barrier_sync(ForwardBarrier::kQueryEmpty, kMmaThreads + 32);
    } else {
      cutlass::arch::ClusterBarrier::wait(&s.q_empty[load % kQStages], (load / kQStages - 1) & 1);
    }
  }
  // Consumers: done with Q's buffer `stage` (every S = Q Kᵀ reading it has completed).
  CUTE_DEVICE static void release_query(SharedStorage& s, int stage) {
    if constexpr (kQStages == 1) {
      barrier_arrive(ForwardBarrier::kQueryEmpty, kMmaThreads + 32);
    } else {
      cutlass::arch::ClusterBarrier::arrive(&s.q_empty[stage]);
    }
  }

  CUTE_DEVICE static ElementOut* output_buffer(SharedStorage& s) {
    if constexpr (kOutputAliasesQ) {
      return s.q.data();
    } else {
      return s.o.data();
    }
  }
};

// v's and the output's head dim (the call's): p.head_dim where the kernel has one head dim.
template <class Config>
CUTE_HOST_DEVICE int head_dim_v(const ForwardParams& p) {
  return Config::kHeadDimV == Config::kHeadDim ? p.head_dim : p.head_dim_v;
}

}  // namespace fa::sm90
