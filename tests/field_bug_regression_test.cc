// One regression test per field bug of DESIGN.md section 3 that concerns the metadata layer
// (rows 3, 5, 8 and 9). Each keeps the reference system's buggy formula as a negative
// control and shows it failing (rejected by the validator, or a wrong attention result)
// where attnmeta's formula passes.

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
  const int64_t buggy_max_kv_len = m_.page_table.cols() * f_.page_size().tokens();
  EXPECT_EQ(m_.max_kv_len, TokenCount(321));
  ASSERT_NE(buggy_max_kv_len, m_.max_kv_len.value()) << "the negative control must differ";
  EXPECT_TRUE(ValidateForwardMetadata(m_.view(), Context()).ok());

  ForwardMetadata buggy = m_;
  buggy.max_kv_len = TokenCount(buggy_max_kv_len);
  const absl::Status s = ValidateForwardMetadata(buggy.view(), Context());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("max_kv_len"), absl::string_view::npos) << s;
}

// Row 5: a split-KV plan for linear per-token K/V made with block size = page size, i.e.
// KV offsets counted in pages of the pool (granularity max(128, page_size)), while the
// consumer reads them as token positions.
TEST_F(FieldBugTest, Row5_LinearKvSplitIsPlannedInTokens) {
  SplitKvOptions opt;
  opt.layout = KvLayout::LinearPerToken();
  opt.num_units = 8;
  opt.kv_granularity = TokenCount(128);
  opt.q_tile = TokenCount(16);
  auto plan = PlanSplitKv(m_.qo_indptr, m_.kv_indptr, opt);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->chunk, TokenCount(128)) << "linear K/V: block size 1, granularity 128 tokens";
  // The consumer's layout, not the pool, decides the split unit: a paged consumer of pages of
  // 48 or 256 tokens splits on those pages.
  for (int64_t ps : {48, 256}) {
    SplitKvOptions paged = opt;
    paged.layout = KvLayout::Paged(*PageSize::Create(ps));
    auto p = PlanSplitKv(m_.qo_indptr, m_.kv_indptr, paged);
    ASSERT_TRUE(p.ok());
    EXPECT_EQ(p->chunk.value() % ps, 0) << ps;
    EXPECT_NE(p->chunk, plan->chunk) << ps;
  }
  std::vector<float> out(p_.q.size(), NAN);
  ASSERT_TRUE(ReferenceAttentionSplitKv(Inputs(m_), *plan, absl::MakeSpan(out)).ok());
  EXPECT_LT(Error(out), 1e-5);

  // Negative control: the same work expressed in pages (block size = page size).
  const int64_t ps = f_.page_size().tokens();
  SplitKvOptions buggy_opt = opt;
  buggy_opt.kv_granularity = TokenCount(std::max<int64_t>(128, ps));
  buggy_opt.layout = KvLayout::Paged(f_.page_size());
  auto buggy = PlanSplitKv(m_.qo_indptr, m_.kv_indptr, buggy_opt);
  ASSERT_TRUE(buggy.ok());
  for (SplitKvWorkItem& w : buggy->work) {
    w.kv_begin = TokenPosition(static_cast<int32_t>(w.kv_begin.value() / ps));
    w.kv_end = TokenPosition(static_cast<int32_t>((w.kv_end.value() + ps - 1) / ps));
  }
  std::vector<float> bad(p_.q.size(), NAN);
  ASSERT_TRUE(ReferenceAttentionSplitKv(Inputs(m_), *buggy, absl::MakeSpan(bad)).ok());
  EXPECT_GT(Error(bad), 1e-2) << "the page-unit plan must visibly break attention";
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

// Row 9: the context-prefill gather applied // page_size and % page_size to token-level
// kv_indices.
TEST_F(FieldBugTest, Row9_GatherCopiesTokenLevelIndicesAsTheyAre) {
  const std::vector<TokenLength>& lens = m_.kv_lens;
  auto gather = GatherContextTokens(
      ContextGatherInputs{ForwardMode::kExtend, m_.kv_indptr, m_.kv_indices, lens, f_.pool_slots()});
  ASSERT_TRUE(gather.ok()) << gather.status();
  std::vector<float> out(p_.q.size(), NAN);
  ASSERT_TRUE(ReferenceAttentionGathered(Inputs(m_), *gather, absl::MakeSpan(out)).ok());
  EXPECT_LT(Error(out), 1e-5);

  // Negative control: the buggy formula, on raw integers (the types do not allow it).
  const int64_t ps = f_.page_size().tokens();
  ContextGather buggy = *gather;
  int64_t out_of_pool = 0;
  for (size_t i = 0; i + 1 < m_.kv_indptr.size(); ++i) {
    for (int64_t t = 0; t < lens[i].value(); ++t) {
      const int64_t entry = m_.kv_indptr[i].value() + t / ps;
      int64_t slot = m_.kv_indices[entry].value() * ps + t % ps;
      if (slot >= f_.pool_slots().value()) {
        ++out_of_pool;  // the reference system read past the pool here
        slot %= f_.pool_slots().value();
      }
      buggy.tok_idx[buggy.cu_k[i].value() + t] = TokenSlot(static_cast<int32_t>(slot));
    }
  }
  std::vector<float> bad(p_.q.size(), NAN);
  ASSERT_TRUE(ReferenceAttentionGathered(Inputs(m_), buggy, absl::MakeSpan(bad)).ok());
  EXPECT_GT(Error(bad), 1e-2) << "the page arithmetic must visibly break attention";
  EXPECT_GT(out_of_pool, 0) << "at page_size 64 the buggy slots leave the pool";
}

}  // namespace
}  // namespace attnmeta
