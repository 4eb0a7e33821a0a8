// PlanDecodeSplitKv: when it splits, how long its chunks are, that its items fit one wave of
// the GPU it is sized for and tile every sequence, and what it refuses.

#include "attention/kernels/decode_split_planner.h"

#include <algorithm>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace attnmeta {
namespace {

std::vector<TokenOffset> Indptr(const std::vector<int32_t>& lens) {
  std::vector<TokenOffset> indptr = {TokenOffset(0)};
  for (int32_t len : lens) indptr.push_back(indptr.back() + TokenCount(len));
  return indptr;
}

// Every sequence is covered from 0 to its length by consecutive items of one sequence each,
// a split sequence has one reduce item over its partial slots, an unsplit one writes the
// output; returns the plan's items.
int64_t ExpectTiles(const SplitKvPlan& plan, const std::vector<int32_t>& lens) {
  std::vector<int64_t> covered(lens.size(), 0);
  std::vector<int> items(lens.size(), 0);
  for (const SplitKvWorkItem& w : plan.work) {
    EXPECT_GE(w.sequence, 0);
    EXPECT_LT(w.sequence, static_cast<int32_t>(lens.size()));
    EXPECT_EQ(w.q_begin.value(), w.sequence);
    EXPECT_EQ(w.q_end.value(), w.sequence + 1);
    EXPECT_EQ(w.kv_begin.value(), covered[w.sequence]) << "items of a sequence follow each other";
    covered[w.sequence] = w.kv_end.value();
    ++items[w.sequence];
  }
  int reduce_expected = 0;
  for (size_t i = 0; i < lens.size(); ++i) {
    EXPECT_EQ(covered[i], lens[i]) << "sequence " << i;
    if (items[i] > 1) ++reduce_expected;
  }
  EXPECT_EQ(static_cast<int>(plan.reduce.size()), reduce_expected);
  return static_cast<int64_t>(plan.work.size());
}

constexpr DecodeSplitOptions kH200{/*multiprocessor_count=*/132, /*blocks_per_item=*/8};

// The decode benchmark's shapes on the H200: a batch of half a wave of blocks or more runs
// unsplit (bs 17 x 8 heads = 136 >= 264 / 2).
TEST(DecodeSplitPlannerTest, BatchOfHalfAWaveOrMoreIsNotSplit) {
  for (int32_t bs : {17, 32, 256}) {
    const std::vector<int32_t> lens(bs, 4096);
    auto plan = PlanDecodeSplitKv(Indptr(lens), KvLayout::LinearPerToken(), kH200);
    ASSERT_TRUE(plan.ok()) << plan.status();
    EXPECT_EQ(ExpectTiles(*plan, lens), bs) << "bs " << bs;
    EXPECT_TRUE(plan->reduce.empty());
    EXPECT_EQ(plan->num_partials, 0);
  }
}

// bs 1 x 16k: 32 items of 512 tokens, 256 blocks for 264 slots.
TEST(DecodeSplitPlannerTest, LongSequenceIsCutIntoOneWave) {
  const std::vector<int32_t> lens = {16384};
  auto plan = PlanDecodeSplitKv(Indptr(lens), KvLayout::LinearPerToken(), kH200);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(ExpectTiles(*plan, lens), 32);
  EXPECT_EQ(plan->chunk.value(), 512);
  EXPECT_EQ(plan->num_partials, 32);
}

// bs 8 x 4k: 4 items of 1,024 tokens a sequence, 256 blocks. Chunks sized from the total alone
// (32k / 33 items rounded up to 1,008) cut each sequence into 5 items: 320 blocks, a second
// wave of 56.
TEST(DecodeSplitPlannerTest, RoundingDoesNotSpillIntoASecondWave) {
  const std::vector<int32_t> lens(8, 4096);
  auto plan = PlanDecodeSplitKv(Indptr(lens), KvLayout::LinearPerToken(), kH200);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(ExpectTiles(*plan, lens), 32);
  EXPECT_EQ(plan->chunk.value(), 1024);
}

// Unequal lengths and odd page sizes, on GPUs of 16 to 132 multiprocessors at 1 to 3 blocks
// each, with 3, 8 or 16 blocks per item, so that many waves are not a multiple of the blocks per
// item: the items never exceed the wave, and every chunk is a whole number of 16-token steps and
// of the layout's pages, the shortest that fits.
TEST(DecodeSplitPlannerTest, ItemsFitTheWaveAtEveryLayout) {
  const std::vector<std::vector<int32_t>> batches = {
      {16384}, {1, 30000}, {5000, 77, 1024, 9999}, {100, 100, 100}, {32768, 32768, 16, 4096, 4096}};
  for (int32_t mp : {16, 80, 110, 132}) {
    for (int32_t per_mp : {1, 2, 3}) {
      for (int32_t per_item : {3, 8, 16}) {
        for (int64_t ps : {1, 7, 16, 64}) {
          for (const auto& lens : batches) {
            const KvLayout layout =
                ps == 1 ? KvLayout::LinearPerToken() : KvLayout::Paged(*PageSize::Create(ps));
            const DecodeSplitOptions options{mp, per_item, per_mp};
            SCOPED_TRACE(::testing::Message()
                         << mp << " multiprocessors x " << per_mp << " blocks, " << per_item
                         << " blocks per item, page size " << ps << ", bs " << lens.size()
                         << ", first " << lens[0]);
            auto plan = PlanDecodeSplitKv(Indptr(lens), layout, options);
            ASSERT_TRUE(plan.ok()) << plan.status();
            const int64_t items = ExpectTiles(*plan, lens);
            const int64_t target = int64_t{mp} * per_mp;
            const int64_t bs = static_cast<int64_t>(lens.size());
            if (2 * bs * per_item >= target) {
              EXPECT_EQ(items, bs) << "half a wave or more: not split";
              continue;
            }
            EXPECT_LE(items * per_item, target) << "one wave";
            EXPECT_EQ(plan->chunk.value() % 16, 0);
            EXPECT_EQ(plan->chunk.value() % ps, 0);
            EXPECT_GE(plan->chunk.value(), options.min_chunk.value());
            int64_t most = 0;  // items of one sequence
            for (int32_t len : lens) {
              most = std::max<int64_t>(most, (len + plan->chunk.value() - 1) / plan->chunk.value());
            }
            EXPECT_LE(most, options.max_items_per_sequence);
            // A chunk one quantum shorter would need more items than the wave holds, or cut a
            // sequence into more than max_items_per_sequence.
            const int64_t quantum = ps == 7 ? 112 : std::max<int64_t>(16, ps);
            if (plan->chunk.value() > quantum &&
                plan->chunk.value() - quantum >= options.min_chunk.value()) {
              int64_t shorter = 0, shorter_most = 0;
              const int64_t chunk = plan->chunk.value() - quantum;
              for (int32_t len : lens) {
                shorter += (len + chunk - 1) / chunk;
                shorter_most = std::max<int64_t>(shorter_most, (len + chunk - 1) / chunk);
              }
              EXPECT_TRUE(shorter * per_item > target ||
                          shorter_most > options.max_items_per_sequence)
                  << "the shortest chunk that fits";
            }
          }
        }
      }
    }
  }
}

// Field case (the decode benchmark, 2026-12-01): 132 multiprocessors at one block each and 8
// blocks per item made 17 items of bs 1 x 16k, 136 blocks, 4 of them a second wave. 16 items
// of 1,024 tokens fit.
TEST(DecodeSplitPlannerTest, ItemsRoundDownToTheWave) {
  const std::vector<int32_t> lens = {16384};
  auto plan = PlanDecodeSplitKv(Indptr(lens), KvLayout::LinearPerToken(),
                                DecodeSplitOptions{/*multiprocessor_count=*/132,
                                                   /*blocks_per_item=*/8,
                                                   /*blocks_per_multiprocessor=*/1});
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(ExpectTiles(*plan, lens), 16);
  EXPECT_EQ(plan->chunk.value(), 1024);
}

// Field case (the decode benchmark with 8 query heads on 1 KV head, 2026-12-01): one block per
// item made 256 items of 64 tokens at bs 1 x 16k, and the block that completed the reduce item
// merged 256 partials (26.8 us; 16.6 with 64 items). At most max_items_per_sequence items of a
// sequence, 64 by default.
TEST(DecodeSplitPlannerTest, ItemsOfASequenceAreCapped) {
  const std::vector<int32_t> lens = {16384, 100};
  DecodeSplitOptions options{/*multiprocessor_count=*/132, /*blocks_per_item=*/1};
  auto plan = PlanDecodeSplitKv(Indptr(lens), KvLayout::LinearPerToken(), options);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->chunk.value(), 256);
  EXPECT_EQ(ExpectTiles(*plan, lens), 64 + 1);
  options.max_items_per_sequence = 32;
  plan = PlanDecodeSplitKv(Indptr(lens), KvLayout::LinearPerToken(), options);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->chunk.value(), 512);
  EXPECT_EQ(ExpectTiles(*plan, lens), 32 + 1);
  // The wave (264 items at most) and min_chunk alone: 128 items of 128 tokens.
  options.max_items_per_sequence = 1 << 20;
  plan = PlanDecodeSplitKv(Indptr(lens), KvLayout::LinearPerToken(), options);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->chunk.value(), 128);
  EXPECT_EQ(ExpectTiles(*plan, lens), 128 + 1);
}

