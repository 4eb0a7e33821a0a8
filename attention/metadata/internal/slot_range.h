// The bound on a KV pool's size, and a fast "are all these slots in [lo, hi)?", shared by the
// validator, the snapshot loader and the gather: one branch-free pass. Callers search for the
// offending entry (to name it) only when it returns false.

#ifndef ATTNMETA_ATTENTION_METADATA_INTERNAL_SLOT_RANGE_H_
#define ATTNMETA_ATTENTION_METADATA_INTERNAL_SLOT_RANGE_H_

#include <algorithm>
#include <cstdint>

#include "absl/types/span.h"
#include "kvcache/units.h"

namespace attnmeta {
namespace internal {

// The most slots a KV pool can have: int32 slots address [0, 2^31).
inline constexpr int64_t kMaxPoolSlots = int64_t{1} << 31;

// Whether a pool of `pool_slots` slots can exist (a size outside [0, kMaxPoolSlots] is the
// caller's bug).
inline bool PoolSlotsAddressable(int64_t pool_slots) {
  return pool_slots >= 0 && pool_slots <= kMaxPoolSlots;
}

// REQUIRES: 0 <= lo <= 2^31. (hi is clamped to [lo, 2^31]: no int32 slot reaches 2^31.)
inline bool AllSlotsIn(absl::Span<const TokenSlot> slots, int64_t lo, int64_t hi) {
  hi = std::max(lo, std::min<int64_t>(hi, kMaxPoolSlots));
  // v in [lo, hi) iff (unsigned)(v - lo) < hi - lo: one compare, no branch. Four scalar
  // accumulators (not an array, which the compiler would keep in memory).
  const uint32_t base = static_cast<uint32_t>(lo);
  const uint32_t span = static_cast<uint32_t>(hi - lo);
  const TokenSlot* p = slots.data();
  const size_t n = slots.size();
  uint32_t b0 = 0, b1 = 0, b2 = 0, b3 = 0;
  size_t k = 0;
  for (; k + 4 <= n; k += 4) {
    b0 |= static_cast<uint32_t>(p[k].value()) - base >= span;
    b1 |= static_cast<uint32_t>(p[k + 1].value()) - base >= span;
    b2 |= static_cast<uint32_t>(p[k + 2].value()) - base >= span;
    b3 |= static_cast<uint32_t>(p[k + 3].value()) - base >= span;
  }
  for (; k < n; ++k) b0 |= static_cast<uint32_t>(p[k].value()) - base >= span;
  return (b0 | b1 | b2 | b3) == 0;
}

}  // namespace internal
}  // namespace attnmeta

#endif  // ATTNMETA_ATTENTION_METADATA_INTERNAL_SLOT_RANGE_H_
