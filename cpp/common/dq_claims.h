// dQ workspace tiles claimed instead of zeroed (the Hopper family's backward where
// BackwardConfig::kdQClaims: head dim 64).
//
// Every key tile adds its dQ partial of a query tile to the fp32 workspace by a bulk reduction;
// the workspace then has to start at zero, and zeroing it is the larger half of the pre-pass's
// bytes (at D = 128, 8 bytes of zeros for every 4 bytes of O and dO it reads). Instead, one int per
// kDqClaimRows workspace rows (BackwardParams::dq_claims, zeroed by the pre-pass) says who writes a
// query tile first:
//   kUnclaimed  no key tile has come to it yet;
//   kClaimed    the key tile that came first stores its partial (a bulk copy, no addition);
//   kWritten    that store is complete: every other key tile adds to it.
// A CTA's dQ writer takes a tile's claim with a compare-and-swap; it publishes kWritten once its
// store has completed (at its next step, before it might wait on another tile's claim, so that no
// two CTAs can wait on each other); one that finds kClaimed waits for kWritten before its reduction.
// The post-pass reads a tile whose claim is still kUnclaimed (no key tile sees its rows) as zeros.
//
// Turns (BackwardParams::deterministic, both families): the same ints count the additions made to
// their query tile, and the key tiles add in a fixed order, that of their index n_block (dq_turn),
// or from the highest index down in the Hopper family's causal calls of many key tiles
// (dq_turn_from_last, sm90/tile_scheduler.h); the kernels walk their query tiles so that the key
// tiles come to each in about that order. A key tile waits until the count says that every key tile
// before it has added (dq_turn_wait), adds (the first stores: the workspace is not zeroed), waits
// for its addition to complete, and passes the turn on (dq_turn_pass: a release that increments).
// The sums are then the same at every run, whichever SMs run which tile when. Where
// BackwardParams::dq_accum_odd is set (fa/kernels.h, sm90_backward_odd_turns), the key tiles of odd
// turns add into a second workspace, counted in their own ints, and the post-pass adds the two: two
// orders, each key tile waiting for the one two turns before it, which a long tile passing its turns
// late (sm90/bwd_load.h) reaches a step sooner than the one just before it. No deadlock: a tile
// waits only for tiles that the schedulers start before it (the Hopper family's counter hands a
// unit's key tiles out in the order of their turns, sm90/tile_scheduler.h; the Ampere family's grid
// has n_block as its fastest index, and a GPU dispatches a grid's CTAs in order), so of the tiles
// that have started and not finished, the first started never waits.
#pragma once

#include <cstdint>

#include <cute/config.hpp>

#include "common/bulk_reduce.h"  // bulk_reduce_wait_complete, fence_view_async_global
#include "fa/kernels.h"            // kDqClaimRows

namespace fa {

enum DqClaim : int { kUnclaimed = 0, kClaimed = 1, kWritten = 2 };

// Takes the claim if no one has (returns kUnclaimed, the caller now owns the first write), else
// returns the state found, with acquire semantics (a kWritten found orders the store before what
// follows).
CUTE_DEVICE int dq_claim(int* claim) {
  int old = kUnclaimed;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("atom.acquire.gpu.global.cas.b32 %0, [%1], %2, %3;\n"
               : "=r"(old) : "l"(claim), "r"(int(kUnclaimed)), "r"(int(kClaimed)) : "memory");
#endif
  return old;
}

// Waits (spinning) until the claim reads kWritten, with acquire semantics.
CUTE_DEVICE void dq_claim_wait_written(const int* claim) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  for (;;) {
    int state;
    asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(state) : "l"(claim) : "memory");
    if (state == kWritten) break;
    __nanosleep(64);
  }
#endif
}

// Waits until this thread's bulk operations but the newest kPending are complete (their writes
// performed) and orders them before its next release: what a claim's publication or a turn's pass
// (below) must follow.
template <int kPending = 0>
CUTE_DEVICE void bulk_writes_before_release() {
  bulk_reduce_wait_complete<kPending>();
  fence_view_async_global();
}

// Publishes a claim whose store this thread issued: once its bulk operations are complete,
// releases kWritten.
CUTE_DEVICE void dq_claim_publish(int* claim) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  bulk_writes_before_release();
  asm volatile("st.release.gpu.global.b32 [%0], %1;\n" :: "l"(claim), "r"(int(kWritten)) : "memory");
#endif
}

// Deterministic order: the turn of key tile n_block at the query tile of rows from row_begin, i.e.
// how many key tiles add to that tile before it. The key tiles that see any of those rows are
// consecutive (a band mask), from the first the rows see (mask.first_visible_tile).
template <class Mask>
CUTE_DEVICE int dq_turn(Mask const& mask, int n_block, int row_begin, int block_n) {
  return n_block - mask.first_visible_tile(row_begin, block_n);
}

// The other order (the Hopper family's causal calls of many key tiles): from the last key tile
// that the query tile of rows before row_end sees (mask.visible_tiles) down.
template <class Mask>
CUTE_DEVICE int dq_turn_from_last(Mask const& mask, int n_block, int row_end, int block_n) {
  return mask.visible_tiles(row_end, block_n) - 1 - n_block;
}

// Waits (spinning) until `turn` has counted `count` arrivals, with acquire semantics.
CUTE_DEVICE void dq_turn_wait(const int* turn, int count) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 700
  for (;;) {
    int arrived;
    asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(arrived) : "l"(turn) : "memory");
    if (arrived >= count) break;
    __nanosleep(32);
  }
#endif
}

// One arrival at `turn`, with release semantics: what this thread wrote, and what it has seen
// written (a barrier's other threads'), is visible to whoever then sees the new count.
CUTE_DEVICE void dq_turn_pass(int* turn) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 700
  asm volatile("red.release.gpu.global.add.s32 [%0], 1;\n" :: "l"(turn) : "memory");
#endif
}

// dq_turn_pass for a turn whose addition this thread made by bulk operations, all but the newest
// kPending of them (issued since, for another tile).
template <int kPending = 0>
CUTE_DEVICE void dq_turn_pass_bulk(int* turn) {
  bulk_writes_before_release<kPending>();
  dq_turn_pass(turn);
}

}  // namespace fa
