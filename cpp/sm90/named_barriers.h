// The named barriers of the Hopper family's kernels, in one place.
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
  kTileFull = 7,       // kTileFull + w: producer -> consumer warpgroup w: its next tile index is in smem
  kTileEmpty = 10,     // kTileEmpty + w: consumer warpgroup w -> producer: it has read it
};
static_assert(static_cast<uint32_t>(ForwardBarrier::kTileEmpty) + 3 < 16);

// The backward's (sm90/bwd_kernel.h).
enum class BackwardBarrier : uint32_t {
  kdSFull = 0,    // both warpgroups have written their rows of dSᵀ: the dQ GEMM may read all of it
  kdQEmpty = 1,   // kdQEmpty + w: warpgroup w's dQ staging buffer has been read by its last reduction
  kdQFull = 3,    // kdQFull + w: warpgroup w's dQ tile is in shared memory, ready to be added
  kEpilogue = 5,  // both warpgroups are done with K and V (dK and dV are staged in their place)
  kTileFull = 6,  // producer -> consumers: the next key tile's index is in shared memory
  kTileEmpty = 7, // consumers -> producer: they have read it (the dQ writer has mbarriers instead)
  kTurnReady = 8, // turn keeper -> consumers: the step's dQ tile is this key tile's turn (deterministic,
                  // above head dim 128: bwd_load.h, BackwardTurnKeeper)
  kTurnDone = 9,  // consumers -> turn keeper: their additions to that tile are done
};
static_assert(static_cast<uint32_t>(BackwardBarrier::kTurnDone) + 1 < 16);

inline constexpr uint32_t kFirstHardwareBarrier = 1;

// bar.sync: wait until `threads` threads (this one included) have arrived at barrier id + offset.
template <class Barrier>
CUTE_DEVICE void barrier_sync(Barrier id, int threads, int offset = 0) {
  const uint32_t hw = kFirstHardwareBarrier + static_cast<uint32_t>(id) + offset;
  asm volatile("bar.sync %0, %1;" : : "r"(hw), "r"(threads) : "memory");
}

// bar.arrive: count this thread at barrier id + offset without waiting.
template <class Barrier>
CUTE_DEVICE void barrier_arrive(Barrier id, int threads, int offset = 0) {
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
