// ReqToTokenPool: the request-to-token table. Row r maps the token positions of the request
// that owns row r to the token slots that hold its K/V.

#ifndef ATTNMETA_KVCACHE_REQ_TO_TOKEN_POOL_H_
#define ATTNMETA_KVCACHE_REQ_TO_TOKEN_POOL_H_

#include <cstdint>
#include <ostream>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kvcache/units.h"

namespace attnmeta {

// A row of the request-to-token table (the reference system's req_pool_index).
class ReqPoolIndex : public internal::Unit<ReqPoolIndex, int32_t> {
 public:
  constexpr ReqPoolIndex() = default;
  constexpr explicit ReqPoolIndex(int32_t row) : Unit(row) {}
  friend std::ostream& operator<<(std::ostream& os, ReqPoolIndex r) {
    return os << "req row " << r.value();
  }
};
static_assert(sizeof(ReqPoolIndex) == sizeof(int32_t));

class ReqToTokenPool {
 public:
  // Largest table accepted: its flat offsets must stay int32-addressable for kernels.
  static constexpr int64_t kMaxEntries = int64_t{1} << 31;

  // InvalidArgument unless max_reqs >= 1, max_context_len >= 1 and the table has at most
  // kMaxEntries entries. Every entry starts as the first slot of the padding page.
  static absl::StatusOr<ReqToTokenPool> Create(int32_t max_reqs, TokenCount max_context_len);

  // Takes the lowest free row. ResourceExhausted when every row is taken.
  absl::StatusOr<ReqPoolIndex> Allocate();

  // Takes the given row (to restore a recorded state). OutOfRange for a row outside the
  // table, FailedPrecondition for a row already allocated.
  absl::Status AllocateRow(ReqPoolIndex row);

  // Returns `row` to the pool. OutOfRange for a row outside the table, FailedPrecondition
  // for a row that is not allocated.
  absl::Status Free(ReqPoolIndex row);

  // Writes `slots` at positions [begin, begin + slots.size()) of `row`.
  // OutOfRange for a row outside the table, or unless 0 <= begin and begin + slots.size() <=
  // max_context_len; FailedPrecondition for a row that is not allocated. On error nothing is
  // written.
  absl::Status Write(ReqPoolIndex row, TokenCount begin, absl::Span<const TokenSlot> slots);

  // The slots at positions [begin, begin + len) of `row`; same errors as Write.
  absl::StatusOr<absl::Span<const TokenSlot>> Read(ReqPoolIndex row, TokenCount begin,
                                                   TokenCount len) const;

  // Inline: GraphState asks it for every row of every replay.
  bool IsAllocated(ReqPoolIndex row) const {
    return row.value() >= 0 && row.value() < max_reqs_ && allocated_[row.value()] != 0;
  }
  int32_t max_reqs() const { return max_reqs_; }
  TokenCount max_context_len() const { return TokenCount(max_context_len_); }
  int32_t num_free_rows() const { return static_cast<int32_t>(free_rows_.size()); }

  // The whole table, row-major: [max_reqs * max_context_len]; entry r * max_context_len + t is
  // the slot of token t of row r. This is what kernels read as `req_to_token`.
  absl::Span<const TokenSlot> table() const { return table_; }

 private:
  ReqToTokenPool(int32_t max_reqs, int64_t max_context_len);
  // OutOfRange for a row outside the table.
  absl::Status CheckRow(ReqPoolIndex row) const;
  absl::Status CheckRange(ReqPoolIndex row, TokenCount begin, TokenCount len) const;

  int32_t max_reqs_;
  int64_t max_context_len_;
  std::vector<TokenSlot> table_;     // [max_reqs * max_context_len]
  std::vector<uint8_t> allocated_;   // [max_reqs], 1 where allocated
  std::vector<ReqPoolIndex> free_rows_;  // back() is the lowest free row
};

}  // namespace attnmeta

#endif  // ATTNMETA_KVCACHE_REQ_TO_TOKEN_POOL_H_
