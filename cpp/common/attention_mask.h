// Which scores a query row may see, as a policy plugged into the mainloop.
//
// Two reasons hide a score: its key lies past seqlen_k (the last key tile is partial), and, when
// kCausal, its key lies after the row's diagonal. The diagonal is bottom-right aligned: query i
// sees key j iff j <= i + (seqlen_k - seqlen_q), the usual lower triangle when the lengths match.
// The mainloop applies the mask only to the few tiles that cross the diagonal or the end of the
// keys (see first_masked_tile); all other tiles are fully visible and pay nothing.
#pragma once

#include <cute/tensor.hpp>

namespace fa {

template <bool kCausal>
struct AttentionMask {
  int seqlen_k;
  int diagonal;  // seqlen_k - seqlen_q

  CUTE_DEVICE AttentionMask(int seqlen_q, int seqlen_k_)
      : seqlen_k(seqlen_k_), diagonal(seqlen_k_ - seqlen_q) {}

  // Causality at run time (the KV-cache kernels), on AttentionMask<true>: without it the diagonal
  // moves past the last key (row i >= 0 sees keys up to i + seqlen_k), so only the end of the keys
  // masks. (AttentionMask<false> never reads the diagonal.)
  CUTE_DEVICE AttentionMask(int seqlen_q, int seqlen_k_, bool causal)
      : seqlen_k(seqlen_k_), diagonal(causal ? seqlen_k_ - seqlen_q : seqlen_k_) {}

  // How many key tiles a query tile of rows [row_begin, row_end) sees at all.
  CUTE_DEVICE int visible_tiles(int row_end, int block_n) const {
    const int keys = kCausal ? cute::min(seqlen_k, cute::max(0, row_end + diagonal)) : seqlen_k;
    return (keys + block_n - 1) / block_n;
  }

  // Key tiles [0, first_masked_tile) are complete and fully visible to every row of the tile that
  // starts at row_begin; the tiles from there on need apply().
  CUTE_DEVICE int first_masked_tile(int row_begin, int block_n) const {
    const int full_tiles = seqlen_k / block_n;
    if constexpr (!kCausal) return full_tiles;
    // Tile n is fully visible to row r iff its last key n·block_n + block_n - 1 <= r + diagonal.
    return cute::min(full_tiles, cute::max(0, (row_begin + diagonal + 1) / block_n));
  }

  // The first query row that sees key `key` (with kCausal, row i sees key j iff i >= j - diagonal).
  CUTE_DEVICE int first_row_seeing(int key) const { return kCausal ? cute::max(0, key - diagonal) : 0; }

  // Whether the tile of rows from row_begin × keys [key_begin, key_begin + block_n) needs apply():
  // it runs past the last key or, with kCausal, its last key lies after its first row's diagonal.
  CUTE_DEVICE bool tile_needs_mask(int row_begin, int key_begin, int block_n) const {
    return key_begin + block_n > seqlen_k || (kCausal && key_begin + block_n - 1 > row_begin + diagonal);
  }

  // Whether query row `row` may not see key `key`.
  CUTE_DEVICE bool hides(int row, int key) const {
    return key >= seqlen_k || (kCausal && key > row + diagonal);
  }

  // scores: an accumulator tile; coords: the (row, key) coordinates of its elements within the
  // tile (an identity tensor partitioned the same way); row0/key0: where the tile starts.
  template <class Scores, class Coords>
  CUTE_DEVICE void apply(Scores& scores, Coords const& coords, int row0, int key0) const {
    CUTE_UNROLL
    for (int i = 0; i < cute::size(scores); ++i) {
      if (hides(row0 + cute::get<0>(coords(i)), key0 + cute::get<1>(coords(i)))) scores(i) = -INFINITY;
    }
  }

  // The same on rows × columns views (each row of coords holds one query row): each row's first
  // hidden key is found once, then each score costs one compare and one select. coords is an
  // identity tensor partitioned for this thread: its element (r, c) is the thread's own origin
  // (a runtime value) plus a compile-time offset (its layout). The columns are compared as those
  // offsets, against the row's end minus the origin's column: written with the columns
  // themselves, the compiler hoisted them out of the step loop and kept one register a column live
  // through it (10 in the D = 256 backward, which spilled).
  template <class Scores, class Coords>
  CUTE_DEVICE void apply_rows(Scores& scores, Coords const& coords, int row0, int key0) const {
    const int origin_col = cute::get<1>(coords(0, 0));
    const auto offset_col = [&](int r, int c) {
      return cute::get<1>(coords.layout()(r, c)) - cute::get<1>(coords.layout()(0, 0));
    };
    CUTE_UNROLL
    for (int r = 0; r < cute::size<0>(scores); ++r) {
      int end = seqlen_k - key0;  // the row sees the tile's columns [0, end)
      if constexpr (kCausal) end = cute::min(end, row0 + cute::get<0>(coords(r, 0)) + diagonal + 1 - key0);
      end -= origin_col;
      CUTE_UNROLL
      for (int c = 0; c < cute::size<1>(scores); ++c) {
        if (offset_col(r, c) >= end) scores(r, c) = -INFINITY;
      }
    }
  }

  // The same for a transposed tile (keys × rows: the Hopper backward's Sᵀ); coords give (key, row).
  template <class Scores, class Coords>
  CUTE_DEVICE void apply_transposed(Scores& scores, Coords const& coords, int row0, int key0) const {
    CUTE_UNROLL
    for (int i = 0; i < cute::size(scores); ++i) {
      if (hides(row0 + cute::get<1>(coords(i)), key0 + cute::get<0>(coords(i)))) scores(i) = -INFINITY;
    }
  }
};

}  // namespace fa
