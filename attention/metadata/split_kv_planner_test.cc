#include "attention/metadata/split_kv_planner.h"

#include <algorithm>
#include <functional>
#include <limits>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace attnmeta {
namespace {

std::vector<TokenOffset> Indptr(const std::vector<int32_t>& lens) {
  std::vector<TokenOffset> out = {TokenOffset(0)};
  for (int32_t l : lens) out.push_back(TokenOffset(out.back().value() + l));
  return out;
}

// The case a randomized test drew, to rerun it by hand.
std::string Describe(const std::vector<int32_t>& q_lens, const std::vector<int32_t>& kv_lens,
                     const SplitKvOptions& opt) {
  std::string out = "q_lens {";
  for (int32_t q : q_lens) out += " " + std::to_string(q);
  out += " } kv_lens {";
  for (int32_t kv : kv_lens) out += " " + std::to_string(kv);
  return out + " } layout " + KvLayoutName(opt.layout) + " num_units " +
         std::to_string(opt.num_units) + " kv_granularity " +
         std::to_string(opt.kv_granularity.value()) + " q_tile " +
         std::to_string(opt.q_tile.value());
}

// Checks every invariant of a plan; returns a failure message or "".
std::string CheckPlan(const std::vector<int32_t>& q_lens, const std::vector<int32_t>& kv_lens,
                      const SplitKvOptions& opt, const SplitKvPlan& plan) {
  const std::vector<TokenOffset> qo = Indptr(q_lens);
  // Each (sequence, tile) must be covered exactly once over [0, kv_len).
  std::map<std::pair<int, int32_t>, std::vector<std::pair<int32_t, int32_t>>> ranges;
  for (const SplitKvWorkItem& w : plan.work) {
    ranges[{w.sequence, w.q_begin.value()}].push_back({w.kv_begin.value(), w.kv_end.value()});
    if (w.kv_begin.value() % plan.chunk.value() != 0) return "kv_begin not on a chunk boundary";
    if (w.kv_end.value() % plan.chunk.value() != 0 && w.kv_end.value() != kv_lens[w.sequence]) {
      return "kv_end not on a chunk boundary";
    }
    if (opt.layout.paged() && w.kv_begin.value() % opt.layout.block().tokens() != 0) {
      return "paged split inside a page";
    }
  }
  int64_t tiles = 0;
  for (size_t i = 0; i < q_lens.size(); ++i) {
    for (int32_t q0 = 0; q0 < q_lens[i]; q0 += static_cast<int32_t>(opt.q_tile.value())) {
      ++tiles;
      auto it = ranges.find({static_cast<int>(i), qo[i].value() + q0});
      if (it == ranges.end()) return "a tile has no work";
      std::vector<std::pair<int32_t, int32_t>> r = it->second;
      std::sort(r.begin(), r.end());
      int32_t at = 0;
      for (auto [b, e] : r) {
        if (b != at || e <= b) return "tile's KV ranges overlap or leave a gap";
        at = e;
      }
      if (at != kv_lens[i]) return "tile's KV ranges do not end at kv_len";
    }
  }
  if (static_cast<int64_t>(ranges.size()) != tiles) return "work for a tile that does not exist";
  // Balance: no unit above ceil(total / units) chunks (the mean plus at most one chunk).
  int64_t total = 0;
  std::vector<int64_t> per_unit(opt.num_units, 0);
  for (int u = 0; u < opt.num_units; ++u) {
    for (int32_t w = plan.unit_indptr[u]; w < plan.unit_indptr[u + 1]; ++w) {
      const SplitKvWorkItem& item = plan.work[w];
      const int64_t c = (item.kv_end.value() - item.kv_begin.value() + plan.chunk.value() - 1) /
                        plan.chunk.value();
      per_unit[u] += c;
      total += c;
    }
  }
  if (plan.unit_indptr.back() != static_cast<int32_t>(plan.work.size())) return "unit_indptr end";
  const double mean = static_cast<double>(total) / opt.num_units;
  for (int64_t c : per_unit) {
    if (c > mean + 1) return "a unit has more than the mean plus one chunk";
  }
  // Partial slots: split tiles only, each slot once, within the capacity function.
  const SplitKvCapacity cap = SplitKvCapacityFor(tiles, opt.num_units);
  if (static_cast<int64_t>(plan.work.size()) > cap.work_items) return "work items over capacity";
  if (plan.num_partials > cap.partials) return "partials over capacity";
  if (static_cast<int64_t>(plan.reduce.size()) > cap.reduce_items) return "reduce over capacity";
  std::vector<int> used(plan.num_partials, 0);
  for (const SplitKvWorkItem& w : plan.work) {
    const bool split = ranges[{w.sequence, w.q_begin.value()}].size() > 1;
    if (split != (w.partial_slot >= 0)) return "partial slot on an unsplit tile or missing";
    if (w.partial_slot >= 0) ++used[w.partial_slot];
  }
  for (int u : used) {
    if (u != 1) return "a partial slot used other than once";
  }
  for (const SplitKvReduceItem& r : plan.reduce) {
    if (r.partial_end - r.partial_begin != static_cast<int32_t>(ranges[{r.sequence, r.q_begin.value()}].size())) {
      return "reduce item does not cover its tile's partials";
    }
  }
  return "";
}

TEST(SplitKvPlannerTest, LinearLayoutSplitsInTokens) {
  SplitKvOptions opt;
  opt.layout = KvLayout::LinearPerToken();
  opt.num_units = 4;
  opt.kv_granularity = TokenCount(128);
  opt.q_tile = TokenCount(64);
  auto plan = PlanSplitKv(Indptr({1}), Indptr({1000}), opt);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->chunk, TokenCount(128));
  EXPECT_EQ(CheckPlan({1}, {1000}, opt, *plan), "");
  EXPECT_EQ(plan->work.size(), 4u);
  EXPECT_EQ(plan->reduce.size(), 1u);
  EXPECT_EQ(plan->work.back().kv_end, TokenPosition(1000));
}

