// The one check of an indptr array's shape, shared by the builders, the validator and the
// split-KV planner.

#ifndef ATTNMETA_ATTENTION_METADATA_INTERNAL_INDPTR_H_
#define ATTNMETA_ATTENTION_METADATA_INTERNAL_INDPTR_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "kvcache/units.h"

namespace attnmeta {
namespace internal {

// InvalidArgument, naming `name`, unless indptr has at least one entry, starts at 0 and never
// decreases.
inline absl::Status CheckIndptr(absl::string_view name, absl::Span<const TokenOffset> indptr) {
  if (indptr.empty()) return absl::InvalidArgumentError(absl::StrCat(name, ": empty"));
  if (indptr[0].value() != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": entry 0 = ", indptr[0].value(), ", must be 0"));
  }
  for (size_t i = 1; i < indptr.size(); ++i) {
    if (indptr[i] < indptr[i - 1]) {
      return absl::InvalidArgumentError(absl::StrCat(
          name, ": entry ", i, " = ", indptr[i].value(), " is less than entry ", i - 1, " = ",
          indptr[i - 1].value(), " (must be non-decreasing)"));
    }
  }
  return absl::OkStatus();
}

}  // namespace internal
}  // namespace attnmeta

#endif  // ATTNMETA_ATTENTION_METADATA_INTERNAL_INDPTR_H_
