#include "attention/kernels/checked_metadata.h"

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "attention/metadata/builders.h"
#include "attention/metadata/split_kv_planner.h"
#include "attention/metadata/testing/batch_fixture.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace attnmeta {
namespace {

using ::testing::HasSubstr;
using testing::BatchFixture;

// A decode batch of 4 sequences over a shuffled pool of page size 16, with its page table.
struct DecodeBatch {
  explicit DecodeBatch(bool page_table = true) : f(16, 5) {
    for (int64_t cached : {30, 0, 77, 16}) f.AddSequence(cached, 1);
    m = *BuildForwardMetadata(f.Batch(ForwardMode::kDecode), f.pool(), f.page_size(),
                              {.page_table = page_table});
  }
  CheckedMetadata Checked() const {
    ValidationContext ctx{f.pool_slots(), f.page_size(), f.num_query_rows()};
    ctx.check_slot_ownership = true;
    return CheckedMetadata{m.view(), ctx};
  }
  // The token-level launch of this batch.
  LaunchedMetadataShape TokenLevel() const {
    LaunchedMetadataShape s;
    s.batch_size = 4;
    s.query_rows = TokenCount(4);
    s.pool_slots = f.pool_slots();
    s.kv_indices_entries = TokenCount(static_cast<int64_t>(m.kv_indices.size()));
    s.max_q_len = TokenCount(1);
    return s;
  }
  LaunchedMetadataShape PageTable() const {
    LaunchedMetadataShape s = TokenLevel();
    s.page_table = true;
    s.kv_indices_entries = TokenCount(0);
    s.page_table_cols = PageCount(m.page_table.cols());
    s.page_size = f.page_size();
    return s;
  }
  BatchFixture f;
  ForwardMetadata m;
};

TEST(CheckLaunchedMetadataTest, AcceptsTheMetadataOfTheLaunch) {
  const DecodeBatch b;
  EXPECT_TRUE(CheckLaunchedMetadata(b.Checked(), b.TokenLevel()).ok());
  EXPECT_TRUE(CheckLaunchedMetadata(b.Checked(), b.PageTable()).ok());
  // A larger device kv_indices (a graph's fixed buffer), a larger pool, a looser max_q_len.
  LaunchedMetadataShape s = b.TokenLevel();
  s.kv_indices_entries += TokenCount(100);
  s.pool_slots += TokenCount(16);
  s.max_q_len = TokenCount(3);
  EXPECT_TRUE(CheckLaunchedMetadata(b.Checked(), s).ok());
}

// Metadata that is in bounds but wrong: the validator's error, with the array it names.
TEST(CheckLaunchedMetadataTest, RefusesMetadataThatFailsValidation) {
  // The slot sequence 0's new token is written to, also a token of sequence 2: inside the
  // pool, so no kernel guard sees it (slot ownership; no page table to disagree with).
  DecodeBatch b(/*page_table=*/false);
  b.m.kv_indices[b.m.kv_indptr[1].value() - 1] = b.m.kv_indices[b.m.kv_indptr[2].value() + 3];
  absl::Status s = CheckLaunchedMetadata(b.Checked(), b.TokenLevel());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("checked mode: "));
  EXPECT_THAT(std::string(s.message()), HasSubstr("a slot handed out twice"));

  DecodeBatch c;
  c.m.kv_indptr[2] = TokenOffset(c.m.kv_indptr[2].value() + 1);  // no longer steps by kv_lens
  s = CheckLaunchedMetadata(c.Checked(), c.TokenLevel());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("kv_indptr"));

  DecodeBatch d;
  PageId& page = d.m.page_table.span().row(2)[1];
  page = PageId(page.value() + 1);  // not the page kv_indices puts that token on
  s = CheckLaunchedMetadata(d.Checked(), d.PageTable());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("page_table"));
}

