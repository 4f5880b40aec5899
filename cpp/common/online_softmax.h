// The online softmax: softmax over a row that arrives one key tile at a time.
//
// For each row the thread keeps the running max m of the scores seen so far and the running sum
// l = Σ exp(scale · (s - m)). A new tile with a larger max m' rescales l and the output accumulator
// O by exp(scale · (m - m')); after the last tile O / l is the softmax-weighted sum of V, and
// scale · m + log(l) the row's log-sum-exp.
//
// exp is computed as exp2 with the scale folded into log2(e) (scale_log2 = scale · log2 e), so
// each probability costs one FFMA and one MUFU.EX2: exp2(s · scale_log2 - m · scale_log2).
// This needs scale > 0, which the binding checks, so that the max of s is the max of s · scale.
//
// m need not be the exact running max: any reference works, as long as O and l use the same one
// (the final O / l and m · scale + log l do not depend on it). The reference moves only when a
// tile's scores exceed it by more than kRescaleThreshold in exp2's units, so that the
// probabilities stay below 2^kRescaleThreshold (fp16 holds up to 65504; l and O are fp32). Then O
// is rescaled (a multiply per accumulator element, 32-128 a thread and tile) in the few tiles where
// a row's scores jump, not in every tile that holds a new max by any margin: with scores of
// similar size that is the first tile of a row only.
//
// Soft-capped scores lie in [-softcap, softcap], and the bf16 forward then needs no running max
// (kHoldsFixedReference, below): a row's reference is set once, in the first key tile where the row
// sees a key, and never moves, so the steps after it compute no max, need no shuffles and never
// rescale O. In a tile that needs a mask (settle_scores) the reference is that tile's max of the
// row, raised by a whole number of exp2's units to at least scale_log2 - kFixedHeadroom (the floor):
// the probability at that max is then a power of two, exact in bf16, so a row that sees one key
// gets O = V exactly, as with the running max. A tile without a mask (floor_scores) shows the row
// all its keys, and the floor itself serves. Every later probability is at most
// 2^(scale_log2 - floor) = 2^kFixedHeadroom (bf16 and fp32 hold it; fp16 does not), and a row's
// largest at least 2^(kFixedHeadroom - 2 · scale_log2), a normal number (2^-120 and above) where
// scale_log2 <= kFixedMaxScaleLog2 (softcap up to 63.7); larger caps take the running max.
//
// Scores and accumulators come as "row-column" views: mode 0 runs over the rows this thread holds
// values of, mode 1 over its values in a row. The values of one row are spread over the lanes
// whose indices differ only in the bits of kRowLanes: the 4 lanes of a quad (0b00011, mma.sync's
// and wgmma's accumulator layouts alike), or the 8 lanes t, t + 4, ..., t + 28 (0b11100) where
// the rows are an mma's N side (the FP8 decode tile with the keys on M, decode_kernel.h), so row
// reductions finish with shuffles among those lanes.
#pragma once

#include <cmath>
#include <type_traits>

#include <cute/tensor.hpp>

