#include "attention/graph/host_metadata_writer.h"

#include <algorithm>
#include <cstdint>
#include <limits>

#include "absl/strings/str_cat.h"
#include "attention/metadata/builders.h"
#include "attention/metadata/custom_mask.h"
#include "attention/metadata/draft_decode_layout.h"
#include "attention/metadata/lengths.h"

namespace attnmeta {

constexpr absl::string_view kWriter = "host metadata writer";

absl::Status HostMetadataWriter::WriteBatchArrays(const MetadataWriteRequest& r,
                                                  const GraphBuffers& b) {
  if (absl::Status s = CheckWriteFitsBuffers(r, b, kWriter); !s.ok()) return s;
  // Draft-decode's arrays are per step and per branch: WriteTokenArrays writes them all.
  if (r.mode == ForwardMode::kDraftDecode) return absl::OkStatus();
  const size_t padded = static_cast<size_t>(r.padded_batch_size);
  const absl::Span<const TokenLength> kv_lens = b.kv_lens.subspan(0, padded);
  if (absl::Status s = BuildIndptr(kv_lens, b.kv_indptr.subspan(0, padded + 1)); !s.ok()) {
    return s;
  }
  if (absl::Status s = BuildIndptr(b.q_lens.subspan(0, padded), b.qo_indptr.subspan(0, padded + 1));
      !s.ok()) {
    return s;
  }
  if (absl::Status s =
          BuildKvLastPageLen(kv_lens, r.page_size, b.kv_last_page_len.subspan(0, padded));
      !s.ok()) {
    return s;
  }
  if (r.mask_layout == MaskLayout::kNone) return absl::OkStatus();
  return BuildMaskIndptr(r.mask_layout, b.q_lens.subspan(0, padded), kv_lens,
                         b.mask_indptr.subspan(0, padded + 1));
}

namespace {

// Every draft-decode step: the real branches, then the padded ones.
absl::Status WriteDraftDecode(const MetadataWriteRequest& r, const GraphBuffers& b) {
  const size_t real = static_cast<size_t>(r.real_batch_size);
  const size_t topk = static_cast<size_t>(r.draft_decode.topk);
  const size_t real_branches = real * topk;
  const size_t padded_branches = static_cast<size_t>(r.padded_batch_size) * topk;
  // Each step's padded branches follow its real ones in kv_indices: checked for every step
  // before the first is written (the batch first, which bounds DraftStepTokens).
  if (absl::Status s =
          CheckDraftDecodeBatch(*r.req_to_token, b.req_rows.subspan(0, real),
                                b.kv_lens.subspan(0, real), r.draft_decode, r.page_size);
      !s.ok()) {
    return s;
  }
  const int64_t padded_len = r.padded_kv_len.value();
  const int64_t padded_count = static_cast<int64_t>(padded_branches - real_branches);
  if (padded_count > 0 &&
      (padded_len < 1 || padded_count > std::numeric_limits<int32_t>::max() / padded_len)) {
    return absl::InvalidArgumentError(absl::StrCat(
        kWriter, ": ", padded_count, " padded branches of ", padded_len, " tokens each"));
  }
  const int64_t padded_tokens = padded_count * padded_len;
  for (int32_t step = 0; step < r.draft_decode.steps; ++step) {
    const int64_t need =
        DraftStepTokens(b.kv_lens.subspan(0, real), r.draft_decode, step).value() + padded_tokens;
    if (need > static_cast<int64_t>(b.draft_steps[step].kv_indices.size())) {
      return absl::InvalidArgumentError(absl::StrCat(
          kWriter, ": draft step ", step, "'s kv_indices holds ",
          b.draft_steps[step].kv_indices.size(), " slots, the padded batch needs ", need));
    }
  }
  for (int32_t step = 0; step < r.draft_decode.steps; ++step) {
    const DraftStepBuffers& d = b.draft_steps[step];
    if (absl::Status s = BuildDraftDecodeStep(
            *r.req_to_token, b.req_rows.subspan(0, real), b.kv_lens.subspan(0, real),
            r.draft_decode, step, r.page_size,
            DraftDecodeStepSpans{d.kv_lens.subspan(0, real_branches),
                                 d.kv_indptr.subspan(0, real_branches + 1),
                                 b.draft_qo_indptr.subspan(0, real_branches + 1),
                                 d.kv_last_page_len.subspan(0, real_branches), d.kv_indices});
        !s.ok()) {
      return s;
    }
    for (size_t z = real_branches; z < padded_branches; ++z) {
      d.kv_lens[z] = r.padded_kv_len;
      d.kv_last_page_len[z] = LastPageLen(r.padded_kv_len, r.page_size);
      const int64_t begin = d.kv_indptr[z].value();
      for (int64_t t = 0; t < r.padded_kv_len.value(); ++t) {
        d.kv_indices[begin + t] = PaddedRowSlot(TokenCount(t), r.page_size);
      }
      d.kv_indptr[z + 1] = d.kv_indptr[z] + r.padded_kv_len.count();
      b.draft_qo_indptr[z + 1] = b.draft_qo_indptr[z] + TokenCount(1);
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status HostMetadataWriter::WriteTokenArrays(const MetadataWriteRequest& r,
                                                  const GraphBuffers& b,
                                                  SplitKvPlanCounts* split_kv_counts) {
  if (absl::Status s = CheckWriteFitsBuffers(r, b, kWriter); !s.ok()) return s;
  if (r.mode == ForwardMode::kDraftDecode) return WriteDraftDecode(r, b);
  const size_t real = static_cast<size_t>(r.real_batch_size);
  const size_t padded = static_cast<size_t>(r.padded_batch_size);
  const absl::Span<const ReqPoolIndex> rows = b.req_rows.subspan(0, real);
  // The padded rows' spans, which no builder below checks, before anything is written.
  if (b.kv_indptr[padded].value() > static_cast<int64_t>(b.kv_indices.size())) {
    return absl::InvalidArgumentError(absl::StrCat("kv_indices: the padded batch needs ",
                                                   b.kv_indptr[padded].value(), " slots, holds ",
                                                   b.kv_indices.size()));
  }
  if (r.mask_layout != MaskLayout::kNone &&
      b.mask_indptr[padded] > static_cast<int64_t>(b.custom_mask.size())) {
    return absl::InvalidArgumentError(absl::StrCat("custom_mask: the padded batch needs ",
                                                   b.mask_indptr[padded], " bytes, holds ",
                                                   b.custom_mask.size()));
  }
  if (absl::Status s = BuildTokenKvIndices(*r.req_to_token, rows, b.kv_indptr.subspan(0, real + 1),
                                           {}, b.kv_indices);
      !s.ok()) {
    return s;
  }
  // Padded rows read slots of the padding page only.
  for (size_t i = real; i < padded; ++i) {
    const int64_t begin = b.kv_indptr[i].value();
    const int64_t len = b.kv_indptr[i + 1].value() - begin;
    for (int64_t t = 0; t < len; ++t) {
      b.kv_indices[begin + t] = PaddedRowSlot(TokenCount(t), r.page_size);
    }
  }
  if (r.page_table) {
    absl::StatusOr<PageTableSpan<PageId>> real_rows = PageTableSpan<PageId>::Create(
        b.page_table.entries(), static_cast<int64_t>(real), b.page_table.cols());
    if (!real_rows.ok()) return real_rows.status();
    if (absl::Status s = BuildPageTable(*r.req_to_token, rows, b.kv_lens.subspan(0, real),
                                        r.page_size, *real_rows);
        !s.ok()) {
      return s;
    }
    for (size_t i = real; i < padded; ++i) {
      const absl::Span<PageId> row = b.page_table.row(static_cast<int64_t>(i));
      std::fill(row.begin(), row.end(), kPaddingPage);
    }
  }
  if (r.mask_layout != MaskLayout::kNone) {
    const int64_t tree_bytes = TreeRowsBytes(b.q_lens.subspan(0, real));
    if (absl::Status s = BuildCustomMask(r.mask_layout, b.tree_mask.subspan(0, tree_bytes),
                                         b.q_lens.subspan(0, real), b.kv_lens.subspan(0, real),
                                         b.mask_indptr.subspan(0, real + 1), b.custom_mask);
        !s.ok()) {
      return s;
    }
    // Padded rows have no tree: each sees all of its KV, every token a padding slot.
    std::fill(b.custom_mask.begin() + b.mask_indptr[real],
              b.custom_mask.begin() + b.mask_indptr[padded], uint8_t{1});
  }
  if (r.split_kv) {
    absl::StatusOr<SplitKvPlanCounts> counts =
        PlanSplitKvInto(b.qo_indptr.subspan(0, padded + 1), b.kv_indptr.subspan(0, padded + 1),
                        r.split_kv_options, b.split_kv);
    if (!counts.ok()) return counts.status();
    if (split_kv_counts != nullptr) *split_kv_counts = *counts;
  }
  return absl::OkStatus();
}

}  // namespace attnmeta
