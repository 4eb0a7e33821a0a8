#include "attention/metadata/request_rows.h"

#include <algorithm>
#include <cstdint>
#include <vector>

#include "gtest/gtest.h"

namespace attnmeta {
namespace {

std::vector<ReqPoolIndex> Rows(std::initializer_list<int32_t> rows) {
  std::vector<ReqPoolIndex> out;
  for (int32_t r : rows) out.push_back(ReqPoolIndex(r));
  return out;
}

bool AllZero(const std::vector<uint8_t>& marks) {
  return std::all_of(marks.begin(), marks.end(), [](uint8_t m) { return m == 0; });
}

TEST(CheckDistinctRowsTest, DistinctRowsPassAndLeaveNoMarks) {
  std::vector<uint8_t> marks(8, 0);
  EXPECT_TRUE(CheckDistinctRows(Rows({3, 0, 7, 5}), absl::MakeSpan(marks)).ok());
  EXPECT_TRUE(AllZero(marks));
  EXPECT_TRUE(CheckDistinctRows({}, absl::MakeSpan(marks)).ok());
  // The same rows again: nothing was left marked.
  EXPECT_TRUE(CheckDistinctRows(Rows({3, 0, 7, 5}), absl::MakeSpan(marks)).ok());
}

TEST(CheckDistinctRowsTest, ARepeatedRowNamesBothRequestsAndLeavesNoMarks) {
  std::vector<uint8_t> marks(8, 0);
  const absl::Status s = CheckDistinctRows(Rows({2, 4, 6, 4, 2}), absl::MakeSpan(marks));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_EQ(s.message(), "requests 1 and 3 share req row 4 (a row holds one request's tokens)");
  EXPECT_TRUE(AllZero(marks));
  EXPECT_TRUE(CheckDistinctRows(Rows({2, 4, 6}), absl::MakeSpan(marks)).ok());
}

TEST(CheckDistinctRowsTest, ARowOutsideTheMarksIsOutOfRangeAndLeavesNoMarks) {
  std::vector<uint8_t> marks(4, 0);
  for (int32_t bad : {4, -1, 1 << 30}) {
    const absl::Status s = CheckDistinctRows(Rows({0, 1, bad}), absl::MakeSpan(marks));
    EXPECT_EQ(s.code(), absl::StatusCode::kOutOfRange) << bad << ": " << s;
    EXPECT_NE(s.message().find("request 2: req row"), absl::string_view::npos) << s;
    EXPECT_TRUE(AllZero(marks)) << bad;
  }
}

}  // namespace
}  // namespace attnmeta