namespace fa {

// Reduces over the lanes whose indices differ only in the bits of kLanes (0b00011: the 4 lanes of
// a quad, 4i .. 4i+3, which share the rows of an accumulator).
template <unsigned kLanes = 0b00011u, class Op>
CUTE_DEVICE float lanes_allreduce(float x, Op op) {
  CUTE_UNROLL
  for (int bit = 4; bit >= 0; --bit) {
    if (kLanes >> bit & 1u) x = op(x, __shfl_xor_sync(0xffffffffu, x, 1 << bit));
  }
  return x;
}

// 1 where cond holds, else 0, as a count the compilers cannot bound: a loop of that many trips
// stays a branch where ptxas would otherwise predicate its body, whose instructions then take
// their issue slots also where cond is false. For rarely taken work in a loop bound by issue.
CUTE_DEVICE int trips_if(bool cond) {
  int trips = cond ? 1 : 0;
  asm volatile("mov.b32 %0, %0;" : "+r"(trips));
  return trips;
}

struct MaxOp {
  CUTE_DEVICE float operator()(float a, float b) const { return fmaxf(a, b); }
};
struct SumOp {
  CUTE_DEVICE float operator()(float a, float b) const { return a + b; }
};

// Whether a forward of this element type and head dim holds the fixed reference when soft-capping
// (above): bf16 up to D = 128. At D = 256 it measured level with the running max, which stays.
template <class Element, int kHeadDim>
inline constexpr bool kHoldsFixedReference = std::is_same_v<Element, cute::bfloat16_t> && kHeadDim <= 128;

// kMaxOffset > 0 (the FP8 forward, whose P enters O += P V as e4m3): the probabilities are
// exp2(s · scale_log2 - m · scale_log2 + kMaxOffset), up to 2^kMaxOffset at the reference, so that
// the small ones stay among e4m3's normal numbers (down to 2^-6); the reference moves once a row's
// scores pass it by 0.8 in exp2's units, which keeps every probability below 2^8.8 = 445.7 (e4m3's
// largest is 448; with unit-variance scores about half the tiles' rescales of the exact running
// max). The row sums and O carry the factor 2^kMaxOffset, which finalize() takes out.
template <int kRows, int kMaxOffset = 0, unsigned kRowLanes = 0b00011u>
struct OnlineSoftmax {
  static constexpr int kRowCount = kRows;
  float row_max[kRows];
  float row_sum[kRows];  // this thread's share of the row's sum; the row's lanes' shares add up at the end

  CUTE_DEVICE OnlineSoftmax() {
    CUTE_UNROLL
    for (int r = 0; r < kRows; ++r) {
      row_max[r] = -INFINITY;
      row_sum[r] = 0.f;
      max_scaled_[r] = 0.f;
      limit_[r] = -INFINITY;
    }
  }

  // How far (in exp2's units: 8, a factor 256; FP8: 0.8, above) a row's scores may exceed its
  // reference max before the reference moves to them and O is rescaled.
  static constexpr float kRescaleThreshold = kMaxOffset > 0 ? 8.8f - kMaxOffset : 8.f;
  // 2^-kMaxOffset: the probabilities' factor, taken out of the sums at the end.
  static constexpr float kUnscale = 1.f / float(1 << kMaxOffset);

  // Folds a tile of raw scores (rows × keys) into the running statistics: scores become the
  // unnormalised probabilities exp(scale · (s - m')), and acc_o (rows × head_dim) is rescaled by
  // exp(scale · (m - m')) where a row's reference max m moved. A row may have every score at -inf
  // (masked) so far: its probabilities are then all 0.
  template <class Scores, class AccO>
  CUTE_DEVICE void update(Scores& scores, AccO& acc_o, float scale_log2) {
    advance_max(scores, scale_log2);
    rescale_output(acc_o);
    exponentiate(scores, scale_log2);
  }

  // update() in two halves, for a mainloop whose O accumulator is still being written by the
  // tensor cores (an asynchronous O += P V of the previous tile) while this tile's softmax runs:
  // rescale_scores() needs only the scores; rescale_output() then touches O once it is complete.
  // With kFirstRows < kRows, rescale_scores() computes the new maxima but only the first kFirstRows
  // rows' probabilities, and rescale_scores_other_rows() the rest (for a mainloop that waits for
  // O's GEMM between the two).
  template <int kFirstRows = kRows, class Scores>
  CUTE_DEVICE void rescale_scores(Scores& scores, float scale_log2) {
    advance_max(scores, scale_log2);
    exponentiate<0, kFirstRows>(scores, scale_log2);
  }
  template <int kFirstRows, class Scores>
  CUTE_DEVICE void rescale_scores_other_rows(Scores& scores, float scale_log2) {
    exponentiate<kFirstRows, kRows>(scores, scale_log2);
  }

