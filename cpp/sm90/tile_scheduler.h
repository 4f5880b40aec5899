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
// The order: (batch, head) pairs one after the other, and within each pair its query tiles, from
// the last to the first when `longest_first` (causal attention, where the last query tiles see the
// most keys). The tiles running at one time are then consecutive query tiles of one or a few heads,
// which read the same K and V at about the same time: those reads come from L2. (Measured on H100,
// benchmarks/NOTES.md: interleaving the tiles of several heads, sized so that their K and V fit in
// L2, was up to 12% slower.)
//
// Varlen batches keep this shape: the order covers the longest sequence's query tiles for every
// sequence, and each role skips a tile that lies past its sequence's rows (common/sequence.h).
#pragma once

#include <algorithm>
#include <cstdint>

#include <cute/config.hpp>
#include <cute/arch/cluster_sm90.hpp>

#include "sm90/named_barriers.h"

namespace fa::sm90 {

struct WorkTile {
  int m_block;
  int head;
  int batch;
};

struct TileScheduler {
  struct Params {
    int m_blocks = 0;  // query tiles per (batch, head)
    int heads = 0;
    int batch = 0;
    int total = 0;     // m_blocks · heads · batch
    bool longest_first = false;
    int* counter = nullptr;  // dynamic scheduling: tiles gridDim.x, gridDim.x + 1, … are handed out from it
  };

  static Params make_params(int m_blocks, int heads, int batch, bool longest_first, int* counter) {
    Params p;
    p.m_blocks = m_blocks;
    p.heads = heads;
    p.batch = batch;
    p.total = m_blocks * heads * batch;
    p.longest_first = longest_first;
    p.counter = counter;
    return p;
  }

  static int grid_size(const Params& p, int sms) { return std::max(1, std::min(p.total, sms)); }

  // The tile after t, as the producer warp learns it (all its lanes get the same answer).
  CUTE_DEVICE static int fetch_next(const Params& p, int t) {
    if (p.counter == nullptr) return t + gridDim.x;
    const bool leader = cute::elect_one_sync();
    const int next = leader ? static_cast<int>(gridDim.x) + atomicAdd(p.counter, 1) : 0;
    return __shfl_sync(0xffffffffu, next, __ffs(__ballot_sync(0xffffffffu, leader)) - 1);
  }

  // The consumers' view: the tile after t (with dynamic scheduling, from the producer's hand-over).
  template <class Handoff>
  CUTE_DEVICE static int receive_next(const Params& p, int t, Handoff const& handoff) {
    return p.counter == nullptr ? t + static_cast<int>(gridDim.x) : handoff.receive();
  }

  CUTE_DEVICE static WorkTile tile(const Params& p, int t) {
    const int bh = t / p.m_blocks;  // (batch, head) pairs as batch·heads + head
    const int m_rank = t - bh * p.m_blocks;
    WorkTile w;
    w.m_block = p.longest_first ? p.m_blocks - 1 - m_rank : m_rank;
    w.batch = bh / p.heads;
    w.head = bh - w.batch * p.heads;
    return w;
  }
};

// Dynamic scheduling's hand-over of the next tile index from the producer warp to the consumer
// threads: one shared-memory slot and two named barriers, kFull (the slot holds the next index)
// and kEmpty (every consumer has read it). Both count the producer warp and the consumers.
template <ForwardBarrier kFull, ForwardBarrier kEmpty, int kThreads>
struct TileHandoff {
  int* slot;

  // Producer warp. Before the first hand-over the slot is free; after it, wait until it is read.
  CUTE_DEVICE void publish(int next, bool first) const {
    if (!first) barrier_sync(kEmpty, kThreads);
    if (cute::elect_one_sync()) *slot = next;
    barrier_arrive(kFull, kThreads);
  }

  // Consumer threads.
  CUTE_DEVICE int receive() const {
    barrier_sync(kFull, kThreads);
    const int next = *slot;
    barrier_arrive(kEmpty, kThreads);
    return next;
  }
};

}  // namespace fa::sm90
