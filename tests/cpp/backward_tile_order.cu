// Host-side check of the Hopper backward's tile order (sm90/tile_scheduler.h, BackwardTileOrder):
// every (key tile, kv head, batch) is taken by exactly one CTA index; without causal the order is
// each (batch, head)'s key tiles in turn; with causal, inside each section of (batch, head) pairs,
// key tile n of every pair comes before key tile n + 1 of any (longest first), and the sections
// follow one another. Prints one line per case and "ok" at the end; exits non-zero on a failure.
#include <cstdio>
#include <vector>

#include "sm90/tile_scheduler.h"

using fa::sm90::BackwardTileOrder;

static int failures = 0;

static void expect(bool ok, const char* what, int n_blocks, int heads, int batch, bool causal, int i) {
  if (!ok && failures++ < 10) {
    std::printf("FAIL %s: n_blocks %d heads %d batch %d causal %d index %d\n", what, n_blocks, heads, batch,
                int(causal), i);
  }
}

static void check(int n_blocks, int heads, int batch, bool causal, long long unit_bytes, long long budget) {
  const auto order = BackwardTileOrder::make(n_blocks, heads, batch, causal, unit_bytes, budget);
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
      const int section = unit / order.section;
      expect(section >= prev_unit_section, "sections in turn", n_blocks, heads, batch, causal, i);
      if (section == prev_unit_section) {
        expect(t.n_block >= prev_n, "longest (lowest key tile) first within a section", n_blocks, heads, batch,
               causal, i);
      }
      prev_unit_section = section;
      prev_n = t.n_block;
    }
  }
  for (size_t j = 0; j < seen.size(); ++j) {
    expect(seen[j] == 1, "every tile exactly once", n_blocks, heads, batch, causal, int(j));
  }
  const long long filled = (long long)order.section * unit_bytes;
  expect(!causal ? order.section == 1
                 : order.section >= 1 && (order.section == 1 || filled <= budget) && order.section <= units &&
                       (order.section & (order.section - 1)) == 0,
         "section: a power of two within the budget", n_blocks, heads, batch, causal, -1);
  std::printf("n_blocks %4d heads %3d batch %2d causal %d: %7lld tiles, section %d\n", n_blocks, heads, batch,
              int(causal), (long long)order.size(), order.section);
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
  }
  std::printf(failures ? "%d failures\n" : "ok\n", failures);
  return failures ? 1 : 0;
}
