// The Hopper-family backward's epilogue of a key tile: dK = scale · Σ dSᵀ Q and dV, converted,
// staged in K's and V's buffers and stored.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>

#include "common/sequence.h"
#include "fa/params.h"
#include "sm90/bwd_config.h"
#include "sm90/bwd_load.h"
#include "sm90/named_barriers.h"
#include "sm90/row_store.h"

namespace fa::sm90 {

// A converted accumulator fragment of consumer thread epilogue_tid into dst (a shared-memory view in
// the accumulator's shape) through copy (a tiled stmatrix copy made for its TiledMma).
template <class Copy, class Fragment, class Dst>
CUTE_DEVICE void stage_fragment(Copy const& copy, Fragment const& fragment, Dst const& dst, int epilogue_tid) {
  auto thr = copy.get_thread_slice(epilogue_tid);
  cute::copy(copy, thr.retile_S(fragment), thr.partition_D(dst));
}

// dK and dV of a key tile to global memory through K's and V's buffers: the caller has scaled
// dK and converted both (fragments of its TiledMmas), and stage(epilogue_tid) copies them into
// the buffers (stmatrix), once both warpgroups' last GEMMs have read K and V. Then TMA stores them
// (rows past seqlen_k are clipped) or, in a varlen batch (where those rows are the next
// sequence's), the threads do with 16-byte writes. Last, the producer may load the next K and V
// (kv_empty).
template <class Config, class Params, class Storage, class Stage>
CUTE_DEVICE void store_dkv(Params const& params, Storage& smem, Stage&& stage, int n_block, int head_kv, int batch) {
  using namespace cute;
  using Element = typename Config::Element;
  constexpr int kBlockN = Config::kBlockN;
  const BackwardParams& p = params.attn;
  // The thread index read again (an asm read the compiler cannot hoist): its epilogue-only
  // derivatives, computed from the first read, were kept live through the main loop and spilled.
  uint32_t tid_now;
  asm volatile("mov.u32 %0, %%tid.x;" : "=r"(tid_now));
  const int epilogue_tid = int(tid_now) - 128;
  barrier_sync(BackwardBarrier::kEpilogue, Config::kMmaThreads);
  stage(epilogue_tid);
  cutlass::arch::fence_view_async_shared();
  barrier_sync(BackwardBarrier::kEpilogue, Config::kMmaThreads);
  const BackwardSmemTensors<Config> sm(smem);
  const int key_begin = n_block * kBlockN;
  if (p.cu_seqlens_q != nullptr) {
    // The sequence's offsets read again rather than kept in registers through the main loop.
    const Sequence out_seq = Sequence::of(p, batch);
    auto store = [&](auto cols, auto const& s, void* base, const Strides& stride, int head_dim) {
      Element* dst = static_cast<Element*>(base) + out_seq.k_offset(stride, batch, head_kv) +
                     int64_t(key_begin) * stride.row;
      store_rows<kBlockN, decltype(cols)::value>(s, dst, stride.row, out_seq.seqlen_k - key_begin, head_dim,
                                                 epilogue_tid, Config::kMmaThreads);
    };
    store(Int<Config::kHeadDim>{}, sm.k, p.dk, p.dk_stride, p.head_dim);
    store(Int<Config::kHeadDimV>{}, sm.v, p.dv, p.dv_stride, p.head_dim_v);
  } else if (epilogue_tid == 0) {
    Tensor mdK = params.tma_dk.get_tma_tensor(make_shape(p.seqlen_k, p.head_dim, p.heads_kv, p.batch));
    Tensor mdV = params.tma_dv.get_tma_tensor(make_shape(p.seqlen_k, p.head_dim_v, p.heads_kv, p.batch));
    auto [tdKgdK, tdKsdK] = tma_tile<typename Config::TileK>(params.tma_dk, mdK, sm.k, n_block, head_kv, batch, 0);
    auto [tdVgdV, tdVsdV] = tma_tile<typename Config::TileV>(params.tma_dv, mdV, sm.v, n_block, head_kv, batch, 0);
    copy(params.tma_dk, tdKsdK, tdKgdK);
    copy(params.tma_dv, tdVsdV, tdVgdV);
    tma_store_arrive();
    tma_store_wait<0>();  // the stores have read K's and V's buffers
  }
  if (p.cu_seqlens_q != nullptr) barrier_sync(BackwardBarrier::kEpilogue, Config::kMmaThreads);  // every row stored
  if (epilogue_tid == 0) cutlass::arch::ClusterBarrier::arrive(&smem.kv_empty);  // the producer may load the next K and V
}

}  // namespace fa::sm90
