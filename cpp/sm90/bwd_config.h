// The Hopper-family backward's configuration: tile shape, shared-memory layouts, the five wgmma
// GEMMs and the shared-memory plan.
//
// A CTA owns kBlockN keys (64 per consumer warpgroup: one wgmma M) and walks query tiles of
// kBlockM rows. The scores are computed transposed, Sᵀ = K Qᵀ and dPᵀ = V dOᵀ (keys × queries),
// so that each warpgroup's Pᵀ and dSᵀ accumulators are, once converted to fp16/bf16, the register
// A operands of its own dV += Pᵀ dO and dK += dSᵀ Q (keys × head dim). dQ = dS K needs every key:
// dSᵀ goes through shared memory and the two warpgroups split dQ's columns.
//
// Above head dim 128 (kSplitHeadDim) dK and dV of 64 keys per warpgroup would not fit in registers,
// and dQ's reductions bound the step (docs/tried.md: b7eb755, c86cb70): a CTA owns 80 keys, 96 at
// D = 192 (FA3's tiles: 20% and 33% fewer dQ bytes per FLOP than 64) and the warpgroups split the
// head dim for dK, dV and dQ and the keys for S and dP:
//   S = Q Kᵀ, dP = dO Vᵀ   queries × keys, half the keys per warpgroup (wgmma N = 40, 48);
//   P, dS                  to shared memory as Pᵀ, dSᵀ (keys × queries, stmatrix .trans);
//   dVᵀ += dOᵀ P, dKᵀ += Qᵀ dS   head dim × keys (wgmma M = the head dim, 128 rows per
//                          warpgroup, N = the CTA's keys): 2 × N accumulator registers a thread;
//   dQ = dS K              in two slices of 128 columns (64 per warpgroup), each added to the
//                          workspace from registers before the next is computed (32 registers).
// One dO buffer (released once dV's GEMM is done) pays for the K and V tiles of 80 (96) keys.
//
// v's head dim may be below q's and k's there (kHeadDimV, FA_HEAD_DIM_PAIRS: DeepSeek's 192/128):
// dP, dV, dO and V at Dv. dVᵀ splits Dv between the warpgroups as above (Dv a multiple of 128),
// and dKᵀ its first D / 128 · 128 rows (the lead). At D = 192 three 64-column blocks remain for
// two warpgroups (an MN-major wgmma operand in the 128-byte swizzle takes whole 64-element
// blocks): dQ's blocks 0 and 2 are warpgroup 0's, its block 1 and dKᵀ's last 64 rows (the tail,
// all the keys: as many multiply-adds as a dQ block) warpgroup 1's (kdQAsymmetric), so both
// still do the same work.
#pragma once

#include <type_traits>

#include <cute/tensor.hpp>
#include <cutlass/pipeline/sm90_pipeline.hpp>

#include "sm90/fwd_config.h"

namespace fa::sm90 {

template <class Element_, int kHeadDim_, int kBlockM_, int kBlockN_, int kStages_, int kHeadDimV_ = kHeadDim_>
struct BackwardConfig {
  using Element = Element_;
  static constexpr int kHeadDim = kHeadDim_;    // q's and k's
  static constexpr int kHeadDimV = kHeadDimV_;  // v's, dO's (and the output's)
  static constexpr int kBlockM = kBlockM_;  // query rows per step
  static constexpr int kBlockN = kBlockN_;  // keys of the CTA
  static constexpr int kStages = kStages_;  // Q (with its lse) buffers

