#include "attention/kernels/device_violation_message.h"

#include <set>
#include <string>

#include "absl/strings/str_cat.h"
#include "attention/kernels/device_violation.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace attnmeta {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

constexpr int64_t kIndex = 41;
constexpr int64_t kValue = 90001;
constexpr int64_t kBound = 777;

kernels::DeviceViolation Violation(int32_t kind) {
  return kernels::DeviceViolation{1, kind, kIndex, kValue, kBound};
}

// Every kind a kernel records, the words that say which array (or item) broke which bound, and
// whether the bound is part of the message (a "negative" has none).
struct Kind {
  kernels::ViolationKind kind;
  const char* names;
  bool has_bound;
};

constexpr Kind kKinds[] = {
    {kernels::kRowOutsideTable, "req_pool_indices entry 41: row 90001 outside [0, 777)", true},
    {kernels::kLengthNegative, "lengths entry 41: 90001 is negative", false},
    {kernels::kLengthPastRow, "kv_lens entry 41: 90001 is past the row of 777", true},
    {kernels::kQueryPastKv, "q_lens entry 41: 90001 query rows over 777 KV tokens", true},
    {kernels::kTotalPastInt32, "indptr entry 41: total 90001 is past INT32_MAX", false},
    {kernels::kTotalPastCapacity, "output entry 41: needs 90001 entries, the buffer holds 777",
     true},
    {kernels::kSlotOutsidePool, "slots entry 41: slot 90001 outside the pool of 777", true},
    {kernels::kIndptrDecreasing, "kv_indptr entry 41: 90001 is below the entry before it (777)",
     true},
    {kernels::kPagesPastTable, "page_table entry 41: needs 90001 pages, the table has 777", true},
    {kernels::kOffsetNegative, "kv_indptr entry 41: 90001 is negative", false},
    {kernels::kQueryIndptrNegative, "qo_indptr entry 41: 90001 is negative", false},
    {kernels::kQueryIndptrDecreasing,
     "qo_indptr entry 41: 90001 is below the entry before it (777)", true},
    {kernels::kQueryRowsPastCapacity, "qo_indptr entry 41: 90001 is past the 777 rows", true},
    {kernels::kQueryPastMaxQLen, "q_lens entry 41: 90001 query rows, past the max_q_len 777", true},
    {kernels::kMaskOutsideBuffer,
     "mask_indptr entry 41: the block at byte 90001 does not fit in the mask of 777 bytes", true},
    {kernels::kQueryRowsMismatch, "qo_indptr entry 41: 90001, want 777", true},
    {kernels::kWorkItemSequence, "split-KV work item 41: sequence 90001 outside the batch of 777",
     true},
    {kernels::kWorkItemPartialSlot,
     "split-KV work item 41: partial slot 90001, the partial buffers hold 777", true},
    {kernels::kWorkItemKvBeginNegative, "split-KV work item 41: kv_begin 90001 is negative", false},
    {kernels::kWorkItemKvEndPastLength,
     "split-KV work item 41: kv_end 90001 is past its sequence's KV length 777", true},
    {kernels::kWorkItemKvEndBeforeBegin,
     "split-KV work item 41: kv_end 90001 is below its kv_begin 777", true},
    {kernels::kReduceItemSequence,
     "split-KV reduce item 41: sequence 90001 outside the batch of 777", true},
    {kernels::kReduceItemPartialEndPastBuffers,
     "split-KV reduce item 41: partial_end 90001 is past the 777 slots", true},
    {kernels::kPartialSlotUnmerged,
     "split-KV work item 41: partial slot 90001 is merged by none of the 777 reduce items", true},
    {kernels::kReduceItemPartialBeginNegative,
     "split-KV reduce item 41: partial_begin 90001 is negative", false},
    {kernels::kReduceItemPartialEndBeforeBegin,
     "split-KV reduce item 41: partial_end 90001 is below its partial_begin 777", true},
    {kernels::kWorkItemShortOfSequence,
     "split-KV work item 41: writes its sequence's output from 90001 of its 777 KV tokens", true},
    {kernels::kStartOutsideRow, "kv_start_idx entry 41: 90001 outside the row of 777 positions",
     true},
};

TEST(DescribeViolationTest, NamesTheArrayTheEntryTheValueAndTheBoundOfEveryKind) {
  for (const Kind& k : kKinds) {
    SCOPED_TRACE(absl::StrCat("kind ", k.kind));
    const std::string message = DescribeViolation(Violation(k.kind));
    EXPECT_THAT(message, HasSubstr(k.names));
    EXPECT_THAT(message, Not(HasSubstr("unknown")));
    if (!k.has_bound) {
      EXPECT_THAT(message, Not(HasSubstr("777")));
    }
  }
}

TEST(DescribeViolationTest, EveryRecordedKindIsInTheTableAndEachHasItsOwnWords) {
  std::set<int32_t> kinds;
  std::set<std::string> messages;
  for (const Kind& k : kKinds) {
    kinds.insert(k.kind);
    messages.insert(DescribeViolation(Violation(k.kind)));
  }
  // Kinds are numbered 1 .. N without gaps; the table holds each once.
  EXPECT_EQ(kinds.size(), sizeof(kKinds) / sizeof(kKinds[0]));
  EXPECT_EQ(*kinds.begin(), 1);
  EXPECT_EQ(*kinds.rbegin(), static_cast<int32_t>(kinds.size()));
  EXPECT_EQ(messages.size(), kinds.size());
}

TEST(DescribeViolationTest, AKindThisBuildDoesNotKnowIsNamedByItsNumber) {
  const int32_t next = static_cast<int32_t>(sizeof(kKinds) / sizeof(kKinds[0])) + 1;
  for (int32_t kind : {kernels::kNoViolation + 0, next, -3}) {
    EXPECT_EQ(DescribeViolation(Violation(kind)),
              absl::StrCat("unknown violation kind ", kind, " at entry 41"));
  }
}

}  // namespace
}  // namespace attnmeta
