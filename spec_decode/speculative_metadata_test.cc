#include "spec_decode/speculative_metadata.h"

#include <cstdint>
#include <limits>
#include <map>
#include <random>
#include <set>
#include <vector>

#include "attention/metadata/reference_attention.h"
#include "attention/metadata/testing/attention_problem.h"
#include "attention/metadata/testing/batch_fixture.h"
#include "gtest/gtest.h"
#include "tools/bench/heap_counter.h"

namespace attnmeta {
namespace {

using testing::AttentionProblem;
using testing::BatchFixture;
using testing::MakeAttentionProblem;
using testing::RelativeL2Error;

constexpr AttentionDims kDims{4, 2, 8};
constexpr double kTolerance = 1e-5;

// The K and V rows of `slots`, in order: a logical sequence read from the allocator's layout.
void Gather(const AttentionProblem& p, absl::Span<const TokenSlot> slots, std::vector<float>& k,
            std::vector<float>& v) {
  const int64_t kv_row = int64_t{p.dims.num_kv_heads} * p.dims.head_dim;
  k.clear();
  v.clear();
  for (TokenSlot s : slots) {
    k.insert(k.end(), p.k_pool.begin() + s.value() * kv_row,
             p.k_pool.begin() + (s.value() + 1) * kv_row);
    v.insert(v.end(), p.v_pool.begin() + s.value() * kv_row,
             p.v_pool.begin() + (s.value() + 1) * kv_row);
  }
}

ReferenceAttentionInputs Inputs(const AttentionProblem& p, const ForwardMetadata& m,
                                PageSize ps, absl::Span<const float> q) {
  return ReferenceAttentionInputs{p.dims, m.view(), ps, q, p.k_pool, p.v_pool};
}

// ---- Draft-extend ----

TEST(DraftExtendTest, FixedFormHasNRowsPerRequest) {
  BatchFixture f(16, 3);
  f.AddSequence(40, 4);
  f.AddSequence(9, 4);
  f.AddSequence(77, 4);
  DraftExtendBatch b{f.rows(), f.kv_lens(), TokenCount(4), {}, TokenCount(0), TokenCount(12)};
  SpecBuildOptions checked;
  checked.check_pool_slots = f.pool_slots();
  auto m = BuildDraftExtendMetadata(b, f.pool(), f.page_size(), checked);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->mode, ForwardMode::kDraftExtend);
  EXPECT_EQ(m->qo_indptr, (std::vector<TokenOffset>{TokenOffset(0), TokenOffset(4), TokenOffset(8),
                                                    TokenOffset(12)}));
  EXPECT_EQ(m->max_q_len, TokenCount(4));
  EXPECT_EQ(m->kv_indptr.back(), TokenOffset(44 + 13 + 81));
  EXPECT_EQ(m->page_table.rows(), 3);
  // Without the page table: token-level only.
  SpecBuildOptions no_table = checked;
  no_table.page_table = false;
  auto token_level = BuildDraftExtendMetadata(b, f.pool(), f.page_size(), no_table);
  ASSERT_TRUE(token_level.ok()) << token_level.status();
  EXPECT_EQ(token_level->page_table.rows(), 0);
  EXPECT_EQ(token_level->kv_indices, m->kv_indices);
}

TEST(DraftExtendTest, VariableFormTakesAcceptedLengthPlusOne) {
  for (int64_t ps : {1, 7, 16, 64}) {
    SCOPED_TRACE(::testing::Message() << "page_size " << ps << " seed " << 4 + ps);
    BatchFixture f(ps, 4 + ps);
    f.AddSequence(30, 1);
    f.AddSequence(12, 3);
    f.AddSequenceSharingPrefix(0, 30, 50, 4);
    std::vector<TokenLength> accepted = {TokenLength(0), TokenLength(2), TokenLength(3)};
    DraftExtendBatch b{f.rows(), f.kv_lens(), TokenCount(0), accepted, TokenCount(4), TokenCount(8)};
    SpecBuildOptions checked;
    checked.check_pool_slots = f.pool_slots();
    auto m = BuildDraftExtendMetadata(b, f.pool(), f.page_size(), checked);
    ASSERT_TRUE(m.ok()) << m.status();
    EXPECT_EQ(m->qo_indptr, (std::vector<TokenOffset>{TokenOffset(0), TokenOffset(1),
                                                      TokenOffset(4), TokenOffset(8)}));
    EXPECT_EQ(m->max_q_len, TokenCount(4));
    // The attention of each request's extended rows equals dense attention over its logical
    // sequence, through token-level indices and through the page table.
    AttentionProblem p = MakeAttentionProblem(f, kDims, 5 + ps);
    std::vector<float> out(p.q.size(), -1.0f);
    ASSERT_TRUE(ReferenceAttentionTokenLevel(Inputs(p, *m, f.page_size(), p.q), absl::MakeSpan(out)).ok());
    EXPECT_LT(RelativeL2Error(out, p.dense), kTolerance);
    std::fill(out.begin(), out.end(), -1.0f);
    ASSERT_TRUE(ReferenceAttentionPageTable(Inputs(p, *m, f.page_size(), p.q), absl::MakeSpan(out)).ok());
    EXPECT_LT(RelativeL2Error(out, p.dense), kTolerance);
  }
}

TEST(DraftExtendTest, BadInputIsAnError) {
  BatchFixture f(16, 3);
  f.AddSequence(40, 4);
  f.AddSequence(9, 4);
  std::vector<TokenLength> accepted = {TokenLength(1), TokenLength(4)};
  std::vector<TokenLength> huge_accepted = {TokenLength(INT32_MAX), TokenLength(1)};
  struct Case {
    const char* what;
    DraftExtendBatch batch;
    const char* message;  // the refusal of its own check, not of a later one
  } cases[] = {
      // The reference system's bug: a prefill qo_indptr's 80 rows for a smaller query.
      {"rows disagree with the query tensor",
       {f.rows(), f.kv_lens(), TokenCount(4), {}, TokenCount(0), TokenCount(80)},
       "draft-extend: the batch has 8 query rows (qo_indptr[bs]) but the query tensor has 80"},
      {"neither form",
       {f.rows(), f.kv_lens(), TokenCount(0), {}, TokenCount(4), TokenCount(8)},
       "draft-extend: give either num_tokens_per_req in [1, INT32_MAX] or accept_lens, got 0 and 0 "
       "accepted lengths"},
      {"both forms",
       {f.rows(), f.kv_lens(), TokenCount(4), accepted, TokenCount(4), TokenCount(8)},
       "draft-extend: give either num_tokens_per_req in [1, INT32_MAX] or accept_lens, got 4 and 2 "
       "accepted lengths"},
      {"negative rows per request",
       {f.rows(), f.kv_lens(), TokenCount(-4), {}, TokenCount(0), TokenCount(-8)},
       "draft-extend: give either num_tokens_per_req in [1, INT32_MAX] or accept_lens, got -4 and "
       "0 "
       "accepted lengths"},
      // 2^32 + 2 rows each: 2 when cut to 32 bits, which the 4 query rows would match.
      {"rows per request past a query length",
       {f.rows(),
        f.kv_lens(),
        TokenCount((int64_t{1} << 32) + 2),
        {},
        TokenCount(0),
        TokenCount(4)},
       "draft-extend: give either num_tokens_per_req in [1, INT32_MAX] or accept_lens, got "
       "4294967298 "
       "and 0 accepted lengths"},
      {"accepted beyond the draft",
       {f.rows(), f.kv_lens(), TokenCount(0), accepted, TokenCount(4), TokenCount(7)},
       "draft-extend: request 1 accepted 4 draft tokens, outside [0, 4)"},
      {"accepted lengths of the wrong size",
       {f.rows(), f.kv_lens(), TokenCount(0), absl::MakeConstSpan(accepted).subspan(1),
        TokenCount(4), TokenCount(5)},
       "draft-extend: 1 accepted lengths for 2 requests"},
  };
  for (const Case& c : cases) {
    const absl::Status s = BuildDraftExtendMetadata(c.batch, f.pool(), f.page_size()).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.what;
    EXPECT_EQ(std::string(s.message()), c.message) << c.what;
  }
  // accepted + 1 past INT32_MAX (a draft longer than that): refused before it becomes a query
  // length, by the accepted-length check itself.
  const DraftExtendBatch huge{
      f.rows(),     f.kv_lens(), TokenCount(0), huge_accepted, TokenCount(int64_t{1} << 32),
      TokenCount(5)};
  const absl::Status s = BuildDraftExtendMetadata(huge, f.pool(), f.page_size()).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(),
            "draft-extend: request 0 accepted 2147483647 draft tokens, outside [0, 2147483647)");
}