TEST(SplitKvPlannerTest, PagedLayoutSplitsOnWholePages) {
  SplitKvOptions opt;
  opt.layout = KvLayout::Paged(*PageSize::Create(48));
  opt.num_units = 3;
  opt.kv_granularity = TokenCount(128);
  auto plan = PlanSplitKv(Indptr({2, 1}), Indptr({500, 1000}), opt);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->chunk, TokenCount(144));  // 128 rounded up to whole pages of 48
  EXPECT_EQ(CheckPlan({2, 1}, {500, 1000}, opt, *plan), "");
}

TEST(SplitKvPlannerTest, RandomBatchesKeepEveryInvariant) {
  const uint64_t seed = 20261129;
  std::mt19937_64 rng(seed);
  for (int iter = 0; iter < 500; ++iter) {
    const int bs = std::uniform_int_distribution<int>(0, 12)(rng);
    std::vector<int32_t> q, kv;
    for (int i = 0; i < bs; ++i) {
      kv.push_back(std::uniform_int_distribution<int32_t>(0, 3000)(rng));
      q.push_back(std::uniform_int_distribution<int32_t>(0, std::min(kv.back(), 300))(rng));
    }
    SplitKvOptions opt;
    const int64_t ps = std::vector<int64_t>{1, 2, 7, 16, 64}[iter % 5];
    opt.layout = iter % 2 ? KvLayout::Paged(*PageSize::Create(ps)) : KvLayout::LinearPerToken();
    opt.num_units = std::uniform_int_distribution<int32_t>(1, 140)(rng);
    opt.kv_granularity = TokenCount(std::uniform_int_distribution<int64_t>(1, 300)(rng));
    opt.q_tile = TokenCount(std::uniform_int_distribution<int64_t>(1, 128)(rng));
    auto plan = PlanSplitKv(Indptr(q), Indptr(kv), opt);
    ASSERT_TRUE(plan.ok()) << plan.status() << " seed " << seed << " iter " << iter << ": "
                           << Describe(q, kv, opt);
    ASSERT_EQ(CheckPlan(q, kv, opt, *plan), "")
        << "seed " << seed << " iter " << iter << ": " << Describe(q, kv, opt);
  }
}

