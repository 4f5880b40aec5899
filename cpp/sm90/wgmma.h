// Issuing a warpgroup's GEMM on wgmma, asynchronously.
//
// wgmma runs in the background: gemm_async() issues the instructions of one GEMM (all its K slices)
// as one commit group and returns; warpgroup_wait<N>() later blocks until at most N groups are in
// flight. Until then the accumulator (and a register A operand) belong to the tensor cores: the
// operand fences keep the compiler from moving reads or writes of those registers across the
// issue.
#pragma once

#include <cute/tensor.hpp>
#include <cute/arch/mma_sm90_gmma.hpp>
#include <cutlass/arch/barrier.h>

namespace fa::sm90 {

// The slice of a TiledMma that partitions the shared-memory operands (wgmma descriptors) of
// consumer warpgroup `cutlass::canonical_warp_group_idx() - first_warpgroup`. A descriptor depends
// only on the warpgroup, and that index is read with a warp shuffle, which the compiler knows to be
// warp-uniform: the descriptors are then computed in uniform registers, where wgmma reads them.
// Sliced by the thread index instead (threadIdx.x, not known to be uniform), every descriptor is
// computed per thread and moved to a uniform register (R2UR) before each wgmma, which waits for it:
// Nsight Compute counted 18% more instructions in the backward than FlashAttention-3's and a
// fixed-latency stall on every wgmma. Accumulators and their coordinates (partition_C) still need
// the thread's own slice.
template <class TiledMma>
CUTE_DEVICE auto warpgroup_slice(TiledMma const& mma, int first_warpgroup) {
  return mma.get_slice((cutlass::canonical_warp_group_idx() - first_warpgroup) * cutlass::NumThreadsPerWarpGroup);
}

// The wgmma instructions of acc (=|+=) A · B, inside a commit group the caller opens and closes
// (gemm_async's, or one that holds two GEMMs).
template <bool kZeroInit, class TiledMma, class TA, class TB, class TC>
CUTE_DEVICE void gemm_issue(TiledMma& mma, TA&& a, TB const& b, TC& acc) {
  using namespace cute;
  mma.accumulate_ = kZeroInit ? GMMA::ScaleOut::Zero : GMMA::ScaleOut::One;
  CUTE_UNROLL
  for (int k = 0; k < size<2>(a); ++k) {
    gemm(mma, a(_, _, k), b(_, _, k), acc);
    mma.accumulate_ = GMMA::ScaleOut::One;
  }
}

// acc (=|+=) A · B. kZeroInit: acc = A · B (the wgmma scale-out of 0 on the first K slice).
// kRegisterA: A is a register fragment (else, like B, wgmma descriptors of shared memory).
template <bool kZeroInit, bool kRegisterA, class TiledMma, class TA, class TB, class TC>
CUTE_DEVICE void gemm_async(TiledMma& mma, TA&& a, TB const& b, TC& acc) {
  using namespace cute;
  if constexpr (kRegisterA) warpgroup_fence_operand(a);
  warpgroup_fence_operand(acc);
  warpgroup_arrive();
  gemm_issue<kZeroInit>(mma, a, b, acc);
  warpgroup_commit_batch();
  warpgroup_fence_operand(acc);
  if constexpr (kRegisterA) warpgroup_fence_operand(a);
}

// Blocks until at most kInFlight of this warpgroup's GEMMs are still running; acc is then safe to
// read if its GEMM was issued before the newest kInFlight ones.
template <int kInFlight, class TC>
CUTE_DEVICE void gemm_wait(TC& acc) {
  cute::warpgroup_wait<kInFlight>();
  cute::warpgroup_fence_operand(acc);
}

}  // namespace fa::sm90
