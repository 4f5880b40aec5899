// One batch entry's rows, for rectangular and variable-length batches alike.
//
// A rectangular batch (fa.forward) gives every entry seqlen_q queries and seqlen_k keys, rows
// from 0 of its own (batch stride) slice. A variable-length batch (fa.forward_varlen) packs the
// sequences' rows one after another in (total, H, D) tensors: entry b's queries are rows
// [cu_seqlens_q[b], cu_seqlens_q[b + 1]), its keys likewise, and the batch strides are 0. The
// kernels take a Sequence at the start of each work tile and address rows through it, so one
// kernel serves both (the rectangular case reads no index tensor).
#pragma once

#include <cstdint>

#include <cute/config.hpp>

#include "fa/kernels.h"
#include "fa/params.h"

namespace fa {

struct Sequence {
  int q_begin = 0;   // the entry's first query row among the tensor's rows
  int k_begin = 0;   // its first key row
  int seqlen_q = 0;
  int seqlen_k = 0;

  CUTE_HOST_DEVICE static Sequence of(const ForwardParams& p, int batch) {
    Sequence s;
    if (p.cu_seqlens_q == nullptr) {
      s.seqlen_q = p.seqlen_q;
      s.seqlen_k = p.seqlen_k;
      if (p.seqused_k != nullptr) s.seqlen_k = p.seqused_k[batch];  // a KV cache's filled part
      if (p.leftpad_k != nullptr) {  // and its left padding (contiguous caches only)
        s.k_begin = p.leftpad_k[batch];
        s.seqlen_k -= s.k_begin;
      }
    } else {
      s.q_begin = p.cu_seqlens_q[batch];
      s.k_begin = p.cu_seqlens_k[batch];
      s.seqlen_q = p.cu_seqlens_q[batch + 1] - s.q_begin;
      s.seqlen_k = p.cu_seqlens_k[batch + 1] - s.k_begin;
    }
    return s;
  }

  // Element offsets of the entry's first query (key) row of head `head` in a tensor with strides s.
  CUTE_HOST_DEVICE int64_t q_offset(const Strides& s, int batch, int head) const {
    return batch * s.batch + head * s.head + int64_t(q_begin) * s.row;
  }
  CUTE_HOST_DEVICE int64_t k_offset(const Strides& s, int batch, int head) const {
    return batch * s.batch + head * s.head + int64_t(k_begin) * s.row;
  }
  // Offset of the entry's first lse value of head `head` (lse rows are contiguous).
  CUTE_HOST_DEVICE int64_t lse_offset(const ForwardParams& p, int batch, int head) const {
    return batch * p.lse_batch_stride + head * p.lse_head_stride + q_begin;
  }

  // The backward workspaces' row of the entry's first query row of head `head`. Varlen: sequence
  // b starts at (cu_seqlens_q[b] + b · kBackwardRowPadding) rounded down to the padding, which is
  // at least where sequence b - 1's padded rows end, so every sequence's query tiles lie in rows
  // of their own.
  CUTE_HOST_DEVICE int64_t workspace_row(const BackwardParams& p, int batch, int head) const {
    if (p.cu_seqlens_q == nullptr) return (int64_t(batch) * p.heads_q + head) * p.seqlen_q_rounded;
    const int64_t begin = (int64_t(q_begin) + int64_t(batch) * kBackwardRowPadding) /
                          kBackwardRowPadding * kBackwardRowPadding;
    return head * p.workspace_head_rows + begin;
  }
};

// The row and batch extents of the tensors as a whole: (seqlen, batch) for a rectangular batch,
// (total rows, 1) for a packed one. The Hopper family's TMA descriptors span these; a sequence's
// tiles are then offset by its first row.
struct TensorExtents {
  int rows_q = 0;
  int rows_k = 0;
  int batches = 0;

  CUTE_HOST_DEVICE static TensorExtents of(const ForwardParams& p) {
    const bool packed = p.cu_seqlens_q != nullptr;
    return {packed ? p.total_q : p.seqlen_q, packed ? p.total_k : p.seqlen_k, packed ? 1 : p.batch};
  }
  // The batch coordinate of batch entry b in these tensors.
  CUTE_HOST_DEVICE int batch_index(int b) const { return batches == 1 ? 0 : b; }
};

}  // namespace fa
