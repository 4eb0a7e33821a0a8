#include "decode_step.h"

#include "gtest/gtest.h"

namespace consumer {
namespace {

TEST(DecodeStepTest, MetadataOfADecodeAfterPrefill) {
  auto m = DecodeStepAfterPrefill({37, 5, 64}, 16, 64, 7);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->kv_indptr.back().value(), 38 + 6 + 65);
  EXPECT_EQ(m->qo_indptr.back().value(), 3);
  EXPECT_EQ(m->max_kv_len.value(), 65);
  EXPECT_EQ(m->page_table.cols().value(), 5);  // ceil(65 / 16)
  // A pool too small for the batch is an error, not a crash.
  EXPECT_EQ(DecodeStepAfterPrefill({37, 5, 64}, 16, 4, 7).status().code(),
            absl::StatusCode::kResourceExhausted);
}

TEST(DecodeStepTest, AGraphReplayOfTheStepValidates) {
  EXPECT_TRUE(ReplayDecodeStepAndValidate({37, 5, 64}, 16, 64, 7, /*bucket=*/4).ok())
      << ReplayDecodeStepAndValidate({37, 5, 64}, 16, 64, 7, 4);
  // More requests than the captured bucket: refused before anything is written.
  EXPECT_EQ(ReplayDecodeStepAndValidate({37, 5, 64}, 16, 64, 7, /*bucket=*/2).code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace consumer
