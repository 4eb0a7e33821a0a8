// ForwardMetadata: what an attention kernel is told about a batch.
//
// Token-level metadata is the common currency: kv_indptr/kv_indices are token-level whatever
// the page size, and no page arithmetic is ever applied to them. The page table is a derived,
// page-level view in its own type. Derived lengths (max_kv_len, kv_last_page_len) come from
// the real lengths in exactly one place (builders.h).
//
// ForwardMetadataView is the same arrays as spans: the validator and kernels read views, so
// owned metadata and fixed graph buffers are checked and consumed the same way.

#ifndef ATTNMETA_ATTENTION_METADATA_FORWARD_METADATA_H_
#define ATTNMETA_ATTENTION_METADATA_FORWARD_METADATA_H_

#include <vector>

#include "absl/types/span.h"
#include "attention/metadata/custom_mask.h"
#include "attention/metadata/forward_mode.h"
#include "attention/metadata/page_table.h"
#include "kvcache/units.h"

namespace attnmeta {

struct ForwardMetadataView {
  ForwardMode mode = ForwardMode::kIdle;
  // [bs + 1]; kv_indptr[0] == 0, non-decreasing, kv_indptr[i + 1] - kv_indptr[i] == kv_lens[i].
  absl::Span<const TokenOffset> kv_indptr;
  // [kv_indptr[bs]]; token t of sequence i lives in slot kv_indices[kv_indptr[i] + t].
  absl::Span<const TokenSlot> kv_indices;
  // [bs + 1]; qo_indptr[0] == 0, non-decreasing, qo_indptr[bs] == the query rows the kernel
  // is given (at most them in a graph bucket of the variable-row form of extend and
  // draft-extend, whose tail no request claims: ValidationContext::allow_unclaimed_rows);
  // sequence i's query rows are its last q_len_i tokens (causal with prefix).
  absl::Span<const TokenOffset> qo_indptr;
  // [bs]; KV tokens each sequence attends to, including this step's new ones.
  absl::Span<const TokenLength> kv_lens;
  // [bs]; (kv_len - 1) % page_size + 1, or 0 for an empty sequence.
  absl::Span<const TokenLength> kv_last_page_len;
  // [bs][>= ceil(max_kv_len / page_size)]; empty (0 x 0) when no page-level consumer runs.
  PageTableSpan<const PageId> page_table;
  TokenCount max_q_len;   // max over i of q_len_i (0 for bs == 0)
  TokenCount max_kv_len;  // max over i of kv_lens[i] (0 for bs == 0)
  // The tree mask of target-verify (custom_mask.h); layout kNone (causal) otherwise.
  CustomMaskView custom_mask;

  int64_t batch_size() const { return static_cast<int64_t>(kv_lens.size()); }
};

struct ForwardMetadata {
  ForwardMode mode = ForwardMode::kIdle;
  std::vector<TokenOffset> kv_indptr;       // [bs + 1]
  std::vector<TokenSlot> kv_indices;        // [kv_indptr[bs]]
  std::vector<TokenOffset> qo_indptr;       // [bs + 1]
  std::vector<TokenLength> kv_lens;         // [bs]
  std::vector<TokenLength> kv_last_page_len;  // [bs]
  PageTable page_table;                     // [bs][max_pages_per_seq] or 0 x 0
  TokenCount max_q_len;
  TokenCount max_kv_len;
  MaskLayout mask_layout = MaskLayout::kNone;
  std::vector<uint8_t> custom_mask;         // [mask_indptr[bs]] or empty
  std::vector<int64_t> mask_indptr;         // [bs + 1] or empty (layout kNone)

  ForwardMetadataView view() const {
    ForwardMetadataView v;
    v.mode = mode;
    v.kv_indptr = kv_indptr;
    v.kv_indices = kv_indices;
    v.qo_indptr = qo_indptr;
    v.kv_lens = kv_lens;
    v.kv_last_page_len = kv_last_page_len;
    v.page_table = page_table.span();
    v.max_q_len = max_q_len;
    v.max_kv_len = max_kv_len;
    v.custom_mask = CustomMaskView{mask_layout, custom_mask, mask_indptr};
    return v;
  }
};

}  // namespace attnmeta

#endif  // ATTNMETA_ATTENTION_METADATA_FORWARD_METADATA_H_
