#include "attention/graph/batch_buckets.h"

#include "gtest/gtest.h"

namespace attnmeta {
namespace {

TEST(BatchSizeBucketsTest, DefaultListAsEnginesUseIt) {
  const BatchSizeBuckets d = BatchSizeBuckets::Default();
  std::vector<int64_t> want = {1, 2, 4};
  for (int64_t b = 8; b <= 256; b += 8) want.push_back(b);
  EXPECT_EQ(d.sizes(), want);
  EXPECT_EQ(d.largest(), 256);
}

TEST(BatchSizeBucketsTest, SmallestBucketThatHoldsTheBatch) {
  const BatchSizeBuckets d = BatchSizeBuckets::Default();
  auto bucket = [&](int64_t bs) { return d.Choose(bs)->bucket; };
  EXPECT_EQ(bucket(0), 1);
  EXPECT_EQ(bucket(1), 1);
  EXPECT_EQ(bucket(3), 4);
  EXPECT_EQ(bucket(8), 8);
  EXPECT_EQ(bucket(9), 16);
  EXPECT_EQ(bucket(255), 256);
  EXPECT_EQ(bucket(256), 256);
  EXPECT_FALSE(d.Choose(256)->eager);
  // Larger than the largest bucket: run eagerly, not an error.
  auto big = d.Choose(257);
  ASSERT_TRUE(big.ok());
  EXPECT_TRUE(big->eager);
  EXPECT_EQ(d.Choose(-1).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(BatchSizeBucketsTest, ConfiguredAndFromConfig) {
  EXPECT_EQ(BatchSizeBuckets::Create({}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(BatchSizeBuckets::Create({4, 4}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(BatchSizeBuckets::Create({0, 4}).status().code(), absl::StatusCode::kInvalidArgument);
  // Decreasing: Choose's binary search would pick wrong buckets.
  const absl::Status decreasing = BatchSizeBuckets::Create({8, 4, 16}).status();
  EXPECT_EQ(decreasing.code(), absl::StatusCode::kInvalidArgument) << decreasing;
  EXPECT_NE(decreasing.message().find("entry 1 = 4"), absl::string_view::npos) << decreasing;
  auto b = BatchSizeBuckets::Create({3, 10, 48});
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->Choose(4)->bucket, 10);
  EXPECT_TRUE(b->Choose(49)->eager);
  BackendConfig c;
  c.set_max_batch_size(20);
  EXPECT_EQ(BatchSizeBuckets::ForConfig(c).sizes(), (std::vector<int64_t>{1, 2, 4, 8, 16, 20}));
  EXPECT_FALSE(BatchSizeBuckets::ForConfig(c).Choose(20)->eager);
  c.set_max_batch_size(16);
  EXPECT_EQ(BatchSizeBuckets::ForConfig(c).sizes(), (std::vector<int64_t>{1, 2, 4, 8, 16}));
  c.set_max_batch_size(20);
  c.add_capture_batch_sizes(5);
  c.add_capture_batch_sizes(20);
  EXPECT_EQ(BatchSizeBuckets::ForConfig(c).sizes(), (std::vector<int64_t>{5, 20}));
}

}  // namespace
}  // namespace attnmeta
