#include "attention/metadata/metadata_diff.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "attention/metadata/builders.h"
#include "attention/metadata/testing/batch_fixture.h"
#include "gtest/gtest.h"

namespace attnmeta {
namespace {

ForwardMetadata Build(const testing::BatchFixture& f, ForwardMode mode) {
  absl::StatusOr<ForwardMetadata> m = BuildForwardMetadata(f.Batch(mode), f.pool(), f.page_size());
  EXPECT_TRUE(m.ok()) << m.status();
  return *std::move(m);
}

class MetadataDiffTest : public ::testing::Test {
 protected:
  MetadataDiffTest() : fixture_(16, /*seed=*/11) {
    fixture_.AddSequence(40, 3);
    fixture_.AddSequence(17, 5);
    want_ = Build(fixture_, ForwardMode::kExtend);
    got_ = want_;
  }
  testing::BatchFixture fixture_;
  ForwardMetadata want_;
  ForwardMetadata got_;
};

TEST_F(MetadataDiffTest, EqualMetadataIsOk) {
  EXPECT_TRUE(DiffMetadata(got_.view(), want_.view()).ok());
}

TEST_F(MetadataDiffTest, NamesTheFirstDifferentKvIndex) {
  got_.kv_indices[17] = TokenSlot(got_.kv_indices[17].value() + 1);
  const absl::Status s = DiffMetadata(got_.view(), want_.view());
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(s.message(), absl::StrCat("kv_indices[17]: got ", got_.kv_indices[17].value(),
                                      ", want ", want_.kv_indices[17].value()));
}

TEST_F(MetadataDiffTest, EveryArrayIsCompared) {
  struct Case {
    const char* prefix;
    void (*corrupt)(ForwardMetadata&);
  };
  const Case cases[] = {
      {"kv_indptr[2]", [](ForwardMetadata& m) { m.kv_indptr[2] = TokenOffset(1); }},
      {"qo_indptr[1]", [](ForwardMetadata& m) { m.qo_indptr[1] = TokenOffset(4); }},
      {"kv_lens[0]", [](ForwardMetadata& m) { m.kv_lens[0] = TokenLength(42); }},
      {"kv_last_page_len[1]", [](ForwardMetadata& m) { m.kv_last_page_len[1] = TokenLength(3); }},
      {"max_q_len", [](ForwardMetadata& m) { m.max_q_len = TokenCount(9); }},
      {"max_kv_len", [](ForwardMetadata& m) { m.max_kv_len = TokenCount(9); }},
      {"page_table row 1[0]", [](ForwardMetadata& m) { m.page_table.span().row(1)[0] = PageId(77); }},
      {"mode", [](ForwardMetadata& m) { m.mode = ForwardMode::kMixed; }},
      {"batch size", [](ForwardMetadata& m) { m.kv_lens.pop_back(); }},
      {"kv_indices: got has", [](ForwardMetadata& m) { m.kv_indices.resize(10); }},
  };
  for (const Case& c : cases) {
    ForwardMetadata got = want_;
    c.corrupt(got);
    const absl::Status s = DiffMetadata(got.view(), want_.view());
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << c.prefix;
    EXPECT_TRUE(absl::StartsWith(s.message(), c.prefix)) << s;
  }
}

// The replayed verify mask is compared only here (graph and speculative tests use
// DiffMetadata): each of its three fields must be. DiffMetadata compares, it does not
// validate, so any bytes do as the mask.
TEST_F(MetadataDiffTest, TheCustomMaskIsCompared) {
  want_.mask_layout = MaskLayout::kFull;
  want_.mask_indptr = {0, 3 * 43, 3 * 43 + 5 * 22};
  want_.custom_mask.assign(want_.mask_indptr.back(), 1);
  for (size_t i = 0; i < want_.custom_mask.size(); i += 7) want_.custom_mask[i] = 0;
  ASSERT_TRUE(DiffMetadata(want_.view(), want_.view()).ok());
  struct Case {
    const char* prefix;
    void (*corrupt)(ForwardMetadata&);
  };
  const Case cases[] = {
      {"custom mask layout: got bit_packed",
       [](ForwardMetadata& m) { m.mask_layout = MaskLayout::kBitPacked; }},
      {"mask_indptr[1]", [](ForwardMetadata& m) { m.mask_indptr[1] = 3 * 43 + 1; }},
      {"custom_mask[200]", [](ForwardMetadata& m) { m.custom_mask[200] ^= 1; }},
      {"custom_mask: got has", [](ForwardMetadata& m) { m.custom_mask.pop_back(); }},
  };
  for (const Case& c : cases) {
    ForwardMetadata got = want_;
    c.corrupt(got);
    const absl::Status s = DiffMetadata(got.view(), want_.view());
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << c.prefix;
    EXPECT_TRUE(absl::StartsWith(s.message(), c.prefix)) << c.prefix << ": " << s;
  }
}

TEST_F(MetadataDiffTest, WiderPageTableMustBePaddedPastTheRows) {
  const PageTableSpan<const PageId> want = want_.page_table.span();
  const int64_t cols = want.cols().value();
  std::vector<PageId> wide(want.rows() * (cols + 2), kPaddingPage);
  for (int64_t i = 0; i < want.rows(); ++i) {
    for (int64_t j = 0; j < cols; ++j) wide[i * (cols + 2) + j] = want.row(i)[j];
  }
  ForwardMetadataView got = want_.view();
  got.page_table = *PageTableSpan<const PageId>::Create(absl::MakeConstSpan(wide), want.rows(),
                                                        want.cols() + PageCount(2));
  EXPECT_TRUE(DiffMetadata(got, want_.view()).ok());
  wide[cols + 1] = PageId(5);
  const absl::Status s = DiffMetadata(got, want_.view());
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_TRUE(absl::StartsWith(s.message(), "page_table row 0[")) << s;
}

// The reference's table is checked too: one row short of the batch is an error, not an
// empty row compared (or a subspan past the table).
TEST_F(MetadataDiffTest, WantTableShorterThanTheBatchIsAnError) {
  const PageTableSpan<const PageId> want = want_.page_table.span();
  ASSERT_GE(want.rows(), 2);
  ForwardMetadataView short_want = want_.view();
  short_want.page_table = *PageTableSpan<const PageId>::Create(
      want.entries().subspan(0, (want.rows() - 1) * want.cols().value()), want.rows() - 1,
      want.cols());
  const absl::Status s = DiffMetadata(want_.view(), short_want);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  // Named as the reference's shortfall, not as a difference in the row past its end.
  EXPECT_TRUE(absl::StartsWith(s.message(), "page table rows (want)")) << s;
}

TEST_F(MetadataDiffTest, TablePresenceMustAgree) {
  ForwardMetadataView got = want_.view();
  got.page_table = {};
  const absl::Status s = DiffMetadata(got, want_.view());
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_TRUE(absl::StartsWith(s.message(), "page table: got none")) << s;
}

}  // namespace
}  // namespace attnmeta
