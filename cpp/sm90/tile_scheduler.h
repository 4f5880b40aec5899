// The tile scheduler of the Hopper family: which (query tile, head, batch) each persistent CTA
// works on, in which order.
//
// The grid has about one CTA per SM, and CTA c starts with work tile c of one linear order. Then:
// - static (tiles of equal length): CTA c takes tiles c + gridDim.x, c + 2·gridDim.x, …; every role
//   of the CTA walks that sequence on its own, and the CTAs stay in step.
// - dynamic (causal: tile lengths differ): the producer warp takes the next tile of the order from
//   a global counter as soon as it has issued the loads of the current one, and hands its index to
//   the consumer warpgroups through shared memory (TileHandoff, below). The tiles running at any
//   moment are then always about gridDim.x consecutive ones of the order (below), and no CTA idles
//   while another still has a queue of long tiles.
//
// The order, not causal: (batch, head) pairs one after the other, and within each pair its query
// tiles. The tiles running at one time are then consecutive query tiles of one or a few heads,
// which read the same K and V at about the same time: those reads come from L2. (Measured on H100,
// docs/tried.md: interleaving the tiles of several heads there was up to 12% slower.)
// Causal (`longest_first`: the last query tiles see the most keys): longest first within sections
// of `section` (batch, head) pairs whose K and V fit in L2 together (Sections, below): the
// section's last query tiles, then its second-to-last ones, and so on. One head at a time would
// hand out each head's longest tile just ~m_blocks tiles before the end, and the CTA that takes the
// last head's runs on while the others idle (simulated: 3–4% of the time from
// 2048 to 8192 rows, 26% at (1, 64, 1024); with sections of 4 or more heads 0–1% and 3%).
// Measured (docs/tried.md, e94eaec): (1, 64, 1024, 128) causal 4–5% faster, the long causal rows
// within ±1% of the one-head order.
//
// Varlen batches keep this shape: the order covers the longest sequence's query tiles for every
// sequence, and each role skips a tile that lies past its sequence's rows (common/sequence.h).
//
// The backward (BackwardTileOrder, below) is persistent too, with its key tiles always taken from
// a counter (next_tile_from): about gridDim.x consecutive ones of its order run at any time.
#pragma once

#include <algorithm>
#include <cstdint>

#include <cute/config.hpp>
#include <cute/arch/cluster_sm90.hpp>
#include <cutlass/fast_math.h>

#include "sm90/named_barriers.h"

namespace fa::sm90 {

struct WorkTile {
  int m_block;
  int head;
  int batch;
};

// An order over `units` units (the forward's (batch, head) pairs, the backward's (batch, kv head)
// pairs) of `per_unit` tiles each, in sections of `section` consecutive units whose tiles are
// interleaved: the section's rank-0 tiles of each unit, then its rank-1 tiles, and so on; the last
// section may be narrower. section = 1: one unit's tiles after the other's.
struct Sections {
  int per_unit = 0;
  int units = 0;
  int section = 1;  // a power of two
  int section_log2 = 0;
  // Divisions by runtime values, precomputed on the host (a multiply-high and a shift on the GPU
  // instead of a ~20-instruction integer division; every role decodes a tile index at each tile).
  cutlass::FastDivmod per_section_divmod;  // section · per_unit
  cutlass::FastDivmod last_width_divmod;   // the last section's width, where it is narrower

  static Sections make(int per_unit, int units, int section) {
    Sections s;
    s.per_unit = per_unit;
    s.units = units;
    s.section = section;
    while ((1 << s.section_log2) < section) ++s.section_log2;
    s.per_section_divmod = cutlass::FastDivmod(std::max(1, section * per_unit));
    s.last_width_divmod = cutlass::FastDivmod(std::max(1, units % section));
    return s;
  }

  // The largest power of two (measured faster by FA3's authors) of units, at most `units`, whose
  // units' bytes fit in `budget` together; 1 if even two do not.
  static int size_for(int units, int64_t unit_bytes, int64_t budget) {
    int section = 1;
    while (2 * section <= units && 2 * section * unit_bytes <= budget) section *= 2;
    return section;
  }

