// Counts shared-memory bank conflicts of every shared-memory access pattern of the Ampere-family
// kernels, on the host (no GPU): the CuTe partitions the kernels use are evaluated on offset
// tensors, and each warp instruction's addresses are grouped the way the hardware serves them.
//
//   ldmatrix (.x4, .trans or not): 4 phases of 8 threads, each thread names one 16-byte row; a
//     phase is one wavefront when its 8 rows fall in 8 different 16-byte bank groups.
//   32-bit stores (the backward's P and dS tiles): one wavefront when the 32 threads hit 32
//     different banks (or the same word).
//   64-bit stores (the backward's staged fp32 dQ tile, the decode kernel's merge): two phases of 16 threads, each one
//     wavefront when its 16 threads' 8-byte words cover distinct bank pairs.
//
// Prints, per pattern, the wavefronts a warp instruction needs beyond the minimum, and exits 1
// if any pattern has some. A plain row-major tile (no swizzle) is checked too, as a control that
// must show conflicts. Built and run by tests/test_smem_layouts.py.
#include <cstdio>
#include <map>
#include <set>
#include <string>

#include <cute/tensor.hpp>

#include "sm80/bwd_config.h"
#include "sm80/kvcache_launch.h"  // the forward's and the KV cache's configs
#include "sm80/bwd_launch.h"

using namespace cute;

