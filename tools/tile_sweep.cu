// Times alternative tile configurations of the Ampere-family kernels on one shape, so that the
// tile tables in cpp/sm80/fwd_launch.h and bwd_launch.h are chosen from measurements
// (docs/tried.md keeps what was chosen and why). A maintainer tool, not part of the package.
//
//   nvcc -std=c++17 -O3 --use_fast_math --expt-relaxed-constexpr -DNDEBUG --split-compile=0 \
//     -gencode=arch=compute_90a,code=sm_90a -Icpp -Icpp/include -I<cutlass>/include \
//     tools/tile_sweep.cu -o tile_sweep
//   ./tile_sweep B H S causal [D]   (fp16; head dims 64, 128 and 256, or only D)
//
// -DFA_SWEEP_FORWARD=0 or -DFA_SWEEP_BACKWARD=0 leaves a direction out, -DFA_SWEEP_HEAD_DIM=D
// compiles head dim D only (shorter compiles).
//
// The first configuration of each list is the one that ships (the tests check it against a
// float64 reference); every other one must reproduce its outputs, or its row says MISMATCH.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "sm80/bwd_launch.h"
#include "sm80/fwd_launch.h"

#ifndef FA_SWEEP_FORWARD
#define FA_SWEEP_FORWARD 1
#endif
#ifndef FA_SWEEP_BACKWARD
#define FA_SWEEP_BACKWARD 1
#endif
#ifndef FA_SWEEP_HEAD_DIM
#define FA_SWEEP_HEAD_DIM 0
#endif

namespace {

using Element = cutlass::half_t;

#define CHECK_CUDA(expr)                                                                    \
  do {                                                                                      \
    cudaError_t err_ = (expr);                                                              \
    if (err_ != cudaSuccess) {                                                              \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #expr, cudaGetErrorString(err_)); \
      std::exit(1);                                                                         \
    }                                                                                       \
  } while (0)

__global__ void fill_uniform(Element* x, int64_t n, uint32_t seed) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    uint32_t h = uint32_t(i) * 2654435761u ^ seed;
    h ^= h >> 16; h *= 0x7feb352du; h ^= h >> 15; h *= 0x846ca68bu; h ^= h >> 16;
    x[i] = Element((float(h) / 4294967296.f * 2.f - 1.f) * 1.7320508f);  // unit variance
  }
}

struct Buffers {
  int64_t q_elems, kv_elems;
  Element *q, *k, *v, *out, *dout, *dq, *dk, *dv;
  float *lse, *dq_accum, *delta;
};

template <class T>
T* device_alloc(int64_t n) {
  T* p = nullptr;
  CHECK_CUDA(cudaMalloc(&p, std::max<int64_t>(n, 1) * sizeof(T)));
  return p;
}

std::vector<float> to_host(const Element* p, int64_t n) {
  std::vector<Element> h(n);
  CHECK_CUDA(cudaMemcpy(h.data(), p, n * sizeof(Element), cudaMemcpyDeviceToHost));
  return std::vector<float>(h.begin(), h.end());
}

// max |a - ref| / max |ref|
double relative_difference(const std::vector<float>& a, const std::vector<float>& ref) {
  double diff = 0, scale = 1e-12;
  for (size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, double(std::fabs(a[i] - ref[i])));
    scale = std::max(scale, double(std::fabs(ref[i])));
  }
  return diff / scale;
}

