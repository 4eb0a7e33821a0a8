#include "kvcache/units.h"

#include "absl/strings/str_cat.h"

namespace attnmeta {

absl::StatusOr<PageSize> PageSize::Create(int64_t tokens) {
  if (tokens < 1 || tokens > kMaxTokens) {
    return absl::InvalidArgumentError(
        absl::StrCat("page_size must be in [1, ", kMaxTokens, "], got ", tokens));
  }
  return PageSize(tokens);
}

}  // namespace attnmeta
