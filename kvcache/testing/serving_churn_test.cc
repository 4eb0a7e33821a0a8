#include "kvcache/testing/serving_churn.h"

#include <algorithm>
#include <functional>
#include <limits>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace attnmeta {
namespace testing {
namespace {

// Room for the 64 running requests of up to 9,214 tokens and the measured ones.
constexpr int64_t kPool = 2000000;
constexpr TokenCount kCtx(4096);

TEST(ServingChurnTest, SlotsAreDistinctAndInThePool) {
  ServingChurnOptions o;
  o.turnovers = 1;
  absl::StatusOr<std::vector<TokenSlot>> slots = ServingChurnSlots(kPool, 16, kCtx, 7, o);
  ASSERT_TRUE(slots.ok()) << slots.status();
  ASSERT_EQ(slots->size(), 16u * 4096u);
  std::vector<int32_t> v;
  for (TokenSlot s : *slots) v.push_back(s.value());
  EXPECT_GE(*std::min_element(v.begin(), v.end()), 1) << "slot 0 is the padding slot";
  EXPECT_LT(*std::max_element(v.begin(), v.end()), kPool);
  std::sort(v.begin(), v.end());
  EXPECT_EQ(std::adjacent_find(v.begin(), v.end()), v.end()) << "a slot handed out twice";
}

TEST(ServingChurnTest, DeterministicPerSeed) {
  ServingChurnOptions o;
  o.turnovers = 1;
  const auto a = ServingChurnSlots(kPool, 4, kCtx, 11, o);
  const auto b = ServingChurnSlots(kPool, 4, kCtx, 11, o);
  const auto c = ServingChurnSlots(kPool, 4, kCtx, 12, o);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  EXPECT_EQ(*a, *b);
  EXPECT_NE(*a, *c);
}

TEST(ServingChurnTest, LocalityOfAHandLayout) {
  const std::vector<TokenSlot> slots = {TokenSlot(1),  TokenSlot(2),   TokenSlot(3),
                                        TokenSlot(10), TokenSlot(20),  TokenSlot(19),
                                        TokenSlot(18), TokenSlot(5000)};
  const SlotLocality l = MeasureSlotLocality(slots, TokenCount(4), 1024);
  EXPECT_DOUBLE_EQ(l.neighbour_fraction, 4.0 / 6.0);
  EXPECT_DOUBLE_EQ(l.regions_per_request, 1.5);
}

// The churned slots keep most of a prompt's tokens next to each other, where a uniform shuffle
// of the same pool keeps almost none: the model is not a shuffle in disguise.
TEST(ServingChurnTest, ChurnedSlotsAreNotAShuffle) {
  ServingChurnOptions o;
  o.turnovers = 2;
  const auto churned = ServingChurnSlots(kPool, 8, kCtx, 3, o);
  ASSERT_TRUE(churned.ok()) << churned.status();
  std::vector<TokenSlot> shuffled(kPool - 1);
  for (size_t i = 0; i < shuffled.size(); ++i) shuffled[i] = TokenSlot(static_cast<int32_t>(i + 1));
  std::mt19937_64 rng(3);
  std::shuffle(shuffled.begin(), shuffled.end(), rng);
  shuffled.resize(8 * 4096);
  const SlotLocality c = MeasureSlotLocality(*churned, kCtx, 1024);
  const SlotLocality s = MeasureSlotLocality(shuffled, kCtx, 1024);
  EXPECT_GT(c.neighbour_fraction, 0.5);
  EXPECT_LT(s.neighbour_fraction, 0.01);
  EXPECT_LT(c.regions_per_request, s.regions_per_request / 4);
}

TEST(ServingChurnTest, BadInputIsRefused) {
  EXPECT_EQ(ServingChurnSlots(1, 1, kCtx, 0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ServingChurnSlots(kPool, 0, kCtx, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ServingChurnSlots(kPool, 1, TokenCount(1), 0).status().code(),
            absl::StatusCode::kInvalidArgument);
  ServingChurnOptions o;
  o.decode_tail = 4096;
  EXPECT_EQ(ServingChurnSlots(kPool, 1, kCtx, 0, o).status().code(),
            absl::StatusCode::kInvalidArgument);
  o = ServingChurnOptions{};
  o.prompt_min = 9000;
  EXPECT_EQ(ServingChurnSlots(kPool, 1, kCtx, 0, o).status().code(),
            absl::StatusCode::kInvalidArgument);
  // Each other option out of its range (no running request would churn forever).
  for (const auto& bad : std::vector<std::function<void(ServingChurnOptions&)>>{
           [](ServingChurnOptions& x) { x.running = 0; },
           [](ServingChurnOptions& x) { x.prompt_min = 0; },
           [](ServingChurnOptions& x) { x.decodes_min = 0; },
           [](ServingChurnOptions& x) { x.decodes_min = x.decodes_max + 1; },
           [](ServingChurnOptions& x) { x.turnovers = -1; },
           [](ServingChurnOptions& x) { x.decode_tail = -1; },
       }) {
    o = ServingChurnOptions{};
    bad(o);
    EXPECT_EQ(ServingChurnSlots(kPool, 1, kCtx, 0, o).status().code(),
              absl::StatusCode::kInvalidArgument);
  }
  // 64 running prompts of at least 512 tokens do not fit 10,000 slots.
  EXPECT_EQ(ServingChurnSlots(10000, 1, kCtx, 0).status().code(),
            absl::StatusCode::kResourceExhausted);
  o = ServingChurnOptions{};
  o.turnovers = std::numeric_limits<int64_t>::max() / kPool + 1;  // turnovers * kPool overflows
  EXPECT_EQ(ServingChurnSlots(kPool, 1, kCtx, 0, o).status().code(),
            absl::StatusCode::kInvalidArgument);
  // Measured requests that cannot fit are refused before the churn and before the output is
  // sized (requests * ctx would overflow; without the check the churn ran, then the reserve
  // for 2^62 requests aborted the process).
  EXPECT_EQ(ServingChurnSlots(kPool, int64_t{1} << 62, kCtx, 0).status().code(),
            absl::StatusCode::kResourceExhausted);
}

}  // namespace
}  // namespace testing
}  // namespace attnmeta
