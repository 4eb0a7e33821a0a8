// One regression test per field bug of DESIGN.md section 3 that concerns the metadata layer
// (rows 3, 5, 8 and 9). Each runs the real code path, and the mutation gate
// (tools/mutation_gate, tests/mutants/field_bug_row*.patch) shows that the test fails when the
// reference system's bug is put back into that path.

#include <cmath>
#include <vector>

#include "attention/metadata/builders.h"
#include "attention/metadata/context_gather.h"
#include "attention/metadata/reference_attention.h"
#include "attention/metadata/split_kv_planner.h"
#include "attention/metadata/testing/attention_problem.h"
#include "attention/metadata/testing/batch_fixture.h"
#include "attention/metadata/validator.h"
#include "gtest/gtest.h"

namespace attnmeta {
namespace {

using testing::BatchFixture;

constexpr AttentionDims kDims{4, 1, 16};  // MLA-like: one shared KV head

// A batch with prefixes at page_size 64 (unaligned lengths, shuffled pages) and its
// attention problem (random K/V and queries, dense attention of the logical sequences).
class FieldBugTest : public ::testing::Test {
 protected:
  void SetUp() override {
    f_.AddSequence(300, 21);
    f_.AddSequence(100, 1);
    f_.AddSequence(0, 70);
    f_.AddSequenceSharingPrefix(0, 256, 260, 5);
    auto m = BuildForwardMetadata(f_.Batch(ForwardMode::kExtend), f_.pool(), f_.page_size());
    ASSERT_TRUE(m.ok()) << m.status();
    m_ = *std::move(m);
    p_ = testing::MakeAttentionProblem(f_, kDims, 77);
  }

  ValidationContext Context() const {
    return ValidationContext{f_.pool_slots(), f_.page_size(), f_.num_query_rows()};
  }
  ReferenceAttentionInputs Inputs(const ForwardMetadata& m) const {
    return ReferenceAttentionInputs{kDims, m.view(), f_.page_size(), p_.q, p_.k_pool, p_.v_pool};
  }
  double Error(const std::vector<float>& got) const {
    return testing::RelativeL2Error(got, p_.dense);
  }

  BatchFixture f_{64, 2024, /*num_pages=*/256};
  ForwardMetadata m_;
  testing::AttentionProblem p_;
};

// Row 3: max_kv_len taken as page_table_cols * page_size.
TEST_F(FieldBugTest, Row3_MaxKvLenComesFromRealLengths) {
  const int64_t buggy_max_kv_len = m_.page_table.cols().value() * f_.page_size().tokens();
  EXPECT_EQ(m_.max_kv_len, TokenCount(321));
  ASSERT_NE(buggy_max_kv_len, m_.max_kv_len.value()) << "the negative control must differ";
  EXPECT_TRUE(ValidateForwardMetadata(m_.view(), Context()).ok());

  ForwardMetadata buggy = m_;
  buggy.max_kv_len = TokenCount(buggy_max_kv_len);
  const absl::Status s = ValidateForwardMetadata(buggy.view(), Context());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("max_kv_len"), absl::string_view::npos) << s;
}

// Row 5: the MLA-prefill split for linear per-token K/V planned with block size = page size
// and granularity max(128, page_size). Here the consumer's layout is an input of the real
// planner, the plan records it, and the real linear consumer refuses a plan made for a paged
// layout before reading anything.
TEST_F(FieldBugTest, Row5_LinearKvSplitIsPlannedInTokens) {
  auto gather = GatherContextTokens(ContextGatherInputs{ForwardMode::kExtend, m_.kv_indptr,
                                                        m_.kv_indices, m_.kv_lens, f_.pool_slots()});
  ASSERT_TRUE(gather.ok()) << gather.status();
  SplitKvOptions opt;
  opt.layout = KvLayout::LinearPerToken();
  opt.num_units = 8;
  // Below the page size (64), so that the linear plan's chunks differ from a paged plan's,
  // which round up to whole pages: the two plans differ in their items, not only their tag.
  opt.kv_granularity = TokenCount(32);
  opt.q_tile = TokenCount(16);
  auto plan = PlanSplitKv(m_.qo_indptr, m_.kv_indptr, opt);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(f_.page_size().tokens(), 64);
  EXPECT_EQ(plan->chunk, TokenCount(32)) << "linear K/V: block size 1, chunks of 32 tokens";
  EXPECT_FALSE(plan->layout.paged());
  ASSERT_FALSE(plan->reduce.empty()) << "the batch must actually be split";
  bool cut_inside_a_page = false;
  for (const SplitKvWorkItem& w : plan->work) cut_inside_a_page |= w.kv_begin.value() % 64 != 0;
  EXPECT_TRUE(cut_inside_a_page) << "a linear plan's items start at token, not page, bounds";
  std::vector<float> out(p_.q.size(), NAN);
  ASSERT_TRUE(ReferenceAttentionGatheredSplitKv(Inputs(m_), *gather, *plan, absl::MakeSpan(out)).ok());
  EXPECT_LT(Error(out), 1e-5);

  // Negative control: the real planner given the reference system's options (the pool's page
  // size as the block, granularity max(128, page_size)); the real linear consumer refuses it.
  const int64_t ps = f_.page_size().tokens();
  SplitKvOptions buggy_opt = opt;
  buggy_opt.layout = KvLayout::Paged(f_.page_size());
  buggy_opt.kv_granularity = TokenCount(std::max<int64_t>(128, ps));
  auto buggy = PlanSplitKv(m_.qo_indptr, m_.kv_indptr, buggy_opt);
  ASSERT_TRUE(buggy.ok()) << buggy.status();
  EXPECT_TRUE(buggy->layout.paged());
  EXPECT_EQ(buggy->layout.block().tokens(), ps);
  std::vector<float> bad(p_.q.size(), NAN);
  const absl::Status s =
      ReferenceAttentionGatheredSplitKv(Inputs(m_), *gather, *buggy, absl::MakeSpan(bad));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("linear per-token"), absl::string_view::npos) << s;
  for (float x : bad) ASSERT_TRUE(std::isnan(x)) << "a refused plan writes nothing";
}