  // Tile i of the order: its rank within its unit, and the unit.
  CUTE_HOST_DEVICE void locate(int i, int& rank, int& unit) const {
    int s, r;
    per_section_divmod(s, r, i);  // section s; r: the tile's place in it
    const int first = s << section_log2;  // the section's first unit
    if (first + section <= units) {
      rank = r >> section_log2;
      unit = first + (r & (section - 1));
    } else {  // the last section, narrower than the others
      int within;
      last_width_divmod(rank, within, r);
      unit = first + within;
    }
  }
};

// A persistent CTA's next tile after t, as its producer warp learns it (all lanes get the same
// answer): from the counter (zeroed before the launch: tiles gridDim.x, gridDim.x + 1, … in the
// order CTAs ask), or, without one, t + gridDim.x.
CUTE_DEVICE int next_tile_from(int* counter, int t) {
  if (counter == nullptr) return t + static_cast<int>(gridDim.x);
  const bool leader = cute::elect_one_sync();
  const int next = leader ? static_cast<int>(gridDim.x) + atomicAdd(counter, 1) : 0;
  return __shfl_sync(0xffffffffu, next, __ffs(__ballot_sync(0xffffffffu, leader)) - 1);
}

struct TileScheduler {
  struct Params {
    int total = 0;  // query tiles · heads · batch
    bool longest_first = false;
    Sections order;  // units: (batch, head) pairs as batch · heads + head; per_unit: query tiles
    cutlass::FastDivmod heads_divmod;  // a unit's batch and head
    int* counter = nullptr;  // dynamic scheduling: tiles gridDim.x, gridDim.x + 1, … are handed out from it
  };

  // Causal sections: what one query head streams through L2 is its share of its kv head's K and V
  // (kv_bytes_per_head: K and V of one query head, divided among the query heads that share them);
  // the sections fill at most kL2Budget of the H100's 50 MB (FA3's choice for its K and V).
  static constexpr int64_t kL2Budget = 32ll << 20;

  static Params make_params(int m_blocks, int heads, int batch, bool longest_first, int64_t kv_bytes_per_head,
                            int* counter) {
    Params p;
    p.total = m_blocks * heads * batch;
    p.longest_first = longest_first;
    const int units = heads * batch;
    p.order = Sections::make(m_blocks, units,
                             longest_first ? Sections::size_for(units, kv_bytes_per_head, kL2Budget) : 1);
    p.heads_divmod = cutlass::FastDivmod(std::max(1, heads));
    p.counter = counter;
    return p;
  }

  static int grid_size(const Params& p, int sms) { return std::max(1, std::min(p.total, sms)); }

  // The tile after t, as the producer warp learns it (all its lanes get the same answer).
  CUTE_DEVICE static int fetch_next(const Params& p, int t) { return next_tile_from(p.counter, t); }

  // Consumer warpgroup `warpgroup`'s view: the tile after t (dynamic: from the producer's hand-over).
  template <class Handoff>
  CUTE_DEVICE static int receive_next(const Params& p, int t, Handoff const& handoff, int warpgroup) {
    return p.counter == nullptr ? t + static_cast<int>(gridDim.x) : handoff.receive(warpgroup);
  }

  CUTE_HOST_DEVICE static WorkTile tile(const Params& p, int t) {
    int m_rank, bh;
    p.order.locate(t, m_rank, bh);
    WorkTile w;
    w.m_block = p.longest_first ? p.order.per_unit - 1 - m_rank : m_rank;
    p.heads_divmod(w.batch, w.head, bh);
    return w;
  }
};

// Dynamic scheduling's hand-over of the next tile index from the producer warp to the consumer
// warpgroups through shared memory: one slot per warpgroup and two named barriers each, kFull + w
// (warpgroup w's slot holds the next index) and kEmpty + w (warpgroup w has read it), each counting
// the producer warp and that warpgroup. A warpgroup that finishes its tile goes on to the next at
// once, without waiting for the others to finish theirs (in ping-pong the other warpgroup is half a
// step behind, its last GEMM and epilogue still to run).
template <ForwardBarrier kFull, ForwardBarrier kEmpty, int kWarpgroups>
struct TileHandoff {
  static constexpr int kThreads = 128 + 32;
  int* slots;  // kWarpgroups

  // Producer warp. Before the first hand-over the slots are free; after it, wait until each is read.
  CUTE_DEVICE void publish(int next, bool first) const {
    CUTE_UNROLL
    for (int w = 0; w < kWarpgroups; ++w) {
      if (!first) barrier_sync(kEmpty, kThreads, w);
      if (cute::elect_one_sync()) slots[w] = next;
      barrier_arrive(kFull, kThreads, w);
    }
  }

