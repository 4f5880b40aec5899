// Global -> shared tile copies with cp.async, and its waits.
#pragma once

#include <cute/tensor.hpp>

namespace fa::sm80 {

// Waits until at most N groups of this thread's cp.async copies are still in flight.
template <int N>
CUTE_DEVICE void cp_async_wait() {
#if defined(CUTE_ARCH_CP_ASYNC_SM80_ENABLED)
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
#endif
}

// Copies a partitioned tile (CPY, CPY_ROWS, CPY_COLS) from global to shared memory with a
// zero-filling cp.async (GmemTileCopy::Load). A vector whose row is at or past rows_left (when
// kCheckRows), or whose columns lie past the real head dim (col_ok false), copies 0 source bytes and
// lands as zeros: nothing past the inputs' end reaches a sum, and a zero V row times a zero
// probability stays zero (garbage could be NaN). One instruction either way, so no shared-memory
// store path beside the copies.
template <bool kCheckRows, class TiledCopy, class Src, class Dst, class Coords, class ColOk>
CUTE_DEVICE void copy_tile_zero_fill(TiledCopy const& tiled_copy, Src const& src, Dst&& dst,
                                     Coords const& coords, ColOk const& col_ok, int rows_left) {
  using namespace cute;
  CUTE_UNROLL
  for (int m = 0; m < size<1>(dst); ++m) {
    const bool row_ok = !kCheckRows || get<0>(coords(0, m, 0)) < rows_left;
    CUTE_UNROLL
    for (int k = 0; k < size<2>(dst); ++k) {
      copy(tiled_copy.with(row_ok && col_ok(k)), src(_, m, k), dst(_, m, k));
    }
  }
}

// The same as copy_tile_zero_fill (with row checks) for rows that do not lie at one stride from
// each other (a paged KV cache): row_ptr(r) gives the address of row r of the tile (called only
// for rows before rows_left); each 16-byte piece of a row is one cp.async from there.
template <class TiledCopy, class RowPtr, class Dst, class Coords, class ColOk>
CUTE_DEVICE void copy_rows_zero_fill(TiledCopy const& tiled_copy, RowPtr&& row_ptr, Dst&& dst,
                                     Coords const& coords, ColOk const& col_ok, int rows_left) {
  using namespace cute;
  CUTE_UNROLL
  for (int m = 0; m < size<1>(dst); ++m) {
    const int row = get<0>(coords(0, m, 0));
    const bool row_ok = row < rows_left;
    const auto* src_row = row_ptr(row_ok ? row : 0);
    CUTE_UNROLL
    for (int k = 0; k < size<2>(dst); ++k) {
      Tensor src = make_tensor(make_gmem_ptr(src_row + get<1>(coords(0, m, k))), make_layout(shape(dst(_, m, k))));
      copy(tiled_copy.with(row_ok && col_ok(k)), src, dst(_, m, k));
    }
  }
}

// Stores a partitioned register tile to global memory, skipping rows at or past rows_left and
// columns past the real head dim.
template <class TiledCopy, class Src, class Dst, class Coords, class ColOk>
CUTE_DEVICE void store_tile_predicated(TiledCopy const& tiled_copy, Src const& src, Dst&& dst,
                                       Coords const& coords, ColOk const& col_ok, int rows_left) {
  using namespace cute;
  CUTE_UNROLL
  for (int m = 0; m < size<1>(dst); ++m) {
    if (get<0>(coords(0, m, 0)) < rows_left) {
      CUTE_UNROLL
      for (int k = 0; k < size<2>(dst); ++k) {
        if (col_ok(k)) copy(tiled_copy, src(_, m, k), dst(_, m, k));
      }
    }
  }
}

// The same as store_tile_predicated for rows that do not lie at one stride from each other (the
// decode kernel's packed rows): row_ptr(r) gives the address of row r of the tile.
template <class TiledCopy, class Src, class RowPtr, class Coords, class ColOk>
CUTE_DEVICE void store_rows_predicated(TiledCopy const& tiled_copy, Src const& src, RowPtr&& row_ptr,
                                       Coords const& coords, ColOk const& col_ok, int rows_left) {
  using namespace cute;
  CUTE_UNROLL
  for (int m = 0; m < size<1>(src); ++m) {
    const int row = get<0>(coords(0, m, 0));
    if (row < rows_left) {
      auto* dst_row = row_ptr(row);
      CUTE_UNROLL
      for (int k = 0; k < size<2>(src); ++k) {
        Tensor dst = make_tensor(make_gmem_ptr(dst_row + get<1>(coords(0, m, k))), make_layout(shape(src(_, m, k))));
        if (col_ok(k)) copy(tiled_copy, src(_, m, k), dst);
      }
    }
  }
}

// col_ok(k): whether the k-th column vector of a partitioned tile lies inside the real head dim.
template <class Coords>
CUTE_DEVICE auto column_predicates(Coords const& coords, int head_dim) {
  using namespace cute;
  auto col_ok = make_tensor<bool>(make_shape(size<2>(coords)));
  CUTE_UNROLL
  for (int k = 0; k < size(col_ok); ++k) col_ok(k) = get<1>(coords(0, 0, k)) < head_dim;
  return col_ok;
}

}  // namespace fa::sm80
