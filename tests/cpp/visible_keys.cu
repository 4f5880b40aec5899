// Host-side check of common/attention_mask.h's mean_visible_keys (the Hopper backward's estimate of
// the keys a row sees, launch_backward): prints "sq sk left right mean" per case for
// tests/test_variants.py, which compares each with the exact mean.
#include <cstdio>

#include "common/attention_mask.h"

int main() {
  const int cases[][4] = {
      {8192, 8192, -1, 0},   {8192, 8192, 127, 0},  {8192, 8192, 1023, 0}, {8192, 8192, 4095, 0},
      {1700, 600, -1, 0},    {600, 2100, -1, 0},    {1000, 1000, 17, 40},  {300, 300, 5000, 5000},
      {411, 177, 0, 0},      {177, 411, 130, -1},   {1, 32768, -1, 0},     {2048, 2048, -1, -1},
      {129, 4160, 63, 0},    {4160, 129, -1, 0},
  };
  for (const auto& c : cases) {
    std::printf("%d %d %d %d %lld\n", c[0], c[1], c[2], c[3],
                static_cast<long long>(fa::mean_visible_keys(c[0], c[1], c[2], c[3])));
  }
  return 0;
}