// ---- Target-verify ----

// Random trees: parent[t] uniform in [0, t) (so a parent precedes its child, as EAGLE's do).
std::vector<int32_t> RandomParents(int64_t bs, int32_t n, std::mt19937_64& rng) {
  std::vector<int32_t> parents(bs * n, -1);
  for (int64_t b = 0; b < bs; ++b) {
    for (int32_t t = 1; t < n; ++t) {
      parents[b * n + t] = std::uniform_int_distribution<int32_t>(0, t - 1)(rng);
    }
  }
  return parents;
}

struct VerifyCase {
  int64_t page_size;
  int32_t n;
};

class TargetVerifyTest : public ::testing::TestWithParam<VerifyCase> {};

// Each draft token attends to the committed prefix, its ancestors and itself: dense masked
// attention over the request's logical sequence, with the mask worked out here from the
// parent array (not from the VerifyTree under test).
TEST_P(TargetVerifyTest, ReferenceAttentionMatchesDenseMaskedAttention) {
  const VerifyCase c = GetParam();
  const uint64_t seed = 1000 + c.page_size * 31 + c.n;
  SCOPED_TRACE(::testing::Message()
               << "seed " << seed << " page_size " << c.page_size << " n " << c.n);
  std::mt19937_64 rng(seed);
  BatchFixture f(c.page_size, seed);
  const std::vector<int64_t> prefixes = {1, 45, 130, 64};
  std::vector<TokenLength> seq_lens;
  for (int64_t prefix : prefixes) {
    f.AddSequence(prefix, c.n);
    seq_lens.push_back(TokenLength(static_cast<int32_t>(prefix)));
  }
  const int64_t bs = static_cast<int64_t>(prefixes.size());
  std::vector<int32_t> parents = RandomParents(bs, c.n, rng);
  auto tree = BuildVerifyTreeFromParents(parents, seq_lens, TokenLength(c.n));
  ASSERT_TRUE(tree.ok()) << tree.status();
  AttentionProblem p = MakeAttentionProblem(f, kDims, seed);
  const int64_t q_row = int64_t{kDims.num_q_heads} * kDims.head_dim;

  std::vector<float> want(p.q.size());
  for (int64_t b = 0; b < bs; ++b) {
    const int64_t prefix = prefixes[b];
    const int64_t kv = prefix + c.n;
    std::vector<uint8_t> sees(c.n * kv, 0);
    for (int32_t t = 0; t < c.n; ++t) {
      for (int64_t col = 0; col < prefix; ++col) sees[t * kv + col] = 1;
      for (int32_t a = t; a >= 0; a = parents[b * c.n + a]) sees[t * kv + prefix + a] = 1;
    }
    std::vector<TokenSlot> slots = f.SlotsOf(static_cast<int>(b));
    std::vector<float> k, v;
    Gather(p, slots, k, v);
    ASSERT_TRUE(DenseMaskedAttention(kDims, absl::MakeConstSpan(p.q).subspan(b * c.n * q_row, c.n * q_row),
                                     k, v, sees,
                                     absl::MakeSpan(want).subspan(b * c.n * q_row, c.n * q_row))
                    .ok());
  }
  SpecBuildOptions checked;
  checked.check_pool_slots = f.pool_slots();
  std::vector<MaskLayout> layouts = {MaskLayout::kFull, MaskLayout::kQLenOnly};
  if (c.n <= 32) layouts.push_back(MaskLayout::kBitPacked);
  for (MaskLayout layout : layouts) {
    SCOPED_TRACE(::testing::Message() << "seed " << seed << " page_size " << c.page_size << " n "
                                      << c.n << " layout " << MaskLayoutName(layout));
    auto m = BuildTargetVerifyMetadata(f.pool(), f.rows(), *tree, layout, TokenCount(bs * c.n),
                                       f.page_size(), checked);
    ASSERT_TRUE(m.ok()) << m.status();
    EXPECT_EQ(m->max_q_len, TokenCount(c.n));
    EXPECT_EQ(m->page_table.rows(), bs);
    SpecBuildOptions no_table = checked;
    no_table.page_table = false;
    auto token_level = BuildTargetVerifyMetadata(f.pool(), f.rows(), *tree, layout,
                                                 TokenCount(bs * c.n), f.page_size(), no_table);
    ASSERT_TRUE(token_level.ok()) << token_level.status();
    EXPECT_EQ(token_level->page_table.rows(), 0);
    int64_t kv_before = 0;  // the draft tokens are read from the cache: kv_indptr counts them
    for (int64_t b = 0; b < bs; ++b) {
      EXPECT_EQ(m->qo_indptr[b + 1].value(), (b + 1) * c.n);
      EXPECT_EQ(m->kv_lens[b].value(), prefixes[b] + c.n);
      kv_before += prefixes[b] + c.n;
      EXPECT_EQ(m->kv_indptr[b + 1].value(), kv_before);
    }
    std::vector<float> out(p.q.size(), -1.0f);
    ASSERT_TRUE(ReferenceAttentionTokenLevel(Inputs(p, *m, f.page_size(), p.q), absl::MakeSpan(out)).ok());
    EXPECT_LT(RelativeL2Error(out, want), kTolerance);
    std::fill(out.begin(), out.end(), -1.0f);
    ASSERT_TRUE(ReferenceAttentionPageTable(Inputs(p, *m, f.page_size(), p.q), absl::MakeSpan(out)).ok());
    EXPECT_LT(RelativeL2Error(out, want), kTolerance);
    // Without the mask (causal over the draft tokens) the result is wrong whenever the tree
    // is not a chain: the mask is what makes it right.
    ForwardMetadata causal = *m;
    causal.mode = ForwardMode::kDraftExtend;
    causal.mask_layout = MaskLayout::kNone;
    causal.custom_mask.clear();
    causal.mask_indptr.clear();
    std::fill(out.begin(), out.end(), -1.0f);
    ASSERT_TRUE(ReferenceAttentionTokenLevel(Inputs(p, causal, f.page_size(), p.q), absl::MakeSpan(out)).ok());
    EXPECT_GT(RelativeL2Error(out, want), 1e-3);
  }
}