  static constexpr int kMmaWarpgroups = 2;
  static constexpr int kMmaThreads = kMmaWarpgroups * 128;
  static constexpr int kThreads = kMmaThreads + 128;  // + the producer warpgroup (one warp loads)
  static constexpr int kProducerRegisters = 24;
  static constexpr int kMmaRegisters = 240;
  // Above head dim 128 the warpgroups split the head dim instead of the keys: 64 keys × D of dK
  // and of dV per warpgroup would not fit in registers (2 × 128 fp32 a thread at D = 256). Each
  // then holds dK, dV and dQ for half the head dim, computes Sᵀ and dPᵀ for half the queries, and
  // Pᵀ joins dSᵀ in shared memory (dV and dK read both as shared-memory operands).
  static constexpr bool kSplitHeadDim = kHeadDim > 128;
  static_assert(kSplitHeadDim ? kBlockN % 16 == 0 && kBlockN / kMmaWarpgroups % 8 == 0 && kBlockM == 64
                              : kBlockN == 64 * kMmaWarpgroups,
                "keys: 64 per wgmma M; or, split, whole k16 slices and wgmma N of 8s");
  static_assert(kBlockM % 64 == 0 && kHeadDim % 64 == 0, "whole 128-byte swizzle rows");
  static_assert(kHeadDimV == kHeadDim || (kSplitHeadDim && kHeadDimV % 128 == 0 && kHeadDimV < kHeadDim),
                "v's own head dim: split head dim only, dVᵀ's rows whole 64-row halves");
  static constexpr int kStagesdO = kSplitHeadDim ? 1 : kStages;  // dO (with its delta) buffers
  // Split head dim: dKᵀ's rows that the warpgroups split (the lead) and those warpgroup 1 computes
  // alone (the tail: 64 at D = 192, else none).
  static constexpr int kdKLeadRows = kSplitHeadDim ? kHeadDim / 128 * 128 : kHeadDim;
  static constexpr int kdKTailRows = kHeadDim - kdKLeadRows;
  static_assert(!kSplitHeadDim || kdKTailRows == 0 || kdKTailRows == 64);

  using TileQ = cute::Shape<cute::Int<kBlockM>, cute::Int<kHeadDim>>;
  using TileDO = cute::Shape<cute::Int<kBlockM>, cute::Int<kHeadDimV>>;
  using TileK = cute::Shape<cute::Int<kBlockN>, cute::Int<kHeadDim>>;
  using TileV = cute::Shape<cute::Int<kBlockN>, cute::Int<kHeadDimV>>;
  using TileKV = TileK;  // keys split (one head dim)
  using TileKt = cute::Shape<cute::Int<kHeadDim>, cute::Int<kBlockN>>;   // split: dKᵀ
  using TileVt = cute::Shape<cute::Int<kHeadDimV>, cute::Int<kBlockN>>;  // split: dVᵀ
  using TileKtLead = cute::Shape<cute::Int<kdKLeadRows>, cute::Int<kBlockN>>;
  using TileKtTail = cute::Shape<cute::Int<64>, cute::Int<kBlockN>>;
  using TileSt = cute::Shape<cute::Int<kBlockN>, cute::Int<kBlockM>>;  // keys × queries
  using TileS = cute::Shape<cute::Int<kBlockM>, cute::Int<kBlockN>>;   // split: queries × keys

