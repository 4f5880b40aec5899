// Does setmaxnreg work in a CTA that is not whole warpgroups? (benchmarks/NOTES.md, session 61)
//
// Warps 0-7 (two whole warpgroups) raise their registers to CINC with setmaxnreg.inc; the warps
// from 8 on lower theirs to PDEC (PDEC = 0: no setmaxnreg there). Each thread then computes a
// register-heavy result that main() checks on the host. Built for sm_90a, e.g.
//   nvcc -gencode arch=compute_90a,code=sm_90a -O3 -DNT=288 -DCINC=248 -DPDEC=64 setmaxnreg_probe.cu
//   nvcc ... -DNT=288 -DCINC=248 -DPDEC=0 "-DLB=__maxnreg__(64)" setmaxnreg_probe.cu
//   nvcc ... -DNT=384 -DCINC=240 -DPDEC=24 setmaxnreg_probe.cu     (the control: a whole 4th warpgroup)
// On the H200 (CUDA 13.0 driver of the device machine) every 288-thread form hung (248/64, 240/64,
// 232/64, 248/56, and without a dec at 248 with __maxnreg__(64) and at 232), the 384-thread
// control printed "no error, mismatches: 0".
#include <cstdio>
#include <cuda_runtime.h>
#ifndef NT
#define NT 288
#endif
#ifndef LB
#define LB __launch_bounds__(NT, 1)
#endif
template <int N> __device__ void reg_inc() { asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N)); }
template <int N> __device__ void reg_dec() { asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N)); }
__global__ void LB probe(float* out, int iters) {
  int warp = threadIdx.x / 32;
  if (warp >= 8) {
#if PDEC > 0
    reg_dec<PDEC>();
#endif
    float a = threadIdx.x;
    for (int i = 0; i < iters; ++i) a = a * 0.999f + 1.f;
    out[blockIdx.x * NT + threadIdx.x] = a;
    return;
  }
  reg_inc<CINC>();
  // Keep many values live so the consumer code uses lots of registers.
  float v[200];
#pragma unroll
  for (int j = 0; j < 200; ++j) v[j] = threadIdx.x * 0.01f + j;
  for (int i = 0; i < iters; ++i) {
#pragma unroll
    for (int j = 0; j < 200; ++j) v[j] = v[j] * 0.999f + v[(j + 1) % 200] * 0.001f;
  }
  float s = 0.f;
#pragma unroll
  for (int j = 0; j < 200; ++j) s += v[j];
  out[blockIdx.x * NT + threadIdx.x] = s;
}
int main() {
  const int blocks = 132 * 4, iters = 1000;
  float* d; cudaMalloc(&d, blocks * NT * 4);
  probe<<<blocks, NT>>>(d, iters);
  cudaError_t e = cudaDeviceSynchronize();
  printf("probe: %s\n", cudaGetErrorString(e));
  float* h = new float[blocks * NT];
  cudaMemcpy(h, d, blocks * NT * 4, cudaMemcpyDeviceToHost);
  // reference on the host for block 0
  int bad = 0;
  for (int t = 0; t < NT; ++t) {
    double ref;
    if (t / 32 >= 8) { float a = t; for (int i = 0; i < iters; ++i) a = a * 0.999f + 1.f; ref = a; }
    else {
      float v[200]; for (int j = 0; j < 200; ++j) v[j] = t * 0.01f + j;
      for (int i = 0; i < iters; ++i) for (int j = 0; j < 200; ++j) v[j] = v[j] * 0.999f + v[(j + 1) % 200] * 0.001f;
      float s = 0; for (int j = 0; j < 200; ++j) s += v[j]; ref = s;
    }
    for (int b = 0; b < blocks; ++b) if (fabs(h[b * NT + t] - ref) > 1e-3 * fabs(ref) + 1e-3) { if (bad < 5) printf("bad b%d t%d %f %f\n", b, t, h[b*NT+t], ref); ++bad; }
  }
  printf("mismatches: %d\n", bad);
  return 0;
}
