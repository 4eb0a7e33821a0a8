#include "attention/metadata/lengths.h"

#include <algorithm>

namespace attnmeta {

TokenCount MaxLength(absl::Span<const TokenLength> lens) {
  int32_t m = 0;
  for (TokenLength l : lens) m = std::max(m, l.value());
  return TokenCount(m);
}

TokenLength LastPageLen(TokenLength kv_len, PageSize page_size) {
  if (kv_len.value() == 0) return TokenLength(0);
  return TokenLength(static_cast<int32_t>((kv_len.value() - 1) % page_size.tokens() + 1));
}

}  // namespace attnmeta