  // Every tile in the 128-byte swizzle (rows of 64 elements) that TMA and wgmma read without bank
  // conflicts. Each is also read transposed by one GEMM: the same bytes seen with the other mode
  // contiguous (MN-major), as the forward reads V.
  using SmemAtom = cute::GMMA::Layout_K_SW128_Atom<Element>;
  using SmemLayoutQ = decltype(cute::tile_to_shape(
      SmemAtom{}, cute::Shape<cute::Int<kBlockM>, cute::Int<kHeadDim>, cute::Int<kStages>>{}));
  using SmemLayoutQt = TransposedLayout<SmemLayoutQ>;
  using SmemLayoutdO = decltype(cute::tile_to_shape(
      SmemAtom{}, cute::Shape<cute::Int<kBlockM>, cute::Int<kHeadDimV>, cute::Int<kStagesdO>>{}));
  using SmemLayoutdOt = TransposedLayout<SmemLayoutdO>;
  using SmemLayoutK = decltype(cute::tile_to_shape(SmemAtom{}, TileK{}));
  using SmemLayoutV = decltype(cute::tile_to_shape(SmemAtom{}, TileV{}));
  using SmemLayoutKt = TransposedLayout<SmemLayoutK>;
  using SmemLayoutVt = TransposedLayout<SmemLayoutV>;
  // dKᵀ's lead and tail rows (split head dim) in Qᵀ's and Kᵀ's buffers: Q's (K's) columns [0, lead)
  // in every stage, and the 64 from `lead` on, transposed. The tail's view starts kQTailOffset
  // (kKTailOffset) elements in: the tiles keep each 64 columns in a block of their own, and whole
  // 1024-byte swizzle periods lie before it, so its swizzled addresses are the whole tile's.
  using SmemLayoutQtLead = TransposedLayout<ColumnsOf<SmemLayoutQ, kdKLeadRows>>;
  using SmemLayoutQtTail = TransposedLayout<ColumnsOf<SmemLayoutQ, 64>>;
  using SmemLayoutKtLead = TransposedLayout<ColumnsOf<SmemLayoutK, kdKLeadRows>>;
  using SmemLayoutKtTail = TransposedLayout<ColumnsOf<SmemLayoutK, 64>>;
  static constexpr int kQTailOffset = kdKLeadRows * kBlockM;  // elements: the tail's first column
  static constexpr int kKTailOffset = kdKLeadRows * kBlockN;
  static_assert(kQTailOffset * sizeof(Element) % 1024 == 0 && kKTailOffset * sizeof(Element) % 1024 == 0,
                "whole swizzle patterns (a 128-byte row's 8-row period) before the tail");
  // dSᵀ as the consumers write it (keys × queries, queries contiguous), two buffers so that one
  // barrier a step suffices; dS as the dQ GEMM reads it (queries × keys, MN-major).
  using SmemLayoutdSt = decltype(cute::tile_to_shape(
      SmemAtom{}, cute::Shape<cute::Int<kBlockN>, cute::Int<kBlockM>, cute::_2>{}));
  using SmemLayoutdS = TransposedLayout<SmemLayoutdSt>;

