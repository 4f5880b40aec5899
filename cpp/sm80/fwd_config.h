// One forward configuration of the Ampere family: tile shape, shared-memory layouts and copy atoms.
#pragma once

#include <type_traits>

#include <cute/tensor.hpp>
#include <cutlass/numeric_types.h>

#include "common/transposed_layout.h"

namespace fa::sm80 {

template <class Element>
using Sm80MmaAtom = std::conditional_t<std::is_same_v<Element, cutlass::half_t>,
                                       cute::SM80_16x8x16_F32F16F16F32_TN,
                                       cute::SM80_16x8x16_F32BF16BF16F32_TN>;

// kWarpsM × kWarpsN warps of m16n8k16 MMAs. Each warp covers 16 rows and 16 contiguous columns
// of every (16·kWarpsM × 16·kWarpsN) slab: the N permutation puts a warp's two n8 atoms side by
// side, so one ldmatrix.x4 loads both of its B fragments and its accumulator columns are contiguous.
template <class Element, int kWarpsM, int kWarpsN>
using Sm80TiledMma = cute::TiledMMA<
    cute::MMA_Atom<Sm80MmaAtom<Element>>,
    cute::Layout<cute::Shape<cute::Int<kWarpsM>, cute::Int<kWarpsN>, cute::_1>>,
    cute::Tile<cute::Int<16 * kWarpsM>,
               cute::Layout<cute::Shape<cute::_8, cute::Int<kWarpsN>, cute::_2>,
                            cute::Stride<cute::_1, cute::_16, cute::_8>>,
               cute::_16>>;

// Shared-memory tiles kCols elements wide, stored as 8-row × kRowChunk-column atoms. A 128-byte
// atom row spans all 32 banks; the XOR swizzle on 16-byte units makes the 8 rows an ldmatrix reads
// (one 16-byte column unit of each) and the 8 consecutive threads of a cp.async row hit 8
// different bank groups.
template <class Element, int kCols>
struct SmemTileShape {
  static constexpr int kRowChunk = kCols % 64 == 0 ? 64 : 32;  // elements per atom row
  static constexpr int kSwizzleBits = kRowChunk == 64 ? 3 : 2;  // 8 or 4 16-byte units per row
  using Atom = decltype(cute::composition(
      cute::Swizzle<kSwizzleBits, 3, 3>{},
      cute::Layout<cute::Shape<cute::_8, cute::Int<kRowChunk>>,
                   cute::Stride<cute::Int<kRowChunk>, cute::_1>>{}));
  // A (kRows × kCols) tile of these atoms.
  template <int kRows>
  using TileLayout =
      decltype(cute::tile_to_shape(Atom{}, cute::Shape<cute::Int<kRows>, cute::Int<kCols>>{}));

  // Global <-> shared copies: 16 bytes (8 elements) a thread, kRowChunk / 8 threads along a row.
  static constexpr int kElemsPerVector = 8;
  static constexpr int kThreadsPerRow = kRowChunk / kElemsPerVector;
};

// Global <-> shared copies of SmemTileShape<Element, kCols> tiles by kThreads threads, 16 bytes a
// thread. Load: cp.async cached in L2 only (.cg), as each tile is read once per CTA, in its
// zero-filling form (a predicate per vector: copy_tile_zero_fill). Store: 16-byte vector writes.
template <class Element, int kCols, int kThreads>
struct GmemTileCopy {
  using Smem = SmemTileShape<Element, kCols>;
  using ThreadLayout =
      cute::Layout<cute::Shape<cute::Int<kThreads / Smem::kThreadsPerRow>, cute::Int<Smem::kThreadsPerRow>>,
                   cute::Stride<cute::Int<Smem::kThreadsPerRow>, cute::_1>>;
  using VectorLayout = cute::Layout<cute::Shape<cute::_1, cute::Int<Smem::kElemsPerVector>>>;
  using Load = decltype(cute::make_tiled_copy(
      cute::Copy_Atom<cute::SM80_CP_ASYNC_CACHEGLOBAL_ZFILL<cute::uint128_t>, Element>{}, ThreadLayout{},
      VectorLayout{}));
  using Store = decltype(cute::make_tiled_copy(
      cute::Copy_Atom<cute::AutoVectorizingCopyWithAssumedAlignment<128>, Element>{}, ThreadLayout{},
      VectorLayout{}));
};

template <class Element_, int kHeadDim_, int kBlockM_, int kBlockN_, int kWarps_, int kStages_ = 1>
struct ForwardConfig {
  using Element = Element_;
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockM = kBlockM_;  // query rows per CTA
  static constexpr int kBlockN = kBlockN_;  // keys per mainloop step
  static constexpr int kWarps = kWarps_;
  static constexpr int kThreads = kWarps * 32;
  // Shared-memory buffers of each of K and V. One: a tile's load overlaps one GEMM of the step
  // before, and a step has two barriers. Two: tile n-1 loads while all of step n runs, and a step
  // has one barrier. Three (the KV-cache tile): tiles n-1 and n-2 are in flight during step n.
  static constexpr int kStages = kStages_;
  static_assert(kHeadDim % 32 == 0 && kBlockM % (16 * kWarps) == 0 && kBlockN % 16 == 0);
  static_assert(kStages >= 1 && kStages <= 4);