namespace {

int failures = 0;

// Extra wavefronts of one warp instruction. offsets[t]: the element offset thread t accesses
// (a 16-byte row for ldmatrix, a 32-bit word for stores); bytes_per_element: 2.
int extra_wavefronts_ldmatrix(const int* offsets) {
  int extra = 0;
  for (int phase = 0; phase < 4; ++phase) {
    std::map<int, std::set<int>> units;  // bank group -> distinct 16-byte units
    for (int t = phase * 8; t < phase * 8 + 8; ++t) {
      const int unit = offsets[t] * 2 / 16;
      units[unit % 8].insert(unit);
    }
    int worst = 0;
    for (auto& [group, u] : units) worst = std::max<int>(worst, int(u.size()));
    extra += worst - 1;
  }
  return extra;
}

int extra_wavefronts_words(const int* offsets) {
  std::map<int, std::set<int>> words;  // bank -> distinct 4-byte words
  for (int t = 0; t < 32; ++t) {
    const int word = offsets[t] * 2 / 4;
    words[word % 32].insert(word);
  }
  int worst = 0;
  for (auto& [bank, w] : words) worst = std::max<int>(worst, int(w.size()));
  return worst - 1;
}

int extra_wavefronts_dwords(const int* byte_offsets) {
  int extra = 0;
  for (int phase = 0; phase < 2; ++phase) {
    std::map<int, std::set<int>> words;  // bank -> distinct 8-byte words touching it
    for (int t = phase * 16; t < phase * 16 + 16; ++t) {
      const int word = byte_offsets[t] / 8;
      for (int b = 0; b < 2; ++b) words[(byte_offsets[t] / 4 + b) % 32].insert(word);
    }
    int worst = 0;
    for (auto& [bank, w] : words) worst = std::max<int>(worst, int(w.size()));
    extra += worst - 1;
  }
  return extra;
}

// tensor_of(thread) is that thread's partition (CPY, rest...) of an offset tensor: mode 0 the
// elements of one access, the rest one access each. Sums extra wavefronts over warp 0's
// instructions (every warp's pattern is a translate of it for these layouts).
template <class PartitionOf>
int count(PartitionOf&& tensor_of, bool ldmatrix) {
  const int accesses = int(size<1>(tensor_of(0)));
  int extra = 0;
  for (int a = 0; a < accesses; ++a) {
    int offsets[32];
    for (int t = 0; t < 32; ++t) offsets[t] = int(tensor_of(t)(0, a));  // the access's first element
    extra += ldmatrix ? extra_wavefronts_ldmatrix(offsets) : extra_wavefronts_words(offsets);
  }
  return extra;
}

void report(const std::string& name, int extra, int instructions) {
  std::printf("%-58s %5d extra wavefronts over %4d warp instructions%s\n", name.c_str(), extra, instructions,
              extra ? "  CONFLICTS" : "");
  if (extra) ++failures;
}

// (CPY, rest...) -> (CPY, accesses)
template <class T>
auto flat(T const& t) {
  return group_modes<1, decltype(rank(t))::value>(t);
}

// The offsets tensor of a shared-memory layout: element offsets, as the kernel's pointers would be.
template <class Layout>
auto offsets_of(Layout layout) {
  return make_tensor(counting_iterator<int>{0}, layout);
}

template <class E>
using LdsmN = Copy_Atom<SM75_U32x4_LDSM_N, E>;
template <class E>
using LdsmT = Copy_Atom<SM75_U16x8_LDSM_T, E>;

// The ldmatrix reads of one operand: a tiled copy (make_tiled_copy_A/B) over a shared-memory layout.
template <class TiledCopy, class SmemLayout>
void check_ldmatrix(const std::string& name, TiledCopy copy, SmemLayout layout) {
  auto s = offsets_of(layout);
  auto part = [&](int t) { return flat(copy.get_thread_slice(t).partition_S(s)); };
  report(name, count(part, true), int(size<1>(part(0))));
}

// A and B operands of one GEMM of a tiled MMA, both through ldmatrix.
template <class TiledMma, class AtomA, class AtomB, class LayoutA, class LayoutB>
void check_gemm(const std::string& name, TiledMma mma, AtomA, AtomB, LayoutA la, LayoutB lb) {
  check_ldmatrix(name + " A", make_tiled_copy_A(AtomA{}, mma), la);
  check_ldmatrix(name + " B", make_tiled_copy_B(AtomB{}, mma), lb);
}

template <class TiledMma, class Atom, class LayoutC>
void check_store(const std::string& name, TiledMma mma, Atom, LayoutC lc) {
  auto copy_c = make_tiled_copy_C(Atom{}, mma);
  auto sc = offsets_of(lc);
  auto part = [&](int t) { auto p = copy_c.get_thread_slice(t).partition_D(sc); return flat(p); };
  report(name, count(part, false), int(size<1>(part(0))));
}

// The staged dQ tile (kBulk): thread t stores (acc(i), acc(i + 1)) as one 64-bit word at the
// workspace position of its (row, col), as the kernel does.
template <class C>
int check_dq_staging() {
  auto mma = typename C::TiledMmadQ{};
  auto coords = [&](int t) {
    return mma.get_thread_slice(t).partition_C(make_identity_tensor(Shape<Int<C::kBlockM>, Int<C::kHeadDim>>{}));
  };
  int extra = 0;
  for (int i = 0; i < size(coords(0)); i += 2) {
    int bytes[32];
    for (int t = 0; t < 32; ++t) {
      const int r = get<0>(coords(t)(i)), c = get<1>(coords(t)(i));
      bytes[t] = (r * C::kHeadDim + fa::dq_workspace_col<C::kHeadDim, true>(r, c)) * 4;
    }
    extra += extra_wavefronts_dwords(bytes);
  }
  return extra;
}

template <class C>
void check_backward(const char* tag) {
  using LdsmN = ::LdsmN<typename C::Element>;
  using LdsmT = ::LdsmT<typename C::Element>;
  const std::string n = std::string("bwd ") + tag + " ";
  check_gemm(n + "S = Q K^T", typename C::TiledMmaSdP{}, LdsmN{}, LdsmN{}, typename C::SmemLayoutQ{}, typename C::SmemLayoutKV{});
  check_gemm(n + "dP = dO V^T", typename C::TiledMmaSdP{}, LdsmN{}, LdsmN{}, typename C::SmemLayoutQ{}, typename C::SmemLayoutKV{});
  check_gemm(n + "dV += P^T dO", typename C::TiledMmadKV{}, LdsmT{}, LdsmT{}, typename C::SmemLayoutPdSt{}, typename C::SmemLayoutQt{});
  check_gemm(n + "dK += dS^T Q", typename C::TiledMmadKV{}, LdsmT{}, LdsmT{}, typename C::SmemLayoutPdSt{}, typename C::SmemLayoutQt{});
  check_gemm(n + "dQ = dS K", typename C::TiledMmadQ{}, LdsmN{}, LdsmT{}, typename C::SmemLayoutPdS{}, typename C::SmemLayoutKVt{});
  check_store(n + "P, dS stores", typename C::TiledMmaSdP{}, typename C::SmemCopyAtomStore{}, typename C::SmemLayoutPdS{});
  if constexpr (C::kDqReduce == fa::sm80::DqReduce::kBulk) {
    report(n + "dQ staging stores", check_dq_staging<C>(), int(size(partition_fragment_C(typename C::TiledMmadQ{}, Shape<Int<C::kBlockM>, Int<C::kHeadDim>>{})) / 2));
  }
}

template <class C>
void check_forward(const char* tag) {
  using E = typename C::Element;
  const std::string n = std::string("fwd ") + tag + " ";
  check_gemm(n + "S = Q K^T", typename C::TiledMma{}, LdsmN<E>{}, LdsmN<E>{}, typename C::SmemLayoutQ{},
             typename C::SmemLayoutKV{});
  check_ldmatrix(n + "O += P V: V", make_tiled_copy_B(LdsmT<E>{}, typename C::TiledMma{}), typename C::SmemLayoutVt{});
}

// The key-splitting decode kernel (decode_kernel.h): its one-warp MMA's ldmatrix reads of Q, of a
// warp's K slice and of its V slice, and the merge's 8-byte stores of each warp's fp32 output (row
// stride kMergeStride floats), as the kernel writes them.
template <class C>
void check_decode(const char* tag) {
  check_forward<C>(tag);
  auto mma = typename C::TiledMma{};
  auto coords = [&](int t) {
    return mma.get_thread_slice(t).partition_C(make_identity_tensor(Shape<Int<C::kRows>, Int<C::kHeadDim>>{}));
  };
  int extra = 0, instructions = 0;
  for (int i = 0; i < size(coords(0)); i += 2, ++instructions) {
    int bytes[32];
    for (int t = 0; t < 32; ++t) bytes[t] = (get<0>(coords(t)(i)) * C::kMergeStride + get<1>(coords(t)(i))) * 4;
    extra += extra_wavefronts_dwords(bytes);
  }
  report(std::string("fwd ") + tag + " merge stores", extra, instructions);
}

}  // namespace

