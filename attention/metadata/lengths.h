// Lengths derived from real sequence lengths, each computed here and nowhere else.

#ifndef ATTNMETA_ATTENTION_METADATA_LENGTHS_H_
#define ATTNMETA_ATTENTION_METADATA_LENGTHS_H_

#include <cstdint>

#include "absl/types/span.h"
#include "kvcache/units.h"

namespace attnmeta {

// The largest of `lens`, 0 when empty: max_kv_len and max_q_len. Never a page-table width
// times the page size.
TokenCount MaxLength(absl::Span<const TokenLength> lens);

// Tokens in the last page of a sequence of kv_len tokens: (kv_len - 1) % page_size + 1, and
// 0 for an empty sequence (and for a negative length, which the builders refuse first).
// Inline and without a 64-bit division: the host replay computes it for every row.
inline TokenLength LastPageLen(TokenLength kv_len, PageSize page_size) {
  if (kv_len.value() <= 0) return TokenLength(0);
  const int32_t before = kv_len.value() - 1;  // >= 0
  if (page_size.log2() >= 0) {
    return TokenLength((before & static_cast<int32_t>(page_size.tokens() - 1)) + 1);
  }
  // A page holds at most 2^20 tokens: the divisor fits int32.
  return TokenLength(before % static_cast<int32_t>(page_size.tokens()) + 1);
}

}  // namespace attnmeta

#endif  // ATTNMETA_ATTENTION_METADATA_LENGTHS_H_