// bs 1 x 1k with 8 blocks per item: 8 items of 128 tokens, one 32-token step for each of a
// block's 4 warps (16 items of 64 left two warps of each block idle).
TEST(DecodeSplitPlannerTest, ChunksGiveEveryWarpAStep) {
  const std::vector<int32_t> lens = {1024};
  auto plan = PlanDecodeSplitKv(Indptr(lens), KvLayout::LinearPerToken(), kH200);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->chunk.value(), 128);
  EXPECT_EQ(ExpectTiles(*plan, lens), 8);
}

TEST(DecodeSplitPlannerTest, MinChunkBoundsTheSplit) {
  const std::vector<int32_t> lens = {1000};
  DecodeSplitOptions options = kH200;
  options.min_chunk = TokenCount(300);
  auto plan = PlanDecodeSplitKv(Indptr(lens), KvLayout::LinearPerToken(), options);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->chunk.value(), 304);
  EXPECT_EQ(ExpectTiles(*plan, lens), 4);
}

// min_chunk at its limit, with page size 48: the chunk, a multiple of 48, rounds down to
// fit 2^30 rather than up past it (which PlanSplitKv refused, naming kv_granularity).
TEST(DecodeSplitPlannerTest, ChunksStayWithinThePlannersLimit) {
  DecodeSplitOptions options = kH200;
  options.min_chunk = TokenCount(int64_t{1} << 30);
  auto plan = PlanDecodeSplitKv(Indptr({100}), KvLayout::Paged(*PageSize::Create(48)), options);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->chunk.value(), (int64_t{1} << 30) / 48 * 48);
  EXPECT_EQ(ExpectTiles(*plan, {100}), 1);
}

