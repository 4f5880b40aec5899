// A tile staged in shared memory stored to global memory by threads, 16 bytes at a time.
//
// The Hopper kernels store their output tiles with TMA, which clips rows past the tensor's end. In
// a variable-length batch the rows past a sequence's end are the next sequence's, which a TMA
// store would overwrite; there the threads that staged the tile store its rows themselves.
#pragma once

#include <cstdint>

#include <cute/tensor.hpp>

namespace fa::sm90 {

// Rows [0, min(kRows, rows_left)) and columns [0, head_dim) of the (kRows, kHeadDim) shared-memory
// tile s, to dst (row stride row_stride), by `threads` threads of which this is thread `tid`. Each
// 8-column piece of a row is contiguous in the kernels' swizzled layouts (the swizzle permutes
// 16-byte units), so it moves as one vector.
template <int kRows, int kHeadDim, class SmemTile, class Element>
CUTE_DEVICE void store_rows(SmemTile const& s, Element* dst, int64_t row_stride, int rows_left, int head_dim,
                            int tid, int threads) {
  constexpr int kVectors = kHeadDim / 8;
  for (int i = tid; i < kRows * kVectors; i += threads) {
    const int row = i / kVectors, col = i % kVectors * 8;
    if (row < rows_left && col < head_dim) {
      *reinterpret_cast<uint4*>(dst + row * row_stride + col) = *reinterpret_cast<const uint4*>(&s(row, col));
    }
  }
}

}  // namespace fa::sm90