  // The fixed reference (soft-capped bf16 scores, above), started by walk_with_reference(): then
  // settle_scores() for a tile that needs a mask, floor_scores() for one that does not, in place of
  // rescale_scores() (O is never rescaled); rescale_scores_other_rows() and finalize() as usual.
  static constexpr float kFixedHeadroom = 64.f;
  static constexpr float kFixedMaxScaleLog2 = 92.f;
  // A tile with a mask: the rows that see their first key here settle their reference (the max is
  // computed only where a row of the warp is still unsettled: the warp's first tiles).
  template <int kFirstRows = kRows, class Scores>
  CUTE_DEVICE void settle_scores(Scores& scores, float scale_log2) {
    using namespace cute;
    if (__any_sync(0xffffffffu, unsettled_ != 0)) {
      const float floor = scale_log2 - kFixedHeadroom;
      CUTE_UNROLL
      for (int r = 0; r < kRows; ++r) {
        const float tile_max = row_max_of(scores, r, -INFINITY);
        if ((unsettled_ >> r & 1u) && tile_max != -INFINITY) {
          const float scaled = tile_max * scale_log2;
          max_scaled_[r] = scaled + fmaxf(0.f, ceilf(floor - scaled));
          row_max[r] = max_scaled_[r] / scale_log2;
          unsettled_ &= ~(1u << r);
        }
      }
    }
    exponentiate<0, kFirstRows>(scores, scale_log2);
  }
  // A tile without a mask: a row still unsettled keeps the floor.
  template <int kFirstRows = kRows, class Scores>
  CUTE_DEVICE void floor_scores(Scores& scores, float scale_log2) {
    unsettled_ = 0;
    exponentiate<0, kFirstRows>(scores, scale_log2);
  }

  // For a soft-capping kernel whose element type and head dim hold the fixed reference
  // (kHoldsFixedReference): walk(true_type) with it started where the cap allows (scale_log2 =
  // softcap · log2 e up to kFixedMaxScaleLog2), else walk(false_type), the running max. The
  // mainloop is instantiated for each, chosen once before it.
  template <class Walk>
  CUTE_DEVICE void walk_with_reference(float scale_log2, Walk&& walk) {
    if (scale_log2 <= kFixedMaxScaleLog2) {
      start_fixed(scale_log2);
      walk(cute::true_type{});
    } else {
      walk(cute::false_type{});
    }
  }

  // Rescales acc_o by the corrections of the last rescale_scores(). Rescaling O is a multiply per
  // accumulator element. Where a row's reference max did not move its correction is exactly 1, so
  // the warp skips the multiplies when none of its rows moved: every tile but a row's first, unless
  // its scores jump by more than kRescaleThreshold. The test is warp-uniform.
  // ptxas may turn that branch into multiplies predicated off, which take their issue slots in
  // every tile; kKeepBranch keeps it a branch (trips_if), for a mainloop bound by issue (the decode
  // kernel).
  template <bool kKeepBranch = false, class AccO>
  CUTE_DEVICE void rescale_output(AccO& acc_o) {
    using namespace cute;
    auto multiply = [&] {
      CUTE_UNROLL
      for (int r = 0; r < kRows; ++r) {
        CUTE_UNROLL
        for (int c = 0; c < size<1>(acc_o); ++c) acc_o(r, c) *= correction_[r];
      }
    };
    if constexpr (kKeepBranch) {
#pragma unroll 1
      for (int t = trips_if(__any_sync(0xffffffffu, max_moved_)); t > 0; --t) multiply();
    } else if (__any_sync(0xffffffffu, max_moved_)) {
      multiply();
    }
  }

  // Divides acc_o by each row's sum and writes each row's log-sum-exp (natural log) into lse.
  // A row that saw no key (sum 0) gets output 0 and lse -inf.
  template <class AccO>
  CUTE_DEVICE void finalize(AccO& acc_o, float scale, float (&lse)[kRows]) {
    float sinks[kRows];
    CUTE_UNROLL
    for (int r = 0; r < kRows; ++r) sinks[r] = -INFINITY;
    finalize(acc_o, scale, lse, sinks);
  }

  // The same with a sink logit for each row (natural log, the scale already applied; -inf: none):
  // exp(sink) joins the row's denominator as a key without a value, and its lse. A row that saw
  // no key then gets output 0 and lse = its sink.
  template <class AccO>
  CUTE_DEVICE void finalize(AccO& acc_o, float scale, float (&lse)[kRows], const float (&sinks)[kRows]) {
    using namespace cute;
    CUTE_UNROLL
    for (int r = 0; r < kRows; ++r) {
      float sum = lanes_allreduce<kRowLanes>(row_sum[r], SumOp{}) * kUnscale;
      float max_scaled = sum > 0.f ? row_max[r] * scale : -INFINITY;  // natural-log units
      float out_factor = 1.f;
      if (sinks[r] != -INFINITY) {
        // Both terms relative to the larger of the row's max and the sink: neither overflows.
        const float top = fmaxf(max_scaled, sinks[r]);
        out_factor = sum > 0.f ? __expf(max_scaled - top) : 0.f;
        sum = sum * out_factor + __expf(sinks[r] - top);
        max_scaled = top;
      }
      const bool seen = sum > 0.f;
      const float inv_sum = seen ? out_factor * kUnscale / sum : 0.f;
      lse[r] = seen ? max_scaled + __logf(sum) : -INFINITY;
      CUTE_UNROLL
      for (int c = 0; c < size<1>(acc_o); ++c) acc_o(r, c) *= inv_sum;
    }
  }

