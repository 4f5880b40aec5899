// Host-side check of the Hopper family's tile orders (sm90/tile_scheduler.h).
// Backward (BackwardTileOrder): every (key tile, kv head, batch) is taken by exactly one CTA index;
// without causal the order is each (batch, head)'s key tiles in turn; with causal, inside each
// section of (batch, head) pairs, key tile n of every pair comes before key tile n + 1 of any
// (longest first; deterministic and causal, `shortest_first`, n + 1 before n), and the sections
// follow one another.
// Forward (TileScheduler): every (query tile, head, batch) exactly once; without causal each
// (batch, head)'s query tiles in turn, first to last; with causal, inside each section, query
// tile m of every pair before query tile m - 1 of any (longest first), sections in turn.
// Prints one line per case and "ok" at the end; exits non-zero on a failure.
#include <cstdio>
#include <vector>

#include "sm90/tile_scheduler.h"

using fa::sm90::BackwardTileOrder;
using fa::sm90::TileScheduler;

static int failures = 0;

static void expect(bool ok, const char* what, int n_blocks, int heads, int batch, bool causal, int i) {
  if (!ok && failures++ < 10) {
    std::printf("FAIL %s: n_blocks %d heads %d batch %d causal %d index %d\n", what, n_blocks, heads, batch,
                int(causal), i);
  }
}

static void check(int n_blocks, int heads, int batch, bool causal, long long unit_bytes, long long budget,
                  bool shortest_first = false) {
  const auto order = BackwardTileOrder::make(n_blocks, heads, batch, causal, shortest_first, unit_bytes, budget);
  const int units = heads * batch;
  std::vector<int> seen(size_t(n_blocks) * units, 0);
  int prev_unit_section = -1, prev_n = -1;
  for (int i = 0; i < int(order.size()); ++i) {
    const auto t = order.tile(i);
    const bool in_range = t.n_block >= 0 && t.n_block < n_blocks && t.head_kv >= 0 && t.head_kv < heads &&
                          t.batch >= 0 && t.batch < batch;
    expect(in_range, "tile out of range", n_blocks, heads, batch, causal, i);
    if (!in_range) continue;
    const int unit = t.batch * heads + t.head_kv;
    ++seen[size_t(unit) * n_blocks + t.n_block];
    if (!causal) {
      expect(unit == i / n_blocks && t.n_block == i % n_blocks, "not causal: a pair's tiles in turn", n_blocks,
             heads, batch, causal, i);
    } else {
      const int section = unit / order.order.section;
      expect(section >= prev_unit_section, "sections in turn", n_blocks, heads, batch, causal, i);
      if (section == prev_unit_section && !shortest_first) {
        expect(t.n_block >= prev_n, "longest (lowest key tile) first within a section", n_blocks, heads, batch,
               causal, i);
      }
      if (section == prev_unit_section && shortest_first) {
        expect(t.n_block <= prev_n, "shortest (highest key tile) first within a section", n_blocks, heads,
               batch, causal, i);
      }
      prev_unit_section = section;
      prev_n = t.n_block;
    }
  }
  for (size_t j = 0; j < seen.size(); ++j) {
    expect(seen[j] == 1, "every tile exactly once", n_blocks, heads, batch, causal, int(j));
  }
  const int section = order.order.section;
  const long long filled = (long long)section * unit_bytes;
  expect(!causal ? section == 1
                 : section >= 1 && (section == 1 || filled <= budget) && section <= units &&
                       (section & (section - 1)) == 0,
         "section: a power of two within the budget", n_blocks, heads, batch, causal, -1);
  std::printf("n_blocks %4d heads %3d batch %2d causal %d%s: %7lld tiles, section %d\n", n_blocks, heads, batch,
              int(causal), shortest_first ? " shortest first" : "", (long long)order.size(), section);
}

