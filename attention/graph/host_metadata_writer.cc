#include "attention/graph/host_metadata_writer.h"

#include <algorithm>
#include <cstdint>

#include "attention/metadata/builders.h"

namespace attnmeta {

absl::Status HostMetadataWriter::WriteBatchArrays(const MetadataWriteRequest& r,
                                                  const GraphBuffers& b) {
  const size_t padded = static_cast<size_t>(r.padded_batch_size);
  const absl::Span<const TokenLength> kv_lens = b.kv_lens.subspan(0, padded);
  if (absl::Status s = BuildIndptr(kv_lens, b.kv_indptr.subspan(0, padded + 1)); !s.ok()) {
    return s;
  }
  if (absl::Status s = BuildIndptr(b.q_lens.subspan(0, padded), b.qo_indptr.subspan(0, padded + 1));
      !s.ok()) {
    return s;
  }
  return BuildKvLastPageLen(kv_lens, r.page_size, b.kv_last_page_len.subspan(0, padded));
}

absl::Status HostMetadataWriter::WriteTokenArrays(const MetadataWriteRequest& r,
                                                  const GraphBuffers& b,
                                                  SplitKvPlanCounts* split_kv_counts) {
  const size_t real = static_cast<size_t>(r.real_batch_size);
  const size_t padded = static_cast<size_t>(r.padded_batch_size);
  const absl::Span<const ReqPoolIndex> rows = b.req_rows.subspan(0, real);
  if (absl::Status s = BuildTokenKvIndices(*r.req_to_token, rows, b.kv_indptr.subspan(0, real + 1),
                                           {}, b.kv_indices);
      !s.ok()) {
    return s;
  }
  // Padded rows read slots of the padding page only: token t of a padded row is slot
  // t % page_size of page 0.
  const int64_t ps = r.page_size.tokens();
  for (size_t i = real; i < padded; ++i) {
    const int64_t begin = b.kv_indptr[i].value();
    const int64_t len = b.kv_indptr[i + 1].value() - begin;
    for (int64_t t = 0; t < len; ++t) {
      b.kv_indices[begin + t] = FirstSlotOf(kPaddingPage, r.page_size) + TokenCount(t % ps);
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