TEST(DecodeSplitPlannerTest, BadOptionsAndBatchesAreRefused) {
  const std::vector<TokenOffset> indptr = Indptr({100, 200});
  for (DecodeSplitOptions o :
       {DecodeSplitOptions{0, 8}, DecodeSplitOptions{132, 0}, DecodeSplitOptions{132, 8, 0},
        DecodeSplitOptions{132, 8, 2, TokenCount(0)},
        DecodeSplitOptions{132, 8, 2, TokenCount(int64_t{1} << 31)},
        DecodeSplitOptions{132, 8, 2, TokenCount(64), 0}}) {
    EXPECT_EQ(PlanDecodeSplitKv(indptr, KvLayout::LinearPerToken(), o).status().code(),
              absl::StatusCode::kInvalidArgument);
  }
  EXPECT_EQ(PlanDecodeSplitKv({}, KvLayout::LinearPerToken(), kH200).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(PlanDecodeSplitKv(Indptr({100, 0}), KvLayout::LinearPerToken(), kH200).status().code(),
            absl::StatusCode::kInvalidArgument)
      << "a decode row needs a KV token";
  // More sequences than int32 query rows: refused before anything is read or sized (the span
  // claims 2^40 + 1 entries over a buffer of 3; nothing reads past the size check).
  const absl::Span<const TokenOffset> claimed(indptr.data(), (size_t{1} << 40) + 1);
  const absl::Status s = PlanDecodeSplitKv(claimed, KvLayout::LinearPerToken(), kH200).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kOutOfRange) << s;
  EXPECT_EQ(s.message(), "decode split: 1099511627776 sequences, beyond int32 query rows");
}

