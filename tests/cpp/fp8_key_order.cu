// The FP8 forward's key order against CuTe's wgmma layouts, on the host (no GPU). The transpose
// pass stores each 16 keys of Vᵀ in the order of P's e4m3 A fragment (sm90/transpose_v.h,
// fp8_v_key_of_slot), so that fp8_probs_as_a_operand (sm90/fragments.h) builds each thread's part
// of P from its own accumulator. That holds when, for every thread and row, the keys its slots of
// P's A operand (O += P V) stand for are the key columns its S = Q Kᵀ accumulator holds. Checked
// for every thread of the consumer warpgroups of each FP8 tile (192 × 96 at D = 128 and 192/128,
// 128 × 192 at D = 64); and, as a control that must fail, for keys in their own order (the slot
// is the key). Exits 1 on a mismatch. Built and run by tests/test_fp8_key_order.py.
#include <cstdio>
#include <map>
#include <set>

#include <cute/tensor.hpp>

#include "sm90/fwd_launch.h"  // Fp8ForwardTile, ForwardConfig
#include "sm90/transpose_v.h"

using namespace cute;

namespace {

// Threads whose keys differ between S's accumulator and P's operand, with slot → key `key_of`.
template <class Config, class KeyOf>
int mismatched_threads(KeyOf key_of) {
  typename Config::TiledMmaS mma_s;
  typename Config::TiledMmaO mma_o;
  constexpr int kBlockM = Config::kBlockM, kBlockN = Config::kBlockN;
  // (row, column): a key of S's accumulator, a slot of P's operand.
  auto coords = make_identity_tensor(Shape<Int<kBlockM>, Int<kBlockN>>{});
  int bad = 0;
  for (int t = 0; t < int(size(mma_s)); ++t) {
    auto s = mma_s.get_thread_slice(t).partition_C(coords);
    auto p = mma_o.get_thread_slice(t).partition_A(coords);
    std::map<int, std::multiset<int>> s_keys, p_keys;  // row → keys
    for (int i = 0; i < int(size(s)); ++i) s_keys[int(get<0>(s(i)))].insert(int(get<1>(s(i))));
    for (int i = 0; i < int(size(p)); ++i) {
      const int slot = int(get<1>(p(i)));
      p_keys[int(get<0>(p(i)))].insert(slot / 16 * 16 + key_of(slot % 16));
    }
    if (s_keys != p_keys || s_keys.empty()) ++bad;
  }
  return bad;
}

template <int kHeadDim, int kHeadDimV>
int check(const char* name) {
  using Tile = fa::sm90::Fp8ForwardTile<kHeadDim, kHeadDimV>;
  using Config = fa::sm90::ForwardConfig<cutlass::float_e4m3_t, kHeadDim, Tile::kBlockM, Tile::kBlockN, Tile::kStages,
                                         kHeadDimV>;
  const int threads = int(size(typename Config::TiledMmaS{}));
  const int permuted = mismatched_threads<Config>([](int slot) { return fa::sm90::fp8_v_key_of_slot(slot); });
  const int plain = mismatched_threads<Config>([](int slot) { return slot; });
  std::printf("%s, tile %d x %d: %d threads; fp8_v_key_of_slot: %d mismatched; "
              "keys in their own order (control): %d\n",
              name, Config::kBlockM, Config::kBlockN, threads, permuted, plain);
  return permuted == 0 && plain == threads && threads == Config::kMmaThreads ? 0 : 1;
}

}  // namespace

int main() {
  int failures = check<128, 128>("D 128") + check<192, 128>("D 192/128") + check<64, 64>("D 64");
  std::printf(failures == 0 ? "ok\n" : "FAILED\n");
  return failures == 0 ? 0 : 1;
}
