// The named barriers of the Hopper-family forward, in one place.
//
// Hardware has 16 per CTA; CUTLASS reserves the first ones (cutlass::arch::NamedBarrier counts ids
// from ReservedNamedBarrierCount), so these are relative ids. Each barrier's thread count is fixed
// by its role (the producer warp and/or the consumer warpgroups).
#pragma once

#include <cstdint>

#include <cutlass/arch/barrier.h>

namespace fa::sm90 {

enum class ForwardBarrier : uint32_t {
  kQueryEmpty = 0,     // consumers -> producer warp: the Q buffer (and O, where O aliases it) is free
  kEpilogue = 1,       // kEpilogue + w: consumer warpgroup w around its half of the output tile
  kWarpgroupTurn = 3,  // kWarpgroupTurn + w: consumer warpgroup w may issue its GEMMs (ping-pong)
  kTileFull = 5,       // producer -> consumers: the next work tile's index is in shared memory
  kTileEmpty = 6,      // consumers -> producer: they have read it
};

CUTE_DEVICE void barrier_sync(ForwardBarrier id, int threads, int offset = 0) {
  cutlass::arch::NamedBarrier::sync(threads, static_cast<uint32_t>(id) + offset);
}

CUTE_DEVICE void barrier_arrive(ForwardBarrier id, int threads, int offset = 0) {
  cutlass::arch::NamedBarrier::arrive(threads, static_cast<uint32_t>(id) + offset);
}

// Ping-pong between the two consumer warpgroups: each issues its GEMMs only on its turn and hands
// the turn over once they are issued, so one warpgroup's softmax runs while the other's GEMMs
// occupy the tensor cores. Turn w is a barrier of both warpgroups: w waits on it (bar.sync), the
// other warpgroup releases it (bar.arrive).
template <int kWarpgroups>
struct WarpgroupTurns {
  static_assert(kWarpgroups == 2, "ping-pong is written for two consumer warpgroups");
  static constexpr int kThreads = 2 * 128;
  int self;  // 0 or 1

  // Warpgroup 0 takes the first turn: warpgroup 1 hands it over before anything else.
  CUTE_DEVICE explicit WarpgroupTurns(int warpgroup) : self(warpgroup) {
    if (self == 1) barrier_arrive(ForwardBarrier::kWarpgroupTurn, kThreads, 0);
  }
  CUTE_DEVICE void wait() const { barrier_sync(ForwardBarrier::kWarpgroupTurn, kThreads, self); }
  CUTE_DEVICE void pass() const { barrier_arrive(ForwardBarrier::kWarpgroupTurn, kThreads, 1 - self); }
};

}  // namespace fa::sm90