  // Sᵀ = K Qᵀ, dPᵀ = V dOᵀ (M = 64 keys per warpgroup, N = the queries); split head dim S = Q Kᵀ,
  // dP = dO Vᵀ (M = the 64 queries, N = kBlockN / 2 keys per warpgroup). Both operands in shared
  // memory.
  using AlongM = cute::Layout<cute::Shape<cute::Int<kMmaWarpgroups>, cute::_1, cute::_1>>;
  using AlongN = cute::Layout<cute::Shape<cute::_1, cute::Int<kMmaWarpgroups>, cute::_1>>;
  using ScoreWarpgroups = std::conditional_t<kSplitHeadDim, AlongN, AlongM>;
  static constexpr int kScoreColumns = kSplitHeadDim ? kBlockN / kMmaWarpgroups : kBlockM;  // per warpgroup
  using TiledMmaSdP = decltype(cute::make_tiled_mma(
      ss_op<Element, cute::Shape<cute::_64, cute::Int<kScoreColumns>, cute::Int<kHeadDim>>>(),
      ScoreWarpgroups{}));
  // dV += Pᵀ dO, dK += dSᵀ Q, B = dO or Q read as head dim × queries, A from registers (the
  // converted Sᵀ-shaped accumulators). Split head dim: dVᵀ += dOᵀ P, dKᵀ += Qᵀ dS, A = dOᵀ or Qᵀ
  // (head dim × queries), B = Pᵀ or dSᵀ from shared memory, the warpgroups along the head dim.
  using TiledMmadKVKeys = decltype(cute::make_tiled_mma(
      rs_op<Element, cute::Shape<cute::_64, cute::Int<kHeadDim>, cute::Int<kBlockM>>, cute::GMMA::Major::K,
            cute::GMMA::Major::MN>(),
      AlongM{}));
  using TiledMmadKVSplit = decltype(cute::make_tiled_mma(
      ss_op<Element, cute::Shape<cute::_64, cute::Int<kBlockN>, cute::Int<kBlockM>>, cute::GMMA::Major::MN,
            cute::GMMA::Major::K>(),
      AlongM{}));
  using TiledMmadKV = std::conditional_t<kSplitHeadDim, TiledMmadKVSplit, TiledMmadKVKeys>;
  // Split head dim, dKᵀ's tail rows: warpgroup 1's alone (kdQAsymmetric).
  using OneWarpgroup = cute::Layout<cute::Shape<cute::_1, cute::_1, cute::_1>>;
  using TiledMmadKTail = decltype(cute::make_tiled_mma(
      ss_op<Element, cute::Shape<cute::_64, cute::Int<kBlockN>, cute::Int<kBlockM>>, cute::GMMA::Major::MN,
            cute::GMMA::Major::K>(),
      OneWarpgroup{}));
  // dQ = dS K: dS and K both MN-major from shared memory. The warpgroups split the query rows
  // where there are 128 (wgmma N = the head dim), else the head dim (N = D / 2); split head dim,
  // N = 64 a warpgroup, which tiles the head dim in kdQSlices slices computed one after the other:
  // two at D = 256; at D = 192 (kdQAsymmetric) a TiledMma of one warpgroup, whose three slices
  // (the head dim's 64-column blocks) the warpgroups share out as above.
  static constexpr bool kdQAlongM = kBlockM >= 128;
  static_assert(!kdQAlongM || kBlockM % (64 * kMmaWarpgroups) == 0);
  static constexpr bool kdQAsymmetric = kSplitHeadDim && kdKTailRows > 0;
  static_assert(!kdQAsymmetric || (kHeadDim == 192 && kMmaWarpgroups == 2));
  static constexpr int kdQColumns = kdQAlongM ? kHeadDim : kSplitHeadDim ? 64 : kHeadDim / kMmaWarpgroups;
  static constexpr int kdQWarpgroups = kdQAsymmetric ? 1 : kMmaWarpgroups;  // those of TiledMmadQ
  static constexpr int kdQThreads = kdQWarpgroups * 128;
  static constexpr int kdQSlices = kHeadDim / (kdQColumns * (kdQAlongM ? 1 : kdQWarpgroups));
  using TileQSlice = cute::Shape<cute::Int<kBlockM>, cute::Int<kHeadDim / kdQSlices>>;
  using TiledMmadQ = decltype(cute::make_tiled_mma(
      ss_op<Element, cute::Shape<cute::_64, cute::Int<kdQColumns>, cute::Int<kBlockN>>, cute::GMMA::Major::MN,
            cute::GMMA::Major::MN>(),
      std::conditional_t<kdQAsymmetric, OneWarpgroup, std::conditional_t<kdQAlongM, AlongM, AlongN>>{}));

  using Pipeline = cutlass::PipelineTmaAsync<kStages>;
  using PipelinedO = cutlass::PipelineTmaAsync<kStagesdO>;

