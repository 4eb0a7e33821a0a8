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
    case ForwardMode::kDraftExtend:
      return "draft_extend";
    case ForwardMode::kTargetVerify:
      return "target_verify";
    case ForwardMode::kDraftDecode:
      return "draft_decode";
  }
  return "unknown";
}

absl::Status CheckKnownForwardMode(ForwardMode mode) {
  if (ForwardModeName(mode) != "unknown") return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("mode ", static_cast<int>(mode), " is not a forward mode"));
}

absl::StatusOr<ForwardMode> ParseForwardMode(absl::string_view name) {
  for (ForwardMode m : {ForwardMode::kDecode, ForwardMode::kExtend, ForwardMode::kMixed,
                        ForwardMode::kIdle, ForwardMode::kDraftExtend, ForwardMode::kTargetVerify,
                        ForwardMode::kDraftDecode}) {
    if (ForwardModeName(m) == name) return m;
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown forward mode '", name, "'"));
}

}  // namespace attnmeta
