// The CUDA implementations of the fa ops: argument checks, output allocation, the choice of a
// kernel (family, dtype, head dim, causal) for the device, and the launch on the current stream.
// Built into its own library (_C_cuda.so), the only one that imports from torch's CUDA library
// (libtorch_cuda: the current stream), so the CPU library loads under any torch.
#include <algorithm>
#include <charconv>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include <cuda_runtime_api.h>
#include <torch/csrc/inductor/aoti_torch/c/shim.h>  // aoti_torch_get_current_cuda_stream (USE_CUDA)
#include <torch/csrc/stable/accelerator.h>

#include "checks.h"
#include "fa/build_config.h"
#include "fa/kernels.h"
#include "fa/per_device.h"
#include "outputs.h"

namespace fa::torch_binding {
namespace {

constexpr int64_t kMaxGridYZ = 65535;  // heads and batch index gridDim.y and .z

void check_cuda(cudaError_t err, const char* op) {
  FA_CHECK(err == cudaSuccess, op, ": CUDA error: ", cudaGetErrorString(err));
}

// The device's compute capability as one number: 80, 86, 90 (asked of the runtime once per device).
int device_capability(const Tensor& t, const char* op) {
  const int capability = fa::device_capability(t.get_device_index());
  FA_CHECK(capability != 0, op, ": the CUDA runtime could not say the compute capability of ", device_name(t));
  return capability;
}

// torch's current stream on the tensor's device: the kernels run on it (CUDA graphs capture them).
cudaStream_t current_stream(const Tensor& t) {
  void* stream = nullptr;
  TORCH_ERROR_CODE_CHECK(aoti_torch_get_current_cuda_stream(t.get_device_index(), &stream));
  return static_cast<cudaStream_t>(stream);
}

// Whether SASS compiled for `build_arch` (80, 86, 90a) runs on a device of compute capability
// `device` (86 for 8.6; the gencode flags embed no PTX): plain SASS on the same major version with
// an equal or newer minor, an `a` arch's only on exactly that compute capability (fa/_info.py's
// arch_runs_on).
bool arch_runs_on(std::string_view build_arch, int device) {
  int built = 0;
  std::from_chars(build_arch.data(), build_arch.data() + build_arch.size(), built);  // stops at the `a`
  const bool specific = !build_arch.empty() && build_arch.back() == 'a';
  return specific ? built == device : built / 10 == device / 10 && built % 10 <= device % 10;
}

// The GPU must be sm80 or newer (cp.async, bf16 mma.sync), and one of the build's archs must run on
// it, so that every op fails alike, before any work, on a device the build has no kernels for.
// Returns its arch name: 80, 86, 90a (Hopper is built as 90a).
std::string check_device(const Tensor& t, const char* op) {
  const int device = device_capability(t, op);
  const std::string arch = std::to_string(device) + (device == 90 ? "a" : "");
  FA_CHECK(device >= 80, op, ": fa's CUDA kernels need compute capability 8.0 or newer ",
           "(cp.async, bf16 mma.sync); ", device_name(t), " is sm_", arch);
  bool runs = false;  // the build's archs, "80,90a": views of a constant, nothing allocated a call
  const std::string_view archs = build_config::kCudaArchs;
  for (std::size_t begin = 0; begin < archs.size();) {
    const std::size_t end = std::min(archs.find(',', begin), archs.size());
    runs = runs || arch_runs_on(archs.substr(begin, end - begin), device);
    begin = end + 1;
  }
  FA_CHECK(runs, op, ": this build of fa has kernels for sm ", build_config::kCudaArchs, " but ", device_name(t),
           " is sm_", arch, "; rebuild with -C cmake.define.FA_CUDA_ARCHS=", arch);
  return arch;
}

// The kernels read and write 16-byte vectors, so every row must start 16-byte aligned: the data
// pointer and the batch, head and row strides in multiples of 8 elements (16 of one byte: an FP8
// cache). A view that is not (an odd storage offset, say) is copied; outputs are allocated aligned.
Tensor aligned_for_kernels(const Tensor& t) {
  const int64_t vector = t.scalar_type() == ScalarType::Float8_e4m3fn ? 16 : 8;
  bool aligned = reinterpret_cast<std::uintptr_t>(t.data_ptr()) % 16 == 0;
  for (int d = 0; d + 1 < t.dim(); ++d) aligned = aligned && (t.size(d) <= 1 || t.stride(d) % vector == 0);
  return aligned ? t : contiguous_copy(t);
}

// A (B, H, S, D) tensor's strides, or a packed (total, H, D) one's (batch stride 0: each sequence's
// rows are found through cu_seqlens).
Strides strides_of(const Tensor& t) {
  if (t.dim() == 3) return {0, t.stride(1), t.stride(0)};
  return {t.stride(0), t.stride(1), t.stride(2)};
}


// What a packed (varlen) batch adds to the params; cu_seqlens as dense_last_dim gives them.
void set_packed_batch(ForwardParams& p, const Tensor& cu_seqlens_q, const Tensor& cu_seqlens_k,
                      const VarlenShape& s) {
  p.cu_seqlens_q = static_cast<const int*>(cu_seqlens_q.data_ptr());
  p.cu_seqlens_k = static_cast<const int*>(cu_seqlens_k.data_ptr());
  p.total_q = static_cast<int>(s.total_q);
  p.total_k = static_cast<int>(s.total_k);
}

// The kernel families, and which one serves a forward call.
enum class Family { kSm80, kSm90 };

// kKvCache: the KV-cache kernels (the Ampere family's, at every head dim of FA_HEAD_DIMS).
enum class Direction { kForward, kBackward, kKvCache };

// The smallest head dim >= head_dim of a build_config list (0: none), and the list as text
// (" 64 128 256", or " (none)").
template <std::size_t N>
int smallest_at_least(const int (&head_dims)[N], int64_t head_dim) {
  int best = 0;
  for (int d : head_dims) {
    if (d != 0 && d >= head_dim && (best == 0 || d < best)) best = d;
  }
  return best;
}

template <std::size_t N>
std::string head_dims_text(const int (&head_dims)[N]) {
  std::string text;
  for (int d : head_dims) text += d != 0 ? " " + str_of(int64_t(d)) : "";
  return text.empty() ? " (none)" : text;
}

// The same for a list of pairs (D, Dv, D, Dv, ..., 0): the smallest pair D'/Dv' with D' >= D and
// Dv' >= Dv ({0, 0}: none; its tiles zero-fill the columns past D and Dv), and the list as text.
struct HeadDimPair {
  int head_dim = 0, head_dim_v = 0;
};
template <std::size_t N>
HeadDimPair smallest_pair_at_least(const int (&pairs)[N], int64_t head_dim, int64_t head_dim_v) {
  HeadDimPair best;
  for (std::size_t i = 0; pairs[i] != 0; i += 2) {
    const int d = pairs[i], dv = pairs[i + 1];
    if (d >= head_dim && dv >= head_dim_v &&
        (best.head_dim == 0 || d < best.head_dim || (d == best.head_dim && dv < best.head_dim_v))) {
      best = {d, dv};
    }
  }
  return best;
}
template <std::size_t N>
std::string head_dim_pairs_text(const int (&pairs)[N]) {
  std::string text;
  for (std::size_t i = 0; pairs[i] != 0; i += 2) {
    text += " " + str_of(int64_t(pairs[i])) + "/" + str_of(int64_t(pairs[i + 1]));
  }
  return text.empty() ? " (none)" : text;
}

// The smallest head dim >= head_dim that `family` has kernels for in `direction` (0: none), with
// soft-capping where `softcap` (forward and backward alike). Its tiles zero-fill the columns past D.
int family_head_dim(Family family, int64_t head_dim, Direction direction = Direction::kForward,
                    bool softcap = false) {
  using namespace build_config;
  if (softcap) {
    return family == Family::kSm80 ? smallest_at_least(kSm80SoftcapHeadDims, head_dim)
                                   : smallest_at_least(kSm90SoftcapHeadDims, head_dim);
  }
  if (family == Family::kSm80) {
    return direction == Direction::kKvCache ? smallest_at_least(kHeadDims, head_dim)
                                            : smallest_at_least(kSm80HeadDims, head_dim);
  }
  return direction == Direction::kForward ? smallest_at_least(kSm90HeadDims, head_dim)
                                          : smallest_at_least(kSm90BackwardHeadDims, head_dim);
}

// The kernel head dim of an FP8 call (`what`: its FP8 tensors) from the build's list `head_dims`
// (the CMake option `option`): the smallest holding head_dim, a multiple of 16 (whole 16-byte
// vectors of bytes); a clear error where none does.
template <std::size_t N>
int fp8_kernel_head_dim(const int (&head_dims)[N], int64_t head_dim, const char* what, const char* option,
                        const char* op) {
  FA_CHECK(head_dim % 16 == 0, op, ": with ", what, " on CUDA, head_dim must be a multiple of 16, got ",
           str_of(head_dim));
  const int best = smallest_at_least(head_dims, head_dim);
  FA_CHECK(best != 0, op, ": ", what, " at head_dim ", str_of(head_dim),
           " need a kernel for a head dim >= it; this build has them for head dims", head_dims_text(head_dims), " (",
           option, ")");
  return best;
}

// No kernel of this build holds head_dim (FA_HEAD_DIMS lists fewer than the binding admits).
[[noreturn]] void fail_head_dim(int64_t head_dim, const char* op) {
  fail(op, ": head_dim ", str_of(head_dim), " needs a kernel for a head dim >= ", str_of(head_dim),
       "; this build has head dims", head_dims_text(build_config::kHeadDims), " (FA_HEAD_DIMS)");
}

// The Ampere family's forward or backward head dim for a call; the binding's checks admit any head
// dim up to 256, so this fails only for a build with fewer head dims (FA_HEAD_DIMS), or a build for
// 90a alone (check_device: then the device is sm_90a), where the Hopper family serves those calls
// and the Ampere family's kernels for them are built only with FA_SM80_ON_HOPPER.
int kernel_head_dim(int64_t head_dim, Direction direction, const char* op) {
  const int best = family_head_dim(Family::kSm80, head_dim, direction);
  if (best == 0 && smallest_at_least(build_config::kHeadDims, head_dim) != 0) {
    fail(op, ": FA_KERNEL_FAMILY=sm80 at head_dim ", str_of(head_dim), ", but this build for 90a alone has",
         " the Ampere family's forward and backward kernels for head dims", head_dims_text(build_config::kSm80HeadDims),
         " only: the Hopper family serves the others (FA_SM80_ON_HOPPER=ON builds them)");
  }
  if (best == 0) fail_head_dim(head_dim, op);
  return best;
}

// The KV-cache kernels' head dim (the Ampere family's, at every head dim of FA_HEAD_DIMS).
int kvcache_head_dim(int64_t head_dim, const char* op) {
  const int best = family_head_dim(Family::kSm80, head_dim, Direction::kKvCache);
  if (best == 0) fail_head_dim(head_dim, op);
  return best;
}

// The kernels that serve a call: a family, its kernel head dim, whether they soft-cap, and v's
// kernel head dim where it is apart from q's and k's (the Hopper forward's FA_HEAD_DIM_PAIRS; else 0).
struct Kernels {
  Family family;
  int head_dim;
  bool softcap = false;
  int head_dim_v = 0;
};

// The Ampere family's soft-capping kernel for a call, or a clear error where this build has none
// (FA_SOFTCAP_HEAD_DIMS; the Ampere family's are built only for archs besides 90a).
Kernels sm80_softcap_kernels(int64_t head_dim, const char* op) {
  const int best = family_head_dim(Family::kSm80, head_dim, Direction::kForward, true);
  if (best == 0) {
    fail(op, ": softcap at head_dim ", str_of(head_dim), " needs a soft-capping kernel for a head dim >= ",
         str_of(head_dim), " of the kernel family that serves the call; this build has them for head dims",
         head_dims_text(build_config::kSm90SoftcapHeadDims), " on Hopper (sm90a) and",
         head_dims_text(build_config::kSm80SoftcapHeadDims),
         " in the Ampere family, which has them only where FA_CUDA_ARCHS lists an arch besides 90a ",
         "(FA_SOFTCAP_HEAD_DIMS)");
  }
  return {Family::kSm80, best, true};
}

// The environment variable FA_KERNEL_FAMILY, read at every call, chooses the family (sm80, sm90,
// or auto / unset). auto takes the Hopper family where it can serve the call (an sm90 device, a
// build with 90a, a native head dim >= D) and the Ampere family otherwise.
std::string family_setting(const char* op) {
  const char* env = std::getenv("FA_KERNEL_FAMILY");
  const std::string want = env ? env : "";
  FA_CHECK(want.empty() || want == "auto" || want == "sm80" || want == "sm90", op,
           ": the environment variable FA_KERNEL_FAMILY must be sm80, sm90 or auto, got '", want, "'");
  return want;
}

// The forward: FA_KERNEL_FAMILY=sm90 where the Hopper family cannot serve the call is an error.
Kernels forward_kernels(const std::string& arch, int64_t head_dim, bool softcap, const char* op) {
  const std::string want = family_setting(op);
  const int sm90_head_dim = arch == "90a" ? family_head_dim(Family::kSm90, head_dim, Direction::kForward, softcap) : 0;
  if (want == "sm90") {
    FA_CHECK(sm90_head_dim != 0, op, ": FA_KERNEL_FAMILY=sm90, but the Hopper family cannot serve this call: ",
                arch != "90a" ? "the device is sm_" + arch + ", not sm_90a"
                : !build_config::kSm90Forward ? std::string("this build has no Hopper kernels (FA_CUDA_ARCHS lacks 90a)")
                : softcap ? "this build has no Hopper soft-capping kernel for head dim " + str_of(head_dim) +
                                " (FA_SOFTCAP_HEAD_DIMS)"
                : "this build has no Hopper kernel for head dim " + str_of(head_dim) + " (FA_HEAD_DIMS)");
  }
  if (want != "sm80" && sm90_head_dim != 0) return {Family::kSm90, sm90_head_dim, softcap};
  if (softcap) return sm80_softcap_kernels(head_dim, op);
  return {Family::kSm80, kernel_head_dim(head_dim, Direction::kForward, op)};
}

// The backward: the Hopper family where it has a kernel for the head dim, else the
// Ampere family, also under FA_KERNEL_FAMILY=sm90 (the forward of those head dims is Hopper's;
// the pair stays one consistent choice per call).
Kernels backward_kernels(const std::string& arch, int64_t head_dim, bool softcap, const char* op) {
  const std::string want = family_setting(op);
  const int sm90_head_dim =
      arch == "90a" ? family_head_dim(Family::kSm90, head_dim, Direction::kBackward, softcap) : 0;
  if (want != "sm80" && sm90_head_dim != 0) return {Family::kSm90, sm90_head_dim, softcap};
  if (softcap) return sm80_softcap_kernels(head_dim, op);
  return {Family::kSm80, kernel_head_dim(head_dim, Direction::kBackward, op)};
}

// Whether this build holds kernels of the family for head_dim in the direction (soft-capping ones
// where kSoftcap).
template <Family kFamily, Direction kDirection, bool kSoftcap>
constexpr bool built(int head_dim) {
  using namespace build_config;
  if constexpr (kSoftcap && kFamily == Family::kSm80) return listed(kSm80SoftcapHeadDims, head_dim);
  if constexpr (kSoftcap) return listed(kSm90SoftcapHeadDims, head_dim);
  if constexpr (kFamily == Family::kSm80 && kDirection == Direction::kKvCache) return has_head_dim(head_dim);
  if constexpr (kFamily == Family::kSm80) return has_sm80_head_dim(head_dim);
  if constexpr (kDirection == Direction::kForward) return has_sm90_head_dim(head_dim);
  return has_sm90_backward_head_dim(head_dim);
}

// Calls fn(ElementTag{}) for dtype, of the element types this build holds.
template <class Fn>
cudaError_t dispatch_dtype(ScalarType dtype, const char* op, Fn&& fn) {
  if constexpr (build_config::kFloat16) {
    if (dtype == ScalarType::Half) return fn(Float16{});
  }
  if constexpr (build_config::kBFloat16) {
    if (dtype == ScalarType::BFloat16) return fn(BFloat16{});
  }
  fail(op, ": this build has no kernels for ", dtype_name(dtype), " (FA_DTYPES)");
}

// Calls fn(ElementTag{}, integral_constant<head dim>{}) for the runtime choice. Only the
// combinations this build holds for the family are instantiated.
template <Family kFamily, Direction kDirection, bool kSoftcap = false, class Fn>
cudaError_t dispatch(ScalarType dtype, int head_dim, const char* op, Fn&& fn) {
  auto with_head_dim = [&](auto tag) -> cudaError_t {
    switch (head_dim) {
#define FA_HEAD_DIM_CASE(D)                                                            \
  case D:                                                                              \
    if constexpr (built<kFamily, kDirection, kSoftcap>(D)) return fn(tag, std::integral_constant<int, D>{}); \
    break;
      FA_HEAD_DIM_CASE(32)
      FA_HEAD_DIM_CASE(64)
      FA_HEAD_DIM_CASE(96)
      FA_HEAD_DIM_CASE(128)
      FA_HEAD_DIM_CASE(256)
#undef FA_HEAD_DIM_CASE
    }
    fail(op, ": no kernel for head dim ", str_of(int64_t(head_dim)));
  };
  return dispatch_dtype(dtype, op, with_head_dim);
}

// The same for `kernels` with bool_constant<causal>{} and bool_constant<softcap>{} as fn's third
// and fourth arguments: kernels instantiated per causal choice, soft-capping ones causal alone, and
// the Ampere family's causal alone at the head dims of build_config::kSm80RunTimeMaskHeadDims.
template <Family kFamily, Direction kDirection, class Fn>
cudaError_t dispatch(ScalarType dtype, const Kernels& kernels, bool causal, const char* op, Fn&& fn) {
  if (kernels.softcap) {
    return dispatch<kFamily, kDirection, true>(dtype, kernels.head_dim, op, [&](auto tag, auto hd) {
      return fn(tag, hd, std::true_type{}, std::true_type{});
    });
  }
  return dispatch<kFamily, kDirection>(dtype, kernels.head_dim, op, [&](auto tag, auto hd) -> cudaError_t {
    if constexpr (kFamily == Family::kSm80 && build_config::sm80_mask_at_run_time(decltype(hd)::value)) {
      return fn(tag, hd, std::true_type{}, std::false_type{});
    } else {
      if (causal) return fn(tag, hd, std::true_type{}, std::false_type{});
      return fn(tag, hd, std::false_type{}, std::false_type{});
    }
  });
}

// The Hopper kernels in the direction for v's head dim apart from q's and k's: the smallest pair
// D'/Dv' of FA_HEAD_DIM_PAIRS (the backward: those with D' above 128 and Dv' a multiple of 128) with
// D' >= D and Dv' >= Dv (its tiles zero-fill the columns past D and Dv), where one serves the call
// (a 90a device, the family not forced to sm80, no soft-capping); else none, and the call runs
// padded (forward_any_head_dims, backward_any_head_dims).
template <Direction kDirection>
std::optional<Kernels> pair_kernels(const std::string& arch, const AttentionShape& s, bool softcap, const char* op) {
  if (arch != "90a" || softcap || family_setting(op) == "sm80") return std::nullopt;
  HeadDimPair best;
  if constexpr (kDirection == Direction::kForward) {
    best = smallest_pair_at_least(build_config::kSm90ForwardHeadDimPairs, s.head_dim, s.head_dim_v);
  } else {
    best = smallest_pair_at_least(build_config::kSm90BackwardHeadDimPairs, s.head_dim, s.head_dim_v);
  }
  if (best.head_dim == 0) return std::nullopt;
  return Kernels{Family::kSm90, best.head_dim, false, best.head_dim_v};
}

// v's head dim apart from q's and k's where no kernel takes the two (another pair's backward, the
// Ampere family, soft-capping, a pair this build lacks): the kernels of one head dim, d = max(D, Dv), on copies
// of the narrower tensors zero-padded to d. Zero columns change no score (q's and k's), and add
// zero columns to the output and dV (v's), which are dropped; dO's and O's zero columns leave
// rowsum(dO ∘ O) as it is. Correct, at the cost of the copies and of the padded columns' work.
Tensor widened(const Tensor& t, int64_t d) {
  const int64_t last = t.size(t.dim() - 1);
  return last == d ? t : torch::stable::pad(t, {0, d - last});
}

// dst = src's first dst.size(-1) columns (nothing to do where src is dst).
void copy_narrowed(Tensor& dst, Tensor& src) {
  const int64_t last = dst.dim() - 1;
  if (src.size(last) == dst.size(last)) {
    if (src.data_ptr() != dst.data_ptr()) torch::stable::copy_(dst, src);
    return;
  }
  torch::stable::copy_(dst, torch::stable::narrow(src, last, 0, dst.size(last)));
}

// The pairs cmake/FaKernels.cmake admits (D/Dv, multiples of 64, Dv < D <= 256): FA_EACH_PAIR(CASE)
// expands CASE(D, DV) for each.
#define FA_EACH_PAIR(CASE) CASE(128, 64) CASE(192, 64) CASE(192, 128) CASE(256, 64) CASE(256, 128) CASE(256, 192)

// Calls fn(ElementTag{}, integral_constant<D>{}, integral_constant<Dv>{}, bool_constant<causal>{})
// for a pair's kernels in the direction (those of FA_EACH_PAIR this build holds).
template <Direction kDirection, class Fn>
cudaError_t dispatch_pair(ScalarType dtype, const Kernels& kernels, bool causal, const char* op, Fn&& fn) {
  auto with_dims = [&](auto tag) -> cudaError_t {
#define FA_PAIR_CASE(D, DV)                                                                        \
  if constexpr (kDirection == Direction::kForward ? build_config::has_sm90_head_dim_pair(D, DV)    \
                                                  : build_config::has_sm90_backward_head_dim_pair(D, DV)) { \
    if (kernels.head_dim == D && kernels.head_dim_v == DV) {                                       \
      using Dims = std::pair<std::integral_constant<int, D>, std::integral_constant<int, DV>>;     \
      if (causal) return fn(tag, typename Dims::first_type{}, typename Dims::second_type{}, std::true_type{}); \
      return fn(tag, typename Dims::first_type{}, typename Dims::second_type{}, std::false_type{}); \
    }                                                                                              \
  }
    FA_EACH_PAIR(FA_PAIR_CASE)
#undef FA_PAIR_CASE
    fail(op, ": no kernel for head dims ", str_of(int64_t(kernels.head_dim)), "/", str_of(int64_t(kernels.head_dim_v)));
  };
  return dispatch_dtype(dtype, op, with_dims);
}

void check_grid_limits(const AttentionShape& s, const char* op) {
  FA_CHECK(s.heads_q <= kMaxGridYZ && s.batch <= kMaxGridYZ, op, ": at most ", str_of(kMaxGridYZ),
           " heads and batch entries are supported, got heads ", str_of(s.heads_q), ", batch ",
           str_of(s.batch));
  FA_CHECK(s.seqlen_q < (int64_t(1) << 31) && s.seqlen_k < (int64_t(1) << 31), op,
           ": sequence lengths must be below 2^31");
}

void fill_forward_params(ForwardParams& p, const Tensor& q, const Tensor& k, const Tensor& v,
                         const Tensor& out, const Tensor& lse,
                         const AttentionShape& s, float scale) {
  p.q = q.data_ptr();
  p.k = k.data_ptr();
  p.v = v.data_ptr();
  p.out = out.data_ptr();
  p.lse = static_cast<float*>(lse.data_ptr());
  p.q_stride = strides_of(q);
  p.k_stride = strides_of(k);
  p.v_stride = strides_of(v);
  p.out_stride = strides_of(out);
  // lse: (B, Hq, Sq), or (Hq, total_q) for a packed batch.
  p.lse_batch_stride = lse.dim() == 2 ? 0 : lse.stride(0);
  p.lse_head_stride = lse.dim() == 2 ? lse.stride(0) : lse.stride(1);
  p.batch = static_cast<int>(s.batch);
  p.heads_q = static_cast<int>(s.heads_q);
  p.heads_kv = static_cast<int>(s.heads_kv);
  p.seqlen_q = static_cast<int>(s.seqlen_q);
  p.seqlen_k = static_cast<int>(s.seqlen_k);
  p.head_dim = static_cast<int>(s.head_dim);
  p.head_dim_v = static_cast<int>(s.head_dim_v);
  p.scale = scale;
  p.scale_log2 = scale * static_cast<float>(M_LOG2E);
}

// The variant's bounds, sinks and soft-capping into p (after fill_forward_params: soft-capping
// moves the softmax's scale onto the capped scores, common/softcap.h; the backward keeps p.scale,
// by which it scales dQ and dK). A window bound past every key is no bound in effect; the kernels
// clamp them (common/attention_mask.h), so any int is fine here.
void set_variant(ForwardParams& p, const Variant& v, Direction direction) {
  auto bound = [](int64_t b) { return static_cast<int>(std::min<int64_t>(b, int64_t(1) << 30)); };
  p.window_left = bound(v.window_left);
  p.window_right = bound(v.window_right);
  p.sinks = v.sinks ? static_cast<const float*>(v.sinks->data_ptr()) : nullptr;
  if (v.softcap > 0) {
    const float softcap = static_cast<float>(v.softcap);
    p.softcap_scale = p.scale / softcap;
    p.scale_log2 = softcap * static_cast<float>(M_LOG2E);
    if (direction == Direction::kForward) p.scale = softcap;
  }
}

// A descale tensor's pointer and strides into p's fields (nothing for None).
void set_descale(const std::optional<Tensor>& t, const float*& ptr, int64_t (&stride)[2]) {
  if (!t) return;
  ptr = static_cast<const float*>(t->data_ptr());
  stride[0] = t->stride(0);
  stride[1] = t->stride(1);
}

// The Hopper forward's tile counter (causal and varlen calls: CTAs take the next tile from it as
// they finish, since the tiles differ in length), zeroed on `stream`; held by the returned tensor.
std::optional<Tensor> sm90_tile_counter(ForwardParams& p, const Tensor& q, bool causal, cudaStream_t stream,
                                        const char* op) {
  if (!causal && p.cu_seqlens_q == nullptr) return std::nullopt;
  Tensor counter = torch::stable::new_empty(q, {1}, ScalarType::Int);
  p.tile_counter = static_cast<int*>(counter.data_ptr());
  // A memset node rather than torch's fill kernel: less host time per call.
  check_cuda(cudaMemsetAsync(p.tile_counter, 0, sizeof(int), stream), op);
  return counter;
}

// Launches the forward kernels of `kernels` for p on q's current stream; causal: the kernels
// instantiated for causal (Variant::causal_kernels: a window's too, common/attention_mask.h).
void run_forward_kernels(ForwardParams& p, const Tensor& q, const Kernels& kernels, bool causal, const char* op) {
  const cudaStream_t stream = current_stream(q);
  cudaError_t err;
  if (kernels.family == Family::kSm90) {
    const std::optional<Tensor> tile_counter = sm90_tile_counter(p, q, causal, stream, op);
    if (kernels.head_dim_v != 0) {
      err = dispatch_pair<Direction::kForward>(q.scalar_type(), kernels, causal, op, [&](auto tag, auto hd, auto hdv, auto c) {
        return sm90::run_forward_dv<decltype(tag), decltype(hd)::value, decltype(hdv)::value, decltype(c)::value,
                                    false>(p, stream);
      });
    } else {
      err = dispatch<Family::kSm90, Direction::kForward>(q.scalar_type(), kernels, causal, op, [&](auto tag, auto hd, auto c, auto sc) {
        return sm90::run_forward<decltype(tag), decltype(hd)::value, decltype(c)::value, decltype(sc)::value>(p, stream);
      });
    }
  } else {
    err = dispatch<Family::kSm80, Direction::kForward>(q.scalar_type(), kernels, causal, op, [&](auto tag, auto hd, auto c, auto sc) {
      return sm80::run_forward<decltype(tag), decltype(hd)::value, decltype(c)::value, decltype(sc)::value>(p, stream);
    });
  }
  check_cuda(err, op);
}

// A forward's inputs made fit for the kernels (aligned_for_kernels), and p filled from them, the
// outputs o and the variant (the caller has set what a packed batch adds).
struct KernelInputs {
  Tensor q, k, v;
};

KernelInputs prepare_forward(ForwardParams& p, const ForwardOutputs& o, const Tensor& q_in, const Tensor& k_in,
                             const Tensor& v_in, const AttentionShape& s, float scale, const Variant& variant,
                             const char* op) {
  check_grid_limits(s, op);
  KernelInputs in{aligned_for_kernels(q_in), aligned_for_kernels(k_in), aligned_for_kernels(v_in)};
  fill_forward_params(p, in.q, in.k, in.v, o.out, o.lse, s, scale);
  set_variant(p, variant, Direction::kForward);
  return in;
}

// The forward of q, k, v (of shape s) into o on the current device with `kernels`.
void forward_into(ForwardParams& p, ForwardOutputs& o, const Tensor& q_in, const Tensor& k_in,
                  const Tensor& v_in, const AttentionShape& s, float scale, const Variant& variant,
                  const Kernels& kernels, const char* op) {
  const KernelInputs in = prepare_forward(p, o, q_in, k_in, v_in, s, scale, variant, op);
  run_forward_kernels(p, in.q, kernels, variant.causal_kernels(), op);
}

// forward_into with the kernels of the family chosen; for v's head dim apart from q's and k's, the
// pair kernels where they serve the call, else those of one head dim on padded copies (widened).
void forward_any_head_dims(ForwardParams& p, ForwardOutputs& o, const Tensor& q, const Tensor& k, const Tensor& v,
                           const AttentionShape& s, float scale, const Variant& variant, const std::string& arch,
                           const char* op) {
  const bool softcap = variant.softcap > 0;
  if (s.head_dim_v == s.head_dim) {
    forward_into(p, o, q, k, v, s, scale, variant, forward_kernels(arch, s.head_dim, softcap, op), op);
    return;
  }
  if (const std::optional<Kernels> pair = pair_kernels<Direction::kForward>(arch, s, softcap, op)) {
    forward_into(p, o, q, k, v, s, scale, variant, *pair, op);
    return;
  }
  const int64_t d = std::max(s.head_dim, s.head_dim_v);
  AttentionShape wide = s;
  wide.head_dim = wide.head_dim_v = d;
  std::vector<int64_t> sizes(o.out.sizes().begin(), o.out.sizes().end());
  sizes.back() = d;
  ForwardOutputs padded{torch::stable::new_empty(o.out, sizes), o.lse};
  forward_into(p, padded, widened(q, d), widened(k, d), widened(v, d), wide, scale, variant,
               forward_kernels(arch, d, softcap, op), op);
  copy_narrowed(o.out, padded.out);
}

// The FP8 forward's kernel head dims for a call, after the checks only that forward needs: the
// Hopper family, no soft-capping, head dims multiples of 16 (whole 16-byte rows for TMA). One head
// dim: the smallest of FA_FP8_HEAD_DIMS holding it; v's below q's and k's: the smallest pair of
// FA_FP8_HEAD_DIM_PAIRS holding both.
HeadDimPair fp8_forward_head_dims(const AttentionShape& s, const Variant& variant, const std::string& arch,
                                  const char* op) {
  FA_CHECK(arch == "90a", op, ": float8_e4m3fn q, k and v run on the Hopper family alone (sm_90a: the e4m3 ",
           "wgmma); this device is sm_", arch, ". Run in bfloat16 or float16 there");
  FA_CHECK(family_setting(op) != "sm80", op, ": FA_KERNEL_FAMILY=sm80, but the Ampere family has no FP8 forward ",
           "(float8_e4m3fn q, k and v run on the Hopper family)");
  FA_CHECK(variant.softcap == 0, op, ": softcap is not supported with float8_e4m3fn q, k and v on CUDA");
  constexpr const char* what = "float8_e4m3fn q, k and v";
  if (s.head_dim_v == s.head_dim) {
    const int d = fp8_kernel_head_dim(build_config::kSm90Fp8HeadDims, s.head_dim, what,
                                      "FA_FP8_HEAD_DIMS; Hopper builds only", op);
    return {d, d};
  }
  FA_CHECK(s.head_dim % 16 == 0 && s.head_dim_v % 16 == 0, op, ": with ", what,
           " on CUDA, head dims must be multiples of 16, got ", str_of(s.head_dim), " (q, k) and ",
           str_of(s.head_dim_v), " (v)");
  const HeadDimPair best = smallest_pair_at_least(build_config::kSm90Fp8HeadDimPairs, s.head_dim, s.head_dim_v);
  FA_CHECK(best.head_dim != 0, op, ": ", what, " with head dims ", str_of(s.head_dim), " (q, k) and ",
           str_of(s.head_dim_v), " (v) need a kernel pair D/Dv holding both (D >= ", str_of(s.head_dim),
           ", Dv >= ", str_of(s.head_dim_v), ", Dv < D); this build has FP8 pairs",
           head_dim_pairs_text(build_config::kSm90Fp8HeadDimPairs), " (FA_FP8_HEAD_DIM_PAIRS, e.g. 192/128; ",
           "Hopper builds only)");
  return best;
}

// The FP8 forward (float8_e4m3fn q, k and v; fa.forward and fa.forward_varlen) into o: v transposed
// into a buffer of this call (ForwardParams::v), the descales, the launch (the caller has set what
// a packed batch adds).
void forward_fp8_into(ForwardParams& p, ForwardOutputs& o, const Tensor& q_in, const Tensor& k_in,
                      const Tensor& v_in, const AttentionShape& s, float scale, const Variant& variant,
                      const Fp8Args& fp8, const std::string& arch, const char* op) {
  const HeadDimPair kernel = fp8_forward_head_dims(s, variant, arch, op);
  const KernelInputs in = prepare_forward(p, o, q_in, k_in, v_in, s, scale, variant, op);
  const Tensor& q = in.q;
  const Tensor& v = in.v;
  const bool packed = p.cu_seqlens_q != nullptr;
  const int64_t keys = packed ? fp8_transposed_v_keys(p.total_k, s.batch) : fp8_transposed_v_keys(s.seqlen_k);
  const Tensor vt = packed ? torch::stable::new_empty(v, {s.heads_kv, s.head_dim_v, keys})
                           : torch::stable::new_empty(v, {s.batch, s.heads_kv, s.head_dim_v, keys});
  p.v_rows = v.data_ptr();
  p.v_rows_stride = strides_of(v);
  p.v = vt.data_ptr();
  p.v_stride = packed ? Strides{0, vt.stride(0), vt.stride(1)} : Strides{vt.stride(0), vt.stride(1), vt.stride(2)};
  set_descale(fp8.q_descale, p.q_descale, p.q_descale_stride);
  set_descale(fp8.k_descale, p.k_descale, p.k_descale_stride);
  set_descale(fp8.v_descale, p.v_descale, p.v_descale_stride);
  p.out_fp16 = fp8.out_dtype == ScalarType::Half;
  const bool causal = variant.causal_kernels();
  const cudaStream_t stream = current_stream(q);
  const std::optional<Tensor> tile_counter = sm90_tile_counter(p, q, causal, stream, op);
  cudaError_t err = cudaErrorInvalidValue;
  // The kernels of one head dim (FA_FP8_HEAD_DIMS) and of the pairs (FA_FP8_HEAD_DIM_PAIRS) this
  // build holds.
#define FA_FP8_FORWARD_CASE(D, DV)                                                                  \
  if constexpr (D == DV ? build_config::listed(build_config::kSm90Fp8HeadDims, D)                   \
                        : build_config::listed_pair(build_config::kSm90Fp8HeadDimPairs, D, DV)) {   \
    if (kernel.head_dim == D && kernel.head_dim_v == DV) {                                          \
      err = causal ? sm90::run_forward_fp8<D, true, DV>(p, stream)                                  \
                   : sm90::run_forward_fp8<D, false, DV>(p, stream);                                \
    }                                                                                               \
  }
  FA_FP8_FORWARD_CASE(64, 64)
  FA_FP8_FORWARD_CASE(128, 128)
  FA_EACH_PAIR(FA_FP8_FORWARD_CASE)
#undef FA_FP8_FORWARD_CASE
  check_cuda(err, op);
}

std::tuple<Tensor, Tensor> forward_cuda(const Tensor& q_in, const Tensor& k_in, const Tensor& v_in,
                                        std::optional<double> softmax_scale, bool causal, int64_t window_left,
                                        int64_t window_right, double softcap, std::optional<Tensor> sinks,
                                        std::optional<Tensor> q_descale, std::optional<Tensor> k_descale,
                                        std::optional<Tensor> v_descale, std::optional<ScalarType> out_dtype) {
  constexpr const char* op = "fa.forward";
  const AttentionShape s = check_forward_inputs(q_in, k_in, v_in);
  const Variant variant = check_variant(op, causal, window_left, window_right, softcap, sinks, q_in, s.heads_q);
  const Fp8Args fp8 = check_fp8_args(op, q_in, s, q_descale, k_descale, v_descale, out_dtype);
  const float scale = resolve_softmax_scale(softmax_scale, s.head_dim);
  const torch::stable::accelerator::DeviceGuard guard(q_in.get_device_index());
  const std::string arch = check_device(q_in, op);
  ForwardOutputs o = allocate_forward_outputs(q_in, s, fp8.out_dtype);
  if (finish_trivial_forward(s, o, variant.sinks)) return {o.out, o.lse};
  ForwardParams p;
  if (fp8.fp8) {
    forward_fp8_into(p, o, q_in, k_in, v_in, s, scale, variant, fp8, arch, op);
  } else {
    forward_any_head_dims(p, o, q_in, k_in, v_in, s, scale, variant, arch, op);
  }
  return {o.out, o.lse};
}

std::tuple<Tensor, Tensor> forward_varlen_cuda(const Tensor& q_in, const Tensor& k_in, const Tensor& v_in,
                                               const Tensor& cu_seqlens_q_in, const Tensor& cu_seqlens_k_in,
                                               int64_t max_seqlen_q, int64_t max_seqlen_k,
                                               std::optional<double> softmax_scale, bool causal,
                                               int64_t window_left, int64_t window_right, double softcap,
                                               std::optional<Tensor> sinks, std::optional<Tensor> q_descale,
                                               std::optional<Tensor> k_descale, std::optional<Tensor> v_descale,
                                               std::optional<ScalarType> out_dtype) {
  constexpr const char* op = "fa.forward_varlen";
  const VarlenShape s = check_varlen_inputs(op, q_in, k_in, v_in, cu_seqlens_q_in, cu_seqlens_k_in,
                                            max_seqlen_q, max_seqlen_k);
  const Variant variant = check_variant(op, causal, window_left, window_right, softcap, sinks, q_in, s.heads_q);
  const Fp8Args fp8 = check_fp8_args(op, q_in, s, q_descale, k_descale, v_descale, out_dtype);
  const float scale = resolve_softmax_scale(softmax_scale, s.head_dim);
  const torch::stable::accelerator::DeviceGuard guard(q_in.get_device_index());
  const std::string arch = check_device(q_in, op);
  ForwardOutputs o = allocate_varlen_outputs(q_in, s, fp8.out_dtype);
  if (finish_trivial_forward(s, o, variant.sinks)) return {o.out, o.lse};
  const Tensor cu_seqlens_q = dense_last_dim(cu_seqlens_q_in);
  const Tensor cu_seqlens_k = dense_last_dim(cu_seqlens_k_in);
  ForwardParams p;
  set_packed_batch(p, cu_seqlens_q, cu_seqlens_k, s);
  if (fp8.fp8) {
    forward_fp8_into(p, o, q_in, k_in, v_in, s, scale, variant, fp8, arch, op);
  } else {
    forward_any_head_dims(p, o, q_in, k_in, v_in, s, scale, variant, arch, op);
  }
  return {o.out, o.lse};
}

// Split-KV's default for a KV-cache call. A split pays for itself where it shortens each CTA's run
// of keys by more than its combine pass costs (about 2-3 us): a cache of fewer than 1024 keys runs
// unsplit; a grid too small to keep the memory busy splits into about one CTA per SM, at most one
// split per 128 keys (a step of the 16-row tiles at D = 128); a grid that reaches a third of the
// SMs, into at most one split per 2048 keys; never more than kMaxSplits. With a window the keys
// counted are the window's (a row sees at most window_left + 1 of them). Measured on the H100 in
// CUDA graphs (docs/tried.md, decoding): B1 Hk8 D128: 160 keys 5.4 us unsplit, 6.3 with 2 splits;
// 1024 keys 9.9 unsplit, 8.0 with 4 splits, 6.9 with 8; B8 Hk8: 1024 keys 11.9 unsplit, 15.2 with 2
// splits; B6 Hk8 at 8192 keys 78.6 unsplit, 72.2 with 2. B1 at 131072 keys: 90% of the copy
// bandwidth with 16 splits, 88% with 33, 80% with 24.
int64_t default_splits(const KVCacheShape& s, const Variant& v, const Tensor& q) {
  const int64_t keys = v.window_left >= 0 ? std::min(s.seqlen_k, v.window_left + s.seqlen_q) : s.seqlen_k;
  const int64_t sms = device_sm_count(q.get_device_index());  // 0 where the runtime cannot say: unsplit
  // A CTA per kv head and decode_block_m rows of its group's queries (the decode kernels pack them).
  const int64_t rows = s.group_size() * s.seqlen_q;
  const int64_t ctas = s.batch * s.heads_kv * ((rows + decode_block_m(rows) - 1) / decode_block_m(rows));
  if (keys < 1024 || ctas >= sms) return 1;
  const int64_t keys_per_split = 3 * ctas > sms ? 2048 : 128;
  return std::max<int64_t>(1, std::min({sms / ctas, keys / keys_per_split, kMaxSplits}));
}

// An FP8 cache's kernel head dim for a call (the smallest of FA_FP8_KV_HEAD_DIMS holding q's and k's
// and v's), after the checks only those kernels need: head dims in whole 16-byte vectors of bytes,
// and at most fp8_kvcache_max_rows query rows a kv head.
int fp8_kvcache_head_dim(const KVCacheShape& s, const char* op) {
  FA_CHECK(s.head_dim % 16 == 0 && s.head_dim_v % 16 == 0, op, ": with float8_e4m3fn caches on CUDA, head_dim ",
           "must be a multiple of 16, got ", str_of(s.head_dim),
           s.head_dim_v != s.head_dim ? " (q, k) and " + str_of(s.head_dim_v) + " (v)" : std::string());
  const int best = fp8_kernel_head_dim(build_config::kSm80Fp8KvHeadDims, std::max(s.head_dim, s.head_dim_v),
                                       "float8_e4m3fn caches", "FA_FP8_KV_HEAD_DIMS", op);
  const int64_t rows = s.group_size() * s.seqlen_q;
  FA_CHECK(rows <= fp8_kvcache_max_rows(best), op, ": with float8_e4m3fn caches, a kv head's query rows ",
           "(heads_q / heads_kv · seqlen_q) may be at most ", str_of(int64_t(fp8_kvcache_max_rows(best))),
           " at head_dim ", str_of(s.head_dim), " (the decode kernel's tile), got ", str_of(s.group_size()), " · ",
           str_of(s.seqlen_q), " = ", str_of(rows), "; attend longer query runs to a 16-bit copy of the keys ",
           "and values, or in chunks of seqlen_q");
  return best;
}

std::tuple<Tensor, Tensor> forward_kvcache_cuda(const Tensor& q_in, const Tensor& k_in, const Tensor& v_in,
                                                const Tensor& cache_seqlens_in, std::optional<Tensor> page_table_in,
                                                std::optional<double> softmax_scale, bool causal, int64_t num_splits,
                                                int64_t window_left, int64_t window_right, double softcap,
                                                std::optional<Tensor> sinks, std::optional<Tensor> cache_leftpad_in,
                                                std::optional<Tensor> k_descale, std::optional<Tensor> v_descale) {
  constexpr const char* op = "fa.forward_kvcache";
  const KVCacheShape s = check_kvcache_inputs(q_in, k_in, v_in, cache_seqlens_in, page_table_in, cache_leftpad_in,
                                              num_splits, k_descale, v_descale);
  const int fp8_head_dim = s.fp8 ? fp8_kvcache_head_dim(s, op) : 0;
  const Variant variant = check_variant(op, causal, window_left, window_right, softcap, sinks, q_in, s.heads_q);
  const float scale = resolve_softmax_scale(softmax_scale, s.head_dim);
  const torch::stable::accelerator::DeviceGuard guard(q_in.get_device_index());
  check_device(q_in, op);
  ForwardOutputs o = allocate_forward_outputs(q_in, s);
  if (finish_trivial_forward(s, o, variant.sinks)) return {o.out, o.lse};
  check_grid_limits(s, op);

  const Tensor q = aligned_for_kernels(q_in);
  const Tensor k = aligned_for_kernels(k_in);
  const Tensor v = aligned_for_kernels(v_in);
  const Tensor cache_seqlens = dense_last_dim(cache_seqlens_in);
  std::optional<Tensor> page_table, cache_leftpad;
  if (page_table_in) page_table = dense_last_dim(*page_table_in);
  if (cache_leftpad_in) cache_leftpad = dense_last_dim(*cache_leftpad_in);
  const int64_t splits = num_splits > 0 ? num_splits : default_splits(s, variant, q);
  FA_CHECK(s.batch * splits <= kMaxGridYZ, op, ": batch · num_splits must be at most ", str_of(kMaxGridYZ),
           ", got ", str_of(s.batch), " · ", str_of(splits));

  ForwardParams p;
  fill_forward_params(p, q, k, v, o.out, o.lse, s, scale);
  set_variant(p, variant, Direction::kForward);
  p.seqused_k = static_cast<const int*>(cache_seqlens.data_ptr());
  if (cache_leftpad) p.leftpad_k = static_cast<const int*>(cache_leftpad->data_ptr());
  if (page_table) {
    // (num_pages, page_size, Hk, D): the page stride in the batch slot, rows within a page.
    p.k_stride = {k.stride(0), k.stride(2), k.stride(1)};
    p.v_stride = {v.stride(0), v.stride(2), v.stride(1)};
    p.page_table = static_cast<const int*>(page_table->data_ptr());
    p.page_table_stride = page_table->stride(0);
    p.page_size = static_cast<int>(s.page_size);
  }
  p.num_splits = static_cast<int>(splits);
  std::optional<Tensor> out_accum, lse_accum;
  if (splits > 1) {
    out_accum = torch::stable::new_empty(q, {splits, s.batch, s.heads_q, s.seqlen_q, s.head_dim_v}, ScalarType::Float);
    lse_accum = torch::stable::new_empty(q, {splits, s.batch, s.heads_q, s.seqlen_q}, ScalarType::Float);
    p.out_accum = static_cast<float*>(out_accum->data_ptr());
    p.lse_accum = static_cast<float*>(lse_accum->data_ptr());
    p.head_dim_accum = static_cast<int>(s.head_dim_v);
  }
  // Decoding is bound by memory bandwidth: the Ampere family serves it on every GPU. Its KV-cache
  // kernels take the mask at run time (one instantiation serves all), and v's head dim apart from
  // q's and k's: the kernel of a head dim holding both reads each at its own width (the columns past
  // it zero-filled) and writes v's.
  cudaError_t err;
  if (s.fp8) {
    set_descale(k_descale, p.k_descale, p.k_descale_stride);
    set_descale(v_descale, p.v_descale, p.v_descale_stride);
    err = dispatch_dtype(q.scalar_type(), op, [&](auto tag) -> cudaError_t {
      switch (fp8_head_dim) {
#define FA_FP8_HEAD_DIM_CASE(D)                                                              \
  case D:                                                                                    \
    if constexpr (build_config::listed(build_config::kSm80Fp8KvHeadDims, D)) {               \
      return sm80::run_forward_kvcache_fp8<decltype(tag), D>(p, current_stream(q));          \
    }                                                                                        \
    break;
        FA_FP8_HEAD_DIM_CASE(64)
        FA_FP8_HEAD_DIM_CASE(128)
        FA_FP8_HEAD_DIM_CASE(256)
#undef FA_FP8_HEAD_DIM_CASE
      }
      fail(op, ": no float8_e4m3fn KV-cache kernel for head dim ", str_of(int64_t(fp8_head_dim)));
    });
    FA_CHECK(err != cudaErrorLaunchOutOfResources, op, ": no float8_e4m3fn KV-cache tile at head dim ",
             str_of(int64_t(fp8_head_dim)), " fits this device's shared memory (",
             device_name(q), "); use a 16-bit cache here");
  } else {
    err = dispatch<Family::kSm80, Direction::kKvCache>(
        q.scalar_type(), kvcache_head_dim(std::max(s.head_dim, s.head_dim_v), op), op, [&](auto tag, auto hd) {
          return sm80::run_forward_kvcache<decltype(tag), decltype(hd)::value>(p, current_stream(q));
        });
  }
  check_cuda(err, op);
  return {o.out, o.lse};
}

// The backward's inputs, made fit for the kernels (16-byte aligned rows, lse rows contiguous).
struct BackwardInputs {
  Tensor dout, q, k, v, out, lse;

