#include "decode_step.h"

#include "gtest/gtest.h"

namespace consumer {
namespace {

TEST(DecodeStepTest, MetadataOfADecodeAfterPrefill) {
  auto m = DecodeStepAfterPrefill({37, 5, 64}, 16, 64, 7, /*query_rows=*/3);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->kv_indptr.back().value(), 38 + 6 + 65);
  EXPECT_EQ(m->qo_indptr.back().value(), 3);
  EXPECT_EQ(m->max_kv_len.value(), 65);
  EXPECT_EQ(m->page_table.cols().value(), 5);  // ceil(65 / 16)
  // A pool too small for the batch is an error, not a crash.
  EXPECT_EQ(DecodeStepAfterPrefill({37, 5, 64}, 16, 4, 7, 3).status().code(),
            absl::StatusCode::kResourceExhausted);
  // A query tensor of another size than the batch's rows: caught by the checked build.
  EXPECT_EQ(DecodeStepAfterPrefill({37, 5, 64}, 16, 64, 7, /*query_rows=*/4).status().code(),
            absl::StatusCode::kInvalidArgument);
  // An empty prompt has no last slot for the decode token to follow.
  EXPECT_EQ(DecodeStepAfterPrefill({37, 0, 64}, 16, 64, 7, 3).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(DecodeStepTest, AGraphReplayOfTheStepValidates) {
  // The bucket's view: 3 real rows and a padded one, each with one query row.
  EXPECT_TRUE(
      ReplayDecodeStepAndValidate({37, 5, 64}, 16, 64, 7, /*bucket=*/4, /*query_rows=*/4).ok())
      << ReplayDecodeStepAndValidate({37, 5, 64}, 16, 64, 7, 4, 4);
  // A captured query tensor of the real rows only, not the bucket's.
  EXPECT_EQ(ReplayDecodeStepAndValidate({37, 5, 64}, 16, 64, 7, 4, /*query_rows=*/3).code(),
            absl::StatusCode::kInvalidArgument);
  // More requests than the captured bucket: refused before anything is written.
  EXPECT_EQ(ReplayDecodeStepAndValidate({37, 5, 64}, 16, 64, 7, /*bucket=*/2, 2).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(DecodeStepTest, ADraftExtendReplayLeavesATailOfUnclaimedRows) {
  // Bucket 4 at 4 draft tokens: 16 query rows. Three requests accept 3, 0 and 1 tokens (4, 1 and
  // 2 rows) and the padded request takes 4: 11 rows claimed, the last 5 a tail.
  absl::StatusOr<int64_t> claimed = ReplayDraftExtendStepAndValidate(
      {37, 5, 64}, {3, 0, 1}, 16, 64, 7, /*bucket=*/4, /*draft_tokens=*/4, /*query_rows=*/16);
  ASSERT_TRUE(claimed.ok()) << claimed.status();
  EXPECT_EQ(*claimed, 11);
  // A query tensor smaller than the rows the bucket claims is an error, tail or not.
  EXPECT_EQ(ReplayDraftExtendStepAndValidate({37, 5, 64}, {3, 0, 1}, 16, 64, 7, 4, 4,
                                             /*query_rows=*/10)
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  // More accepted tokens than drafted: refused by the replay before anything is written.
  EXPECT_EQ(
      ReplayDraftExtendStepAndValidate({37, 5, 64}, {4, 0, 1}, 16, 64, 7, 4, 4, 16).status().code(),
      absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace consumer