// A host copy that is not the launch's, refused before it is validated against the wrong
// pool or query rows.
TEST(CheckLaunchedMetadataTest, RefusesAHostCopyOfAnotherLaunch) {
  const DecodeBatch b;
  const auto refused = [&](LaunchedMetadataShape s, const std::string& what) {
    const absl::Status st = CheckLaunchedMetadata(b.Checked(), s);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << what;
    EXPECT_THAT(std::string(st.message()), HasSubstr(what));
  };
  LaunchedMetadataShape s = b.TokenLevel();
  s.batch_size = 5;
  refused(s, "batch size is 4, the launch's 5");
  s = b.TokenLevel();
  s.query_rows = TokenCount(3);
  refused(s, "num_query_rows is 4, the launch's query rows 3");
  s = b.TokenLevel();
  s.pool_slots -= TokenCount(1);
  refused(s, "exceed the launch pools'");
  s = b.TokenLevel();
  s.kv_indices_entries -= TokenCount(1);
  refused(s, "but the launch's kv_indices holds");
  s = b.TokenLevel();
  s.mask_layout = MaskLayout::kFull;
  refused(s, "mask layout");
  s = b.TokenLevel();
  s.max_q_len = TokenCount(0);
  refused(s, "max_q_len");
  s = b.TokenLevel();
  s.max_q_len = TokenCount(2);
  s.max_q_len_exact = true;
  refused(s, "max_q_len (the launch's must equal it)");
  s = b.PageTable();
  s.page_table_cols += PageCount(1);
  refused(s, "page table width");
  s = b.PageTable();
  s.page_size = *PageSize::Create(64);
  refused(s, "the context's page_size is 16, the launch's page table's 64");

  const DecodeBatch no_table(/*page_table=*/false);
  const absl::Status st = CheckLaunchedMetadata(no_table.Checked(), b.PageTable());
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(st.message()), HasSubstr("has none"));
}

// A tail of query rows no sequence claims (a captured variable-row extend): accepted only in
// extend and draft-extend, where the context allows it and the launch writes it.
TEST(CheckLaunchedMetadataTest, UnclaimedQueryRowsOnlyForALaunchThatWritesThem) {
  DecodeBatch b;
  CheckedMetadata checked = b.Checked();
  checked.context.allow_unclaimed_rows = true;
  LaunchedMetadataShape s = b.TokenLevel();
  // No tail: the allowance changes nothing, whatever the launch writes.
  EXPECT_TRUE(CheckLaunchedMetadata(checked, s).ok()) << CheckLaunchedMetadata(checked, s);
  // Two rows past qo_indptr[bs] = 4.
  checked.context.num_query_rows = TokenCount(6);
  s.query_rows = TokenCount(6);
  s.max_q_len = TokenCount(2);
  absl::Status st = CheckLaunchedMetadata(checked, s);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(st.message(),
            "checked mode: qo_indptr: qo_indptr[bs] = 4 but the query tensor has 6 rows")
      << "decode has no tail, whatever the context allows";
  b.m.mode = ForwardMode::kExtend;
  checked = b.Checked();
  checked.context.allow_unclaimed_rows = true;
  checked.context.num_query_rows = TokenCount(6);
  st = CheckLaunchedMetadata(checked, s);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(st.message(),
            "checked mode: qo_indptr: qo_indptr[bs] = 4 but the query tensor has 6 rows")
      << "the launch does not write the tail";
  s.zero_unclaimed_rows = true;
  EXPECT_TRUE(CheckLaunchedMetadata(checked, s).ok()) << CheckLaunchedMetadata(checked, s);
  checked.context.allow_unclaimed_rows = false;
  st = CheckLaunchedMetadata(checked, s);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(st.message(),
            "checked mode: qo_indptr: qo_indptr[bs] = 4 but the query tensor has 6 rows");
}