// The fixed-buffer entry point writes the same plan into spans of exactly the capacity the
// batch can need, leaves the tails alone, and refuses spans one entry short.
TEST(SplitKvPlannerTest, IntoFixedBuffersAtExactlyTheCapacity) {
  const std::vector<int32_t> q = {1, 40, 0, 7};
  const std::vector<int32_t> kv = {900, 300, 5, 2000};
  SplitKvOptions opt;
  opt.num_units = 9;
  opt.kv_granularity = TokenCount(64);
  opt.q_tile = TokenCount(16);
  auto plan = PlanSplitKv(Indptr(q), Indptr(kv), opt);
  ASSERT_TRUE(plan.ok()) << plan.status();
  const SplitKvCapacity cap = SplitKvCapacityFor(*NumQueryTiles(Indptr(q), opt.q_tile), 9);
  const SplitKvWorkItem poison_w{-7, TokenOffset(-7), TokenOffset(-7), TokenPosition(-7),
                                 TokenPosition(-7), -7};
  const SplitKvReduceItem poison_r{-7, TokenOffset(-7), TokenOffset(-7), -7, -7};
  std::vector<SplitKvWorkItem> work(cap.work_items, poison_w);
  std::vector<SplitKvReduceItem> reduce(cap.reduce_items, poison_r);
  std::vector<int32_t> units(10, -7);
  auto counts = PlanSplitKvInto(Indptr(q), Indptr(kv), opt,
                                {absl::MakeSpan(work), absl::MakeSpan(units), absl::MakeSpan(reduce)});
  ASSERT_TRUE(counts.ok()) << counts.status();
  // What the spans hold is a valid plan of this batch by the checks above (independent of the
  // planner), and the same one the vector form returns.
  SplitKvPlan from_spans;
  from_spans.layout = opt.layout;
  from_spans.chunk = counts->chunk;
  from_spans.work.assign(work.begin(), work.begin() + counts->work_items);
  from_spans.unit_indptr = units;
  from_spans.reduce.assign(reduce.begin(), reduce.begin() + counts->reduce_items);
  from_spans.num_partials = counts->num_partials;
  EXPECT_EQ(CheckPlan(q, kv, opt, from_spans), "");
  for (size_t i = 0; i < plan->reduce.size(); ++i) {
    const SplitKvReduceItem& r = reduce[i];
    const SplitKvReduceItem& want = plan->reduce[i];
    EXPECT_TRUE(r.sequence == want.sequence && r.q_begin == want.q_begin && r.q_end == want.q_end &&
                r.partial_begin == want.partial_begin && r.partial_end == want.partial_end)
        << "reduce item " << i;
  }
  ASSERT_EQ(counts->work_items, static_cast<int64_t>(plan->work.size()));
  ASSERT_EQ(counts->reduce_items, static_cast<int64_t>(plan->reduce.size()));
  EXPECT_EQ(counts->num_partials, plan->num_partials);
  EXPECT_EQ(counts->chunk, plan->chunk);
  EXPECT_EQ(units, plan->unit_indptr);
  for (size_t i = 0; i < work.size(); ++i) {
    const SplitKvWorkItem& w = work[i];
    const SplitKvWorkItem& want = i < plan->work.size() ? plan->work[i] : poison_w;
    EXPECT_TRUE(w.sequence == want.sequence && w.q_begin == want.q_begin &&
                w.q_end == want.q_end && w.kv_begin == want.kv_begin &&
                w.kv_end == want.kv_end && w.partial_slot == want.partial_slot)
        << "work item " << i;
  }
  for (size_t i = plan->reduce.size(); i < reduce.size(); ++i) {
    EXPECT_EQ(reduce[i].sequence, -7) << "reduce tail " << i;
  }
  // One short: refused, nothing written.
  std::vector<SplitKvWorkItem> short_work(cap.work_items - 1, poison_w);
  std::vector<int32_t> untouched(10, -7);
  EXPECT_EQ(PlanSplitKvInto(Indptr(q), Indptr(kv), opt,
                            {absl::MakeSpan(short_work), absl::MakeSpan(untouched),
                             absl::MakeSpan(reduce)})
                .status()
                .code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(untouched, std::vector<int32_t>(10, -7));
  for (const SplitKvWorkItem& w : short_work) EXPECT_EQ(w.sequence, -7);
  // The reduce items or the unit offsets one short: refused too, nothing written.
  std::vector<SplitKvWorkItem> fresh_work(cap.work_items, poison_w);
  std::vector<SplitKvReduceItem> short_reduce(cap.reduce_items - 1, poison_r);
  EXPECT_EQ(PlanSplitKvInto(Indptr(q), Indptr(kv), opt,
                            {absl::MakeSpan(fresh_work), absl::MakeSpan(untouched),
                             absl::MakeSpan(short_reduce)})
                .status()
                .code(),
            absl::StatusCode::kResourceExhausted);
  std::vector<int32_t> short_units(9, -7);
  EXPECT_EQ(PlanSplitKvInto(
                Indptr(q), Indptr(kv), opt,
                {absl::MakeSpan(fresh_work), absl::MakeSpan(short_units), absl::MakeSpan(reduce)})
                .status()
                .code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(untouched, std::vector<int32_t>(10, -7));
  EXPECT_EQ(short_units, std::vector<int32_t>(9, -7));
  for (const SplitKvWorkItem& w : fresh_work) EXPECT_EQ(w.sequence, -7);
  for (const SplitKvReduceItem& r : short_reduce) EXPECT_EQ(r.sequence, -7);
}

// No unit boundaries without units: a count below one is none, the lowest int32 too.
TEST(SplitKvPlannerTest, CapacityOfNoUnits) {
  for (int32_t units : {1, 0, -5, std::numeric_limits<int32_t>::min()}) {
    const SplitKvCapacity c = SplitKvCapacityFor(7, units);
    EXPECT_EQ(c.work_items, 7) << units;
    EXPECT_EQ(c.reduce_items, 0) << units;
    EXPECT_EQ(c.partials, 0) << units;
  }
}

TEST(SplitKvPlannerTest, NumQueryTiles) {
  EXPECT_EQ(*NumQueryTiles(Indptr({0, 1, 64, 65, 200}), TokenCount(64)), 0 + 1 + 1 + 2 + 4);
  EXPECT_EQ(*NumQueryTiles(Indptr({}), TokenCount(64)), 0);
  // A tile larger than any batch: one tile per sequence with rows (no q + q_tile - 1 wrap).
  EXPECT_EQ(*NumQueryTiles(Indptr({2, 0, INT32_MAX - 2}), TokenCount(INT64_MAX)), 2);
  // A tile of no rows divides nothing: refused, not a division by zero.
  EXPECT_EQ(NumQueryTiles(Indptr({0, 1}), TokenCount(0)).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(SplitKvPlannerTest, RejectsBadInput) {
  SplitKvOptions opt;
  EXPECT_EQ(PlanSplitKv(Indptr({2}), Indptr({1}), opt).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(PlanSplitKv(Indptr({1, 1}), Indptr({4}), opt).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(PlanSplitKv({TokenOffset(1), TokenOffset(2)}, Indptr({4}), opt).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(PlanSplitKv({TokenOffset(0), TokenOffset(2), TokenOffset(1)}, Indptr({4, 4}), opt)
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  for (auto bad : std::vector<std::function<void(SplitKvOptions&)>>{
           [](SplitKvOptions& o) { o.num_units = 0; },
           [](SplitKvOptions& o) { o.num_units = INT32_MAX; },
           [](SplitKvOptions& o) { o.kv_granularity = TokenCount(0); },
           [](SplitKvOptions& o) { o.kv_granularity = TokenCount(INT64_MAX); },
           [](SplitKvOptions& o) { o.q_tile = TokenCount(-3); },
       }) {
    SplitKvOptions o;
    bad(o);
    EXPECT_EQ(PlanSplitKv(Indptr({1}), Indptr({4}), o).status().code(),
              absl::StatusCode::kInvalidArgument);
  }
}

// Each option's largest value is taken and the next one refused: num_units up to 2^20,
// kv_granularity and q_tile up to 2^30 (past it the tile count's q + q_tile - 1 could wrap).
TEST(SplitKvPlannerTest, OptionsAtTheirBounds) {
  const auto code = [](const std::function<void(SplitKvOptions&)>& set) {
    SplitKvOptions o;
    set(o);
    return PlanSplitKv(Indptr({1}), Indptr({4}), o).status().code();
  };
  constexpr int64_t kTokens = int64_t{1} << 30;
  EXPECT_EQ(code([](SplitKvOptions& o) { o.num_units = 1 << 20; }), absl::StatusCode::kOk);
  EXPECT_EQ(code([](SplitKvOptions& o) { o.num_units = (1 << 20) + 1; }),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code([](SplitKvOptions& o) { o.kv_granularity = TokenCount(kTokens); }),
            absl::StatusCode::kOk);
  EXPECT_EQ(code([](SplitKvOptions& o) { o.kv_granularity = TokenCount(kTokens + 1); }),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code([](SplitKvOptions& o) { o.q_tile = TokenCount(kTokens); }), absl::StatusCode::kOk);
  EXPECT_EQ(code([](SplitKvOptions& o) { o.q_tile = TokenCount(kTokens + 1); }),
            absl::StatusCode::kInvalidArgument);
}

std::vector<TokenLength> Lengths(const std::vector<int32_t>& lens) {
  std::vector<TokenLength> out;
  for (int32_t l : lens) out.push_back(TokenLength(l));
  return out;
}

// A batch whose query tiles plus unit boundaries pass int32 work-item offsets: refused before
// the planner allocates (about 51 GB here) or the counter loops over 2^31 tiles.
TEST(SplitKvPlannerTest, WorkItemsPastInt32AreRefused) {
  SplitKvOptions o;
  o.num_units = 1 << 20;
  o.kv_granularity = TokenCount(1);
  o.q_tile = TokenCount(1);
  // 2^31 - 2^20 + 1 tiles and 2^20 - 1 boundaries: 2^31 work items at most, one too many.
  const int32_t q = std::numeric_limits<int32_t>::max() - (1 << 20) + 2;
  const absl::Status counted = CountSplitKvPlan(Lengths({q}), Lengths({q}), o).status();
  EXPECT_EQ(counted.code(), absl::StatusCode::kOutOfRange) << counted;
  EXPECT_THAT(std::string(counted.message()), ::testing::HasSubstr("2147483648 work items"));
  // Into empty spans, so that a planner without the bound fails on capacity, allocating
  // nothing; PlanSplitKv runs the same input checks.
  const absl::Status planned =
      PlanSplitKvInto(Indptr({q}), Indptr({q}), o, SplitKvPlanSpans{}).status();
  EXPECT_EQ(planned.code(), absl::StatusCode::kOutOfRange) << planned;
}

// CountSplitKvPlan, from the lengths alone, reports what the planner writes, on random batches
// that reach every split shape (no split, tiles over many units, units with nothing).
TEST(SplitKvPlannerTest, CountsFromLengthsEqualWhatThePlanWrites) {
  const uint64_t seed = 20261130;
  std::mt19937_64 rng(seed);
  for (int iter = 0; iter < 2000; ++iter) {
    const int bs = std::uniform_int_distribution<int>(0, 14)(rng);
    std::vector<int32_t> q, kv;
    for (int i = 0; i < bs; ++i) {
      kv.push_back(std::uniform_int_distribution<int32_t>(0, 4000)(rng));
      q.push_back(std::uniform_int_distribution<int32_t>(0, std::min(kv.back(), 200))(rng));
    }
    SplitKvOptions opt;
    const int64_t ps = std::vector<int64_t>{1, 2, 7, 16, 64}[iter % 5];
    opt.layout = iter % 2 ? KvLayout::Paged(*PageSize::Create(ps)) : KvLayout::LinearPerToken();
    opt.num_units = std::uniform_int_distribution<int32_t>(1, 300)(rng);
    opt.kv_granularity = TokenCount(std::uniform_int_distribution<int64_t>(1, 600)(rng));
    opt.q_tile = TokenCount(std::uniform_int_distribution<int64_t>(1, 128)(rng));
    auto plan = PlanSplitKv(Indptr(q), Indptr(kv), opt);
    auto counts = CountSplitKvPlan(Lengths(q), Lengths(kv), opt);
    ASSERT_TRUE(plan.ok() && counts.ok())
        << plan.status() << counts.status() << " " << Describe(q, kv, opt);
    const std::string at = "seed " + std::to_string(seed) + " iter " + std::to_string(iter) + ": " +
                           Describe(q, kv, opt);
    EXPECT_EQ(counts->chunk, plan->chunk) << at;
    EXPECT_EQ(counts->work_items, static_cast<int64_t>(plan->work.size())) << at;
    EXPECT_EQ(counts->reduce_items, static_cast<int64_t>(plan->reduce.size())) << at;
    EXPECT_EQ(counts->num_partials, plan->num_partials) << at;
  }
  SplitKvOptions opt;
  EXPECT_EQ(CountSplitKvPlan(Lengths({2}), Lengths({1}), opt).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CountSplitKvPlan(Lengths({-1}), Lengths({1}), opt).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CountSplitKvPlan(Lengths({1, 1}), Lengths({4}), opt).status().code(),
            absl::StatusCode::kInvalidArgument);
  opt.num_units = 0;
  EXPECT_EQ(CountSplitKvPlan(Lengths({1}), Lengths({4}), opt).status().code(),
            absl::StatusCode::kInvalidArgument);
  // Lengths whose sums pass the int32 indptrs the planner plans from: each of three sequences
  // of 2^31 - 1 rows would add 2^62 chunks, past INT64_MAX together.
  SplitKvOptions fine;
  fine.kv_granularity = TokenCount(1);
  const int32_t max = std::numeric_limits<int32_t>::max();
  EXPECT_EQ(CountSplitKvPlan(Lengths({max, max, max}), Lengths({max, max, max}), fine)
                .status()
                .code(),
            absl::StatusCode::kOutOfRange);
  EXPECT_EQ(CountSplitKvPlan(Lengths({0, 0}), Lengths({max, 1}), fine).status().code(),
            absl::StatusCode::kOutOfRange);
  EXPECT_TRUE(CountSplitKvPlan(Lengths({0, 0}), Lengths({max - 1, 1}), fine).ok());
}

}  // namespace
}  // namespace attnmeta
