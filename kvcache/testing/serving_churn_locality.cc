// Prints how close the tokens of requests lie in a page-size-1 pool after ServingChurnSlots'
// modelled serving churn, next to a uniform shuffle of the same pool (the decode benchmark's
// page-size-1 layout).
//
// Usage: serving_churn_locality POOL_SLOTS REQUESTS CTX [SEED]
// Region: 1,024 slots, a 2 MB page of a K pool of 2 KB slots (8 KV heads x 128 x bf16).
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "kvcache/testing/serving_churn.h"

int main(int argc, char** argv) {
  using namespace attnmeta;
  if (argc < 4) {
    std::fprintf(stderr, "usage: %s POOL_SLOTS REQUESTS CTX [SEED]\n", argv[0]);
    return 2;
  }
  const int64_t pool = std::atoll(argv[1]), requests = std::atoll(argv[2]);
  const TokenCount ctx(std::atoll(argv[3]));
  const uint64_t seed = argc > 4 ? std::strtoull(argv[4], nullptr, 10) : 42;
  absl::StatusOr<std::vector<TokenSlot>> churned =
      testing::ServingChurnSlots(pool, requests, ctx, seed);
  if (!churned.ok()) {
    std::fprintf(stderr, "%s\n", churned.status().ToString().c_str());
    return 1;
  }
  std::vector<TokenSlot> shuffled(pool - 1);
  for (size_t i = 0; i < shuffled.size(); ++i) shuffled[i] = TokenSlot(static_cast<int32_t>(i + 1));
  std::mt19937_64 rng(seed);
  std::shuffle(shuffled.begin(), shuffled.end(), rng);
  shuffled.resize(churned->size());
  constexpr int64_t kRegion = 1024;
  for (const auto& [name, slots] :
       {std::make_pair("churned", &*churned), std::make_pair("shuffled", &shuffled)}) {
    const testing::SlotLocality l = testing::MeasureSlotLocality(*slots, ctx, kRegion);
    std::printf(
        "%-8s %lld requests of %lld tokens over %lld slots: %.1f%% of consecutive tokens "
        "in neighbouring slots, %.0f regions of %lld slots per request\n",
        name, static_cast<long long>(requests), static_cast<long long>(ctx.value()),
        static_cast<long long>(pool), 100.0 * l.neighbour_fraction, l.regions_per_request,
        static_cast<long long>(kRegion));
  }
  return 0;
}