  // Consumer warpgroup w's threads.
  CUTE_DEVICE int receive(int w) const {
    barrier_sync(kFull, kThreads, w);
    const int next = slots[w];
    barrier_arrive(kEmpty, kThreads, w);
    return next;
  }
};

// The backward's order of key tiles: the persistent CTAs take them in this order, each the next
// one as it finishes its last (next_tile_from).
// - Not causal (every key tile walks every query tile): each (batch, kv head)'s key tiles one after
//   the other, so the CTAs running at once stream the same Q and dO tiles and add into the same dQ.
// - Causal: key tile n walks the query tiles from its diagonal down, so the first key tiles carry
//   the most work. Started in the order above, the last head's long tiles start last and run on
//   while the other SMs idle (simulated: 3% of the time at (2, 64, 4096), 27% at (1, 64, 1024)).
//   Instead, longest first within sections of `section` (batch, kv head) pairs whose Q, dO and
//   dQ workspace fit in L2 together: the section's first key tiles, then its second ones, and so
//   on (only the last section's tail is left, and its tiles are the shortest).
// - Deterministic (BackwardParams::deterministic), in sections as causal: there a unit's key tiles
//   add to each query tile's dQ one after the other (common/dq_claims.h), each a little behind the
//   one before, and with a unit's key tiles one after the other the ~gridDim.x tiles running at
//   once are all the key tiles of a few units, whose waits chain (the last behind every other); in
//   sections they are a few key tiles of each of `section` units. Measured on the non-causal rows:
//   0.90-0.99x of the default backward instead of 0.79-0.91x at head dim 128 and below, 0.93-0.94x
//   instead of 0.84-0.90x at 256 (docs/tried.md).
// - Deterministic and causal, with at least kShortestFirstWaves key tiles an SM: shortest first
//   within the sections (`shortest_first`). The key tiles then add to a query tile from the last
//   that sees it down (dq_turn_from_last), each walking up from its diagonal (BackwardSteps): the
//   one before a tile in a query tile's order is the next shorter key tile, started earlier and
//   two steps ahead of it there (common/dq_claims.h). Measured against the first-to-last order
//   (H200, bf16, det / default): (2, 64, 4096, 128) 0.908 -> 0.924, (4, 64, 8192, 128) 0.900 ->
//   0.914, (2, 16, 16384, 128) 0.876 -> 0.883, (16, 16, 2048, 64) 0.969 -> 0.983, 25-31 waves
//   of key tiles; but (1, 64, 1024, 128), 3.9 waves, 0.89, where the other order had measured
//   0.91-0.95: the longest tiles then come last, and the SMs that finish first idle
//   (docs/tried.md).
constexpr int kShortestFirstWaves = 16;

struct BackwardTileOrder {
  struct Tile {
    int n_block;
    int head_kv;
    int batch;
  };

  int heads = 0;   // kv heads
  Sections order;  // units: (batch, kv head) pairs, key tiles per unit
  bool shortest_first = false;  // a unit's key tiles from its last (deterministic causal calls of many)

  // unit_bytes: what one (batch, kv head) streams through L2 (Q, dO and the dQ workspace of its
  // query heads); l2_budget: how much of L2 the sections may fill; sectioned: the causal (or
  // deterministic) order, else each unit's tiles one after the other; shortest_first: the
  // deterministic causal order.
  static BackwardTileOrder make(int n_blocks, int heads, int batch, bool sectioned, bool shortest_first,
                                int64_t unit_bytes, int64_t l2_budget) {
    BackwardTileOrder o;
    o.heads = heads;
    o.shortest_first = shortest_first;
    const int units = heads * batch;
    o.order = Sections::make(n_blocks, units, sectioned ? Sections::size_for(units, unit_bytes, l2_budget) : 1);
    return o;
  }

  CUTE_HOST_DEVICE int64_t size() const { return int64_t(order.per_unit) * order.units; }

  CUTE_HOST_DEVICE Tile tile(int i) const {
    int rank, unit;
    order.locate(i, rank, unit);
    return {shortest_first ? order.per_unit - 1 - rank : rank, unit % heads, unit / heads};
  }
};

}  // namespace fa::sm90
