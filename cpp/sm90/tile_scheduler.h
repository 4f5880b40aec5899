// The tile scheduler of the Hopper family: which (query tile, head, batch) each persistent CTA
// works on, in which order.
//
// The grid has about one CTA per SM; CTA c takes work tiles c, c + gridDim.x, c + 2·gridDim.x, …
// of one linear order. Every role of the CTA (the producer warp and each consumer warpgroup) walks
// the same sequence on its own, so they need no messages to agree on it.
//
// The order:
// - (batch, head) pairs go in sections of `heads_per_section`, sized on the host so that a
//   section's keys and values fit in about half of L2: the CTAs running at one time then read the
//   same few heads' K and V, which come from L2 instead of DRAM.
// - Inside a section the query tiles go from the last to the first (`longest_first`, for causal
//   attention, where the last query tiles see the most keys), interleaving the section's heads:
//   the long tiles start first and the short ones fill the tail.
// Varlen batches (a later issue) keep this shape: the per-batch lengths come from a sequence-length
// type, not from this order.
#pragma once

#include <algorithm>
#include <cstdint>

#include <cute/config.hpp>

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
    int heads_per_section = 1;
    bool longest_first = false;
  };

  // kv_bytes_per_head: bytes of K and V one head reads; l2_bytes: the device's L2 size.
  static Params make_params(int m_blocks, int heads, int batch, bool longest_first,
                            int64_t kv_bytes_per_head, int64_t l2_bytes) {
    Params p;
    p.m_blocks = m_blocks;
    p.heads = heads;
    p.batch = batch;
    p.total = m_blocks * heads * batch;
    const int64_t fit = std::max<int64_t>(1, l2_bytes / 2 / std::max<int64_t>(1, kv_bytes_per_head));
    p.heads_per_section = static_cast<int>(std::min<int64_t>(fit, int64_t(heads) * batch));
    p.longest_first = longest_first;
    return p;
  }

  static int grid_size(const Params& p, int sms) { return std::max(1, std::min(p.total, sms)); }

  CUTE_DEVICE static WorkTile tile(const Params& p, int t) {
    const int per_section = p.heads_per_section * p.m_blocks;
    const int section = t / per_section;
    const int first_head = section * p.heads_per_section;  // (batch, head) pairs as batch·heads + head
    const int heads_here = min(p.heads_per_section, p.heads * p.batch - first_head);
    const int r = t - section * per_section;
    const int m_rank = r / heads_here;
    const int bh = first_head + (r - m_rank * heads_here);
    WorkTile w;
    w.m_block = p.longest_first ? p.m_blocks - 1 - m_rank : m_rank;
    w.batch = bh / p.heads;
    w.head = bh - w.batch * p.heads;
    return w;
  }
};

}  // namespace fa::sm90
