// The forward modes a batch can be in. The speculative modes (draft-extend, target-verify,
// draft-decode) are added by spec_decode/.

#ifndef ATTNMETA_ATTENTION_METADATA_FORWARD_MODE_H_
#define ATTNMETA_ATTENTION_METADATA_FORWARD_MODE_H_

#include <ostream>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace attnmeta {

enum class ForwardMode {
  kDecode,  // one query row per request
  kExtend,  // prefill or chunked prefill: q_len >= 1 new rows on top of a cached prefix
  kMixed,   // extend and decode requests in one batch
  kIdle,    // batch size 0 (a data-parallel rank with nothing to do)
};

absl::string_view ForwardModeName(ForwardMode mode);
// Parses a name returned by ForwardModeName; InvalidArgument otherwise.
absl::StatusOr<ForwardMode> ParseForwardMode(absl::string_view name);

inline std::ostream& operator<<(std::ostream& os, ForwardMode mode) {
  return os << ForwardModeName(mode);
}

}  // namespace attnmeta

#endif  // ATTNMETA_ATTENTION_METADATA_FORWARD_MODE_H_