static void check_forward(int m_blocks, int heads, int batch, bool causal, long long kv_bytes_per_head) {
  const auto p = TileScheduler::make_params(m_blocks, heads, batch, causal, kv_bytes_per_head, nullptr);
  const int units = heads * batch;
  std::vector<int> seen(size_t(m_blocks) * units, 0);
  int prev_section = -1, prev_m = -1;
  for (int t = 0; t < p.total; ++t) {
    const auto w = TileScheduler::tile(p, t);
    const bool in_range = w.m_block >= 0 && w.m_block < m_blocks && w.head >= 0 && w.head < heads && w.batch >= 0 &&
                          w.batch < batch;
    expect(in_range, "forward: tile out of range", m_blocks, heads, batch, causal, t);
    if (!in_range) continue;
    const int unit = w.batch * heads + w.head;
    ++seen[size_t(unit) * m_blocks + w.m_block];
    if (!causal) {
      expect(unit == t / m_blocks && w.m_block == t % m_blocks, "forward, not causal: a pair's tiles in turn",
             m_blocks, heads, batch, causal, t);
    } else {
      const int section = unit / p.order.section;
      expect(section >= prev_section, "forward: sections in turn", m_blocks, heads, batch, causal, t);
      if (section == prev_section) {
        expect(w.m_block <= prev_m, "forward: longest (last query tile) first within a section", m_blocks, heads,
               batch, causal, t);
      }
      prev_section = section;
      prev_m = w.m_block;
    }
  }
  for (size_t j = 0; j < seen.size(); ++j) {
    expect(seen[j] == 1, "forward: every tile exactly once", m_blocks, heads, batch, causal, int(j));
  }
  const int section = p.order.section;
  expect(!causal ? section == 1
                 : (section == 1 || (long long)section * kv_bytes_per_head <= TileScheduler::kL2Budget) &&
                       section <= units && (section & (section - 1)) == 0,
         "forward section: a power of two within the budget", m_blocks, heads, batch, causal, -1);
  std::printf("forward m_blocks %4d heads %3d batch %2d causal %d: %7d tiles, section %d\n", m_blocks, heads, batch,
              int(causal), p.total, section);
}

int main() {
  const long long mb = 1 << 20, budget = 40 * mb;
  for (bool causal : {false, true}) {
    check(32, 64, 2, causal, 4 * mb, budget);    // (2, 64, 4096, 128): sections of 8
    check(64, 64, 4, causal, 8 * mb, budget);    // (4, 64, 8192, 128): sections of 4
    check(8, 64, 1, causal, 1 * mb, budget);     // (1, 64, 1024, 128): sections of 32
    check(128, 16, 2, causal, 16 * mb, budget);  // (2, 16, 16384, 128): sections of 2
    check(5, 3, 7, causal, 1 * mb, budget);      // 21 pairs: sections of 16, the last of 5
    check(3, 1, 1, causal, 1 * mb, budget);      // one pair
    check(7, 2, 3, causal, 64 * mb, budget);     // no two pairs fit: sections of 1
    // D = 128's budget (BackwardConfig::kL2SectionBudget, 20 MB)
    check(32, 64, 2, causal, 4 * mb, 20 * mb);    // (2, 64, 4096, 128): sections of 4
    check(64, 64, 4, causal, 8 * mb, 20 * mb);    // (4, 64, 8192, 128): sections of 2
    check(128, 16, 2, causal, 16 * mb, 20 * mb);  // (2, 16, 16384, 128): sections of 1
    // The forward: K and V of one query head (2 · Sk · D · 2 bytes) against 32 MB.
    check_forward(32, 16, 8, causal, 2 * mb);    // (8, 16, 4096, 128): sections of 16
    check_forward(64, 16, 4, causal, 4 * mb);    // (4, 16, 8192, 128): sections of 8
    check_forward(8, 64, 1, causal, mb / 2);     // (1, 64, 1024, 128): sections of 64
    check_forward(11, 16, 16, causal, mb / 2);   // (16, 16, 2048, 64), 192-row tiles: sections of 64
    check_forward(5, 3, 7, causal, 3 * mb);      // 21 pairs: sections of 8, the last of 5
    check_forward(3, 1, 1, causal, 1 * mb);      // one pair
    check_forward(7, 2, 3, causal, 64 * mb);     // no two pairs fit: sections of 1
    // Divisors the precomputed divisions (cutlass::FastDivmod) must get right: odd, large, one.
    check_forward(1023, 7, 5, causal, mb / 8);   // sections of 32 over 35 pairs, the last of 3
    check_forward(1, 96, 3, causal, 4 * mb);     // one query tile a pair: sections of 8
    check_forward(333, 1, 97, causal, mb / 4);   // 97 pairs of one head, sections of 64 and 33
    check(1001, 13, 1, causal, 2 * mb, budget);  // 13 pairs: sections of 8, the last of 5
  }
  // Deterministic and causal: shortest first.
  check(32, 64, 2, true, 4 * mb, 20 * mb, true);    // (2, 64, 4096, 128): sections of 4
  check(128, 16, 2, true, 16 * mb, 20 * mb, true);  // (2, 16, 16384, 128): sections of 1
  check(5, 3, 7, true, 1 * mb, budget, true);       // 21 pairs: sections of 16, the last of 5
  check(1001, 13, 1, true, 2 * mb, budget, true);   // 13 pairs: sections of 8, the last of 5
  std::printf(failures ? "%d failures\n" : "ok\n", failures);
  return failures ? 1 : 0;
}
