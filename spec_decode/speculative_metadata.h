// The forward metadata of the three EAGLE modes, eager path (DESIGN.md sections 2 and 2b). The
// graph path (attention/graph/) writes the same arrays into fixed buffers.
//
//  - Draft-extend: the draft model extends each request by its rows of this step: a fixed
//    num_tokens_per_req rows each (qo_indptr = [0, n, 2n, ...], max_q_len = n), or, in the
//    variable form, accept_len + 1 rows each. KV: the request's tokens, token-level.
//  - Target-verify: the target model scores each request's n draft tokens, arranged as the
//    VerifyTree: n query rows per request, KV = the committed prefix plus the draft slots
//    (kv_len = seq_len + n, so the page table of the unified path covers seq_len + n), and the
//    tree as a custom mask (FULL, QLEN_ONLY or bit-packed, with int64 mask_indptr).
//  - Draft-decode: `steps` steps of bs * topk branches, one query row each, token-level KV in
//    the layout of draft_decode_layout.h; one ForwardMetadata per step.
//
// Each checks that the query rows the kernel will be given equal qo_indptr[bs] (the reference
// system once gave a 4-row draft-extend query a prefill qo_indptr of [0, 80]: DESIGN.md
// section 3, row 8), and writes nothing (returns no metadata) on error.

#ifndef ATTNMETA_SPEC_DECODE_SPECULATIVE_METADATA_H_
#define ATTNMETA_SPEC_DECODE_SPECULATIVE_METADATA_H_

#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "attention/metadata/builders.h"
#include "attention/metadata/custom_mask.h"
#include "attention/metadata/draft_decode_layout.h"
#include "attention/metadata/forward_metadata.h"
#include "kvcache/req_to_token_pool.h"
#include "kvcache/units.h"
#include "spec_decode/verify_tree.h"

namespace attnmeta {

struct SpecBuildOptions {
  bool page_table = true;  // draft-extend and target-verify; draft-decode is token-level only
  // Checked mode: validate the result (slot ownership included) against a pool of this many
  // slots.
  std::optional<TokenCount> check_pool_slots;
};

struct DraftExtendBatch {
  absl::Span<const ReqPoolIndex> req_rows;  // [bs]
  absl::Span<const TokenLength> kv_lens;    // [bs], the rows extended now included
  // Fixed form: num_tokens_per_req >= 1 rows per request, accept_lens empty. Variable form:
  // num_tokens_per_req == 0 and accept_lens [bs], accept_lens[i] + 1 rows for request i.
  TokenCount num_tokens_per_req;  // at most INT32_MAX (a query length)
  absl::Span<const TokenLength> accept_lens;
  TokenCount num_draft_tokens;  // variable form: accept_lens[i] < num_draft_tokens
  TokenCount num_query_rows;     // rows of the query tensor the kernel is given
};

// InvalidArgument: neither or both forms, num_tokens_per_req < 0 or past INT32_MAX,
// accept_lens of the wrong size, an accepted length outside
// [0, min(num_draft_tokens, INT32_MAX)), query rows that disagree with num_query_rows; then
// BuildForwardMetadata's errors.
absl::StatusOr<ForwardMetadata> BuildDraftExtendMetadata(const DraftExtendBatch& batch,
                                                         const ReqToTokenPool& pool,
                                                         PageSize page_size,
                                                         const SpecBuildOptions& options = {});

// The tree's seq_lens are the committed prefixes; the n draft tokens of request b must be in
// its row at positions [seq_len, seq_len + n). The draft tokens' K/V are read from the cache
// like the prefix's (attention/kernels read every key through the metadata), so kv_lens[b] is
// seq_len + n and kv_indptr their prefix sum, the FULL mask's column count per row. (DESIGN.md
// 2b's kv_indptr over the committed prefix alone is for a kernel handed the draft tokens' K/V
// beside the cache; here that prefix is kv_lens[b] - n.) InvalidArgument: rows not the tree's batch
// size, mask layout kNone, num_query_rows != bs * n; OutOfRange: a request's seq_len + n
// beyond INT32_MAX; then BuildForwardMetadata's errors.
absl::StatusOr<ForwardMetadata> BuildTargetVerifyMetadata(
    const ReqToTokenPool& pool, absl::Span<const ReqPoolIndex> req_rows, const VerifyTree& tree,
    MaskLayout mask_layout, TokenCount num_query_rows, PageSize page_size,
    const SpecBuildOptions& options = {});

// Every step of a multi-step draft-decode, step 0 first. The errors of CheckDraftDecodeBatch
// (draft_decode_layout.h), then InvalidArgument: a request row listed twice
// (CheckDistinctRows), an empty batch (CheckModeBatchSize), or num_query_rows != bs * topk;
// ResourceExhausted: all steps' kv_indices together beyond INT32_MAX entries; all returned before
// any step's arrays are allocated. In checked mode also the validator's errors.
absl::StatusOr<std::vector<ForwardMetadata>> BuildDraftDecodeMetadata(
    const ReqToTokenPool& pool, absl::Span<const ReqPoolIndex> req_rows,
    absl::Span<const TokenLength> seq_lens, DraftDecodeShape shape, TokenCount num_query_rows,
    PageSize page_size, const SpecBuildOptions& options = {});

}  // namespace attnmeta

#endif  // ATTNMETA_SPEC_DECODE_SPECULATIVE_METADATA_H_
