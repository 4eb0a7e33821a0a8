#include "attention/metadata/forward_mode.h"

#include "absl/strings/str_cat.h"

namespace attnmeta {

absl::string_view ForwardModeName(ForwardMode mode) {
  switch (mode) {
    case ForwardMode::kDecode:
      return "decode";
    case ForwardMode::kExtend:
      return "extend";
    case ForwardMode::kMixed:
      return "mixed";
    case ForwardMode::kIdle:
      return "idle";
  }
  return "unknown";
}

absl::StatusOr<ForwardMode> ParseForwardMode(absl::string_view name) {
  for (ForwardMode m :
       {ForwardMode::kDecode, ForwardMode::kExtend, ForwardMode::kMixed, ForwardMode::kIdle}) {
    if (ForwardModeName(m) == name) return m;
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown forward mode '", name, "'"));
}

}  // namespace attnmeta
