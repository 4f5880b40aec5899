// The named barriers of the Hopper-family forward, in one place.
//
// Hardware has 16 per CTA; barrier 0 is __syncthreads', so these ids count from 1 (CUTLASS's
// NamedBarrier would reserve 8 of the 16 for CUTLASS's own collectives, which this kernel does not
// use, and leave too few for three consumer warpgroups). Each barrier's thread count is fixed by
// its role (the producer warp and/or the consumer warpgroups).
#pragma once

#include <cstdint>

#include <cute/config.hpp>

namespace fa::sm90 {

enum class ForwardBarrier : uint32_t {
  kQueryEmpty = 0,     // consumers -> producer warp: the Q buffer (and O, where O aliases it) is free
  kEpilogue = 1,       // kEpilogue + w: consumer warpgroup w around its slice of the output tile
  kWarpgroupTurn = 4,  // kWarpgroupTurn + w: consumer warpgroup w may issue its GEMMs (ping-pong)
  kTileFull = 7,       // producer -> consumers: the next work tile's index is in shared memory
  kTileEmpty = 8,      // consumers -> producer: they have read it
};
static_assert(static_cast<uint32_t>(ForwardBarrier::kTileEmpty) + 1 < 16);

inline constexpr uint32_t kFirstHardwareBarrier = 1;

// bar.sync: wait until `threads` threads (this one included) have arrived at barrier id + offset.
CUTE_DEVICE void barrier_sync(ForwardBarrier id, int threads, int offset = 0) {
  const uint32_t hw = kFirstHardwareBarrier + static_cast<uint32_t>(id) + offset;
  asm volatile("bar.sync %0, %1;" : : "r"(hw), "r"(threads) : "memory");
}

// bar.arrive: count this thread at barrier id + offset without waiting.
CUTE_DEVICE void barrier_arrive(ForwardBarrier id, int threads, int offset = 0) {
  const uint32_t hw = kFirstHardwareBarrier + static_cast<uint32_t>(id) + offset;
  asm volatile("bar.arrive %0, %1;" : : "r"(hw), "r"(threads) : "memory");
}

// Ping-pong between the consumer warpgroups: each issues its GEMMs only on its turn and hands the
// turn to the next one (round robin) once they are issued, so one warpgroup's softmax runs while
// the others' GEMMs occupy the tensor cores. Turn w is a barrier of warpgroup w, which waits on it
// (bar.sync), and of the warpgroup before it, which releases it (bar.arrive).
template <int kWarpgroups>
struct WarpgroupTurns {
  static_assert(kWarpgroups == 2 || kWarpgroups == 3);
  static constexpr int kThreads = 2 * 128;
  int self;  // 0 .. kWarpgroups - 1

  // Warpgroup 0 takes the first turn: the last warpgroup hands it over before anything else.
  CUTE_DEVICE explicit WarpgroupTurns(int warpgroup) : self(warpgroup) {
    if (self == kWarpgroups - 1) barrier_arrive(ForwardBarrier::kWarpgroupTurn, kThreads, 0);
  }
  CUTE_DEVICE void wait() const { barrier_sync(ForwardBarrier::kWarpgroupTurn, kThreads, self); }
  CUTE_DEVICE void pass() const {
    barrier_arrive(ForwardBarrier::kWarpgroupTurn, kThreads, self == kWarpgroups - 1 ? 0 : self + 1);
  }
};

}  // namespace fa::sm90
