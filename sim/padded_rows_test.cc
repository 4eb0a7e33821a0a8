#include "sim/padded_rows.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace attnmeta {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

constexpr int64_t kRowValues = 6;  // 2 query heads of head dim 3
constexpr int64_t kHeads = 2;
constexpr int64_t kBucket = 4;

// A bucket of 4 rows, every value finite and distinct.
struct Bucket {
  std::vector<float> out = std::vector<float>(kBucket * kRowValues);  // [kBucket][kRowValues]
  std::vector<float> lse = std::vector<float>(kBucket * kHeads);      // [kBucket][kHeads]
  Bucket() {
    for (size_t i = 0; i < out.size(); ++i) out[i] = 0.5f * static_cast<float>(i) - 3.0f;
    for (size_t i = 0; i < lse.size(); ++i) lse[i] = 1.0f + static_cast<float>(i);
  }
};

// Equal sizes and bytes (NaN included, which == would not match).
bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

TEST(TrimPaddedRowsTest, FinitePaddedRowsAreCutOff) {
  Bucket b;
  const Bucket before;
  ASSERT_TRUE(TrimPaddedRows(2, kRowValues, kHeads, &b.out, &b.lse).ok());
  EXPECT_EQ(b.out, std::vector<float>(before.out.begin(), before.out.begin() + 2 * kRowValues));
  EXPECT_EQ(b.lse, std::vector<float>(before.lse.begin(), before.lse.begin() + 2 * kHeads));
}

TEST(TrimPaddedRowsTest, ABucketWithoutPaddingIsKeptWhole) {
  Bucket b;
  const Bucket before;
  ASSERT_TRUE(TrimPaddedRows(kBucket, kRowValues, kHeads, &b.out, &b.lse).ok());
  EXPECT_EQ(b.out, before.out);
  EXPECT_EQ(b.lse, before.lse);
}

TEST(TrimPaddedRowsTest, NoRealRowsLeavesEmptyArrays) {
  Bucket b;
  ASSERT_TRUE(TrimPaddedRows(0, kRowValues, kHeads, &b.out, &b.lse).ok());
  EXPECT_TRUE(b.out.empty());
  EXPECT_TRUE(b.lse.empty());
}

// Each non-finite value in a padded row fails, named by its row and array, whether it is the
// first value past the real rows, one in the middle or the bucket's last.
TEST(TrimPaddedRowsTest, ANonFinitePaddedValueIsNamedAndNothingChanges) {
  struct Case {
    bool in_lse;
    int64_t index;
    float value;
    const char* row;
    const char* printed;  // the value as the message prints it
  };
  for (const Case& c : {Case{false, 2 * kRowValues, kNaN, "padded row 2 ", ": nan in"},
                        Case{false, 3 * kRowValues + 4, kInf, "padded row 3 ", ": inf in"},
                        Case{false, kBucket * kRowValues - 1, -kInf, "padded row 3 ", ": -inf in"},
                        Case{true, 2 * kHeads, -kInf, "padded row 2 ", ": -inf in"},
                        Case{true, 2 * kHeads + 1, kNaN, "padded row 2 ", ": nan in"},
                        Case{true, kBucket * kHeads - 1, kInf, "padded row 3 ", ": inf in"}}) {
    SCOPED_TRACE(testing::Message() << (c.in_lse ? "lse" : "output") << " index " << c.index);
    Bucket b;
    (c.in_lse ? b.lse : b.out)[c.index] = c.value;
    const Bucket poisoned = b;
    const absl::Status s = TrimPaddedRows(2, kRowValues, kHeads, &b.out, &b.lse);
    EXPECT_EQ(s.code(), absl::StatusCode::kInternal);
    EXPECT_THAT(s.message(), AllOf(HasSubstr(c.row), HasSubstr(c.printed),
                                   HasSubstr(c.in_lse ? "in its lse" : "in its output")));
    EXPECT_TRUE(SameBits(b.out, poisoned.out));
    EXPECT_TRUE(SameBits(b.lse, poisoned.lse));
  }
}