  static constexpr int kQBytes = kBlockM * kHeadDim * sizeof(Element);
  static constexpr int kdOBytes = kBlockM * kHeadDimV * sizeof(Element);
  static constexpr int kRowBytes = kBlockM * sizeof(float);  // a tile's lse or delta values
  static constexpr int kKVBytes = kBlockN * (kHeadDim + kHeadDimV) * sizeof(Element);  // K and V
  // Each warpgroup's share of the dQ tile (kBlockM · D / 2 fp32) in the order of its accumulator
  // registers: see dq_staging_offset(). Staged in shared memory for the dQ writer's bulk
  // reductions, kdQStages buffers (a warpgroup's reduction of one step may still be reading its
  // buffer while the next step stages into the other); or, split head dim (kdQFromRegisters),
  // added to the workspace straight from registers by 16-byte reductions: a staged tile would be
  // 64 KB there, and the tile's trip through shared memory (written, then read by the reduction)
  // is saved.
  static constexpr int kdQWarpgroupFloats = kBlockM * kHeadDim / kdQWarpgroups;
  static constexpr bool kdQFromRegisters = kSplitHeadDim;
  static constexpr int kdQStages = kdQFromRegisters ? 0 : 2;
  // The workspace's query tiles claimed instead of zeroed (common/dq_claims.h) at head dim 64: its
  // backward 1.7–3% faster. At D = 128 a run-time choice (kdQClaimsAtRunTime): claims where a row
  // sees few keys, whose call the zeros' round trip through memory weighs on most. Timed both ways
  // call by call in one process (tools/bwd_rows.py --knob claims, H100, 2026-12-07; claims / zeros):
  // at (4, 32, 8192) windows of 512 and 1024 keys 0.91 and 0.96, causal at 1024 and 2048 tokens
  // 0.93 and 0.97; but level from about 1800 keys a row (a 2048-key window 1.00, causal at 4096
  // tokens 1.01) and 2–5% slower from 3584 (causal at 8192 and 16384 tokens, non-causal at 8192,
  // a 4096-key window), as in 4b7f035's measurement (docs/tried.md). kdQClaimsMaxKeys lies between:
  // claims where a row sees at most that many keys on average (mean_visible_keys, attention_mask.h);
  // FA_BWD_DQ_CLAIMS_MAX_KEYS, read at each call, overrides it.
  static constexpr bool kdQClaims = !kdQFromRegisters && kHeadDim <= 64;
  static constexpr bool kdQClaimsAtRunTime = !kdQFromRegisters && !kdQClaims;
  static constexpr int kdQClaimsMaxKeys = 1536;
  // The rows of the units past the first two waves' prepared by the main kernel's warps 2 and 3
  // instead of the pre-pass (BackwardParams::unit_ready), at head dims 64 and 256: there the
  // backward's kernels took 1.2–2.8% (D = 64) and 0–4.4% (D = 256) less time, 0.986–1.001× the
  // time at the power limit. At D = 128 the main kernel slowed by about what the pre-pass saved
  // (level at the limit; docs/tried.md, 5a12417).
  static constexpr bool kRowsInMainKernel = kHeadDim != 128;
  // Not where a row sees few keys on average (a narrow window, short causal rows): the consumers
  // then need a unit's rows faster than two warps a CTA prepare them (each warp one 1 KB round
  // trip to memory at a time), and wait. Timed both ways call by call in one process
  // (tools/bwd_rows.py, H100, 2026-12-07): at D = 64 the pre-pass 0.63x the time with a 128-key
  // window at (4, 64/8, 8192), 0.93x with 512 keys, 0.97x causal at 1024 tokens (512 keys a row),
  // but 1.01-1.03x from 640 keys (windows of 640-2048 keys, causal at 1536-8192 tokens); at
  // D = 256 0.73x with 128 keys, 0.92x with 1024, 0.84x / 0.97x causal at 1024 / 2048 tokens, but
  // 1.02-1.04x from 1536 keys. The threshold between (head dim 192: 256's, not measured).
  // FA_BWD_ROWS_MIN_KEYS, read at each call, overrides it.
  static constexpr int kRowsInMainKernelMinKeys = kHeadDim <= 64 ? 576 : 1152;
  // How much of L2 the causal order's sections may fill (BackwardTileOrder: (batch, kv head) units
  // whose Q, dO and dQ workspace rows stream through L2 together, their key tiles longest first).
  // 20 MB at D = 128: timed call by call against 40 MB in one process (bench.py --interleave,
  // docs/tried.md, fec31b6) 1.0-2.2% faster on the causal (2, 64, 4096), (4, 64, 8192)
  // and (2, 16, 16384) rows, whose sections then hold 4, 2 and 1 units instead of 8, 4 and 2.
  // 40 MB at D = 64 and 256, timed the same way (causal (16, 16, 2048, 64) and
  // (4, 16, 4096, 256)): at D = 64 20 MB level (sections of 16 units instead of 32), 80 MB 2.5%
  // slower; at D = 256 20 MB 2.2% slower (2 units instead of 4), 80 MB level.
  // FA_BWD_L2_BUDGET_MB, read at each call, overrides it (launch_backward).
  static constexpr int64_t kL2SectionBudget = int64_t(kHeadDim == 128 ? 20 : 40) << 20;
  // A deterministic backward's (its key tiles add to each query tile's dQ in turn) at D = 256,
  // where they add in the order from the first key tile: 160 MB. Timed call by call against 40
  // (H200, docs/tried.md): causal (2, 16, 8192), (4, 16, 4096) 352 → 414, 355 → 387 TFLOP/s;
  // non-causal 440 → 447, 416 → 410. 240 MB level with 160, 320 MB and more 3-41% slower
  // non-causal; at D = 64 and 128, 80 MB level to 13% slower than their defaults. In the causal
  // order from the last key tile down (BackwardTileOrder's shortest_first) kL2SectionBudget:
  // (4, 16, 4096) 388 TFLOP/s, 218 with 160 MB.
  static constexpr int64_t kL2SectionBudgetDeterministic = kHeadDim == 256 ? int64_t(160) << 20 : kL2SectionBudget;
  // On a memory bus narrower than the H200's 6144 bits (the H100 SXM's 5120: 3.35 TB/s against 4.8),
  // a deterministic backward's at D = 256 in both orders: 20 MB. Timed call by call (H100, c07b4fb,
  // FA_BWD_L2_BUDGET_MB; docs/tried.md): non-causal (4, 16, 4096), (2, 16, 8192) 311 → 422, 409 →
  // 416 TFLOP/s against 160 MB (40 MB 424, 422; 80 MB 370, 425); causal (shortest first) 322 → 385,
  // 358 → 413 against 40 MB (80 MB 211, 234).
  static constexpr int kNarrowBusBits = 6144;
  // The budget of a call's sections (launch_backward): shortest_first, its causal deterministic order
  // from the last key tile down; bus_bits, the device's memory bus width.
  static constexpr int64_t l2_section_budget(bool deterministic, bool shortest_first, int bus_bits) {
    if (deterministic && kHeadDim == 256 && bus_bits < kNarrowBusBits) return int64_t(20) << 20;
    return deterministic && !shortest_first ? kL2SectionBudgetDeterministic : kL2SectionBudget;
  }

