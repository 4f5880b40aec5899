// The packed query rows of a KV-cache (decode) CTA, shared by the Ampere family's two decode
// kernels (fwd_kernel.h with kDecode, and decode_kernel.h).
//
// A decode CTA serves one kv head of one batch entry (and, with split-KV, one share of its keys).
// Its rows are the group's query heads × positions, packed: row R is query head
// head_kv · group + R / seqlen_q at position R % seqlen_q, so the whole group shares each K/V load.
// These give each tile row's addresses in q, out and lse, and its row of split-KV's fp32 partial
// results ((split, batch, head, position) rows, common/split_kv.h).
#pragma once

#include <cstdint>

#include <cute/config.hpp>

#include "fa/params.h"

namespace fa::sm80 {

template <class Element>
struct DecodeRows {
  const ForwardParams& params;
  int batch;
  int head_kv;
  int split;
  int group;      // query heads per kv head
  int seqlen_q;
  int row_begin;  // the tile's first packed row

  CUTE_DEVICE int head_of(int r) const { return head_kv * group + (row_begin + r) / seqlen_q; }
  CUTE_DEVICE int position_of(int r) const { return (row_begin + r) % seqlen_q; }

  CUTE_DEVICE const Element* q_row(int r) const {
    return static_cast<const Element*>(params.q) + batch * params.q_stride.batch + head_of(r) * params.q_stride.head +
           int64_t(position_of(r)) * params.q_stride.row;
  }
  CUTE_DEVICE Element* out_row(int r) const {
    return static_cast<Element*>(params.out) + batch * params.out_stride.batch + head_of(r) * params.out_stride.head +
           int64_t(position_of(r)) * params.out_stride.row;
  }
  CUTE_DEVICE float& lse_at(int r) const {
    return params.lse[batch * params.lse_batch_stride + head_of(r) * params.lse_head_stride + position_of(r)];
  }
  // Split-KV: the row of the tile's row r among the fp32 partial results.
  CUTE_DEVICE int64_t accum_row(int r) const {
    return ((int64_t(split) * params.batch + batch) * params.heads_q + head_of(r)) * params.seqlen_q + position_of(r);
  }
};

}  // namespace fa::sm80
