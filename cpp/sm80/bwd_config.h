// One backward configuration of the Ampere family: tile shapes, the three warp layouts of its
// GEMMs, shared-memory layouts and copy atoms.
#pragma once

#include <cute/tensor.hpp>

#include "sm80/fwd_config.h"

namespace fa::sm80 {

// How the main kernel adds its dQ tile into the fp32 workspace:
//   kBulk    stage the tile in shared memory and add it with one bulk reduction
//            (cp.reduce.async.bulk, sm90; before sm90 it falls back to kPairs)
//   kPairs   a global reduction per column pair (one 8-byte vector reduction on sm90)
//   kScalar  a global reduction per element
//   kSkip    nothing: a timing experiment only (tools/tile_sweep.cu measures what the
//            reductions cost with it), never instantiated by the library.
enum class DqReduce { kBulk, kPairs, kScalar, kSkip };

// kBlockM query rows × kBlockN keys per step. The five GEMMs use three warp arrangements:
//   S = Q Kᵀ, dP = dO Vᵀ        (kBlockM × kBlockN)  kWarpsMSdP warps along M
//   dV += Pᵀ dO, dK += dSᵀ Q    (kBlockN × D)        kWarpsNdKV warps along kBlockN
//   dQ = dS K                   (kBlockM × D)        kWarpsMdQ warps along M
// dO has kdOStages_ shared-memory buffers: with two, the next query tile's Q and dO both load
// from the start of a step, and a step needs two barriers instead of three.
template <class Element_, int kHeadDim_, int kBlockM_, int kBlockN_, int kWarps_, int kWarpsMSdP_,
          int kWarpsNdKV_, int kWarpsMdQ_, int kdOStages_ = 2, DqReduce kDqReduce_ = DqReduce::kBulk>
struct BackwardConfig {
  using Element = Element_;
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockM = kBlockM_;
  static constexpr int kBlockN = kBlockN_;
  static constexpr int kWarps = kWarps_;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kWarpsMSdP = kWarpsMSdP_;
  static constexpr int kWarpsNdKV = kWarpsNdKV_;
  static constexpr int kWarpsMdQ = kWarpsMdQ_;
  static_assert(kWarps % kWarpsMSdP == 0 && kWarps % kWarpsNdKV == 0 && kWarps % kWarpsMdQ == 0);

  using TiledMmaSdP = Sm80TiledMma<Element, kWarpsMSdP, kWarps / kWarpsMSdP>;
  using TiledMmadKV = Sm80TiledMma<Element, kWarpsNdKV, kWarps / kWarpsNdKV>;
  using TiledMmadQ = Sm80TiledMma<Element, kWarpsMdQ, kWarps / kWarpsMdQ>;

  // Q, dO (kBlockM × D), K, V (kBlockN × D), and P, dS (kBlockM × kBlockN): the forward's
  // swizzled row atoms. Each is also read transposed (ldmatrix.trans) by one of the GEMMs.
  using SmemQ = SmemTileShape<Element, kHeadDim>;
  using SmemLayoutQ = typename SmemQ::template TileLayout<kBlockM>;
  using SmemLayoutQt = TransposedLayout<SmemLayoutQ>;
  using SmemLayoutKV = typename SmemQ::template TileLayout<kBlockN>;
  using SmemLayoutKVt = TransposedLayout<SmemLayoutKV>;
  using SmemLayoutPdS = typename SmemTileShape<Element, kBlockN>::template TileLayout<kBlockM>;
  using SmemLayoutPdSt = TransposedLayout<SmemLayoutPdS>;

  using SmemCopyAtom = cute::Copy_Atom<cute::SM75_U32x4_LDSM_N, Element>;
  using SmemCopyAtomTransposed = cute::Copy_Atom<cute::SM75_U16x8_LDSM_T, Element>;
  using SmemCopyAtomStore = cute::Copy_Atom<cute::AutoVectorizingCopyWithAssumedAlignment<128>, Element>;

  using GmemCopyLoad = typename GmemTileCopy<Element, kHeadDim, kThreads>::Load;
  using GmemCopyStore = typename GmemTileCopy<Element, kHeadDim, kThreads>::Store;

  static constexpr int kQStages = 2;  // the next Q tile loads while this one is in use
  static constexpr int kdOStages = kdOStages_;
  static_assert(kdOStages == 1 || kdOStages == 2);
  static constexpr DqReduce kDqReduce = kDqReduce_;
  static constexpr bool kDqSwizzle = kDqReduce == DqReduce::kBulk;  // the workspace layout (backward_rows.h)
  static constexpr int kSmemQ = int(cute::cosize(SmemLayoutQ{}));
  static constexpr int kSmemKV = int(cute::cosize(SmemLayoutKV{}));
  static constexpr int kSmemPdS = int(cute::cosize(SmemLayoutPdS{}));
  // kBulk: the fp32 dQ tile, in the workspace's layout
  static constexpr int kSmemdQBytes = kDqReduce == DqReduce::kBulk ? kBlockM * kHeadDim * int(sizeof(float)) : 0;
  // Per Q stage: the tile's lse and delta (fp32), loaded with it
  static constexpr int kSmemRowBytes = kQStages * 2 * kBlockM * int(sizeof(float));
  static_assert(kThreads >= 2 * kBlockM, "one thread per lse and per delta value");
  // Q stages, dO stages, K, V, P, dS, lse and delta stages, dQ (last: left out before sm90)
  static constexpr int kSmemBytes = ((kQStages + kdOStages) * kSmemQ + 2 * kSmemKV + 2 * kSmemPdS) *
                                        int(sizeof(Element)) + kSmemRowBytes + kSmemdQBytes;
};

}  // namespace fa::sm80