  // The buffers only some configurations have, as base classes present or empty: Pᵀ (split head
  // dim; laid out as dSᵀ, two buffers) and dQ's staging buffers (not with kdQFromRegisters).
  struct PtBuffer {
    cute::array_aligned<Element, decltype(cute::cosize(SmemLayoutdSt{}))::value, 1024> pt;
  };
  struct NoPtBuffer {};
  struct DqStaging {
    cute::array_aligned<float, kdQStages * kMmaWarpgroups * kdQWarpgroupFloats, 128> dq;
  };
  struct NoDqStaging {};

  struct SharedStorage : std::conditional_t<kSplitHeadDim, PtBuffer, NoPtBuffer>,
                         std::conditional_t<kdQFromRegisters, NoDqStaging, DqStaging> {
    cute::array_aligned<Element, decltype(cute::cosize(SmemLayoutQ{}))::value, 1024> q;
    cute::array_aligned<Element, decltype(cute::cosize(SmemLayoutdO{}))::value, 1024> dout;
    cute::array_aligned<Element, decltype(cute::cosize(SmemLayoutK{}))::value, 1024> k;
    cute::array_aligned<Element, decltype(cute::cosize(SmemLayoutV{}))::value, 1024> v;
    cute::array_aligned<Element, decltype(cute::cosize(SmemLayoutdSt{}))::value, 1024> ds;
    cute::array_aligned<float, kStages * kBlockM, 128> lse_log2;  // with Q
    cute::array_aligned<float, kStagesdO * kBlockM, 128> delta;   // with dO
    typename Pipeline::SharedStorage pipeline_q;
    typename PipelinedO::SharedStorage pipeline_do;
    uint64_t kv_full;   // transaction barrier of the K and V tiles
    uint64_t kv_empty;  // the consumers have stored a key tile's dK and dV from K's and V's buffers
    uint64_t writer_tile_full;   // next_tile holds the next index, for the dQ writer
    uint64_t writer_tile_empty;  // the dQ writer has read it
    int next_tile;      // the persistent CTA's next key tile (BackwardTileHandoff, bwd_load.h)
  };
  static constexpr int kSmemBytes = sizeof(SharedStorage);
  static_assert(kSmemBytes <= kMaxSmemBytes, "tile does not fit in shared memory");

