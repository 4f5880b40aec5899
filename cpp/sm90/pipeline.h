// The TMA pipelines of the Hopper family's kernels (cutlass::PipelineTmaAsync): their roles.
#pragma once

#include <cute/config.hpp>
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

}  // namespace fa::sm90