 private:
  float max_scaled_[kRows];  // the reference max times scale_log2, less kMaxOffset (0 for a row that is still empty)
  float limit_[kRows];       // the reference max plus kRescaleThreshold / scale_log2 (-inf when empty)
  float correction_[kRows];  // exp2 of (old reference - new reference) · scale_log2, for O and the row sum
  bool max_moved_ = false;
  unsigned unsettled_ = 0;   // the fixed reference: bit r while row r has seen no key

  // Every row at the fixed reference's floor, unsettled.
  CUTE_DEVICE void start_fixed(float scale_log2) {
    static_assert(kMaxOffset == 0 && kRows <= 32);
    CUTE_UNROLL
    for (int r = 0; r < kRows; ++r) {
      max_scaled_[r] = scale_log2 - kFixedHeadroom;
      row_max[r] = max_scaled_[r] / scale_log2;
    }
    unsettled_ = (1u << kRows) - 1;
  }

  // The max of `start` and row r's scores in this tile, over the lanes that hold the row.
  template <class Scores>
  CUTE_DEVICE static float row_max_of(const Scores& scores, int r, float start) {
    CUTE_UNROLL
    for (int c = 0; c < cute::size<1>(scores); ++c) start = fmaxf(start, scores(r, c));
    return lanes_allreduce<kRowLanes>(start, MaxOp{});
  }

  // The new reference maxima (row_max); the row sums take their corrections at once, O in
  // rescale_output(). The test against limit_ (unscaled) runs beside the multiply by scale_log2,
  // so between a row's max and its exponentials there is one instruction more than with the exact
  // running max: the select of the new or the old reference (measured 0.9-1.7% at D = 64).
  template <class Scores>
  CUTE_DEVICE void advance_max(Scores& scores, float scale_log2) {
    using namespace cute;
    static_assert(decltype(size<0>(scores))::value == kRows);
    max_moved_ = false;
    CUTE_UNROLL
    for (int r = 0; r < kRows; ++r) {
      const float tile_max = row_max_of(scores, r, row_max[r]);
      // A row's first finite scores always move the reference (past a limit of -inf; the
      // correction exp2(-inf) = 0 falls on an all-zero acc_o); a row still all -inf (masked) never
      // does, and keeps max_scaled_ 0, so its probabilities are exp2(-inf) = 0.
      const bool move = tile_max > limit_[r];
      const float scaled = tile_max * scale_log2;
      const float correction = move ? exp2f(row_max[r] * scale_log2 - scaled) : 1.f;
      if (move) {
        row_max[r] = tile_max;
        max_scaled_[r] = scaled - kMaxOffset;
        limit_[r] = tile_max + kRescaleThreshold / scale_log2;
      }
      max_moved_ |= move;
      row_sum[r] *= correction;
      correction_[r] = correction;
    }
  }

  // scores -> exp2(s · scale_log2 - max_scaled), summed into the row sums (rows [kBegin, kEnd)).
  template <int kBegin = 0, int kEnd = kRows, class Scores>
  CUTE_DEVICE void exponentiate(Scores& scores, float scale_log2) {
    using namespace cute;
    CUTE_UNROLL
    for (int r = kBegin; r < kEnd; ++r) {
      float sum = 0.f;
      CUTE_UNROLL
      for (int c = 0; c < size<1>(scores); ++c) {
        scores(r, c) = exp2f(scores(r, c) * scale_log2 - max_scaled_[r]);
        sum += scores(r, c);
      }
      row_sum[r] += sum;
    }
  }
};

}  // namespace fa
