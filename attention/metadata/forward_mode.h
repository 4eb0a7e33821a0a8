// The forward modes a batch can be in. The speculative modes' metadata is built by
// spec_decode/; the rules of every mode, the speculative ones included, are in mode_rules.h.

#ifndef ATTNMETA_ATTENTION_METADATA_FORWARD_MODE_H_
#define ATTNMETA_ATTENTION_METADATA_FORWARD_MODE_H_

#include <ostream>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace attnmeta {

enum class ForwardMode {
  kDecode,  // one query row per request
  kExtend,  // prefill or chunked prefill: q_len >= 1 new rows on top of a cached prefix
  kMixed,   // extend and decode requests in one batch
  kIdle,    // batch size 0 (a data-parallel rank with nothing to do)
  // EAGLE speculative decoding:
  kDraftExtend,   // the draft model extends each request by its accepted tokens (q_len >= 1)
  kTargetVerify,  // the target model scores each request's draft tokens (q_len >= 1)
  kDraftDecode,   // one draft step: one query row per branch
};

// The mode's name, or "unknown" for a value that is none of the enumerators (an integer cast
// to ForwardMode).
absl::string_view ForwardModeName(ForwardMode mode);
// OK when `mode` is one of the enumerators, else InvalidArgument ("mode N is not a forward
// mode"): every entry point that takes a mode refuses the rest.
absl::Status CheckKnownForwardMode(ForwardMode mode);
// Parses a name returned by ForwardModeName; InvalidArgument otherwise.
absl::StatusOr<ForwardMode> ParseForwardMode(absl::string_view name);

inline std::ostream& operator<<(std::ostream& os, ForwardMode mode) {
  return os << ForwardModeName(mode);
}

}  // namespace attnmeta

#endif  // ATTNMETA_ATTENTION_METADATA_FORWARD_MODE_H_