  // The warps stack along M: each owns 16 rows of every 16·kWarps-row slab of the query tile and
  // all of its keys, so a row's softmax never leaves its warp.
  using TiledMma = Sm80TiledMma<Element, kWarps, 1>;

  using Smem = SmemTileShape<Element, kHeadDim>;
  using SmemLayoutQ = typename Smem::template TileLayout<kBlockM>;
  using SmemLayoutKV = typename Smem::template TileLayout<kBlockN>;
  // O += P V needs V as the (head_dim × keys) B operand.
  using SmemLayoutVt = TransposedLayout<SmemLayoutKV>;
  using SmemLayoutO = SmemLayoutQ;  // the output tile is staged where Q was

  using SmemCopyAtom = cute::Copy_Atom<cute::SM75_U32x4_LDSM_N, Element>;            // Q, K
  using SmemCopyAtomTransposed = cute::Copy_Atom<cute::SM75_U16x8_LDSM_T, Element>;  // V
  using SmemCopyAtomO = cute::Copy_Atom<cute::AutoVectorizingCopyWithAssumedAlignment<128>, Element>;

  using GmemCopyQKV = typename GmemTileCopy<Element, kHeadDim, kThreads>::Load;
  using GmemCopyO = typename GmemTileCopy<Element, kHeadDim, kThreads>::Store;

  static constexpr int kSmemBytes =
      int(cute::cosize(SmemLayoutQ{}) + 2 * kStages * cute::cosize(SmemLayoutKV{})) * int(sizeof(Element));
};

}  // namespace fa::sm80

namespace fa::sm80 {

// The key-splitting decode kernel (decode_kernel.h): kWarps warps side by side along the keys,
// each with its own kWarpKeys-key slice of every step, its own kStages-deep K/V buffers in shared
// memory and its own online softmax over kRows (16 or 32; an FP8 cache also 8) packed query rows;
// the warps' results are merged once, at the end. One warp covers the rows: its MMA is a column of
// kRows / 16 m16n8k16 atoms, or at 8 rows (kKeysOnM) a row of atoms along the keys, 8 query rows wide.
//
// ElementKV: the cache's element type, Element's or cutlass::float_e4m3_t (an FP8 cache; fp8_kv.h).
// An FP8 cache's slices land as bytes, rows of kHeadDim with their 16-byte pieces swizzled
// (SmemLayoutKVIn), and the warp builds its GEMMs' fragments from them itself (decode_kernel.h);
// O += P V then runs as an fp16 GEMM.
template <class T>
struct TypeIs {
  using type = T;
};

// A warp's cp.async copy of rows of kHeadDim one-byte values into a row-major buffer, 16 a thread.
template <class ElementKV, int kHeadDim>
struct Fp8RowCopy {
  static constexpr int kThreadsPerRow = kHeadDim / 16;
  static_assert(kHeadDim % 16 == 0 && 32 % kThreadsPerRow == 0, "whole rows per copy: head dims 32, 64, 128, 256");
  using type = decltype(cute::make_tiled_copy(
      cute::Copy_Atom<cute::SM80_CP_ASYNC_CACHEGLOBAL_ZFILL<cute::uint128_t>, ElementKV>{},
      cute::Layout<cute::Shape<cute::Int<32 / kThreadsPerRow>, cute::Int<kThreadsPerRow>>,
                   cute::Stride<cute::Int<kThreadsPerRow>, cute::_1>>{},
      cute::Layout<cute::Shape<cute::_1, cute::_16>>{}));
};

template <class Element_, int kHeadDim_, int kRows_, int kWarps_, int kWarpKeys_, int kStages_,
          class ElementKV_ = Element_>
struct DecodeConfig {
  using Element = Element_;
  using ElementKV = ElementKV_;
  static constexpr bool kFp8 = !std::is_same_v<ElementKV, Element>;
  static_assert(!kFp8 || sizeof(ElementKV) == 1);
  // S = Q Kᵀ's operands: q's dtype, or fp16 with an FP8 cache (its keys are exactly fp16; a bf16 query
  // is rescaled into fp16 row by row: decode_kernel.h)
  using ElementQK = std::conditional_t<kFp8, cutlass::half_t, Element>;
  using ElementPV = std::conditional_t<kFp8, cutlass::half_t, Element>;  // P and V in O += P V
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kRows = kRows_;             // packed query rows per CTA
  static constexpr int kWarps = kWarps_;
  static constexpr int kWarpKeys = kWarpKeys_;     // keys of a warp's slice of a step
  static constexpr int kBlockN = kWarps * kWarpKeys;  // keys per step
  static constexpr int kStages = kStages_;         // K/V buffers per warp
  static constexpr int kThreads = kWarps * 32;
  // An FP8 cache's tile of 8 rows puts the keys on the mma's M side (decode_keys_on_m.h).
  static constexpr bool kKeysOnM = kFp8 && kRows == 8;
  static_assert(kHeadDim % 32 == 0 && (kRows % 16 == 0 || kKeysOnM) && kWarpKeys % 16 == 0 && kStages >= 2 &&
                kStages <= 4);
  static_assert(!kFp8 || kHeadDim == 64 || kHeadDim == 128 || kHeadDim == 256, "FP8 caches: head dims 64, 128, 256");

