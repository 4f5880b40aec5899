// The cost of one dQ exchange between the two CTAs of a cluster, on its own: each of a CTA's two
// warpgroups ships kGroups 16-byte vectors a thread (8 KB a warpgroup at 4) into the other CTA's
// shared memory, waits for the other CTA's, reads them, and says so (one remote arrival a warp),
// kIters times back to back: the pattern of the D = 256 backward's dQ pairs
// (benchmarks/experiments/bwd-d256-dq-pairs.patch, benchmarks/NOTES.md, session 25), without the
// rest of its step. Clocks per exchange, per mode of shipping:
//   0  st.async, each 16-byte store counted on the receiver's transaction barrier (expect_tx);
//   1  weak st.shared::cluster stores, then one release arrival a thread (barrier of 128);
//   2  weak stores, __syncwarp, then one cluster-scope fence and arrival a warp (barrier of 4).
// Run with one cluster and with as many as fit (all SMs exchanging at once). A development tool,
// not part of the package: it tells whether an exchange can hide in a step of ~6000 clocks.
//
//   nvcc -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a benchmarks/dsmem_rate.cu -o dsmem_rate
//   ./dsmem_rate
#include <cstdint>
#include <cstdio>
#include <vector>

#include <cuda_runtime.h>

constexpr int kThreads = 256;  // two warpgroups
constexpr int kGroups = 4;     // 16-byte vectors a thread an exchange
constexpr int kIters = 4096;

__device__ uint32_t smem_u32(const void* p) { return static_cast<uint32_t>(__cvta_generic_to_shared(p)); }

__device__ uint32_t remote(const void* p, uint32_t rank) {
  uint32_t r;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(r) : "r"(smem_u32(p)), "r"(rank));
  return r;
}

__device__ void wait_parity(uint64_t* bar, uint32_t parity) {
  asm volatile(
      "{\n\t.reg .pred done;\n\t"
      "W_%=:\n\t"
      "mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 done, [%0], %1;\n\t"
      "@!done bra W_%=;\n\t}"
      :
      : "r"(smem_u32(bar)), "r"(parity)
      : "memory");
}

__device__ void arrive_remote(uint32_t bar) {
  asm volatile("mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%0];" : : "r"(bar) : "memory");
}

__device__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release;\n\tbarrier.cluster.wait.acquire;" : : : "memory");
}

template <int kMode>
__global__ void __cluster_dims__(2, 1, 1) __launch_bounds__(kThreads, 1)
    exchange_kernel(long long* cycles, float* sink, int* wrong) {
  __shared__ alignas(128) float4 received[2][kGroups * 128];  // [warpgroup][vector · 128 + thread]
  __shared__ alignas(8) uint64_t full[2];   // this CTA's: the other CTA's vectors are here
  __shared__ alignas(8) uint64_t empty[2];  // this CTA's: the other CTA has read what this one shipped
  uint32_t rank;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(rank));
  const uint32_t partner = rank ^ 1;
  const int wg = threadIdx.x / 128, t = threadIdx.x % 128, lane = threadIdx.x % 32;
  if (threadIdx.x == 0) {
    const uint32_t full_count = kMode == 0 ? 1 : kMode == 1 ? 128 : 4;
    for (int w = 0; w < 2; ++w) {
      asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" : : "r"(smem_u32(&full[w])), "r"(full_count));
      asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" : : "r"(smem_u32(&empty[w])), "r"(4));
    }
    asm volatile("fence.mbarrier_init.release.cluster;" : : : "memory");
  }
  cluster_sync();

  const uint32_t slots = remote(&received[wg][t], partner);
  const uint32_t partner_full = remote(&full[wg], partner);
  const uint32_t partner_empty = remote(&empty[wg], partner);
  float4 v[kGroups];
  for (int j = 0; j < kGroups; ++j) v[j] = make_float4(rank + j, t, wg, 1.0f);
  float acc = 0.0f;

  const long long start = clock64();
  for (int it = 0; it < kIters; ++it) {
    wait_parity(&empty[wg], (it & 1) ^ 1);  // the other CTA has read the last exchange
    for (int j = 0; j < kGroups; ++j) {
      const uint32_t addr = slots + j * 128 * 16;
      if constexpr (kMode == 0) {
        asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.f32 [%0], {%1, %2, %3, %4}, [%5];"
                     :
                     : "r"(addr), "f"(v[j].x), "f"(v[j].y), "f"(v[j].z), "f"(v[j].w), "r"(partner_full)
                     : "memory");
      } else {
        asm volatile("st.shared::cluster.v4.f32 [%0], {%1, %2, %3, %4};"
                     :
                     : "r"(addr), "f"(v[j].x), "f"(v[j].y), "f"(v[j].z), "f"(v[j].w)
                     : "memory");
      }
    }
    if constexpr (kMode == 0) {
      if (t == 0) {
        asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;"
                     :
                     : "r"(smem_u32(&full[wg])), "r"(kGroups * 128 * 16)
                     : "memory");
      }
    } else if constexpr (kMode == 1) {
      arrive_remote(partner_full);
    } else {
      __syncwarp();
      if (lane == 0) {
        asm volatile("fence.acq_rel.cluster;" : : : "memory");
        arrive_remote(partner_full);
      }
    }
    wait_parity(&full[wg], it & 1);
    for (int j = 0; j < kGroups; ++j) {
      const float4 r = received[wg][j * 128 + t];
      acc += r.x + r.y + r.z + r.w;
      if (r.x != float(partner + j + it) || r.y != float(t)) atomicAdd(wrong, 1);  // not what was shipped
      v[j].x += 1.0f;  // a new value each exchange
    }
    __syncwarp();
    if (lane == 0) arrive_remote(partner_empty);
  }
  const long long stop = clock64();
  cluster_sync();  // no CTA exits while the other may still arrive on its barriers
  if (threadIdx.x == 0) cycles[blockIdx.x] = stop - start;
  if (acc == -1.0f) *sink = acc;  // keep the reads
}