INSTANTIATE_TEST_SUITE_P(PageSizesAndTrees, TargetVerifyTest,
                         ::testing::Values(VerifyCase{1, 8}, VerifyCase{7, 8}, VerifyCase{16, 8},
                                           VerifyCase{64, 8}, VerifyCase{16, 13},
                                           VerifyCase{7, 40}));

TEST(TargetVerifyBadInputTest, RefusedBeforeAnythingIsBuilt) {
  BatchFixture f(16, 3);
  f.AddSequence(20, 4);
  f.AddSequence(30, 4);
  std::vector<TokenLength> seq_lens = {TokenLength(20), TokenLength(30)};
  std::vector<int32_t> parents = {-1, 0, 0, 1, -1, 0, 1, 2};
  auto tree = BuildVerifyTreeFromParents(parents, seq_lens, TokenLength(4));
  ASSERT_TRUE(tree.ok());
  EXPECT_EQ(BuildTargetVerifyMetadata(f.pool(), f.rows(), *tree, MaskLayout::kFull, TokenCount(80),
                                      f.page_size())
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(BuildTargetVerifyMetadata(f.pool(), f.rows(), *tree, MaskLayout::kNone, TokenCount(8),
                                      f.page_size())
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  // A layout cast from an integer would build a batch with no mask bytes at all.
  const absl::Status unknown =
      BuildTargetVerifyMetadata(f.pool(), f.rows(), *tree, static_cast<MaskLayout>(7),
                                TokenCount(8), f.page_size())
          .status();
  EXPECT_EQ(unknown.code(), absl::StatusCode::kInvalidArgument) << unknown;
  EXPECT_EQ(unknown.message(), "mask layout 7 is not a mask layout");
  EXPECT_EQ(BuildTargetVerifyMetadata(f.pool(), absl::MakeConstSpan(f.rows()).subspan(1), *tree,
                                      MaskLayout::kFull, TokenCount(8), f.page_size())
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  // Draft slots beyond what the row holds: the committed prefix claims more than was written.
  std::vector<TokenLength> too_long = {TokenLength(20), TokenLength(8190)};
  auto long_tree = BuildVerifyTreeFromParents(parents, too_long, TokenLength(4));
  ASSERT_TRUE(long_tree.ok());
  EXPECT_EQ(BuildTargetVerifyMetadata(f.pool(), f.rows(), *long_tree, MaskLayout::kFull,
                                      TokenCount(8), f.page_size())
                .status()
                .code(),
            absl::StatusCode::kOutOfRange);
}

// ---- Draft-decode ----

TEST(DraftDecodeLayoutTest, SourcePositionsWorkedByHand) {
  const PageSize ps4 = *PageSize::Create(4);
  const PageSize ps1 = *PageSize::Create(1);
  // topk 3, steps 2, seq_len 6 on 4-token pages: the partial page holds 2 prefix tokens, so
  // each branch needs ceil((2 + 2) / 4) = 1 page; branch k starts at 4 + 4k + 2.
  const DraftDecodeShape shape{3, 2};
  EXPECT_EQ(DraftSourcePosition(TokenLength(6), 0, shape, ps4).value(), 6);
  EXPECT_EQ(DraftSourcePosition(TokenLength(6), 1, shape, ps4).value(), 10);
  EXPECT_EQ(DraftSourcePosition(TokenLength(6), 2, shape, ps4).value(), 14);
  EXPECT_EQ(DraftRowTokens(TokenLength(6), shape, ps4).value(), 16);
  // seq_len 7: 3 prefix tokens in the partial page, ceil(5 / 4) = 2 pages per branch.
  EXPECT_EQ(DraftSourcePosition(TokenLength(7), 1, shape, ps4).value(), 4 + 8 + 3);
  // Page size 1 or topk 1: branches back to back after the prefix.
  EXPECT_EQ(DraftSourcePosition(TokenLength(6), 2, shape, ps1).value(), 6 + 2 * 2);
  EXPECT_EQ(DraftSourcePosition(TokenLength(6), 0, DraftDecodeShape{1, 2}, ps4).value(), 6);
  // Used entries: seq_lens_sum * topk + branches * (step + 1).
  std::vector<TokenLength> lens = {TokenLength(6), TokenLength(9)};
  EXPECT_EQ(DraftStepTokens(lens, shape, 1).value(), 15 * 3 + 6 * 2);
}

// What the layout is for, checked over many shapes without its formula: every branch's run
// of `steps` draft positions starts past the prefix, no two runs share a position and the row
// holds them all (DraftRowTokens); with pages of several tokens and several branches, a run
// starts at the prefix's offset in its page (the prefix's tail is copied there) and no page
// holds positions of two branches' runs.
TEST(DraftDecodeLayoutTest, BranchesRunApartInTheirOwnPages) {
  for (int64_t p : {1, 2, 7, 16, 64}) {
    const PageSize ps = *PageSize::Create(p);
    for (int32_t topk : {1, 2, 3, 8}) {
      for (int32_t steps : {1, 2, 5, 17, 70}) {
        const DraftDecodeShape shape{topk, steps};
        for (int32_t len = 0; len <= 3 * p + 2; ++len) {
          SCOPED_TRACE(::testing::Message() << "page_size " << p << " topk " << topk << " steps "
                                            << steps << " seq_len " << len);
          const int64_t row = DraftRowTokens(TokenLength(len), shape, ps).value();
          std::map<int64_t, int32_t> owner;  // page (or position at page size 1) -> branch
          std::set<int64_t> used;
          for (int32_t k = 0; k < topk; ++k) {
            const int64_t src = DraftSourcePosition(TokenLength(len), k, shape, ps).value();
            ASSERT_GE(src, len);
            ASSERT_LE(src + steps, row);
            const bool own_pages = p > 1 && topk > 1;
            if (own_pages) {
              ASSERT_EQ(src % p, len % p);
            }
            for (int64_t pos = src; pos < src + steps; ++pos) {
              ASSERT_TRUE(used.insert(pos).second) << "position " << pos << " of two runs";
              if (!own_pages) continue;
              const auto [it, fresh] = owner.emplace(pos / p, k);
              ASSERT_TRUE(fresh || it->second == k) << "page " << pos / p << " of two branches";
            }
          }
        }
      }
    }
  }
}

struct DraftCase {
  int64_t page_size;
  int32_t topk;
};

class DraftDecodeTest : public ::testing::TestWithParam<DraftCase> {};

// Each branch's single query row attends to the request's prefix and the branch's own draft
// tokens of this and earlier steps: dense attention over that logical sequence.
TEST_P(DraftDecodeTest, EveryStepMatchesDenseAttentionPerBranch) {
  const DraftCase c = GetParam();
  const DraftDecodeShape shape{c.topk, 3};
  const uint64_t seed = 77 + c.page_size * 13 + c.topk;
  BatchFixture f(c.page_size, seed);
  const PageSize ps = f.page_size();
  const std::vector<int64_t> prefixes = {5, 33, 64, 100};
  std::vector<TokenLength> seq_lens;
  for (int64_t prefix : prefixes) {
    const TokenLength len(static_cast<int32_t>(prefix));
    // The draft slots every branch will write, allocated after the prefix as an engine does.
    f.AddSequence(prefix, DraftRowTokens(len, shape, ps).value() - prefix);
    seq_lens.push_back(len);
  }
  const int64_t bs = static_cast<int64_t>(prefixes.size());
  const int64_t branches = bs * c.topk;
  SpecBuildOptions checked;
  checked.check_pool_slots = f.pool_slots();
  auto steps = BuildDraftDecodeMetadata(f.pool(), f.rows(), seq_lens, shape,
                                        TokenCount(branches), ps, checked);
  ASSERT_TRUE(steps.ok()) << steps.status();
  ASSERT_EQ(steps->size(), 3u);
  AttentionProblem p = MakeAttentionProblem(f, kDims, seed);
  const int64_t q_row = int64_t{kDims.num_q_heads} * kDims.head_dim;
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> q(branches * q_row);
  for (float& x : q) x = normal(rng);
  // DESIGN.md 2b, restated here rather than taken from draft_decode_layout.h: branch k's draft
  // run starts k * steps after the prefix when pages are single tokens or there is one
  // branch; otherwise every branch owns whole pages, starting where the prefix's last partial
  // page starts, the prefix's tail copied to the same offset in its first page.
  auto source = [&](int64_t len, int32_t k) -> int64_t {
    const int64_t p = c.page_size;
    if (p == 1 || c.topk == 1) return len + k * shape.steps;
    int64_t pages_per_branch = 1;
    while (pages_per_branch * p < len % p + shape.steps) ++pages_per_branch;
    return (len - len % p) + k * pages_per_branch * p + len % p;
  };
  int64_t prefix_sum = 0;
  for (int64_t prefix : prefixes) prefix_sum += prefix;
  for (int32_t step = 0; step < shape.steps; ++step) {
    SCOPED_TRACE(::testing::Message() << "seed " << seed << " page_size " << c.page_size
                                      << " topk " << c.topk << " step " << step);
    const ForwardMetadata& m = (*steps)[step];
    // Every branch: the request's prefix and step + 1 draft tokens.
    EXPECT_EQ(m.kv_indptr.back().value(), c.topk * prefix_sum + branches * (step + 1));
    std::vector<float> want(q.size());
    for (int64_t s = 0; s < bs; ++s) {
      std::vector<TokenSlot> row = f.SlotsOf(static_cast<int>(s));
      for (int32_t k = 0; k < c.topk; ++k) {
        const int64_t z = s * c.topk + k;
        std::vector<TokenSlot> logical(row.begin(), row.begin() + prefixes[s]);
        const int64_t src = source(prefixes[s], k);
        logical.insert(logical.end(), row.begin() + src, row.begin() + src + step + 1);
        std::vector<float> kk, vv;
        Gather(p, logical, kk, vv);
        ASSERT_TRUE(DenseAttention(kDims, absl::MakeConstSpan(q).subspan(z * q_row, q_row), kk,
                                   vv, absl::MakeSpan(want).subspan(z * q_row, q_row))
                        .ok());
      }
    }
    std::vector<float> out(q.size(), -1.0f);
    ASSERT_TRUE(ReferenceAttentionTokenLevel(Inputs(p, m, ps, q), absl::MakeSpan(out)).ok());
    EXPECT_LT(RelativeL2Error(out, want), kTolerance);
  }
}

INSTANTIATE_TEST_SUITE_P(PageSizesAndBranches, DraftDecodeTest,
                         ::testing::Values(DraftCase{1, 1}, DraftCase{1, 4}, DraftCase{7, 3},
                                           DraftCase{16, 1}, DraftCase{16, 4}, DraftCase{64, 2}));

TEST(DraftDecodeBadInputTest, ShapesRowsAndInt32Offsets) {
  BatchFixture f(16, 3, 4096, 8, 256);
  f.AddSequence(100, 60);
  std::vector<TokenLength> lens = {TokenLength(100)};
  const PageSize ps = f.page_size();
  EXPECT_EQ(BuildDraftDecodeMetadata(f.pool(), f.rows(), lens, {0, 3}, TokenCount(0), ps)
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(BuildDraftDecodeMetadata(f.pool(), f.rows(), lens, {2, 0}, TokenCount(2), ps)
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(BuildDraftDecodeMetadata(f.pool(), f.rows(), lens, {2, 3}, TokenCount(3), ps)
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  // Draft runs past the row: 4 branches of 1 page each after 100 tokens need 151 positions
  // (fine); 250 committed tokens need more than the 256 the row holds.
  EXPECT_TRUE(BuildDraftDecodeMetadata(f.pool(), f.rows(), lens, {4, 3}, TokenCount(4), ps).ok());
  std::vector<TokenLength> near_full = {TokenLength(250)};
  EXPECT_EQ(BuildDraftDecodeMetadata(f.pool(), f.rows(), near_full, {4, 3}, TokenCount(4), ps)
                .status()
                .code(),
            absl::StatusCode::kOutOfRange);
  // A step whose offsets pass INT32_MAX: OutOfRange, before anything is read or written.
  std::vector<TokenLength> huge = {TokenLength(1 << 30), TokenLength(1 << 30)};
  std::vector<ReqPoolIndex> two_rows = {f.rows()[0], f.rows()[0]};
  EXPECT_EQ(BuildDraftDecodeMetadata(f.pool(), two_rows, huge, {1, 3}, TokenCount(2), ps)
                .status()
                .code(),
            absl::StatusCode::kOutOfRange);
  // Shapes of up to INT32_MAX branches or steps: OutOfRange before any step's arrays are
  // allocated (they would take gigabytes, or 2^31 steps' metadata).
  const int32_t max = std::numeric_limits<int32_t>::max();
  EXPECT_EQ(BuildDraftDecodeMetadata(f.pool(), f.rows(), lens, {max, 1}, TokenCount(max), ps)
                .status()
                .code(),
            absl::StatusCode::kOutOfRange);
  EXPECT_EQ(BuildDraftDecodeMetadata(f.pool(), f.rows(), lens, {1, max}, TokenCount(1), ps)
                .status()
                .code(),
            absl::StatusCode::kOutOfRange);
  EXPECT_EQ(BuildDraftDecodeMetadata(f.pool(), two_rows, std::vector<TokenLength>{TokenLength(100), TokenLength(100)}, {1 << 30, 1},
                                     TokenCount(1), ps)
                .status()
                .code(),
            absl::StatusCode::kOutOfRange);
  // An empty batch with more steps than a row holds.
  EXPECT_EQ(BuildDraftDecodeMetadata(f.pool(), {}, {}, {1, 257}, TokenCount(0), ps)
                .status()
                .code(),
            absl::StatusCode::kOutOfRange);
  // An empty batch within a row: refused as the validator refuses it (idle batches and only
  // they are empty), whether checked or not; its steps' arrays would be sized by the shape
  // alone.
  EXPECT_EQ(BuildDraftDecodeMetadata(f.pool(), {}, {}, {1, 256}, TokenCount(0), ps).status().code(),
            absl::StatusCode::kInvalidArgument);
  SpecBuildOptions checked;
  checked.check_pool_slots = f.pool_slots();
  EXPECT_EQ(BuildDraftDecodeMetadata(f.pool(), {}, {}, {1, 256}, TokenCount(0), ps, checked)
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
}

// A request row listed twice is refused before any step is allocated, as BuildForwardMetadata
// and graph replay refuse it. Without the check nothing bounds the steps by the pool: 1000
// requests on one row drafting 4 branches of 1000 steps pass every other check (all steps
// together need 2,002,000,000 entries, under INT32_MAX) and take 8 GB. The test's batch is
// 100 requests of 4 branches of 100 steps (8 MB), which the heap check sees as well.
TEST(DraftDecodeBadInputTest, ARepeatedRowIsRefusedBeforeAllocating) {
  BatchFixture f(1, 5, /*num_pages=*/64, /*max_reqs=*/2, /*max_context=*/8192);
  f.AddSequence(0, 0);
  f.AddSequence(0, 0);
  std::vector<ReqPoolIndex> rows(100, f.rows()[1]);
  rows[0] = f.rows()[0];
  const std::vector<TokenLength> lens(100, TokenLength(0));
  const DraftDecodeShape shape{4, 100};
  const int64_t live = bench::HeapLiveBytes();
  bench::ResetHeapPeak();
  const absl::Status s =
      BuildDraftDecodeMetadata(f.pool(), rows, lens, shape, TokenCount(400), f.page_size())
          .status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_EQ(s.message(), absl::StrCat("draft-decode: requests 1 and 2 share req row ",
                                      f.rows()[1].value(), " (a row holds one request's tokens)"));
  if (bench::HeapCounterIsLive()) {
    EXPECT_LT(bench::HeapPeakBytes() - live, 64 << 10);
  }
  // The two distinct rows with the same shape are built.
  EXPECT_TRUE(BuildDraftDecodeMetadata(f.pool(), f.rows(), absl::MakeConstSpan(lens).subspan(0, 2),
                                       shape, TokenCount(8), f.page_size())
                  .ok());
}

// Each step fits int32 offsets and every draft run fits its row, but all steps together do
// not: 65536 steps of one branch over an empty prefix need 65536 * 65537 / 2 = 2^31 + 2^15
// kv_indices entries (8 GiB, and 65536 steps' metadata, were they allocated).
// ResourceExhausted before anything is allocated.
TEST(DraftDecodeBadInputTest, AllStepsTogetherBeyondInt32) {
  BatchFixture f(1, 5, 64, 1, 1 << 16);
  f.AddSequence(1, 0);
  const std::vector<TokenLength> lens = {TokenLength(0)};
  const absl::StatusOr<std::vector<ForwardMetadata>> steps = BuildDraftDecodeMetadata(
      f.pool(), f.rows(), lens, {1, 1 << 16}, TokenCount(1), f.page_size());
  EXPECT_EQ(steps.status().code(), absl::StatusCode::kResourceExhausted) << steps.status();
  // The last step alone, as the device path builds it step by step, still builds.
  std::vector<TokenSlot> kv_indices(1 << 16);
  std::vector<TokenLength> kv_lens(1);
  std::vector<TokenOffset> kv_indptr(2), qo_indptr(2);
  std::vector<TokenLength> last_page_len(1);
  ASSERT_TRUE(BuildDraftDecodeStep(
                  f.pool(), f.rows(), lens, {1, 1 << 16}, (1 << 16) - 1, f.page_size(),
                  DraftDecodeStepSpans{absl::MakeSpan(kv_lens), absl::MakeSpan(kv_indptr),
                                       absl::MakeSpan(qo_indptr), absl::MakeSpan(last_page_len),
                                       absl::MakeSpan(kv_indices)})
                  .ok());
  // One branch of no committed tokens at its 2^16-th step: 2^16 draft tokens, one query row.
  EXPECT_EQ(kv_lens[0], TokenLength(1 << 16));
  EXPECT_EQ(kv_indptr, (std::vector<TokenOffset>{TokenOffset(0), TokenOffset(1 << 16)}));
  EXPECT_EQ(qo_indptr, (std::vector<TokenOffset>{TokenOffset(0), TokenOffset(1)}));
  EXPECT_EQ(last_page_len[0], TokenLength(1));
}

// A step outside [0, steps) is refused before anything is written, even with outputs that
// would hold it: its branches' runs end past the rows CheckDraftDecodeBatch checked.
TEST(DraftDecodeBadInputTest, StepsOutsideTheShapeAreRefused) {
  BatchFixture f(16, 3, 4096, 8, 256);
  f.AddSequence(100, 60);
  const std::vector<TokenLength> lens = {TokenLength(100)};
  const DraftDecodeShape shape{2, 3};
  for (int32_t step : {0, 2, 3, -1}) {
    std::vector<TokenLength> kv_lens(2, TokenLength(-7)), last(2, TokenLength(-7));
    std::vector<TokenOffset> kv_indptr(3, TokenOffset(-7)), qo_indptr(3, TokenOffset(-7));
    std::vector<TokenSlot> kv_indices(1024, TokenSlot(-7));
    const absl::Status s = BuildDraftDecodeStep(
        f.pool(), f.rows(), lens, shape, step, f.page_size(),
        DraftDecodeStepSpans{absl::MakeSpan(kv_lens), absl::MakeSpan(kv_indptr),
                             absl::MakeSpan(qo_indptr), absl::MakeSpan(last),
                             absl::MakeSpan(kv_indices)});
    if (step == 0 || step == 2) {
      EXPECT_TRUE(s.ok()) << "step " << step << ": " << s;
      continue;
    }
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << "step " << step << ": " << s;
    EXPECT_NE(s.message().find("outside [0, 3)"), absl::string_view::npos) << s;
    EXPECT_EQ(kv_indptr, std::vector<TokenOffset>(3, TokenOffset(-7)));
    EXPECT_EQ(kv_indices, std::vector<TokenSlot>(1024, TokenSlot(-7)));
  }
}

// A later step's kv_indices must hold that step's tokens: one sized for an earlier step is
// refused before anything is written.
TEST(DraftDecodeBadInputTest, EachStepNeedsItsOwnKvIndices) {
  BatchFixture f(16, 3, 4096, 8, 256);
  f.AddSequence(100, 60);
  const std::vector<TokenLength> lens = {TokenLength(100)};
  const DraftDecodeShape shape{2, 3};
  const int64_t step0 = DraftStepTokens(lens, shape, 0).value();
  const int64_t step2 = DraftStepTokens(lens, shape, 2).value();
  ASSERT_LT(step0, step2);
  for (const int64_t size : {step2 - 1, step0}) {
    std::vector<TokenLength> kv_lens(2, TokenLength(-7)), last(2, TokenLength(-7));
    std::vector<TokenOffset> kv_indptr(3, TokenOffset(-7)), qo_indptr(3, TokenOffset(-7));
    std::vector<TokenSlot> kv_indices(static_cast<size_t>(size), TokenSlot(-7));
    const absl::Status s = BuildDraftDecodeStep(
        f.pool(), f.rows(), lens, shape, 2, f.page_size(),
        DraftDecodeStepSpans{absl::MakeSpan(kv_lens), absl::MakeSpan(kv_indptr),
                             absl::MakeSpan(qo_indptr), absl::MakeSpan(last),
                             absl::MakeSpan(kv_indices)});
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << size << ": " << s;
    EXPECT_NE(s.message().find(absl::StrCat("where step 2 needs ", step2)), absl::string_view::npos)
        << s;
    EXPECT_EQ(kv_indices, std::vector<TokenSlot>(static_cast<size_t>(size), TokenSlot(-7)));
  }
}

// The layout's own int32 check (field-bug row 10), called directly: the eager builder now
// refuses such a batch before it reaches the step.
TEST(DraftDecodeBadInputTest, StepRefusesOffsetsPastInt32) {
  BatchFixture f(16, 3, 4096, 8, 256);
  f.AddSequence(100, 60);
  const std::vector<TokenLength> huge = {TokenLength(1 << 30), TokenLength(1 << 30)};
  const std::vector<ReqPoolIndex> two_rows = {f.rows()[0], f.rows()[0]};
  std::vector<TokenLength> kv_lens(2), last(2);
  std::vector<TokenOffset> kv_indptr(3), qo_indptr(3);
  std::vector<TokenSlot> kv_indices(16);
  const absl::Status s = BuildDraftDecodeStep(
      f.pool(), two_rows, huge, {1, 3}, 0, f.page_size(),
      DraftDecodeStepSpans{absl::MakeSpan(kv_lens), absl::MakeSpan(kv_indptr),
                           absl::MakeSpan(qo_indptr), absl::MakeSpan(last),
                           absl::MakeSpan(kv_indices)});
  EXPECT_EQ(s.code(), absl::StatusCode::kOutOfRange);
  // Named for the offsets, not for the rows the draft runs would pass (also OutOfRange).
  EXPECT_NE(s.message().find("beyond int32 offsets"), absl::string_view::npos) << s;
}

}  // namespace
}  // namespace attnmeta