  using TiledMma = Sm80TiledMma<ElementQK, 1, 1>;   // S = Q Kᵀ
  using TiledMmaO = Sm80TiledMma<ElementPV, 1, 1>;  // O += P V
  // Q's fragments stay in registers (kRows · D / 64 a thread) beside O's fp32 accumulator
  // (kRows · D / 32) up to 16 rows × 128; beyond, the two would spill, so Q is read from shared
  // memory each step.
  static constexpr bool kQInRegisters = kRows * kHeadDim <= 16 * 128;

  using Smem = SmemTileShape<Element, kHeadDim>;
  using SmemLayoutQ = typename Smem::template TileLayout<kRows>;
  using SmemLayoutKV = typename Smem::template TileLayout<kWarpKeys>;  // a slice as the GEMMs read it
  using SmemLayoutVt = TransposedLayout<SmemLayoutKV>;
  // A slice as it lands: SmemLayoutKV, or an FP8 cache's bytes row by row, the 16-byte piece p of
  // key row k at p ^ (k mod 8) (mod 4 at D = 64): a warp's 16-byte loads of one piece of 8 rows
  // (K) and 4-byte loads of two pieces of 4 rows 2 apart (V) then touch every bank once.
  static constexpr int kPieceBits = kHeadDim >= 128 ? 3 : 2;
  static constexpr int kRowBits = kHeadDim == 64 ? 6 : kHeadDim == 128 ? 7 : 8;
  using SmemLayoutFp8 = decltype(cute::composition(
      cute::Swizzle<kPieceBits, 4, kRowBits - 4>{},
      cute::Layout<cute::Shape<cute::Int<kWarpKeys>, cute::Int<kHeadDim>>, cute::Stride<cute::Int<kHeadDim>, cute::_1>>{}));
  using SmemLayoutKVIn = std::conditional_t<kFp8, SmemLayoutFp8, SmemLayoutKV>;

  using SmemCopyAtom = cute::Copy_Atom<cute::SM75_U32x4_LDSM_N, ElementQK>;            // Q, K
  using SmemCopyAtomTransposed = cute::Copy_Atom<cute::SM75_U16x8_LDSM_T, ElementPV>;  // V
  // Each warp copies its own slices (and warp 0 the query rows): a warp-wide cp.async copy, 16
  // bytes a thread (8 values; an FP8 cache's 16).
  using GmemCopy = typename GmemTileCopy<Element, kHeadDim, 32>::Load;
  using GmemCopyKV =
      typename std::conditional_t<kFp8, Fp8RowCopy<ElementKV, kHeadDim>, TypeIs<GmemCopy>>::type;

  // The query rows, and with an FP8 cache each row's factor (float) after them.
  static constexpr int kQTileBytes = int(cute::cosize(SmemLayoutQ{})) * int(sizeof(Element));
  static constexpr int kQBytes = kQTileBytes + (kFp8 ? 128 : 0);
  static_assert(!kFp8 || kRows * int(sizeof(float)) <= 128);
  static constexpr int kKVInBytes = int(cute::cosize(SmemLayoutKVIn{})) * int(sizeof(ElementKV));  // as it lands
  static constexpr int kWarpBytes = 2 * kStages * kKVInBytes;  // a warp's K and V buffers
  // The merge: each warp's normalised fp32 output rows and lse, in the K/V buffers once every warp
  // is done with them. Rows padded by 8 floats: a warp's 8-byte stores of its accumulator (rows
  // lane / 4 and + 8, columns 2 · (lane % 4) + 8j) then fill 32 banks in each half-warp phase.
  static constexpr int kMergeStride = kHeadDim + 8;
  static constexpr int kMergeBytes = kWarps * kRows * (kMergeStride + 1) * int(sizeof(float));
  static constexpr int kSmemBytes = kQBytes + (kWarps * kWarpBytes > kMergeBytes ? kWarps * kWarpBytes : kMergeBytes);
};

}  // namespace fa::sm80
