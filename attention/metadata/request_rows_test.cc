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

// The sorting form finds the same pair: the earliest request whose row an earlier one holds.
TEST(CheckDistinctRowsTest, TheSortingFormNamesTheSamePair) {
  EXPECT_TRUE(CheckDistinctRows(Rows({3, 0, 7, 5})).ok());
  EXPECT_TRUE(CheckDistinctRows({}).ok());
  for (const std::vector<ReqPoolIndex>& rows :
       {Rows({2, 4, 6, 4, 2}), Rows({9, 1, 1, 9}), Rows({5, 3, 5, 3, 3}), Rows({7, 7}),
        Rows({0, 8, 6, 4, 2, 6, 8})}) {
    std::vector<uint8_t> marks(16, 0);
    const absl::Status by_marks = CheckDistinctRows(rows, absl::MakeSpan(marks));
    const absl::Status by_sorting = CheckDistinctRows(rows);
    EXPECT_EQ(by_sorting.code(), absl::StatusCode::kInvalidArgument) << by_sorting;
    EXPECT_EQ(by_sorting, by_marks);
  }
  EXPECT_EQ(CheckDistinctRows(Rows({9, 1, 1, 9})).message(),
            "requests 1 and 2 share req row 1 (a row holds one request's tokens)");
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