// The launcher's check of a host plan: the planner's plans pass, and each way a plan can fail
// to be the batch's is refused with a message that says which.
TEST(CheckDecodeSplitPlanTest, RefusesEveryPlanThatIsNotTheBatchs) {
  const std::vector<int32_t> lens = {100, 60, 800};
  const KvLayout linear = KvLayout::LinearPerToken();
  const absl::StatusOr<SplitKvPlan> planned = PlanDecodeSplitKv(
      Indptr(lens), linear, DecodeSplitOptions{/*multiprocessor_count=*/8, /*blocks_per_item=*/8,
                                               /*blocks_per_multiprocessor=*/8});
  ASSERT_TRUE(planned.ok()) << planned.status();
  const SplitKvPlan& plan = *planned;
  ASSERT_GT(plan.num_partials, 0);
  ASSERT_FALSE(plan.reduce.empty());
  EXPECT_TRUE(CheckDecodeSplitPlan(plan, linear, 3).ok()) << CheckDecodeSplitPlan(plan, linear, 3);
  // The split sequence: the one the reduce item merges; one of its items, and a direct item.
  const int32_t split_seq = plan.reduce[0].sequence;
  size_t split_item = plan.work.size(), direct_item = plan.work.size();
  for (size_t k = 0; k < plan.work.size(); ++k) {
    if (plan.work[k].sequence == split_seq && split_item == plan.work.size()) split_item = k;
    if (plan.work[k].partial_slot < 0 && direct_item == plan.work.size()) direct_item = k;
  }
  ASSERT_LT(split_item + 1, plan.work.size());
  ASSERT_EQ(plan.work[split_item + 1].sequence, split_seq);
  ASSERT_LT(direct_item, plan.work.size());

  struct Case {
    const char* words;
    std::function<void(SplitKvPlan&)> edit;
    KvLayout layout = KvLayout::LinearPerToken();
    int64_t bs = 3;
  };
  const std::vector<Case> cases = {
      {"made for layout LinearPerToken, but this decode reads Paged(page_size 16)",
       [](SplitKvPlan&) {}, KvLayout::Paged(*PageSize::Create(16))},
      {"a negative batch size", [](SplitKvPlan&) {}, linear, -1},
      // A batch the plan cannot cover, refused before anything is sized by it (the launcher's
      // bs is what a device span claims).
      {"work items for a batch of 1000000000000 sequences (each needs one)", [](SplitKvPlan&) {},
       linear, int64_t{1000000000000}},
      {"negative num_partials", [](SplitKvPlan& p) { p.num_partials = -1; }},
      {"partial slots for",
       [](SplitKvPlan& p) { p.num_partials = static_cast<int32_t>(p.work.size()) + 1; }},
      {"does not fit a decode batch of 2", [](SplitKvPlan&) {}, linear, 2},
      {"does not fit a decode batch",
       [&](SplitKvPlan& p) {
         p.work[direct_item].q_end = TokenOffset(p.work[direct_item].q_end.value() + 1);
       }},
      {"does not fit a decode batch",  // another row than its sequence's
       [&](SplitKvPlan& p) {
         p.work[direct_item].q_begin = TokenOffset(p.work[direct_item].q_begin.value() + 1);
       }},
      {"does not fit a decode batch",  // the first slot past the partials
       [&](SplitKvPlan& p) { p.work[split_item].partial_slot = p.num_partials; }},
      {"reduce item 0 (sequence",
       [](SplitKvPlan& p) { p.reduce[0].q_end = TokenOffset(p.reduce[0].q_end.value() + 1); }},
      {"reduce item 0 (sequence",
       [](SplitKvPlan& p) { p.reduce[0].q_begin = TokenOffset(p.reduce[0].q_begin.value() + 1); }},
      {"does not fit a decode batch",
       [&](SplitKvPlan& p) { p.work[direct_item].kv_begin = TokenPosition(-1); }},
      {"does not fit a decode batch",
       [&](SplitKvPlan& p) {
         p.work[direct_item].kv_end = TokenPosition(p.work[direct_item].kv_begin.value() - 1);
       }},
      {"written twice",
       [&](SplitKvPlan& p) { p.work[direct_item].partial_slot = p.work[split_item].partial_slot; }},
      {"written twice",
       [&](SplitKvPlan& p) {  // by two items of the split sequence
         p.work[split_item + 1].partial_slot = p.work[split_item].partial_slot;
       }},
      {"which no work item of sequence",
       [&](SplitKvPlan& p) {
         const int32_t other = p.work[direct_item].sequence;
         p.reduce[0].sequence = other;
         p.reduce[0].q_begin = TokenOffset(other);
         p.reduce[0].q_end = TokenOffset(other + 1);
       }},
      {"direct items",
       [&](SplitKvPlan& p) {
         const int32_t gone = p.work[direct_item].sequence;
         p.work.erase(std::remove_if(p.work.begin(), p.work.end(),
                                     [&](const SplitKvWorkItem& w) { return w.sequence == gone; }),
                      p.work.end());
       }},
      {"do not tile its KV from 0",
       [&](SplitKvPlan& p) { p.work[direct_item].kv_begin = TokenPosition(1); }},
      {"is written but never merged", [](SplitKvPlan& p) { p.reduce[0].partial_end -= 1; }},
      {"it needs one direct item, or split items and one reduce item",
       [&](SplitKvPlan& p) {  // the split sequence's items all direct: each writes its output
         for (SplitKvWorkItem& w : p.work) {
           if (w.sequence == split_seq) w.partial_slot = -1;
         }
         p.reduce.clear();
         p.num_partials = 0;
       }},
      {"it needs one direct item, or split items and one reduce item",
       [](SplitKvPlan& p) {  // two reduce items over halves of one sequence's partials
         SplitKvReduceItem second = p.reduce[0];
         const int32_t mid = (p.reduce[0].partial_begin + p.reduce[0].partial_end) / 2;
         p.reduce[0].partial_end = mid;
         second.partial_begin = mid;
         p.reduce.insert(p.reduce.begin() + 1, second);
       }},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.words);
    SplitKvPlan bad = plan;
    c.edit(bad);
    const absl::Status s = CheckDecodeSplitPlan(bad, c.layout, c.bs);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_THAT(std::string(s.message()), ::testing::HasSubstr(c.words));
  }
}

}  // namespace
}  // namespace attnmeta