  BackwardInputs(const Tensor& dout_in, const Tensor& q_in, const Tensor& k_in, const Tensor& v_in,
                 const Tensor& out_in, const Tensor& lse_in)
      : dout(aligned_for_kernels(dout_in)),
        q(aligned_for_kernels(q_in)),
        k(aligned_for_kernels(k_in)),
        v(aligned_for_kernels(v_in)),
        out(aligned_for_kernels(out_in)),
        lse(lse_in.stride(lse_in.dim() - 1) == 1 ? lse_in : contiguous_copy(lse_in)) {}
};

// Fills the rest of p (the caller has set what a packed batch adds) for the backward of `in` into
// g, allocates the fp32 workspaces (dQ accumulated by every key tile, delta = rowsum(dO ∘ O) and,
// for the Hopper family, lse in log2 units; rows padded so that every query tile lies inside them,
// dQ's columns as wide as the kernel's head dim), and launches the kernels. The workspaces are
// (B, Hq, rows) or, for a packed batch, (Hq, rows) with the sequences at their own padded offsets
// (common/sequence.h). deterministic: dQ's partials added in a fixed order (common/dq_claims.h).
void run_backward_kernels(BackwardParams& p, const BackwardInputs& in, const Gradients& g,
                          const AttentionShape& s, float scale, const Kernels& kernels, const Variant& variant,
                          bool deterministic, const char* op) {
  const bool causal = variant.causal_kernels();  // the kernels instantiated for causal serve every window
  check_grid_limits(s, op);
  FA_CHECK(build_config::kSm80Backward || build_config::kSm90Backward, op, ": this build has no CUDA backward kernels");
  const Tensor& q = in.q;
  const bool packed = p.cu_seqlens_q != nullptr;
  const int64_t rounded = (s.seqlen_q + kBackwardRowPadding - 1) / kBackwardRowPadding * kBackwardRowPadding;
  // Varlen: each head's rows a multiple of the padding too, so that every tile's rows start
  // 16-byte aligned (the Hopper family loads them with bulk copies).
  const int64_t head_rows =
      (p.total_q + (s.batch + 1) * kBackwardRowPadding - 1) / kBackwardRowPadding * kBackwardRowPadding;
  // One allocation for all of them (an allocation costs host time at every call): dQ's rows, then
  // delta's, then (Hopper) lse_log2's, the tile counters (128 floats' room), the dQ claims (an
  // int per kDqClaimRows rows) and the units' prepared row blocks, each part but the last 512-byte
  // aligned (the rows are padded to 128).
  const bool sm90 = kernels.family == Family::kSm90;
  const int64_t rows = packed ? s.heads_q * head_rows : s.batch * s.heads_q * rounded;
  // Deterministic: the odd turns' sums and counts apart where fa/kernels.h says so
  // (BackwardParams::dq_accum_odd; the pair kernels add dQ from registers).
  const bool odd_turns = sm90 && deterministic && kernels.head_dim_v == 0 &&
                         sm90_backward_odd_turns(kernels.head_dim, causal, s.seqlen_q, s.group_size());
  const int64_t dq_part = rows * kernels.head_dim;
  const int64_t dq_floats = odd_turns ? 2 * dq_part : dq_part;
  // Claims: the Hopper family's, and the turns of a deterministic call (either family).
  const int64_t claims_part = sm90 || deterministic ? rows / kDqClaimRows : 0;
  const int64_t claims = odd_turns ? 2 * claims_part : claims_part;
  // Rectangular batches (Hopper): an int per (batch, kv head) unit, the row blocks the main kernel
  // has prepared of it (BackwardParams::unit_ready; its launcher decides whether it prepares any).
  const int64_t units = sm90 && !packed ? int64_t(s.batch) * s.heads_kv : 0;
  const Tensor workspace = torch::stable::new_empty(
      q, {dq_floats + (sm90 ? 2 * rows + 128 : rows) + claims + units}, ScalarType::Float);
  float* const base = static_cast<float*>(workspace.data_ptr());

  fill_forward_params(p, q, in.k, in.v, in.out, in.lse, s, scale);
  set_variant(p, variant, Direction::kBackward);
  p.dout = in.dout.data_ptr();
  p.dout_stride = strides_of(in.dout);
  p.dq = g.dq.data_ptr();
  p.dk = g.dk.data_ptr();
  p.dv = g.dv.data_ptr();
  p.dq_stride = strides_of(g.dq);
  p.dk_stride = strides_of(g.dk);
  p.dv_stride = strides_of(g.dv);
  p.dq_accum = base;
  p.delta = base + dq_floats;
  p.lse_log2 = sm90 ? base + dq_floats + rows : nullptr;
  p.tile_counter = sm90 ? reinterpret_cast<int*>(base + dq_floats + 2 * rows) : nullptr;  // zeroed by the pre-pass
  // The dQ claims: used (and zeroed by the pre-pass) where the Hopper kernel claims the workspace's
  // tiles instead of zeroing them (its launcher decides: sm90::BackwardConfig::kdQClaims), and
  // as the turns of a deterministic call.
  float* const claims_base = base + dq_floats + (sm90 ? 2 * rows + 128 : rows);
  p.dq_claims = claims > 0 ? reinterpret_cast<int*>(claims_base) : nullptr;
  p.dq_accum_odd = odd_turns ? base + dq_part : nullptr;
  p.dq_claims_odd = odd_turns ? p.dq_claims + claims_part : nullptr;
  p.unit_ready = units > 0 ? reinterpret_cast<int*>(claims_base + claims) : nullptr;
  p.deterministic = deterministic;
  p.seqlen_q_rounded = static_cast<int>(rounded);
  p.head_dim_rounded = kernels.head_dim;
  p.workspace_head_rows = packed ? head_rows : 0;

  const cudaStream_t stream = current_stream(q);
  cudaError_t err;
  if (kernels.family == Family::kSm90 && kernels.head_dim_v != 0) {
    err = dispatch_pair<Direction::kBackward>(q.scalar_type(), kernels, causal, op, [&](auto tag, auto hd, auto hdv, auto c) {
      return sm90::run_backward_dv<decltype(tag), decltype(hd)::value, decltype(hdv)::value, decltype(c)::value,
                                   false>(p, stream);
    });
  } else if (kernels.family == Family::kSm90) {
    err = dispatch<Family::kSm90, Direction::kBackward>(q.scalar_type(), kernels, causal, op, [&](auto tag, auto hd, auto c, auto sc) {
      return sm90::run_backward<decltype(tag), decltype(hd)::value, decltype(c)::value, decltype(sc)::value>(p, stream);
    });
  } else {
    err = dispatch<Family::kSm80, Direction::kBackward>(q.scalar_type(), kernels, causal, op, [&](auto tag, auto hd, auto c, auto sc) {
      return sm80::run_backward<decltype(tag), decltype(hd)::value, decltype(c)::value, decltype(sc)::value>(p, stream);
    });
  }
  check_cuda(err, op);
}

// The backward's kernels for the call: for v's head dim apart from q's and k's the Hopper backward's
// pair kernels where they serve it, else those of one head dim on padded copies (widened, above).
void backward_any_head_dims(BackwardParams& p, const Tensor& dout, const Tensor& q, const Tensor& k,
                            const Tensor& v, const Tensor& out, const Tensor& lse, Gradients& g,
                            const AttentionShape& s, float scale, const Variant& variant, bool deterministic,
                            const std::string& arch, const char* op) {
  if (s.head_dim_v != s.head_dim) {
    if (const std::optional<Kernels> pair = pair_kernels<Direction::kBackward>(arch, s, variant.softcap > 0, op)) {
      run_backward_kernels(p, BackwardInputs(dout, q, k, v, out, lse), g, s, scale, *pair, variant, deterministic,
                           op);
      return;
    }
  }
  const int64_t d = std::max(s.head_dim, s.head_dim_v);
  const Kernels kernels = backward_kernels(arch, d, variant.softcap > 0, op);
  if (s.head_dim_v == s.head_dim) {
    run_backward_kernels(p, BackwardInputs(dout, q, k, v, out, lse), g, s, scale, kernels, variant, deterministic, op);
    return;
  }
  AttentionShape wide = s;
  wide.head_dim = wide.head_dim_v = d;
  const Tensor qw = widened(q, d), kw = widened(k, d), vw = widened(v, d);
  // The gradients of the padded tensors in their own (wider) buffers, then their first columns.
  auto gradient_of = [&](Tensor& grad, const Tensor& wide_input) {
    return grad.size(grad.dim() - 1) == d ? grad : torch::stable::new_empty(wide_input, wide_input.sizes());
  };
  Gradients gw{gradient_of(g.dq, qw), gradient_of(g.dk, kw), gradient_of(g.dv, vw)};
  run_backward_kernels(p, BackwardInputs(widened(dout, d), qw, kw, vw, widened(out, d), lse), gw, wide, scale,
                       kernels, variant, deterministic, op);
  copy_narrowed(g.dq, gw.dq);
  copy_narrowed(g.dk, gw.dk);
  copy_narrowed(g.dv, gw.dv);
}

std::tuple<Tensor, Tensor, Tensor> backward_cuda(const Tensor& dout_in, const Tensor& q_in,
                                                 const Tensor& k_in, const Tensor& v_in,
                                                 const Tensor& out_in, const Tensor& lse_in,
                                                 std::optional<double> softmax_scale, bool causal,
                                                 int64_t window_left, int64_t window_right, double softcap,
                                                 bool deterministic) {
  constexpr const char* op = "fa.backward";
  const AttentionShape s = check_backward_inputs(dout_in, q_in, k_in, v_in, out_in, lse_in);
  const Variant variant =
      check_variant(op, causal, window_left, window_right, softcap, std::nullopt, q_in, s.heads_q);
  const float scale = resolve_softmax_scale(softmax_scale, s.head_dim);
  const torch::stable::accelerator::DeviceGuard guard(q_in.get_device_index());
  const std::string arch = check_device(q_in, op);
  Gradients g = allocate_gradients(q_in, k_in, v_in);
  if (finish_trivial_backward(s, g)) return {g.dq, g.dk, g.dv};

  BackwardParams p;
  backward_any_head_dims(p, dout_in, q_in, k_in, v_in, out_in, lse_in, g, s, scale, variant, deterministic, arch, op);
  return {g.dq, g.dk, g.dv};
}

std::tuple<Tensor, Tensor, Tensor> backward_varlen_cuda(const Tensor& dout_in, const Tensor& q_in,
                                                        const Tensor& k_in, const Tensor& v_in,
                                                        const Tensor& out_in, const Tensor& lse_in,
                                                        const Tensor& cu_seqlens_q_in, const Tensor& cu_seqlens_k_in,
                                                        int64_t max_seqlen_q, int64_t max_seqlen_k,
                                                        std::optional<double> softmax_scale, bool causal,
                                                        int64_t window_left, int64_t window_right, double softcap,
                                                        bool deterministic) {
  constexpr const char* op = "fa.backward_varlen";
  const VarlenShape s = check_varlen_backward_inputs(dout_in, q_in, k_in, v_in, out_in, lse_in, cu_seqlens_q_in,
                                                     cu_seqlens_k_in, max_seqlen_q, max_seqlen_k);
  const Variant variant =
      check_variant(op, causal, window_left, window_right, softcap, std::nullopt, q_in, s.heads_q);
  const float scale = resolve_softmax_scale(softmax_scale, s.head_dim);
  const torch::stable::accelerator::DeviceGuard guard(q_in.get_device_index());
  const std::string arch = check_device(q_in, op);
  Gradients g = allocate_varlen_gradients(q_in, k_in, v_in);
  if (finish_trivial_backward(s, g)) return {g.dq, g.dk, g.dv};

  const Tensor cu_seqlens_q = dense_last_dim(cu_seqlens_q_in);
  const Tensor cu_seqlens_k = dense_last_dim(cu_seqlens_k_in);
  BackwardParams p;
  set_packed_batch(p, cu_seqlens_q, cu_seqlens_k, s);
  backward_any_head_dims(p, dout_in, q_in, k_in, v_in, out_in, lse_in, g, s, scale, variant, deterministic, arch, op);
  return {g.dq, g.dk, g.dv};
}

}  // namespace
}  // namespace fa::torch_binding

STABLE_TORCH_LIBRARY_IMPL(fa, CUDA, m) {
  m.impl("forward", TORCH_BOX(&fa::torch_binding::forward_cuda));
  m.impl("backward", TORCH_BOX(&fa::torch_binding::backward_cuda));
  m.impl("forward_varlen", TORCH_BOX(&fa::torch_binding::forward_varlen_cuda));
  m.impl("forward_kvcache", TORCH_BOX(&fa::torch_binding::forward_kvcache_cuda));
  m.impl("backward_varlen", TORCH_BOX(&fa::torch_binding::backward_varlen_cuda));
}
