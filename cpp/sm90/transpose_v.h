// The FP8 forward's V, transposed before the attention kernel reads it.
//
// An e4m3 wgmma reads both operands K-major, so O += P V needs V with the keys contiguous:
// (Dv, keys) rows for each (batch entry, kv head). This kernel writes them from v's own rows
// (keys, Dv) into the buffer at params.v (ForwardParams: v_rows → v), 64 keys × Dv a CTA: 16-byte
// loads of the rows into shared memory, then 16-byte stores of 16 keys of one column, the keys of
// each 16 in P's fragment order (fp8_v_key_of_slot).
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>
#include <cute/config.hpp>

#include "common/sequence.h"
#include "fa/params.h"

namespace fa::sm90 {

// Where batch entry `batch`'s keys start in a row of the transposed V: 0 for a rectangular batch
// (each entry has rows of its own), and for a varlen batch cu_seqlens_k[b] + 16·b rounded down to
// a multiple of 16, at or past the previous sequence's end: every TMA box of V then starts at a
// 16-byte aligned key (a box starting at sequence b's own first key, packed, faulted with an
// illegal instruction on the H200), and every 16 keys of the rows (fp8_v_key_of_slot's blocks)
// belong to one sequence.
CUTE_HOST_DEVICE int transposed_v_begin(const ForwardParams& p, int batch) {
  if (p.cu_seqlens_k == nullptr) return 0;
  return (p.cu_seqlens_k[batch] + 16 * batch) / 16 * 16;
}

// The keys of each 16 in the order P's e4m3 A fragment holds them (fragments.h,
// fp8_probs_as_a_operand): slot 4t + i of a 16-key block holds key 2t + i (i < 2) or 8 + 2t + i - 2,
// the keys a thread's accumulator of S = Q Kᵀ holds. P V sums over the keys, so it is the same
// product when P's columns and Vᵀ's keys take one order; this one lets each thread form its part of
// P's A operand from its own accumulator, with no shuffles.
CUTE_HOST_DEVICE constexpr int fp8_v_key_of_slot(int slot) {
  return (slot & 2) * 4 + (slot >> 2) * 2 + (slot & 1);
}

// One CTA: keys [64·x, 64·x + 64) of batch entry z's part of the rows, head y. Each entry's part
// runs from transposed_v_begin to the next entry's (or the row's end): its keys, then zeros, so
// that a box that reaches past its last key reads zeros, never bytes left unwritten.
template <int kHeadDim>
__global__ void __launch_bounds__(256) transpose_v_kernel(const ForwardParams p) {
  constexpr int kKeys = 64, kThreads = 256, kPitch = kHeadDim + 16;
  __shared__ alignas(16) uint8_t tile[kKeys * kPitch];
  const int head = blockIdx.y, entry = blockIdx.z, first = blockIdx.x * kKeys;
  const Sequence seq = Sequence::of(p, entry);
  const int begin = transposed_v_begin(p, entry);
  const bool last = p.cu_seqlens_k == nullptr || entry + 1 == p.batch;
  const int span = (last ? int(p.v_stride.row) : transposed_v_begin(p, entry + 1)) - begin;
  if (first >= span) return;
  const int head_dim = p.head_dim_v;
  const auto* src = static_cast<const uint8_t*>(p.v_rows) + entry * p.v_rows_stride.batch +
                    head * p.v_rows_stride.head + int64_t(seq.k_begin) * p.v_rows_stride.row;
  auto* dst = static_cast<uint8_t*>(const_cast<void*>(p.v)) + entry * p.v_stride.batch + head * p.v_stride.head + begin;

  constexpr int kChunks = kHeadDim / 16;  // 16-byte pieces of a row
  for (int i = threadIdx.x; i < kKeys * kChunks; i += kThreads) {
    const int key = i / kChunks, col = i % kChunks * 16;
    uint4 value = make_uint4(0, 0, 0, 0);
    if (first + key < seq.seqlen_k && col < head_dim) {
      value = *reinterpret_cast<const uint4*>(src + int64_t(first + key) * p.v_rows_stride.row + col);
    }
    *reinterpret_cast<uint4*>(&tile[key * kPitch + col]) = value;
  }
  __syncthreads();
  for (int i = threadIdx.x; i < kHeadDim * (kKeys / 16); i += kThreads) {
    const int col = i % kHeadDim, key = i / kHeadDim * 16;
    if (col >= head_dim || first + key >= span) continue;
    uint32_t words[4];
    CUTE_UNROLL
    for (int w = 0; w < 4; ++w) {
      uint32_t word = 0;
      CUTE_UNROLL
      for (int b = 0; b < 4; ++b) {
        word |= uint32_t(tile[(key + fp8_v_key_of_slot(4 * w + b)) * kPitch + col]) << (8 * b);
      }
      words[w] = word;
    }
    *reinterpret_cast<uint4*>(dst + int64_t(col) * p.v_stride.row + first + key) =
        make_uint4(words[0], words[1], words[2], words[3]);
  }
}

// Writes the transposed V of params (v_rows → v) on `stream`.
template <int kHeadDim>
cudaError_t transpose_v_fp8(const ForwardParams& params, cudaStream_t stream) {
  // An entry's part of a row: up to its keys + 46 in a varlen batch (transposed_v_begin).
  const long long span = params.cu_seqlens_k == nullptr ? params.v_stride.row : params.seqlen_k + 48LL;
  if (span == 0 || params.batch == 0) return cudaSuccess;
  const dim3 grid(static_cast<unsigned>((span + 63) / 64), params.heads_kv, params.batch);
  transpose_v_kernel<kHeadDim><<<grid, 256, 0, stream>>>(params);
  return cudaGetLastError();
}

}  // namespace fa::sm90
