// The rate of one wgmma shape on its own: how many FLOP a clock an SM gets from a warpgroup GEMM
// of shape 64 × N × 256 (fp16 in, fp32 out; the backward's K = 256 at head dim 256) when each of
// `warpgroups` consumer warpgroups issues it back to back (16 k16 instructions a GEMM, then a wait),
// with A from shared memory (SS) or registers (RS), and B (and an A in shared memory) K-major or
// MN-major (the 128-byte swizzle). A maintainer tool, not part of the package: it tells whether a shape
// is bound by the tensor cores (4096 FLOP/clk an H100 SM, dense fp16) or by shared-memory operand
// reads (docs/performance.md).
//
//   nvcc -std=c++17 -O3 --expt-relaxed-constexpr -DNDEBUG -DCUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED \
//     -gencode=arch=compute_90a,code=sm_90a -I<cutlass>/include tools/wgmma_rate.cu -o wgmma_rate
//   ./wgmma_rate
#include <cstdio>
#include <vector>

#include <cute/tensor.hpp>
#include <cute/atom/mma_traits_sm90_gmma.hpp>

using namespace cute;
using Element = cutlass::half_t;

constexpr int kK = 256;
constexpr int kIters = 4096;

template <int N, bool kRegisterA, bool kMajorMNB, int kWarpgroups>
__global__ void __launch_bounds__(kWarpgroups * 128, 1) rate_kernel(long long* cycles, float* sink) {
  extern __shared__ __align__(1024) char smem[];
  Element* a_ptr = reinterpret_cast<Element*>(smem);
  Element* b_ptr = a_ptr + 64 * kK;
  // Small values (no Inf or NaN in the products), different per element.
  for (int i = threadIdx.x; i < 64 * kK + 256 * kK; i += blockDim.x) {
    a_ptr[i] = Element(float((i * 37) % 17 - 8) * 0.01f);
  }
  __syncthreads();
  using AtomK = GMMA::Layout_K_SW128_Atom<Element>;
  using AtomMN = GMMA::Layout_MN_SW128_Atom<Element>;
  // kMajorMNB with A in shared memory: A MN-major too (the dQ GEMM's form).
  constexpr bool kMajorMNA = kMajorMNB && !kRegisterA;
  auto tile = [](auto rows, auto major_mn) {
    if constexpr (decltype(major_mn)::value) return tile_to_shape(AtomMN{}, make_shape(rows, Int<kK>{}));
    else return tile_to_shape(AtomK{}, make_shape(rows, Int<kK>{}));
  };
  Tensor sA = make_tensor(make_smem_ptr(a_ptr), tile(_64{}, cute::bool_constant<kMajorMNA>{}));
  Tensor sB = make_tensor(make_smem_ptr(b_ptr), tile(Int<N>{}, cute::bool_constant<kMajorMNB>{}));
  constexpr auto kMajorA = kMajorMNA ? GMMA::Major::MN : GMMA::Major::K;
  constexpr auto kMajorB = kMajorMNB ? GMMA::Major::MN : GMMA::Major::K;
  using Shape_ = Shape<_64, Int<N>, Int<kK>>;
  auto op = [] {
    if constexpr (kRegisterA) return GMMA::rs_op_selector<Element, Element, float, Shape_, GMMA::Major::K, kMajorB>();
    else return GMMA::ss_op_selector<Element, Element, float, Shape_, kMajorA, kMajorB>();
  }();
  auto mma = make_tiled_mma(op);
  auto thr = mma.get_slice(threadIdx.x % 128);
  Tensor tA = thr.partition_fragment_A(sA);
  Tensor tB = thr.partition_fragment_B(sB);
  if constexpr (kRegisterA) {
    Tensor tAsA = thr.partition_A(sA);
    for (int i = 0; i < size(tA); ++i) tA(i) = tAsA(i);
  }
  Tensor acc = partition_fragment_C(mma, Shape<_64, Int<N>>{});
  clear(acc);
  __syncthreads();
  const long long start = clock64();
  for (int it = 0; it < kIters; ++it) {
    if constexpr (kRegisterA) warpgroup_fence_operand(tA);
    warpgroup_fence_operand(acc);
    warpgroup_arrive();
    CUTE_UNROLL
    for (int k = 0; k < size<2>(tA); ++k) gemm(mma, tA(_, _, k), tB(_, _, k), acc);
    warpgroup_commit_batch();
    warpgroup_wait<0>();
    warpgroup_fence_operand(acc);
    if constexpr (kRegisterA) warpgroup_fence_operand(tA);
  }
  __syncthreads();
  const long long stop = clock64();
  float sum = 0.f;
  for (int i = 0; i < size(acc); ++i) sum += acc(i);
  if (sum == 12345.f) sink[threadIdx.x] = sum;  // keeps the GEMMs
  if (threadIdx.x == 0) cycles[blockIdx.x] = stop - start;
}

template <int N, bool kRegisterA, bool kMajorMNB, int kWarpgroups>
void run(const char* name) {
  auto kernel = rate_kernel<N, kRegisterA, kMajorMNB, kWarpgroups>;
  const int smem = (64 + 256) * kK * int(sizeof(Element));
  cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  int sms = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  long long* cycles;
  float* sink;
  cudaMalloc(&cycles, sms * sizeof(long long));
  cudaMalloc(&sink, 1024 * sizeof(float));
  kernel<<<sms, kWarpgroups * 128, smem>>>(cycles, sink);  // warm-up
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  cudaEventRecord(e0);
  kernel<<<sms, kWarpgroups * 128, smem>>>(cycles, sink);
  cudaEventRecord(e1);
  cudaError_t err = cudaEventSynchronize(e1);
  if (err != cudaSuccess) {
    std::printf("%s: %s\n", name, cudaGetErrorString(err));
    std::exit(1);
  }
  float ms = 0.f;
  cudaEventElapsedTime(&ms, e0, e1);
  std::vector<long long> host(sms);
  cudaMemcpy(host.data(), cycles, sms * sizeof(long long), cudaMemcpyDeviceToHost);
  double mean_cycles = 0;
  for (long long c : host) mean_cycles += double(c) / sms;
  const double flop_cta = 2.0 * 64 * N * kK * double(kIters) * kWarpgroups;
  std::printf("| %-28s | %2d | %7.0f FLOP/clk | %5.1f%% of 4096 | %6.1f TFLOP/s |\n", name, kWarpgroups,
              flop_cta / mean_cycles, 100.0 * flop_cta / mean_cycles / 4096, flop_cta * sms / (ms * 1e9));
  cudaFree(cycles);
  cudaFree(sink);
}

int main() {
  std::printf("| GEMM 64 x N x 256, fp16 | warpgroups | per SM | | |\n|---|---|---|---|---|\n");
  run<32, false, false, 2>("SS n32 (fa Sᵀ, dPᵀ at D 256)");
  run<40, false, false, 2>("SS n40 (FA3's D 256)");
  run<64, false, false, 2>("SS n64");
  run<128, false, false, 2>("SS n128");
  run<128, false, true, 2>("SS n128, A, B MN-major (dQ)");
  run<256, false, false, 2>("SS n256");
  run<32, true, false, 2>("RS n32");
  run<64, true, false, 2>("RS n64");
  run<128, true, true, 2>("RS n128, B MN-major");
  run<32, false, false, 3>("SS n32");
  run<64, false, false, 3>("SS n64");
  run<32, false, false, 1>("SS n32");
  run<64, false, false, 1>("SS n64");
  return 0;
}