// Also counts the vectors received that differ from the ones shipped (`wrong`, over both runs).
template <int kMode>
double clocks_per_exchange(int clusters, int& wrong) {
  long long* cycles;
  float* sink;
  int* wrong_dev;
  cudaMalloc(&cycles, sizeof(long long) * 2 * clusters);
  cudaMalloc(&sink, sizeof(float));
  cudaMalloc(&wrong_dev, sizeof(int));
  cudaMemset(wrong_dev, 0, sizeof(int));
  for (int rep = 0; rep < 2; ++rep) exchange_kernel<kMode><<<2 * clusters, kThreads>>>(cycles, sink, wrong_dev);  // warm-up, then timed
  cudaError_t err = cudaDeviceSynchronize();
  if (err != cudaSuccess) {
    std::printf("error: %s\n", cudaGetErrorString(err));
    return -1.0;
  }
  std::vector<long long> host(2 * clusters);
  cudaMemcpy(host.data(), cycles, sizeof(long long) * host.size(), cudaMemcpyDeviceToHost);
  cudaMemcpy(&wrong, wrong_dev, sizeof(int), cudaMemcpyDeviceToHost);
  cudaFree(cycles);
  cudaFree(sink);
  cudaFree(wrong_dev);
  double mean = 0;
  for (long long c : host) mean += double(c);
  return mean / host.size() / kIters;
}

int main() {
  int sms = 0, clusters = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(sms / 2 * 2);
  config.blockDim = dim3(kThreads);
  cudaOccupancyMaxActiveClusters(&clusters, exchange_kernel<0>, &config);
  std::printf("%d SMs, %d clusters of 2 at once; %d bytes a warpgroup an exchange\n", sms, clusters,
              kGroups * 128 * 16);
  const char* names[] = {"st.async + expect_tx", "weak stores + arrival a thread", "weak stores + fence and arrival a warp"};
  for (int n : {1, clusters}) {
    std::printf("%d cluster(s):\n", n);
    int wrong[3];
    const double c[] = {clocks_per_exchange<0>(n, wrong[0]), clocks_per_exchange<1>(n, wrong[1]),
                        clocks_per_exchange<2>(n, wrong[2])};
    for (int m = 0; m < 3; ++m) {
      std::printf("  %-40s %8.0f clocks an exchange, %d vectors wrong\n", names[m], c[m], wrong[m]);
    }
  }
  return 0;
}
