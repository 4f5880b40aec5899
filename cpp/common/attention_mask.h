// Which scores a query row may see, as a policy plugged into the mainloop.
//
// Two reasons hide a score: its key lies past seqlen_k (the last key tile is partial), and, with
// kLocal, its key lies outside the row's window around its diagonal. The diagonal is bottom-right
// aligned: row i's diagonal key is i' = i + (seqlen_k - seqlen_q), and row i sees key j iff
//   i' - left <= j <= i' + right
// with the bounds (ForwardParams::window_left / window_right) read at run time: causal is
// right = 0 with left unbounded; a sliding window (Mistral, Gemma, gpt-oss) bounds left too. The
// kernels instantiated for causal (their kCausal parameter) take this mask with kLocal = true and
// serve every such bound; the others take kLocal = false and see every key.
//
// The mainloops apply the mask only to the few key tiles that cross a row's bounds or the end of
// the keys; the tiles of a query tile fall into three runs, from the last to the first:
//   [first_masked_tile, visible_tiles)      cross the right bound (the diagonal) or the keys' end
//   [left_masked_tiles, first_masked_tile)  fully visible: no mask
//   [first_visible_tile, left_masked_tiles) cross the left bound (windows only)
// and the tiles outside [first_visible_tile, visible_tiles) are never loaded.
#pragma once

#include <algorithm>
#include <cstdint>

#include <cute/tensor.hpp>

#include "fa/params.h"

namespace fa {

// A window's bounds as offsets from a row (AttentionMask below: row r sees the keys [r + lo,
// r + hi] below seqlen_k), for the kernels and the host alike.
template <class Index>
CUTE_HOST_DEVICE constexpr Index window_lo(Index seqlen_q, Index seqlen_k, int window_left) {
  return seqlen_k - seqlen_q - (window_left < 0 ? seqlen_k : cute::min(Index(window_left), seqlen_k));
}
template <class Index>
CUTE_HOST_DEVICE constexpr Index window_hi(Index seqlen_q, Index seqlen_k, int window_right) {
  return seqlen_k - seqlen_q + (window_right < 0 ? seqlen_q : cute::min(Index(window_right), seqlen_q));
}

// The mean number of keys a row of a seqlen_q × seqlen_k attention sees through the window
// (window_left, window_right: -1 unbounded), from 64 rows sampled evenly (a row's count is
// piecewise linear in its index, so the error is a few keys): a host-side estimate of the work a
// row brings to a kernel.
inline int64_t mean_visible_keys(int64_t seqlen_q, int64_t seqlen_k, int window_left, int window_right) {
  if (seqlen_q <= 0 || seqlen_k <= 0) return 0;
  const int64_t lo = window_lo(seqlen_q, seqlen_k, window_left);
  const int64_t hi = window_hi(seqlen_q, seqlen_k, window_right);
  constexpr int kSamples = 64;
  int64_t keys = 0;
  for (int s = 0; s < kSamples; ++s) {
    const int64_t row = (2 * s + 1) * seqlen_q / (2 * kSamples);
    keys += std::max<int64_t>(0, std::min(seqlen_k - 1, row + hi) - std::max<int64_t>(0, row + lo) + 1);
  }
  return keys / kSamples;
}

template <bool kLocal>
struct AttentionMask {
  // Row r sees the keys [r + lo, r + hi] below seqlen_k: lo = diagonal - left, hi = diagonal + right
  // with diagonal = seqlen_k - seqlen_q. An unbounded side is clamped to where it stops hiding
  // anything (left = seqlen_k: row 0 then sees key 0; right = seqlen_q: the last row sees the last
  // key), and so is a bound past it, so that every sum below stays within seqlen_q + 2 · seqlen_k.
  // Two values rather than the diagonal and both bounds: they stay in registers through the
  // mainloops, where the D = 256 Hopper forward has none to spare.
  int seqlen_k;
  int lo;
  int hi;

  CUTE_DEVICE AttentionMask(int seqlen_q, int seqlen_k_, const ForwardParams& p)
      : seqlen_k(seqlen_k_),
        lo(window_lo(seqlen_q, seqlen_k_, p.window_left)),
        hi(window_hi(seqlen_q, seqlen_k_, p.window_right)) {}

  // The same mask with the keys counted from `keys` (a multiple of the key tile): key j here is
  // key j + keys of this one, so that a mainloop may count its tiles from a window's first.
  CUTE_DEVICE AttentionMask shifted(int keys) const {
    AttentionMask m = *this;
    m.seqlen_k -= keys;
    m.lo -= keys;
    m.hi -= keys;
    return m;
  }

  // The end of the key tiles a query tile of rows [row_begin, row_end) sees at all.
  CUTE_DEVICE int visible_tiles(int row_end, int block_n) const {
    const int keys = kLocal ? cute::min(seqlen_k, cute::max(0, row_end + hi)) : seqlen_k;
    return (keys + block_n - 1) / block_n;
  }