int main() {
  using half = cutlass::half_t;
  {  // control: without the swizzle, ldmatrix on 128-byte rows is an 8-way conflict
    using C = fa::sm80::ForwardConfigFor<half, 64>;
    auto copy_a = make_tiled_copy_A(LdsmN<half>{}, typename C::TiledMma{});
    auto plain = offsets_of(Layout<Shape<Int<C::kBlockM>, Int<64>>, Stride<Int<64>, _1>>{});
    auto part = [&](int t) { return flat(copy_a.get_thread_slice(t).partition_S(plain)); };
    const int extra = count(part, true);
    std::printf("%-58s %5d extra wavefronts (must be > 0)\n", "control: unswizzled 64-column tile, ldmatrix", extra);
    if (extra == 0) ++failures;
  }
  check_forward<fa::sm80::ForwardConfigFor<half, 64>>("d64");
  check_forward<fa::sm80::ForwardConfigFor<half, 128>>("d128");
  check_forward<fa::sm80::ForwardConfigFor<half, 256>>("d256");
  check_decode<fa::sm80::DecodeConfigFor<half, 64, 16>>("decode d64");
  check_decode<fa::sm80::DecodeConfigFor<half, 128, 16>>("decode d128");
  check_decode<fa::sm80::DecodeConfigFor<half, 256, 16>>("decode d256");
  check_decode<fa::sm80::DecodeConfigFor<half, 64, 32>>("decode d64 32 rows");
  check_decode<fa::sm80::DecodeConfigFor<half, 128, 32>>("decode d128 32 rows");
  check_backward<fa::sm80::BackwardConfigFor<half, 32>>("d32");
  check_backward<fa::sm80::BackwardConfigFor<half, 64>>("d64");
  check_backward<fa::sm80::BackwardConfigFor<half, 96>>("d96");
  check_backward<fa::sm80::BackwardConfigFor<half, 128>>("d128");
  check_backward<fa::sm80::BackwardConfigFor<half, 256>>("d256");
  std::printf("%s\n", failures ? "bank conflicts found" : "no bank conflicts");
  return failures ? 1 : 0;
}
