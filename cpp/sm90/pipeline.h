// The TMA pipelines of the Hopper family's kernels (cutlass::PipelineTmaAsync): their roles.
#pragma once

#include <cute/config.hpp>
#include <cute/arch/util.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/pipeline/sm90_pipeline.hpp>

namespace fa::sm90 {

// Warpgroup 0 produces (thread 0, in its loading warp, arms each stage's transaction barrier with
// transaction_bytes); the `consumers` threads of the other warpgroups consume (every one of them
// arrives at a stage's empty barrier when done with it).
template <class Pipeline>
CUTE_DEVICE typename Pipeline::Params tma_pipeline_params(int transaction_bytes, int consumers) {
  typename Pipeline::Params params;
  params.transaction_bytes = transaction_bytes;
  params.role = cutlass::canonical_warp_group_idx() == 0 ? Pipeline::ThreadCategory::Producer
                                                         : Pipeline::ThreadCategory::Consumer;
  params.is_leader = threadIdx.x == 0;
  params.num_consumers = consumers;
  return params;
}

// The barriers of a pipeline whose consumers release each stage with `consumer_arrivals` arrivals
// (initialised here rather than by the pipeline, whose count assumes a cluster shape known at
// compile time): every consumer thread of one CTA, or, for a CTA pair, one thread of each consumer
// warpgroup of both CTAs (release_to_pair). One thread of warp 0 initialises them.
template <class Pipeline>
CUTE_DEVICE void init_pipeline_barriers(typename Pipeline::SharedStorage& s, int consumer_arrivals) {
  if (cutlass::canonical_warp_idx_sync() == 0 && cute::elect_one_sync()) {
    for (uint32_t stage = 0; stage < Pipeline::Stages; ++stage) {
      s.full_barrier_[stage].init(1);
      s.empty_barrier_[stage].init(consumer_arrivals);
    }
  }
  cutlass::arch::fence_barrier_init();
}

// A consumer's release of `stage` in a CTA pair (both CTAs' producers fill this CTA's buffers):
// threads 0 and 1 of each consumer warpgroup arrive at CTA 0's and CTA 1's empty barrier.
template <class Storage>
CUTE_DEVICE void release_to_pair(Storage& s, int stage, int warpgroup_thread) {
  if (warpgroup_thread < 2) s.empty_barrier_[stage].arrive(static_cast<uint32_t>(warpgroup_thread), 1u);
}

}  // namespace fa::sm90
