#include "attention/metadata/mode_rules.h"

#include "absl/strings/str_cat.h"

namespace attnmeta {

absl::Status CheckModeBatchSize(ForwardMode mode, int64_t batch_size) {
  if (absl::Status s = CheckKnownForwardMode(mode); !s.ok()) return s;
  if (batch_size < 0 || (mode == ForwardMode::kIdle) != (batch_size == 0)) {
    return absl::InvalidArgumentError(absl::StrCat("mode ", ForwardModeName(mode),
                                                   " with batch_size ", batch_size,
                                                   ": idle batches and only they are empty"));
  }
  return absl::OkStatus();
}

absl::Status CheckModeSequence(ForwardMode mode, int64_t i, TokenCount q_len, TokenCount kv_len) {
  if (q_len.value() < 0 || kv_len.value() < 0 || q_len > kv_len) {
    return absl::InvalidArgumentError(
        absl::StrCat("sequence ", i, ": need 0 <= q_len <= kv_len, got q_len ", q_len.value(),
                     ", kv_len ", kv_len.value()));
  }
  if ((mode == ForwardMode::kDecode || mode == ForwardMode::kDraftDecode) && q_len.value() != 1) {
    return absl::InvalidArgumentError(absl::StrCat("sequence ", i, ": ", ForwardModeName(mode),
                                                   " has exactly one query row per sequence, got ",
                                                   q_len.value()));
  }
  if ((mode == ForwardMode::kExtend || mode == ForwardMode::kMixed ||
       mode == ForwardMode::kDraftExtend || mode == ForwardMode::kTargetVerify) &&
      q_len.value() < 1) {
    return absl::InvalidArgumentError(absl::StrCat("sequence ", i, ": ", ForwardModeName(mode),
                                                   " needs q_len >= 1, got ", q_len.value()));
  }
  return absl::OkStatus();
}

absl::Status CheckModeMask(ForwardMode mode, MaskLayout layout) {
  if (absl::Status s = CheckKnownMaskLayout(layout); !s.ok()) return s;
  if (mode == ForwardMode::kTargetVerify && layout == MaskLayout::kNone) {
    return absl::InvalidArgumentError("target_verify needs a custom mask (the draft tree)");
  }
  if ((mode == ForwardMode::kDecode || mode == ForwardMode::kDraftDecode ||
       mode == ForwardMode::kIdle) &&
      layout != MaskLayout::kNone) {
    return absl::InvalidArgumentError(absl::StrCat(ForwardModeName(mode), " takes no custom mask, got ",
                                                   MaskLayoutName(layout)));
  }
  return absl::OkStatus();
}

}  // namespace attnmeta
