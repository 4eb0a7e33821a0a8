// Lengths derived from real sequence lengths, each computed here and nowhere else.

#ifndef ATTNMETA_ATTENTION_METADATA_LENGTHS_H_
#define ATTNMETA_ATTENTION_METADATA_LENGTHS_H_

#include "absl/types/span.h"
#include "kvcache/units.h"

namespace attnmeta {

// The largest of `lens`, 0 when empty: max_kv_len and max_q_len. Never a page-table width
// times the page size.
TokenCount MaxLength(absl::Span<const TokenLength> lens);

// Tokens in the last page of a sequence of kv_len tokens: (kv_len - 1) % page_size + 1, and
// 0 for an empty sequence. REQUIRES: kv_len >= 0.
TokenLength LastPageLen(TokenLength kv_len, PageSize page_size);

}  // namespace attnmeta

#endif  // ATTNMETA_ATTENTION_METADATA_LENGTHS_H_
