#include "attention/metadata/metadata_diff.h"

#include <cstdint>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/types/span.h"

namespace attnmeta {
namespace {

int64_t Raw(int64_t v) { return v; }
int64_t Raw(uint8_t v) { return v; }
template <typename T>
int64_t Raw(T v) {
  return v.value();
}

// The first `n` entries of `got` and `want` are equal; either being shorter is a difference.
template <typename T>
absl::Status Same(absl::string_view array, absl::Span<const T> got, absl::Span<const T> want,
                  int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const bool have_got = i < static_cast<int64_t>(got.size());
    const bool have_want = i < static_cast<int64_t>(want.size());
    if (!have_got || !have_want) {
      return absl::FailedPreconditionError(absl::StrCat(
          array, ": ", have_got ? "want" : "got", " has ",
          have_got ? want.size() : got.size(), " entries, ", n, " compared"));
    }
    if (Raw(got[i]) != Raw(want[i])) {
      return absl::FailedPreconditionError(
          absl::StrCat(array, "[", i, "]: got ", Raw(got[i]), ", want ", Raw(want[i])));
    }
  }
  return absl::OkStatus();
}

absl::Status SameCount(absl::string_view what, int64_t got, int64_t want) {
  if (got == want) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(what, ": got ", got, ", want ", want));
}

}  // namespace

absl::Status DiffMetadata(const ForwardMetadataView& got, const ForwardMetadataView& want) {
  if (got.mode != want.mode) {
    return absl::FailedPreconditionError(absl::StrCat("mode: got ", ForwardModeName(got.mode),
                                                      ", want ", ForwardModeName(want.mode)));
  }
  const int64_t bs = want.batch_size();
  if (absl::Status s = SameCount("batch size", got.batch_size(), bs); !s.ok()) return s;
  absl::Status s = Same("kv_indptr", got.kv_indptr, want.kv_indptr, bs + 1);
  if (s.ok()) s = Same("qo_indptr", got.qo_indptr, want.qo_indptr, bs + 1);
  if (s.ok()) s = Same("kv_lens", got.kv_lens, want.kv_lens, bs);
  if (s.ok()) s = Same("kv_last_page_len", got.kv_last_page_len, want.kv_last_page_len, bs);
  if (!s.ok()) return s;
  const int64_t tokens = want.kv_indptr[bs].value();
  s = Same("kv_indices", got.kv_indices, want.kv_indices, tokens);
  if (s.ok()) s = SameCount("max_q_len", got.max_q_len.value(), want.max_q_len.value());
  if (s.ok()) s = SameCount("max_kv_len", got.max_kv_len.value(), want.max_kv_len.value());
  if (!s.ok()) return s;
  if (got.custom_mask.layout != want.custom_mask.layout) {
    return absl::FailedPreconditionError(
        absl::StrCat("custom mask layout: got ", MaskLayoutName(got.custom_mask.layout),
                     ", want ", MaskLayoutName(want.custom_mask.layout)));
  }
  if (!want.custom_mask.mask_indptr.empty()) {
    s = Same("mask_indptr", got.custom_mask.mask_indptr, want.custom_mask.mask_indptr, bs + 1);
    if (s.ok()) {
      s = Same("custom_mask", got.custom_mask.mask, want.custom_mask.mask,
               want.custom_mask.mask_indptr[bs]);
    }
    if (!s.ok()) return s;
  }
  const bool got_table = got.page_table.rows() != 0;
  const bool want_table = want.page_table.rows() != 0;
  if (got_table != want_table) {
    return absl::FailedPreconditionError(absl::StrCat(
        "page table: got ", got_table ? "one" : "none", ", want ", want_table ? "one" : "none"));
  }
  if (!want_table) return absl::OkStatus();
  if (got.page_table.cols() < want.page_table.cols()) {
    return absl::FailedPreconditionError(
        absl::StrCat("page table: got ", got.page_table.cols().value(), " columns, want at least ",
                     want.page_table.cols().value()));
  }
  if (got.page_table.rows() < bs) {
    return SameCount("page table rows", got.page_table.rows(), bs);
  }
  if (want.page_table.rows() < bs) {
    return SameCount("page table rows (want)", want.page_table.rows(), bs);
  }
  for (int64_t i = 0; i < bs; ++i) {
    const absl::Span<const PageId> g = got.page_table.row(i);
    const absl::Span<const PageId> w = want.page_table.row(i);
    s = Same(absl::StrCat("page_table row ", i), g, w, static_cast<int64_t>(w.size()));
    if (!s.ok()) return s;
    for (size_t j = w.size(); j < g.size(); ++j) {
      if (g[j] != kPaddingPage) {
        return absl::FailedPreconditionError(absl::StrCat("page_table row ", i, "[", j, "]: got ",
                                                          g[j].value(), ", want the padding page"));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace attnmeta