template <class Fn>
float median_ms(Fn&& fn, int reps = 20) {
  for (int i = 0; i < 3; ++i) CHECK_CUDA(fn());
  std::vector<float> times;
  cudaEvent_t start, stop;
  CHECK_CUDA(cudaEventCreate(&start));
  CHECK_CUDA(cudaEventCreate(&stop));
  for (int i = 0; i < reps; ++i) {
    CHECK_CUDA(cudaEventRecord(start));
    CHECK_CUDA(fn());
    CHECK_CUDA(cudaEventRecord(stop));
    CHECK_CUDA(cudaEventSynchronize(stop));
    float ms = 0;
    CHECK_CUDA(cudaEventElapsedTime(&ms, start, stop));
    times.push_back(ms);
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

template <class Config>
std::string name_of(const char* kind) {
  char buf[96];
  std::snprintf(buf, sizeof(buf), "%s d%d %dx%d w%d", kind, Config::kHeadDim, Config::kBlockM, Config::kBlockN,
                Config::kWarps);
  return buf;
}

// The backward's variants: warp layouts, dO stages and how dQ is reduced.
template <class Config>
std::string backward_name(bool causal) {
  using fa::sm80::DqReduce;
  char buf[128];
  std::snprintf(buf, sizeof(buf), "%s (%d,%d,%d) dO%d %s", name_of<Config>(causal ? "bwd causal" : "bwd").c_str(),
                Config::kWarpsMSdP, Config::kWarpsNdKV, Config::kWarpsMdQ, Config::kdOStages,
                Config::kDqReduce == DqReduce::kBulk    ? "dQ bulk"
                : Config::kDqReduce == DqReduce::kPairs ? "dQ pairs"
                : Config::kDqReduce == DqReduce::kScalar ? "dQ scalar"
                                                         : "no dQ (timing only)");
  return buf;
}

template <class Kernel>
void report(const std::string& name, float ms, double flops, Kernel kernel, double diff) {
  cudaFuncAttributes attr{};
  CHECK_CUDA(cudaFuncGetAttributes(&attr, kernel));
  std::printf("%-34s %9.3f ms %6.0f TFLOP/s  regs %3d  spill %4zu B  smem %3d KB  diff %.1e%s\n", name.c_str(), ms,
              flops / (ms * 1e-3) / 1e12, attr.numRegs, attr.localSizeBytes,
              int(attr.maxDynamicSharedSizeBytes / 1024), diff, diff > 2e-2 ? "  MISMATCH" : "");
}

template <bool kCausal, class Config, class... Rest>
void sweep_forward(fa::ForwardParams p, const Buffers& b, double flops, std::vector<float>* ref) {
  const float ms = median_ms([&] { return fa::sm80::launch_forward<Config, kCausal, false>(p, nullptr); });
  CHECK_CUDA(cudaDeviceSynchronize());
  auto out = to_host(b.out, b.q_elems);
  if (ref->empty()) *ref = out;
  report(name_of<Config>(kCausal ? "fwd causal" : "fwd") + " s" + std::to_string(Config::kStages), ms, flops,
         fa::sm80::forward_kernel<Config, kCausal>, relative_difference(out, *ref));
  if constexpr (sizeof...(Rest) > 0) sweep_forward<kCausal, Rest...>(p, b, flops, ref);
}

template <bool kCausal, class Config, class... Rest>
void sweep_backward(fa::BackwardParams p, const Buffers& b, double flops, std::vector<float>* ref) {
  p.head_dim_rounded = Config::kHeadDim;
  const float ms = median_ms([&] { return fa::sm80::launch_backward<Config, kCausal, false>(p, nullptr); });
  CHECK_CUDA(cudaDeviceSynchronize());
  std::vector<float> grads;
  for (auto [ptr, n] : {std::pair{b.dq, b.q_elems}, std::pair{b.dk, b.kv_elems}, std::pair{b.dv, b.kv_elems}}) {
    auto g = to_host(ptr, n);
    grads.insert(grads.end(), g.begin(), g.end());
  }
  if (ref->empty()) *ref = grads;
  // Without dQ only dK and dV can be compared.
  const size_t compared = Config::kDqReduce == fa::sm80::DqReduce::kSkip ? size_t(b.q_elems) : 0;
  report(backward_name<Config>(kCausal), ms, flops, fa::sm80::backward_kernel<Config, kCausal>,
         relative_difference(std::vector<float>(grads.begin() + compared, grads.end()),
                             std::vector<float>(ref->begin() + compared, ref->end())));
  if constexpr (sizeof...(Rest) > 0) sweep_backward<kCausal, Rest...>(p, b, flops, ref);
}

template <int D> using Fwd = fa::sm80::ForwardConfigFor<Element, D>;
template <int D> using Bwd = fa::sm80::BackwardConfigFor<Element, D>;
template <int D, int M, int N, int W, int kStages = 1>
using FwdAlt = fa::sm80::ForwardConfig<Element, D, M, N, W, kStages>;
template <int D, int M, int N, int W, int A, int B, int C, int kdOStages = 2,
          fa::sm80::DqReduce kReduce = fa::sm80::DqReduce::kBulk>
using BwdAlt = fa::sm80::BackwardConfig<Element, D, M, N, W, A, B, C, kdOStages, kReduce>;
using fa::sm80::DqReduce;

template <int D, bool kCausal>
void run(int batch, int heads, int seqlen) {
  Buffers b{};
  b.q_elems = b.kv_elems = int64_t(batch) * heads * seqlen * D;
  for (Element** p : {&b.q, &b.k, &b.v, &b.out, &b.dout, &b.dq, &b.dk, &b.dv}) *p = device_alloc<Element>(b.q_elems);
  const int rows = (seqlen + 127) / 128 * 128;
  b.lse = device_alloc<float>(int64_t(batch) * heads * seqlen);
  b.delta = device_alloc<float>(int64_t(batch) * heads * rows);
  b.dq_accum = device_alloc<float>(int64_t(batch) * heads * rows * D);
  uint32_t seed = 1;
  for (Element* p : {b.q, b.k, b.v, b.dout}) fill_uniform<<<1024, 256>>>(p, b.q_elems, seed++);

  fa::BackwardParams p;
  p.q = b.q; p.k = b.k; p.v = b.v; p.out = b.out; p.lse = b.lse; p.dout = b.dout;
  p.dq = b.dq; p.dk = b.dk; p.dv = b.dv; p.dq_accum = b.dq_accum; p.delta = b.delta;
  const fa::Strides s{int64_t(heads) * seqlen * D, int64_t(seqlen) * D, D};
  p.q_stride = p.k_stride = p.v_stride = p.out_stride = s;
  p.dout_stride = p.dq_stride = p.dk_stride = p.dv_stride = s;
  p.lse_batch_stride = int64_t(heads) * seqlen;
  p.lse_head_stride = seqlen;
  p.batch = batch; p.heads_q = p.heads_kv = heads; p.seqlen_q = p.seqlen_k = seqlen; p.head_dim = D;
  p.scale = 1.f / std::sqrt(float(D));
  p.scale_log2 = p.scale * float(M_LOG2E);
  p.seqlen_q_rounded = rows;

  const double flops = 4.0 * batch * heads * double(seqlen) * seqlen * D / (kCausal ? 2 : 1);
  std::printf("\n(B, H, S, D) = (%d, %d, %d, %d) fp16 causal=%d\n", batch, heads, seqlen, D, int(kCausal));
  std::vector<float> fwd_ref, bwd_ref;
  // The backward reads the shipped forward's out and lse.
  if constexpr (D == 256) {
    if (FA_SWEEP_FORWARD) {
      sweep_forward<kCausal, Fwd<256>, FwdAlt<256, 128, 64, 8, 2>>(p, b, flops, &fwd_ref);
    }
    fa::sm80::launch_forward<Fwd<256>, kCausal, false>(p, nullptr);
    if (FA_SWEEP_BACKWARD) {
      sweep_backward<kCausal, Bwd<256>, BwdAlt<256, 64, 64, 8, 4, 2, 2, 2, DqReduce::kPairs>>(p, b, 2.5 * flops,
                                                                                             &bwd_ref);
    }
  } else if constexpr (D == 128) {
    if (FA_SWEEP_FORWARD) {
      sweep_forward<kCausal, Fwd<128>, FwdAlt<128, 128, 32, 4, 1>, FwdAlt<128, 128, 64, 4>,
                    FwdAlt<128, 64, 64, 4, 2>>(p, b, flops, &fwd_ref);
    }
    fa::sm80::launch_forward<Fwd<128>, kCausal, false>(p, nullptr);
    if (FA_SWEEP_BACKWARD) {
      sweep_backward<kCausal, Bwd<128>, BwdAlt<128, 64, 128, 8, 2, 4, 2, 1>,
                     BwdAlt<128, 64, 128, 8, 2, 4, 2, 2, DqReduce::kPairs>,
                     BwdAlt<128, 64, 128, 8, 2, 4, 2, 2, DqReduce::kSkip>, BwdAlt<128, 64, 128, 8, 2, 4, 4>>(
          p, b, 2.5 * flops, &bwd_ref);
    }
  } else {
    if (FA_SWEEP_FORWARD) {
      sweep_forward<kCausal, Fwd<64>, FwdAlt<64, 128, 64, 4, 2>, FwdAlt<64, 128, 128, 4>>(
          p, b, flops, &fwd_ref);
    }
    fa::sm80::launch_forward<Fwd<64>, kCausal, false>(p, nullptr);
    if (FA_SWEEP_BACKWARD) {
      sweep_backward<kCausal, Bwd<64>, BwdAlt<64, 128, 128, 8, 4, 4, 4, 1>,
                     BwdAlt<64, 128, 128, 8, 4, 4, 4, 2, DqReduce::kPairs>,
                     BwdAlt<64, 128, 128, 8, 4, 4, 4, 2, DqReduce::kSkip>>(p, b, 2.5 * flops, &bwd_ref);
    }
  }
  for (void* ptr : {(void*)b.q, (void*)b.k, (void*)b.v, (void*)b.out, (void*)b.dout, (void*)b.dq, (void*)b.dk,
                    (void*)b.dv, (void*)b.lse, (void*)b.delta, (void*)b.dq_accum}) {
    CHECK_CUDA(cudaFree(ptr));
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 5 && argc != 6) {
    std::fprintf(stderr, "usage: %s B H S causal(0|1) [D]   (fp16; head dims 64, 128 and 256, or only D)\n", argv[0]);
    return 2;
  }
  const int batch = std::atoi(argv[1]), heads = std::atoi(argv[2]), seqlen = std::atoi(argv[3]);
  const bool causal = std::atoi(argv[4]) != 0;
  const int only = argc == 6 ? std::atoi(argv[5]) : 0;
  for (int d : {128, 64, 256}) {
    if (only != 0 && d != only) continue;
    if constexpr (FA_SWEEP_HEAD_DIM == 0 || FA_SWEEP_HEAD_DIM == 128) {
      if (d == 128) causal ? run<128, true>(batch, heads, seqlen) : run<128, false>(batch, heads, seqlen);
    }
    if constexpr (FA_SWEEP_HEAD_DIM == 0 || FA_SWEEP_HEAD_DIM == 64) {
      if (d == 64) causal ? run<64, true>(batch, heads, seqlen) : run<64, false>(batch, heads, seqlen);
    }
    if constexpr (FA_SWEEP_HEAD_DIM == 0 || FA_SWEEP_HEAD_DIM == 256) {
      if (d == 256) causal ? run<256, true>(batch, heads, seqlen) : run<256, false>(batch, heads, seqlen);
    }
  }
  return 0;
}
