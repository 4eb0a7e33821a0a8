#include "kvcache/req_to_token_pool.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "glog/logging.h"

namespace attnmeta {
namespace {

// The free list's order: back() is the lowest row.
bool DescendingRows(ReqPoolIndex a, ReqPoolIndex b) { return b < a; }

}  // namespace

absl::StatusOr<ReqToTokenPool> ReqToTokenPool::Create(int32_t max_reqs,
                                                      TokenCount max_context_len) {
  if (max_reqs < 1) {
    return absl::InvalidArgumentError(absl::StrCat("max_reqs must be >= 1, got ", max_reqs));
  }
  if (max_context_len.value() < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_context_len must be >= 1, got ", max_context_len.value()));
  }
  if (max_context_len.value() > kMaxEntries / max_reqs) {
    return absl::InvalidArgumentError(absl::StrCat(
        "req_to_token table of ", max_reqs, " x ", max_context_len.value(),
        " entries exceeds the int32-addressable limit of ", kMaxEntries));
  }
  return ReqToTokenPool(max_reqs, max_context_len.value());
}

ReqToTokenPool::ReqToTokenPool(int32_t max_reqs, int64_t max_context_len)
    : max_reqs_(max_reqs),
      max_context_len_(max_context_len),
      table_(static_cast<size_t>(max_reqs) * max_context_len, TokenSlot(0)),
      allocated_(max_reqs, false) {
  free_rows_.reserve(max_reqs);
  for (int32_t r = max_reqs - 1; r >= 0; --r) free_rows_.push_back(ReqPoolIndex(r));
}

absl::Status ReqToTokenPool::CheckRow(ReqPoolIndex row) const {
  if (row.value() < 0 || row.value() >= max_reqs_) {
    return absl::OutOfRangeError(
        absl::StrCat("req row ", row.value(), " outside [0, ", max_reqs_, ")"));
  }
  return absl::OkStatus();
}

absl::StatusOr<ReqPoolIndex> ReqToTokenPool::Allocate() {
  if (free_rows_.empty()) {
    return absl::ResourceExhaustedError(
        absl::StrCat("all ", max_reqs_, " req_to_token rows are allocated"));
  }
  ReqPoolIndex row = free_rows_.back();
  free_rows_.pop_back();
  allocated_[row.value()] = true;
  return row;
}

absl::Status ReqToTokenPool::AllocateRow(ReqPoolIndex row) {
  if (absl::Status s = CheckRow(row); !s.ok()) return s;
  if (allocated_[row.value()]) {
    return absl::FailedPreconditionError(
        absl::StrCat("req row ", row.value(), " is already allocated"));
  }
  allocated_[row.value()] = true;
  // A binary search, not a scan from the front: a snapshot's rows are allocated lowest first,
  // and each is then found (and erased) at the back in O(log n).
  const auto pos = std::lower_bound(free_rows_.begin(), free_rows_.end(), row, DescendingRows);
  CHECK(pos != free_rows_.end() && *pos == row) << "free list lost row " << row.value();
  free_rows_.erase(pos);
  return absl::OkStatus();
}

absl::Status ReqToTokenPool::Free(ReqPoolIndex row) {
  if (absl::Status s = CheckRow(row); !s.ok()) return s;
  if (!allocated_[row.value()]) {
    return absl::FailedPreconditionError(
        absl::StrCat("req row ", row.value(), " is not allocated (double free?)"));
  }
  allocated_[row.value()] = false;
  // Keep the free list sorted so that Allocate() hands out the lowest free row.
  auto pos = std::lower_bound(free_rows_.begin(), free_rows_.end(), row, DescendingRows);
  free_rows_.insert(pos, row);
  return absl::OkStatus();
}

absl::Status ReqToTokenPool::CheckRange(ReqPoolIndex row, TokenCount begin,
                                        TokenCount len) const {
  if (absl::Status s = CheckRow(row); !s.ok()) return s;
  if (!allocated_[row.value()]) {
    return absl::FailedPreconditionError(
        absl::StrCat("req row ", row.value(), " is not allocated"));
  }
  if (begin.value() < 0 || len.value() < 0 ||
      begin.value() > max_context_len_ - len.value()) {
    return absl::OutOfRangeError(absl::StrCat(
        len.value(), " positions from ", begin.value(), " of req row ", row.value(),
        " do not fit in [0, max_context_len = ", max_context_len_, ")"));
  }
  return absl::OkStatus();
}

absl::Status ReqToTokenPool::Write(ReqPoolIndex row, TokenCount begin,
                                   absl::Span<const TokenSlot> slots) {
  TokenCount len(static_cast<int64_t>(slots.size()));
  if (absl::Status s = CheckRange(row, begin, len); !s.ok()) return s;
  std::copy(slots.begin(), slots.end(),
            table_.begin() + row.value() * max_context_len_ + begin.value());
  return absl::OkStatus();
}

absl::StatusOr<absl::Span<const TokenSlot>> ReqToTokenPool::Read(ReqPoolIndex row,
                                                                 TokenCount begin,
                                                                 TokenCount len) const {
  if (absl::Status s = CheckRange(row, begin, len); !s.ok()) return s;
  return absl::Span<const TokenSlot>(table_).subspan(
      row.value() * max_context_len_ + begin.value(), len.value());
}

}  // namespace attnmeta
