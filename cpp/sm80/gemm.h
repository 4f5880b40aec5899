// Warp-level GEMMs on mma.sync, with operands read from shared memory through ldmatrix.
//
// Both loop over the K mode of the fragments and load slice k+1 from shared memory before issuing
// the MMAs of slice k, so the ldmatrix latency hides behind tensor-core work.
#pragma once

#include <cute/tensor.hpp>

namespace fa::sm80 {

// acc += A · B, A and B from shared memory. rA/rB are the MMA's register fragments (MMA, M|N, K);
// rA_copy/rB_copy the same registers as the ldmatrix copies see them (ThrCopy::retile_D);
// sA/sB the shared-memory tiles partitioned by those copies.
template <class Acc, class RA, class RACopy, class SA, class CopyA, class RB, class RBCopy, class SB,
          class CopyB, class TiledMma>
CUTE_DEVICE void gemm_smem_smem(Acc& acc, RA& rA, RACopy&& rA_copy, SA const& sA, CopyA const& copy_a,
                                RB& rB, RBCopy&& rB_copy, SB const& sB, CopyB const& copy_b,
                                TiledMma const& mma) {
  using namespace cute;
  static_assert(decltype(size<2>(rA))::value == decltype(size<2>(rB))::value);
  copy(copy_a, sA(_, _, _0{}), rA_copy(_, _, _0{}));
  copy(copy_b, sB(_, _, _0{}), rB_copy(_, _, _0{}));
  CUTE_UNROLL
  for (int k = 0; k < size<2>(rA); ++k) {
    if (k + 1 < size<2>(rA)) {
      copy(copy_a, sA(_, _, k + 1), rA_copy(_, _, k + 1));
      copy(copy_b, sB(_, _, k + 1), rB_copy(_, _, k + 1));
    }
    gemm(mma, rA(_, _, k), rB(_, _, k), acc);
  }
}

// acc += A · B, A already in registers (e.g. probabilities converted from an accumulator),
// B from shared memory.
template <class Acc, class RA, class RB, class RBCopy, class SB, class CopyB, class TiledMma>
CUTE_DEVICE void gemm_regs_smem(Acc& acc, RA const& rA, RB& rB, RBCopy&& rB_copy, SB const& sB,
                                CopyB const& copy_b, TiledMma const& mma) {
  using namespace cute;
  static_assert(decltype(size<2>(rA))::value == decltype(size<2>(rB))::value);
  copy(copy_b, sB(_, _, _0{}), rB_copy(_, _, _0{}));
  CUTE_UNROLL
  for (int k = 0; k < size<2>(rA); ++k) {
    if (k + 1 < size<2>(rA)) copy(copy_b, sB(_, _, k + 1), rB_copy(_, _, k + 1));
    gemm(mma, rA(_, _, k), rB(_, _, k), acc);
  }
}

}  // namespace fa::sm80