  // Where value i of thread mma_tid's dQ accumulator (of TiledMmadQ's kdQThreads: a whole tile's)
  // lies in the staging buffer and in the workspace tile (which the buffer is added to, or
  // kdQFromRegisters the registers are): groups of 4 consecutive registers are 16-byte vectors,
  // and the 128 threads of a warpgroup store theirs side by side, so each warp's vector store or
  // reduction covers 512 contiguous bytes (no bank conflicts in the buffer). The convert pass reads
  // it back the same way.
  CUTE_HOST_DEVICE static constexpr int dq_staging_offset(int mma_tid, int i) {
    return (mma_tid / 128) * kdQWarpgroupFloats + ((i / 4) * 128 + mma_tid % 128) * 4 + i % 4;
  }
  // Step t's staging buffer (floats from the start of SharedStorage::dq).
  CUTE_HOST_DEVICE static constexpr int dq_staging_buffer(int t) {
    return (t % kdQStages) * kMmaWarpgroups * kdQWarpgroupFloats;
  }
};

// The shared-memory tiles of a BackwardConfig's SharedStorage as CuTe tensors, those that a GEMM
// reads transposed also seen so (the same bytes). Pᵀ's buffer (split head dim only) is viewed
// where it is used (bwd_mma_split.h).
template <class Config>
struct BackwardSmemTensors {
  using Element = typename Config::Element;
  template <class Layout>
  using View = decltype(cute::make_tensor(cute::make_smem_ptr(static_cast<Element*>(nullptr)), Layout{}));
  template <class Layout>
  CUTE_DEVICE static View<Layout> view(Element* data) { return cute::make_tensor(cute::make_smem_ptr(data), Layout{}); }

  View<typename Config::SmemLayoutQ> q;
  View<typename Config::SmemLayoutQt> qt;
  View<typename Config::SmemLayoutdO> dout;
  View<typename Config::SmemLayoutdOt> doutt;
  View<typename Config::SmemLayoutK> k;
  View<typename Config::SmemLayoutV> v;
  View<typename Config::SmemLayoutKt> kt;
  View<typename Config::SmemLayoutVt> vt;
  View<typename Config::SmemLayoutdSt> dst;  // keys × queries, two buffers
  View<typename Config::SmemLayoutdS> ds;    // the same seen as queries × keys

  template <class Storage>
  CUTE_DEVICE explicit BackwardSmemTensors(Storage& smem)
      : q(view<typename Config::SmemLayoutQ>(smem.q.data())),
        qt(view<typename Config::SmemLayoutQt>(smem.q.data())),
        dout(view<typename Config::SmemLayoutdO>(smem.dout.data())),
        doutt(view<typename Config::SmemLayoutdOt>(smem.dout.data())),
        k(view<typename Config::SmemLayoutK>(smem.k.data())),
        v(view<typename Config::SmemLayoutV>(smem.v.data())),
        kt(view<typename Config::SmemLayoutKt>(smem.k.data())),
        vt(view<typename Config::SmemLayoutVt>(smem.v.data())),
        dst(view<typename Config::SmemLayoutdSt>(smem.ds.data())),
        ds(view<typename Config::SmemLayoutdS>(smem.ds.data())) {}
};

}  // namespace fa::sm90