// With several, the first is named: the output's padded rows in order, then the lse's.
TEST(TrimPaddedRowsTest, TheFirstNonFiniteValueIsNamed) {
  Bucket b;
  b.out[3 * kRowValues] = kNaN;
  b.out[2 * kRowValues + 5] = kInf;
  b.lse[2 * kHeads] = -kInf;
  absl::Status s = TrimPaddedRows(2, kRowValues, kHeads, &b.out, &b.lse);
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal);
  EXPECT_THAT(s.message(), AllOf(HasSubstr("padded row 2 "), HasSubstr(": inf in its output")));
  b.out[2 * kRowValues + 5] = 1.0f;
  b.out[3 * kRowValues] = 1.0f;
  s = TrimPaddedRows(2, kRowValues, kHeads, &b.out, &b.lse);
  EXPECT_THAT(s.message(), AllOf(HasSubstr("padded row 2 "), HasSubstr(": -inf in its lse")));
}

// Sizes whose products would overflow int64 are refused, not wrapped into a match.
TEST(TrimPaddedRowsTest, CountsPastInt64AreRefused) {
  std::vector<float> out(4, 1.0f);  // [4][1]
  std::vector<float> lse(4, 2.0f);
  // 4 rows of 2^62 + 1 heads: 2^64 + 4 values, a product that wraps to the lse's 4.
  const absl::Status s = TrimPaddedRows(2, 1, (int64_t{1} << 62) + 1, &out, &lse);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_EQ(out, std::vector<float>(4, 1.0f));
  EXPECT_EQ(lse, std::vector<float>(4, 2.0f));
}

// The real rows are the comparison's business (against the CPU reference), not this check's.
TEST(TrimPaddedRowsTest, NonFiniteRealRowsAreLeftToTheComparison) {
  Bucket b;
  b.out[2 * kRowValues - 1] = kNaN;
  b.lse[2 * kHeads - 1] = -kInf;
  ASSERT_TRUE(TrimPaddedRows(2, kRowValues, kHeads, &b.out, &b.lse).ok());
  ASSERT_EQ(b.out.size(), 2 * kRowValues);
  EXPECT_TRUE(std::isnan(b.out.back()));
  EXPECT_EQ(b.lse.back(), -kInf);
}

TEST(TrimPaddedRowsTest, ArraysNotOfOneBucketAreRefused) {
  struct Case {
    int64_t real_rows, row_values, heads, out_size, lse_size;
  };
  for (const Case& c :
       {Case{-1, kRowValues, kHeads, kBucket * kRowValues, kBucket * kHeads},
        Case{kBucket + 1, kRowValues, kHeads, kBucket * kRowValues, kBucket * kHeads},
        Case{2, 0, kHeads, kBucket * kRowValues, kBucket * kHeads},
        Case{2, kRowValues, 0, kBucket * kRowValues, kBucket * kHeads},
        Case{2, kRowValues, kHeads, kBucket * kRowValues + 1, kBucket * kHeads},
        Case{2, kRowValues, kHeads, kBucket * kRowValues, kBucket * kHeads - 1},
        Case{2, kRowValues, kHeads, kBucket * kRowValues, kBucket * kHeads + 2}}) {
    SCOPED_TRACE(testing::Message()
                 << "real_rows " << c.real_rows << " row_values " << c.row_values << " heads "
                 << c.heads << " sizes " << c.out_size << ", " << c.lse_size);
    std::vector<float> out(c.out_size, 1.0f);
    std::vector<float> lse(c.lse_size, 2.0f);
    const absl::Status s = TrimPaddedRows(c.real_rows, c.row_values, c.heads, &out, &lse);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_EQ(out, std::vector<float>(c.out_size, 1.0f));
    EXPECT_EQ(lse, std::vector<float>(c.lse_size, 2.0f));
  }
}

}  // namespace
}  // namespace attnmeta
