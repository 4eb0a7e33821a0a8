// Slots as PagedTokenAllocator hands them out on a server that has run a while, for measuring
// what a kernel reading the pool through them sees (a uniform shuffle is the worst case of
// locality, and the freshly made pool's ascending order the best).
#ifndef ATTNMETA_KVCACHE_TESTING_SERVING_CHURN_H_
#define ATTNMETA_KVCACHE_TESTING_SERVING_CHURN_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "kvcache/units.h"

namespace attnmeta {
namespace testing {

// The modelled server: `running` requests at once, each a prompt of [prompt_min, prompt_max]
// tokens allocated in one extend, then [decodes_min, decodes_max] decode steps batched with the
// others. A finished request keeps its slots (a prefix cache) until an allocation needs room;
// then the oldest are freed first. The model runs until `turnovers` times the pool's slots
// were handed out; then the measured requests arrive together, each a prompt of
// ctx - decode_tail tokens, then decode_tail decode steps batched together.
struct ServingChurnOptions {
  int64_t running = 64;
  int64_t prompt_min = 512, prompt_max = 8191;
  int64_t decodes_min = 16, decodes_max = 1023;
  int64_t turnovers = 2;
  int64_t decode_tail = 256;  // at most ctx - 1
};

// The slots of `requests` requests of `ctx` tokens each, [requests][ctx], from a page-size-1
// allocator over `pool_slots` slots (padding slot included), seeded with `seed`.
// InvalidArgument: pool_slots outside [2, 2^31], requests < 1, ctx < 2, or options out of range
// (running < 1, 1 <= min <= max for the prompts and decodes, turnovers in [0, 2^63 /
// pool_slots), decode_tail in [0, ctx - 1]); ResourceExhausted: the running and measured
// requests do not fit the pool (requests * ctx > pool_slots - 1 before any churn).
absl::StatusOr<std::vector<TokenSlot>> ServingChurnSlots(int64_t pool_slots, int64_t requests,
                                                         TokenCount ctx, uint64_t seed,
                                                         const ServingChurnOptions& options = {});

// How close a layout's tokens lie: of each request's consecutive tokens, the fraction whose
// slots are neighbours (one apart, either way), and the mean number of distinct regions of
// `region_slots` slots a request touches (a region: what one page of the GPU's virtual memory
// holds of the K pool, 1,024 slots of 2 KB for a 2 MB page).
// REQUIRES: slots.size() is a multiple of ctx >= 2; region_slots >= 1.
struct SlotLocality {
  double neighbour_fraction;
  double regions_per_request;
};
SlotLocality MeasureSlotLocality(const std::vector<TokenSlot>& slots, TokenCount ctx,
                                 int64_t region_slots);

}  // namespace testing
}  // namespace attnmeta

#endif  // ATTNMETA_KVCACHE_TESTING_SERVING_CHURN_H_