// A split plan of another step's batch: a sequence's items ending short of its KV length (its
// newest token unread) or past it, or naming a sequence the batch does not have.
TEST(CheckLaunchedMetadataTest, RefusesASplitPlanThatDoesNotEndAtEachLength) {
  const DecodeBatch b;
  std::vector<TokenOffset> qo_indptr;
  for (int32_t i = 0; i <= 4; ++i) qo_indptr.push_back(TokenOffset(i));
  SplitKvOptions options;
  options.num_units = 8;
  options.kv_granularity = TokenCount(16);
  const absl::StatusOr<SplitKvPlan> plan = PlanSplitKv(qo_indptr, b.m.kv_indptr, options);
  ASSERT_TRUE(plan.ok()) << plan.status();
  LaunchedMetadataShape s = b.TokenLevel();
  s.split_plan = &*plan;
  EXPECT_TRUE(CheckLaunchedMetadata(b.Checked(), s).ok()) << CheckLaunchedMetadata(b.Checked(), s);
  const auto refused = [&](SplitKvPlan bad, const std::string& what) {
    LaunchedMetadataShape t = b.TokenLevel();
    t.split_plan = &bad;
    const absl::Status st = CheckLaunchedMetadata(b.Checked(), t);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << what;
    EXPECT_THAT(std::string(st.message()), HasSubstr(what));
  };
  // Sequence 2 (78 tokens) is split; its last item is the one ending at 78.
  const auto last_of = [](SplitKvPlan& p, int32_t sequence) -> SplitKvWorkItem& {
    SplitKvWorkItem* last = nullptr;
    for (SplitKvWorkItem& w : p.work) {
      if (w.sequence == sequence && (last == nullptr || w.kv_end > last->kv_end)) last = &w;
    }
    return *last;
  };
  SplitKvPlan short_plan = *plan;
  ASSERT_EQ(last_of(short_plan, 2).kv_end, TokenPosition(78));
  last_of(short_plan, 2).kv_end = TokenPosition(77);
  refused(short_plan, "items of sequence 2 end at 77, its KV length is 78");
  SplitKvPlan long_plan = *plan;
  last_of(long_plan, 0).kv_end = TokenPosition(32);
  refused(long_plan, "items of sequence 0 end at 32, its KV length is 31");
  SplitKvPlan foreign = *plan;
  foreign.work.back().sequence = 7;
  refused(foreign, "names sequence 7 of a batch of 4");
}

// An extend batch with a FULL mask: the device mask must hold the host's mask_indptr[bs] bytes.
TEST(CheckLaunchedMetadataTest, RefusesADeviceMaskSmallerThanTheHostMask) {
  BatchFixture f(16, 9);
  f.AddSequence(10, 2);
  f.AddSequence(5, 3);
  const std::vector<uint8_t> tree = {1, 0, 1, 1, 1, 0, 0, 1, 1, 0, 1, 1, 1};
  ForwardBatch batch = f.Batch(ForwardMode::kExtend);
  batch.tree_mask = tree;
  BuildOptions options;
  options.page_table = false;
  options.mask_layout = MaskLayout::kFull;
  absl::StatusOr<ForwardMetadata> m = BuildForwardMetadata(batch, f.pool(), f.page_size(), options);
  ASSERT_TRUE(m.ok()) << m.status();
  const CheckedMetadata checked{m->view(),
                                ValidationContext{f.pool_slots(), f.page_size(), f.num_query_rows()}};
  LaunchedMetadataShape s;
  s.batch_size = 2;
  s.query_rows = TokenCount(5);
  s.pool_slots = f.pool_slots();
  s.kv_indices_entries = TokenCount(static_cast<int64_t>(m->kv_indices.size()));
  s.mask_layout = MaskLayout::kFull;
  s.mask_bytes = static_cast<int64_t>(m->custom_mask.size());
  s.max_q_len = TokenCount(3);
  EXPECT_TRUE(CheckLaunchedMetadata(checked, s).ok()) << CheckLaunchedMetadata(checked, s);
  s.mask_bytes = m->mask_indptr.back() - 1;
  const absl::Status st = CheckLaunchedMetadata(checked, s);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(st.message()), HasSubstr("but the launch's mask holds"));
}

}  // namespace
}  // namespace attnmeta