  // The first key tile the rows from row_begin see (the window's left bound; 0 without one). When
  // it is at or past visible_tiles(), the rows see no key.
  CUTE_DEVICE int first_visible_tile(int row_begin, int block_n) const {
    if constexpr (!kLocal) return 0;
    const int first_key = cute::max(0, row_begin + lo);
    return first_key >= seqlen_k ? (seqlen_k + block_n - 1) / block_n : first_key / block_n;
  }

  // Key tiles [0, first_masked_tile) are complete and lie before the right bound of every row of
  // the tile that starts at row_begin; the tiles from there on need apply().
  CUTE_DEVICE int first_masked_tile(int row_begin, int block_n) const {
    const int full_tiles = seqlen_k / block_n;
    if constexpr (!kLocal) return full_tiles;
    // Tile n is fully visible to row r iff its last key n·block_n + block_n - 1 <= r + hi.
    return cute::min(full_tiles, cute::max(0, (row_begin + hi + 1) / block_n));
  }

  // Key tiles [0, left_masked_tiles) hold keys that some row before row_end does not see by the
  // left bound: they need apply() too (0 without a left bound).
  CUTE_DEVICE int left_masked_tiles(int row_end, int block_n) const {
    if constexpr (!kLocal) return 0;
    // Tile n is fully visible to row r iff n·block_n >= r + lo; the last row binds.
    const int first_key = row_end - 1 + lo;
    return first_key <= 0 ? 0 : (first_key + block_n - 1) / block_n;
  }

  // The first query row that sees key `key` (with kLocal, row i sees key j only if i >= j - hi).
  CUTE_DEVICE int first_row_seeing(int key) const { return kLocal ? cute::max(0, key - hi) : 0; }

  // The end of the query rows that see a key before key_end (with kLocal, row i sees key j only if
  // i <= j - lo); callers take the min with seqlen_q.
  CUTE_DEVICE int rows_end_seeing(int key_end) const {
    return kLocal ? cute::max(0, key_end - lo) : 0x7fffffff;
  }

  // Whether the tile of rows [row_begin, row_begin + block_m) × keys [key_begin, key_begin +
  // block_n) needs apply(): it runs past the last key or, with kLocal, crosses a row's bound.
  CUTE_DEVICE bool tile_needs_mask(int row_begin, int block_m, int key_begin, int block_n) const {
    return key_begin + block_n > seqlen_k ||
           (kLocal && (key_begin + block_n - 1 > row_begin + hi || key_begin < row_begin + block_m - 1 + lo));
  }

  // Whether query row `row` may not see key `key`.
  CUTE_DEVICE bool hides(int row, int key) const {
    return key >= seqlen_k || (kLocal && (key > row + hi || key < row + lo));
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
  // and last visible keys are found once, then each score costs two compares and one select.
  // coords is an identity tensor partitioned for this thread: its element (r, c) is the thread's
  // own origin (a runtime value) plus a compile-time offset (its layout). The columns are compared
  // as those offsets, against the row's bounds minus the origin's column: written with the
  // columns themselves, the compiler hoisted them out of the step loop and kept one register a
  // column live through it (10 in the D = 256 backward, which spilled).
  // kEnd / kBegin: whether to compare with the row's end (seqlen_k and the right bound) and its
  // beginning (the left bound); a tile of the left run (common/attention_mask.h, above) is complete
  // and before every row's right bound, so it needs kBegin alone.
  template <bool kEnd = true, bool kBegin = kLocal, class Scores, class Coords>
  CUTE_DEVICE void apply_rows(Scores& scores, Coords const& coords, int row0, int key0) const {
    const int origin_col = cute::get<1>(coords(0, 0));
    const auto offset_col = [&](int r, int c) {
      return cute::get<1>(coords.layout()(r, c)) - cute::get<1>(coords.layout()(0, 0));
    };
    CUTE_UNROLL
    for (int r = 0; r < cute::size<0>(scores); ++r) {
      int end = seqlen_k - key0;  // the row sees the tile's columns [begin, end)
      int begin = 0;
      if constexpr (kLocal) {
        const int row = row0 + cute::get<0>(coords(r, 0)) - key0;
        end = cute::min(end, row + hi + 1);
        begin = row + lo;
      }
      end -= origin_col;
      begin -= origin_col;
      CUTE_UNROLL
      for (int c = 0; c < cute::size<1>(scores); ++c) {
        bool hidden = false;
        if constexpr (kEnd) hidden = offset_col(r, c) >= end;
        if constexpr (kLocal && kBegin) hidden = hidden || offset_col(r, c) < begin;
        if (hidden) scores(r, c) = -INFINITY;
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
