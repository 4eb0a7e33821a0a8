#include "kvcache/req_to_token_pool.h"

#include <random>
#include <set>
#include <vector>

#include "gtest/gtest.h"

namespace attnmeta {
namespace {

std::vector<TokenSlot> Slots(std::initializer_list<int32_t> v) {
  std::vector<TokenSlot> out;
  for (int32_t s : v) out.push_back(TokenSlot(s));
  return out;
}

TEST(ReqToTokenPoolTest, CreateRejectsBadSizes) {
  EXPECT_EQ(ReqToTokenPool::Create(0, TokenCount(8)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ReqToTokenPool::Create(-1, TokenCount(8)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ReqToTokenPool::Create(4, TokenCount(0)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ReqToTokenPool::Create(4, TokenCount(-3)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ReqToTokenPool::Create(1 << 16, TokenCount(1 << 16)).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(ReqToTokenPoolTest, AllocatesLowestFreeRowAndExhausts) {
  ReqToTokenPool pool = *ReqToTokenPool::Create(3, TokenCount(8));
  EXPECT_EQ(*pool.Allocate(), ReqPoolIndex(0));
  EXPECT_EQ(*pool.Allocate(), ReqPoolIndex(1));
  EXPECT_EQ(*pool.Allocate(), ReqPoolIndex(2));
  EXPECT_EQ(pool.num_free_rows(), 0);
  EXPECT_EQ(pool.Allocate().status().code(), absl::StatusCode::kResourceExhausted);
  ASSERT_TRUE(pool.Free(ReqPoolIndex(1)).ok());
  ASSERT_TRUE(pool.Free(ReqPoolIndex(0)).ok());
  EXPECT_EQ(*pool.Allocate(), ReqPoolIndex(0));
  EXPECT_EQ(*pool.Allocate(), ReqPoolIndex(1));
}

TEST(ReqToTokenPoolTest, AllocateRowTakesThatRow) {
  ReqToTokenPool pool = *ReqToTokenPool::Create(4, TokenCount(8));
  ASSERT_TRUE(pool.AllocateRow(ReqPoolIndex(2)).ok());
  EXPECT_TRUE(pool.IsAllocated(ReqPoolIndex(2)));
  EXPECT_EQ(pool.AllocateRow(ReqPoolIndex(2)).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(pool.AllocateRow(ReqPoolIndex(4)).code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(pool.num_free_rows(), 3);
  EXPECT_EQ(*pool.Allocate(), ReqPoolIndex(0));
  EXPECT_EQ(*pool.Allocate(), ReqPoolIndex(1));
  EXPECT_EQ(*pool.Allocate(), ReqPoolIndex(3));
}

// Rows taken by number, freed and handed out again, in a random order, against a set of the
// free rows: Allocate must hand out the lowest free row after any mix of them.
TEST(ReqToTokenPoolTest, RowsTakenByNumberKeepTheFreeListInOrder) {
  constexpr uint32_t kSeed = 53;
  constexpr int32_t kRows = 64;
  std::mt19937 rng(kSeed);
  ReqToTokenPool pool = *ReqToTokenPool::Create(kRows, TokenCount(2));
  std::set<int32_t> free_rows;
  for (int32_t r = 0; r < kRows; ++r) free_rows.insert(r);
  for (int step = 0; step < 2000; ++step) {
    SCOPED_TRACE(::testing::Message() << "seed " << kSeed << ", step " << step);
    const int32_t row = static_cast<int32_t>(rng() % kRows);
    switch (rng() % 3) {
      case 0:
        if (free_rows.count(row) != 0) {
          ASSERT_TRUE(pool.AllocateRow(ReqPoolIndex(row)).ok());
          free_rows.erase(row);
        } else {
          ASSERT_EQ(pool.AllocateRow(ReqPoolIndex(row)).code(),
                    absl::StatusCode::kFailedPrecondition);
        }
        break;
      case 1:
        if (free_rows.count(row) == 0) {
          ASSERT_TRUE(pool.Free(ReqPoolIndex(row)).ok());
          free_rows.insert(row);
        }
        break;
      default:
        if (free_rows.empty()) {
          ASSERT_EQ(pool.Allocate().status().code(), absl::StatusCode::kResourceExhausted);
        } else {
          ASSERT_EQ(*pool.Allocate(), ReqPoolIndex(*free_rows.begin()));
          free_rows.erase(free_rows.begin());
        }
    }
    ASSERT_EQ(pool.num_free_rows(), static_cast<int32_t>(free_rows.size()));
    for (int32_t r = 0; r < kRows; ++r) {
      ASSERT_EQ(pool.IsAllocated(ReqPoolIndex(r)), free_rows.count(r) == 0) << "row " << r;
    }
  }
}

TEST(ReqToTokenPoolTest, FreeErrorsLeaveStateUnchanged) {
  ReqToTokenPool pool = *ReqToTokenPool::Create(2, TokenCount(4));
  const ReqPoolIndex r = *pool.Allocate();
  EXPECT_EQ(pool.Free(ReqPoolIndex(5)).code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(pool.Free(ReqPoolIndex(-1)).code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(pool.Free(ReqPoolIndex(1)).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(pool.num_free_rows(), 1);
  ASSERT_TRUE(pool.Free(r).ok());
  EXPECT_EQ(pool.Free(r).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(pool.num_free_rows(), 2);
}

TEST(ReqToTokenPoolTest, WriteThenReadRoundTrips) {
  ReqToTokenPool pool = *ReqToTokenPool::Create(2, TokenCount(6));
  const ReqPoolIndex a = *pool.Allocate();
  const ReqPoolIndex b = *pool.Allocate();
  ASSERT_TRUE(pool.Write(a, TokenCount(0), Slots({17, 18, 19})).ok());
  ASSERT_TRUE(pool.Write(a, TokenCount(3), Slots({40})).ok());
  ASSERT_TRUE(pool.Write(b, TokenCount(4), Slots({7, 8})).ok());
  auto prefix = pool.Read(a, TokenCount(0), TokenCount(4));
  ASSERT_TRUE(prefix.ok());
  EXPECT_EQ(std::vector<TokenSlot>(prefix->begin(), prefix->end()), Slots({17, 18, 19, 40}));
  auto tail = pool.Read(b, TokenCount(4), TokenCount(2));
  ASSERT_TRUE(tail.ok());
  EXPECT_EQ(std::vector<TokenSlot>(tail->begin(), tail->end()), Slots({7, 8}));
  // Row-major flat table, as kernels read it.
  EXPECT_EQ(pool.table()[1 * 6 + 5], TokenSlot(8));
  EXPECT_EQ(pool.table().size(), 12u);
}

TEST(ReqToTokenPoolTest, OutOfRangeWritesAndReadsChangeNothing) {
  ReqToTokenPool pool = *ReqToTokenPool::Create(2, TokenCount(4));
  const ReqPoolIndex a = *pool.Allocate();
  ASSERT_TRUE(pool.Write(a, TokenCount(0), Slots({1, 2, 3, 4})).ok());
  const std::vector<TokenSlot> before(pool.table().begin(), pool.table().end());

  EXPECT_EQ(pool.Write(a, TokenCount(2), Slots({9, 9, 9})).code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(pool.Write(a, TokenCount(-1), Slots({9})).code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(pool.Write(ReqPoolIndex(1), TokenCount(0), Slots({9})).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(pool.Write(ReqPoolIndex(2), TokenCount(0), Slots({9})).code(),
            absl::StatusCode::kOutOfRange);
  EXPECT_EQ(pool.Read(a, TokenCount(1), TokenCount(4)).status().code(),
            absl::StatusCode::kOutOfRange);
  EXPECT_EQ(pool.Read(a, TokenCount(0), TokenCount(-1)).status().code(),
            absl::StatusCode::kOutOfRange);
  EXPECT_EQ(pool.Read(a, TokenCount(1), TokenCount(INT64_MAX)).status().code(),
            absl::StatusCode::kOutOfRange);
  EXPECT_EQ(pool.Read(ReqPoolIndex(1), TokenCount(0), TokenCount(1)).status().code(),
            absl::StatusCode::kFailedPrecondition);

  EXPECT_EQ(std::vector<TokenSlot>(pool.table().begin(), pool.table().end()), before);
}

}  // namespace
}  // namespace attnmeta