// Row 8: eager draft-extend given a prefill qo_indptr ([0, 80] for 4 query rows).
TEST_F(FieldBugTest, Row8_QoIndptrMustEndAtTheQueryRowsGiven) {
  EXPECT_EQ(m_.qo_indptr.back().value(), f_.num_query_rows().value());
  EXPECT_TRUE(ValidateForwardMetadata(m_.view(), Context()).ok());

  // Negative control: qo_indptr from the prefill's sequence lengths instead of the query rows.
  ForwardMetadata buggy = m_;
  ASSERT_TRUE(BuildIndptr(m_.kv_lens, absl::MakeSpan(buggy.qo_indptr)).ok());
  ASSERT_NE(buggy.qo_indptr.back(), m_.qo_indptr.back());
  const absl::Status s = ValidateForwardMetadata(buggy.view(), Context());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("qo_indptr"), absl::string_view::npos) << s;
  // A consumer given it refuses to run rather than reading past the query tensor.
  std::vector<float> out(p_.q.size());
  EXPECT_EQ(ReferenceAttentionTokenLevel(Inputs(buggy), absl::MakeSpan(out)).code(),
            absl::StatusCode::kInvalidArgument);
}

// Row 8 in its own mode: an eager draft-extend of 4 query rows (one request of 80 KV
// tokens) given the prefill's qo_indptr [0, 80]. Checked mode, against the query tensor
// actually handed to the kernel, refuses it before any kernel runs.
TEST(FieldBugRow8Test, DraftExtendQoIndptrMustEndAtTheQueryRowsGiven) {
  BatchFixture f(16, 31);
  f.AddSequence(76, 4);
  BuildOptions checked;
  checked.check = MetadataCheck{f.pool_slots(), TokenCount(4)};
  auto good = BuildForwardMetadata(f.Batch(ForwardMode::kDraftExtend), f.pool(), f.page_size(),
                                   checked);
  ASSERT_TRUE(good.ok()) << good.status();
  EXPECT_EQ(good->qo_indptr, (std::vector<TokenOffset>{TokenOffset(0), TokenOffset(4)}));
  EXPECT_EQ(good->max_q_len, TokenCount(4));
  // The reference system's batch: query lengths taken from the prefill (80 rows).
  const std::vector<TokenLength> prefill_rows = {TokenLength(80)};
  ForwardBatch buggy = f.Batch(ForwardMode::kDraftExtend);
  buggy.q_lens = prefill_rows;
  const absl::Status s =
      BuildForwardMetadata(buggy, f.pool(), f.page_size(), checked).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("qo_indptr[bs] = 80 but the query tensor has 4 rows"),
            absl::string_view::npos)
      << s;
}

// Row 9: the context-prefill gather applied // page_size and % page_size to token-level
// kv_indices. The real gather copies token-level slots as they are, at page size 64 with
// shuffled pages; attention over its output equals dense attention, token by token. (The
// mutation gate puts the page arithmetic back into the gather:
// tests/mutants/field_bug_row9_gather_page_arithmetic.patch.)
TEST_F(FieldBugTest, Row9_GatherCopiesTokenLevelIndicesAsTheyAre) {
  const std::vector<TokenLength>& lens = m_.kv_lens;
  auto gather = GatherContextTokens(
      ContextGatherInputs{ForwardMode::kExtend, m_.kv_indptr, m_.kv_indices, lens, f_.pool_slots()});
  ASSERT_TRUE(gather.ok()) << gather.status();
  for (size_t i = 0; i < lens.size(); ++i) {
    const std::vector<TokenSlot> slots = f_.SlotsOf(static_cast<int>(i));
    for (int32_t t = 0; t < lens[i].value(); ++t) {
      ASSERT_EQ(gather->tok_idx[gather->cu_k[i].value() + t], slots[t])
          << "sequence " << i << " token " << t;
    }
  }
  std::vector<float> out(p_.q.size(), NAN);
  ASSERT_TRUE(ReferenceAttentionGathered(Inputs(m_), *gather, absl::MakeSpan(out)).ok());
  EXPECT_LT(Error(out), 1e-5);
}

}  // namespace
}  // namespace attnmeta
