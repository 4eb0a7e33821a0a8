// The rule that a batch's requests own distinct rows of the request-to-token table, in one place
// for the eager builders, the draft-decode layout and graph replay.

#ifndef ATTNMETA_ATTENTION_METADATA_REQUEST_ROWS_H_
#define ATTNMETA_ATTENTION_METADATA_REQUEST_ROWS_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "kvcache/req_to_token_pool.h"

namespace attnmeta {

// InvalidArgument naming the earliest request whose row an earlier request holds, and that
// one: a row holds one request's tokens, and two requests listed on one row would write the
// same slots (the validator sees only that their slots collide). Distinct rows also bound what
// a builder sizes by the rows: at most one table row of tokens per request. Sorts a copy of
// the rows: O(bs log bs) time and O(bs) memory, for the eager builders.
absl::Status CheckDistinctRows(absl::Span<const ReqPoolIndex> rows);

// The same check and message in O(bs) time with no allocation, for a caller that keeps
// `marks`: scratch of one byte per row of the table, all 0 on entry and again on return
// (graph replay). OutOfRange for a row outside `marks` (callers check rows against the table
// first).
absl::Status CheckDistinctRows(absl::Span<const ReqPoolIndex> rows, absl::Span<uint8_t> marks);

}  // namespace attnmeta

#endif  // ATTNMETA_ATTENTION_METADATA_REQUEST_ROWS_H_
