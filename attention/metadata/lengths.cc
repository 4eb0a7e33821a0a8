#include "attention/metadata/lengths.h"

#include <algorithm>

namespace attnmeta {

TokenCount MaxLength(absl::Span<const TokenLength> lens) {
  int32_t m = 0;
  for (TokenLength l : lens) m = std::max(m, l.value());
  return TokenCount(m);
}

}  // namespace attnmeta
