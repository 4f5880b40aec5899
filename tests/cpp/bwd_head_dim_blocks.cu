// The Hopper backward at q/k head dim 192 and v's 128 (sm90/bwd_config.h, kdQAsymmetric), on the
// host (no GPU): the views and slices its warpgroups share out hold what they stand for.
//   1. dKᵀ's lead and tail views of Q's and K's shared-memory tiles (first_columns, and the tail at
//      kQTailOffset / kKTailOffset) address what the whole tiles put at those coordinates, every
//      stage; a tail view without its offset (a control) does not.
//   2. dQ's three 64-column slices: slice j of the one-warpgroup TiledMma's Kᵀ operand holds the
//      head dim's columns [64j, 64j + 64); value v of slice j's accumulator, added to the workspace at
//      dq_staging_offset(thread, 32j + v), is the element the convert pass reads there (the whole
//      tile's accumulator), and the 128 threads' offsets cover the tile's 64 × 192 floats once.
//   3. The accumulators of dKᵀ's lead (both warpgroups), its tail (one) and dVᵀ cover their tiles once.
// Exits 1 on a failure. Built and run by tests/test_bwd_head_dim_blocks.py.
#include <cstdio>
#include <set>
#include <utility>
#include <vector>

#include <cute/tensor.hpp>

#include "sm90/bwd_launch.h"  // BackwardConfigFor

using namespace cute;

namespace {

int failures = 0;

void expect(bool ok, const char* what) {
  std::printf("%s: %s\n", what, ok ? "ok" : "FAILED");
  if (!ok) ++failures;
}

// Whether view(d, m[, s]) + offset == whole(m, first + d[, s]) for every coordinate of the view.
template <class View, class Whole>
bool same_addresses(View const& view, Whole const& whole, int first, int offset) {
  if constexpr (decltype(rank(view))::value == 2) {
    for (int d = 0; d < int(size<0>(view)); ++d)
      for (int m = 0; m < int(size<1>(view)); ++m)
        if (int(view(d, m)) + offset != int(whole(m, first + d))) return false;
  } else {
    for (int s = 0; s < int(size<2>(view)); ++s)
      for (int d = 0; d < int(size<0>(view)); ++d)
        for (int m = 0; m < int(size<1>(view)); ++m)
          if (int(view(d, m, s)) + offset != int(whole(m, first + d, s))) return false;
  }
  return true;
}

// Whether the threads' partitions of `tile` (an accumulator shape) under `mma` cover it once.
template <class Mma, class Tile>
bool covers_once(Mma const& mma, Tile const& tile, int threads) {
  std::set<std::pair<int, int>> seen;
  int count = 0;
  for (int t = 0; t < threads; ++t) {
    auto c = mma.get_thread_slice(t).partition_C(make_identity_tensor(tile));
    for (int i = 0; i < int(size(c)); ++i) {
      seen.insert({int(get<0>(c(i))), int(get<1>(c(i)))});
      ++count;
    }
  }
  return count == int(size(tile)) && int(seen.size()) == count;
}

}  // namespace

int main() {
  using Config = fa::sm90::BackwardConfigFor<cutlass::bfloat16_t, 192, 128>;
  static_assert(Config::kdQAsymmetric && Config::kdKLeadRows == 128 && Config::kdKTailRows == 64);
  constexpr int kBlockM = Config::kBlockM, kBlockN = Config::kBlockN;
  std::printf("D 192/128, %d query rows x %d keys\n", kBlockM, kBlockN);

  // 1. The views.
  typename Config::SmemLayoutQ q;
  typename Config::SmemLayoutK k;
  expect(same_addresses(typename Config::SmemLayoutQtLead{}, q, 0, 0), "Q lead view");
  expect(same_addresses(typename Config::SmemLayoutQtTail{}, q, 128, Config::kQTailOffset), "Q tail view");
  expect(same_addresses(typename Config::SmemLayoutKtLead{}, k, 0, 0), "K lead view");
  expect(same_addresses(typename Config::SmemLayoutKtTail{}, k, 128, Config::kKTailOffset), "K tail view");
  expect(!same_addresses(typename Config::SmemLayoutQtTail{}, q, 128, 0), "Q tail view without its offset (control) differs");

  // 2. dQ's slices.
  typename Config::TiledMmadQ mma_dq;
  static_assert(decltype(size(mma_dq))::value == 128 && Config::kdQSlices == 3);
  bool slices_ok = true;
  {
    auto b = mma_dq.get_thread_slice(0).partition_B(make_identity_tensor(typename Config::TileKt{}));
    for (int j = 0; j < 3; ++j) {
      auto slice = fa::sm90::n_slice<3>(b, j);
      for (int i = 0; i < int(size(slice)); ++i) {
        const int col = int(get<0>(slice(i)));
        if (col < 64 * j || col >= 64 * j + 64) slices_ok = false;
      }
    }
  }
  expect(slices_ok, "dQ slice j's K operand is the head dim's columns [64j, 64j + 64)");
  bool offsets_ok = true;
  std::vector<int> hits(kBlockM * 192, 0);
  for (int t = 0; t < 128; ++t) {
    auto thr = mma_dq.get_thread_slice(t);
    auto whole = thr.partition_C(make_identity_tensor(typename Config::TileQ{}));         // the convert pass's
    auto slice = thr.partition_C(make_identity_tensor(typename Config::TileQSlice{}));    // the main kernel's
    static_assert(decltype(size(slice))::value == 32);
    for (int j = 0; j < 3; ++j) {
      for (int v = 0; v < 32; ++v) {
        const int i = 32 * j + v;
        const bool same = int(get<0>(whole(i))) == int(get<0>(slice(v))) &&
                          int(get<1>(whole(i))) == 64 * j + int(get<1>(slice(v)));
        if (!same) offsets_ok = false;
        ++hits[Config::dq_staging_offset(t, i)];
      }
    }
  }
  bool once = true;
  for (int h : hits) once = once && h == 1;
  expect(offsets_ok, "dQ slice values land where the convert pass reads them");
  expect(once, "dQ workspace offsets cover the tile once");

  // 3. The dK and dV accumulators.
  expect(covers_once(typename Config::TiledMmadKV{}, typename Config::TileKtLead{}, 256), "dK lead rows covered once");
  expect(covers_once(typename Config::TiledMmadKTail{}, typename Config::TileKtTail{}, 128), "dK tail rows covered once");
  expect(covers_once(typename Config::TiledMmadKV{}, typename Config::TileVt{}, 256), "dV covered once");

  std::printf(failures == 0 ? "ok\n" : "%d failed\n", failures);
  return failures == 0 ? 0 : 1;
}
