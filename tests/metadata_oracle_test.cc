// The oracle of the metadata layer: for every forward mode, page sizes 1, 2, 7, 16 and 64,
// shuffled page pools, unaligned lengths and prefix reuse, attention read through each kind
// of metadata (token-level kv_indices, page table, context-prefill gather, split-KV plan)
// equals dense attention over the logical, unpaged sequences (AttentionProblem).

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "attention/metadata/builders.h"
#include "attention/metadata/context_gather.h"
#include "attention/metadata/reference_attention.h"
#include "attention/metadata/split_kv_planner.h"
#include "attention/metadata/testing/attention_problem.h"
#include "attention/metadata/testing/batch_fixture.h"
#include "gtest/gtest.h"

namespace attnmeta {
namespace {

using testing::BatchFixture;

using testing::AttentionProblem;
using testing::MakeAttentionProblem;
using testing::RelativeL2Error;

constexpr AttentionDims kDims{4, 2, 8};

struct Case {
  ForwardMode mode;
  int64_t page_size;
  uint64_t seed;
};

std::string Describe(const Case& c) {
  return absl::StrCat("mode=", ForwardModeName(c.mode), " page_size=", c.page_size,
                      " seed=", c.seed);
}

// Adds sequences for the mode: unaligned cached prefixes, some shared with earlier sequences.
void AddSequences(const Case& c, std::mt19937_64& rng, BatchFixture& f) {
  if (c.mode == ForwardMode::kIdle) return;
  auto uniform = [&](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };
  const int bs = static_cast<int>(uniform(1, 7));
  for (int i = 0; i < bs; ++i) {
    const bool decode_row = c.mode == ForwardMode::kDecode ||
                            (c.mode == ForwardMode::kMixed && uniform(0, 1) == 0);
    const int64_t new_tokens = decode_row ? 1 : uniform(1, 40);
    const int64_t cached = uniform(0, 300);
    if (i > 0 && uniform(0, 2) == 0 && f.kv_lens()[0].value() >= c.page_size) {
      const int64_t shared = uniform(c.page_size, f.kv_lens()[0].value());
      f.AddSequenceSharingPrefix(0, shared, std::max(shared, cached), new_tokens);
    } else {
      f.AddSequence(cached, new_tokens);
    }
  }
}

void RunCase(const Case& c) {
  SCOPED_TRACE(Describe(c));
  std::mt19937_64 rng(c.seed);
  BatchFixture f(c.page_size, c.seed, /*num_pages=*/4000 / c.page_size + 64);
  AddSequences(c, rng, f);
  auto m = BuildForwardMetadata(f.Batch(c.mode), f.pool(), f.page_size());
  ASSERT_TRUE(m.ok()) << m.status();
  if (c.mode == ForwardMode::kIdle) {
    // No sequence: nothing to attend, and metadata that says so.
    EXPECT_EQ(m->kv_indptr, std::vector<TokenOffset>{TokenOffset(0)});
    EXPECT_EQ(m->qo_indptr, std::vector<TokenOffset>{TokenOffset(0)});
    EXPECT_TRUE(m->kv_indices.empty());
    EXPECT_TRUE(m->kv_lens.empty());
    EXPECT_EQ(m->max_q_len, TokenCount(0));
    EXPECT_EQ(m->max_kv_len, TokenCount(0));
    return;
  }

  const AttentionProblem p = MakeAttentionProblem(f, kDims, c.seed);
  ASSERT_FALSE(p.q.empty());
  const std::vector<float>& want = p.dense;
  ReferenceAttentionInputs in{kDims, m->view(), f.page_size(), p.q, p.k_pool, p.v_pool};
  auto check = [&](const char* path, const absl::Status& s, const std::vector<float>& got) {
    ASSERT_TRUE(s.ok()) << path << ": " << s;
    EXPECT_LT(RelativeL2Error(got, want), 1e-5) << path;
  };
  std::vector<float> out(p.q.size(), NAN);
  check("token-level kv_indices", ReferenceAttentionTokenLevel(in, absl::MakeSpan(out)), out);
  out.assign(p.q.size(), NAN);
  check("page table", ReferenceAttentionPageTable(in, absl::MakeSpan(out)), out);
  out.assign(p.q.size(), NAN);
  auto gather = GatherContextTokens(
      ContextGatherInputs{c.mode, m->kv_indptr, m->kv_indices, m->kv_lens, f.pool_slots()});
  ASSERT_TRUE(gather.ok()) << gather.status();
  check("context-prefill gather", ReferenceAttentionGathered(in, *gather, absl::MakeSpan(out)),
        out);
  for (bool paged : {false, true}) {
    SplitKvOptions opt;
    opt.layout = paged ? KvLayout::Paged(f.page_size()) : KvLayout::LinearPerToken();
    opt.num_units = static_cast<int32_t>(std::uniform_int_distribution<int>(1, 40)(rng));
    opt.kv_granularity = TokenCount(std::uniform_int_distribution<int64_t>(1, 128)(rng));
    opt.q_tile = TokenCount(std::uniform_int_distribution<int64_t>(1, 16)(rng));
    auto plan = PlanSplitKv(m->qo_indptr, m->kv_indptr, opt);
    ASSERT_TRUE(plan.ok()) << plan.status();
    out.assign(p.q.size(), NAN);
    check(paged ? "split-KV, paged layout" : "split-KV, linear layout",
          ReferenceAttentionSplitKv(in, *plan, absl::MakeSpan(out)), out);
  }
}

class MetadataOracleTest
    : public ::testing::TestWithParam<std::tuple<ForwardMode, int64_t>> {};

TEST_P(MetadataOracleTest, EveryMetadataPathEqualsDenseAttention) {
  const auto [mode, ps] = GetParam();
  for (uint64_t seed = 1; seed <= 6; ++seed) RunCase({mode, ps, seed * 1000 + ps});
}

INSTANTIATE_TEST_SUITE_P(
    ModesAndPageSizes, MetadataOracleTest,
    ::testing::Combine(::testing::Values(ForwardMode::kDecode, ForwardMode::kExtend,
                                         ForwardMode::kMixed, ForwardMode::kIdle),
                       ::testing::Values<int64_t>(1, 2, 7, 16, 64)),
    [](const ::testing::TestParamInfo<std::tuple<ForwardMode, int64_t>>& info) {
      return absl::StrCat(ForwardModeName(std::get<0>(info.param)), "_page_size_",
                          std::get<1>(info.param));
    });

}  // namespace
}  // namespace attnmeta
