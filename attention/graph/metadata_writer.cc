#include "attention/graph/metadata_writer.h"

#include <cstdint>
#include <limits>

#include "absl/strings/str_cat.h"

namespace attnmeta {

absl::Status CheckWriteFitsBuffers(const MetadataWriteRequest& r, const GraphBuffers& b,
                                   absl::string_view writer) {
  const int64_t padded = r.padded_batch_size;
  auto fits = [&](absl::string_view what, size_t size, int64_t need) {
    return static_cast<uint64_t>(need) <= size
               ? absl::OkStatus()
               : absl::InvalidArgumentError(absl::StrCat(writer, ": ", what, " holds ", size,
                                                         " entries, ", need, " needed"));
  };
  if (r.real_batch_size < 0 || padded < r.real_batch_size) {
    return absl::InvalidArgumentError(absl::StrCat(writer, ": a real batch of ",
                                                   r.real_batch_size, " in a padded batch of ",
                                                   padded));
  }
  if (r.req_to_token == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(writer, ": no req_to_token"));
  }
  // req_rows first: then padded is at most a span's size, SIZE_MAX / 4, and padded + 1 fits.
  if (absl::Status st = fits("req_rows", b.req_rows.size(), padded); !st.ok()) return st;
  for (absl::Status st :
       {fits("kv_lens", b.kv_lens.size(), padded), fits("q_lens", b.q_lens.size(), padded),
        fits("kv_indptr", b.kv_indptr.size(), padded + 1),
        fits("qo_indptr", b.qo_indptr.size(), padded + 1),
        fits("kv_last_page_len", b.kv_last_page_len.size(), padded)}) {
    if (!st.ok()) return st;
  }
  if (r.mode == ForwardMode::kDraftDecode) {
    if (absl::Status st = CheckDraftDecodeShape(r.draft_decode); !st.ok()) return st;
    if (static_cast<size_t>(r.draft_decode.steps) > b.draft_steps.size()) {
      return absl::InvalidArgumentError(absl::StrCat(writer, ": ", r.draft_decode.steps,
                                                     " draft steps, ", b.draft_steps.size(),
                                                     " steps' buffers"));
    }
    if (padded > (std::numeric_limits<int64_t>::max() - 1) / r.draft_decode.topk) {
      return absl::InvalidArgumentError(absl::StrCat(writer, ": ", padded, " requests of top-k ",
                                                     r.draft_decode.topk,
                                                     " overflow a count of branches"));
    }
    const int64_t branches = padded * r.draft_decode.topk;
    if (absl::Status st = fits("draft_qo_indptr", b.draft_qo_indptr.size(), branches + 1);
        !st.ok()) {
      return st;
    }
    for (int32_t step = 0; step < r.draft_decode.steps; ++step) {
      const DraftStepBuffers& d = b.draft_steps[step];
      for (absl::Status st : {fits("a draft step's kv_lens", d.kv_lens.size(), branches),
                              fits("a draft step's kv_indptr", d.kv_indptr.size(), branches + 1),
                              fits("a draft step's kv_last_page_len", d.kv_last_page_len.size(),
                                   branches)}) {
        if (!st.ok()) return st;
      }
    }
  }
  // A request for the page table needs its rows (the fused launch takes an empty buffer for
  // none).
  if (r.page_table && r.mode != ForwardMode::kDraftDecode &&
      (b.page_table.cols() < PageCount(1) || b.page_table.rows() < padded)) {
    return absl::InvalidArgumentError(absl::StrCat(
        writer, ": the request asks for the page table, whose buffer is ", b.page_table.rows(),
        " x ", b.page_table.cols().value(), " for a padded batch of ", padded));
  }
  if (r.mask_layout != MaskLayout::kNone) {
    return fits("mask_indptr", b.mask_indptr.size(), padded + 1);
  }
  return absl::OkStatus();
}

}  // namespace attnmeta
