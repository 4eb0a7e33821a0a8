// The validator: checks every invariant of a ForwardMetadataView against the KV pool and the
// query tensor, and names the first broken one (array, index, values). Kernels trust only
// validated metadata: checked mode (BuildOptions::check, and the attention launchers'
// checked mode, attention/kernels/checked_metadata.h) runs it before every use.

#ifndef ATTNMETA_ATTENTION_METADATA_VALIDATOR_H_
#define ATTNMETA_ATTENTION_METADATA_VALIDATOR_H_

#include "absl/status/status.h"
#include "attention/metadata/forward_metadata.h"
#include "kvcache/units.h"

namespace attnmeta {

struct ValidationContext {
  TokenCount pool_slots;      // slots in the KV pool, padding page included, <= 2^31
  PageSize page_size;
  TokenCount num_query_rows;  // rows of the query tensor the kernel is given
  // Padded rows of a captured graph point at the padding page; real batches never do. With
  // it, a sequence reads the padding page only as a padded row does (every slot there), and
  // the padded rows' slots, which they all write, are exempt from ownership.
  bool allow_padding_page = false;
  // Rows of the query tensor past qo_indptr[bs] that no sequence claims: the tail a captured
  // graph's variable-row extend leaves (GraphState, ReplayResult::padded), which a kernel
  // launched with VarlenAttentionArgs::zero_unclaimed_rows writes as rows that see nothing.
  // With it, qo_indptr[bs] of an extend or draft-extend batch may end below num_query_rows,
  // never past it; the other modes ignore it (nothing gives them a tail).
  bool allow_unclaimed_rows = false;
  // Also check slot ownership: no slot written this step (the last q_len tokens of each
  // sequence) is used by any other token of the batch. It catches a page handed out twice,
  // which req_to_token, kv_indices and the page table would all agree on. Costs a sort of
  // the written slots and one filter probe per KV token (docs/perf_notes.md); on in checked
  // mode, in metadata_check and in the tests.
  bool check_slot_ownership = false;
};

// OK, or InvalidArgument naming the first broken invariant it finds (the message starts with
// the array's name, then the index and the values). The invariants: pool_slots in
// [0, 2^31]; the mode's batch size;
// array sizes (kv_indptr and qo_indptr [bs + 1], kv_last_page_len [bs], kv_indices at least
// kv_indptr[bs]); kv_indptr starts at 0, is non-decreasing and its steps equal kv_lens;
// qo_indptr starts at 0, is non-decreasing and ends at num_query_rows (at most it, with
// allow_unclaimed_rows in extend and draft-extend); each sequence's
// q_len/kv_len allowed by the mode; max_q_len and max_kv_len equal to the real maxima;
// kv_last_page_len; every slot of kv_indices[0, kv_indptr[bs]) inside the pool (and outside
// the padding page unless allowed); the page table (when present) wide enough, its pages in
// the pool, consistent with kv_indices token by token, and padded past each sequence's pages;
// the custom mask (custom_mask.h): the mode allows its layout (target-verify needs one),
// mask_indptr [bs + 1] with the layout's block sizes, the mask at least mask_indptr[bs] bytes
// of 0/1 (FULL, QLEN_ONLY), every query row seeing its own position, and in target-verify
// (a draft tree, DESIGN.md 2b) every row seeing the root and, in a FULL block, every prefix
// column. With check_slot_ownership: no written slot is shared (the message names both users).
// Its cost is linear in bs + kv_indptr[bs] + page table entries + mask_indptr[bs] (plus the
// ownership check's sort of the qo_indptr[bs] written slots).
absl::Status ValidateForwardMetadata(const ForwardMetadataView& m, const ValidationContext& ctx);

}  // namespace attnmeta

#endif  // ATTNMETA_ATTENTION_METADATA_VALIDATOR_H_
