// The token-level layout of multi-step EAGLE draft-decode with top-k branches (DESIGN.md
// section 2b), shared by the eager builder (spec_decode/) and the graph writers.
//
// Each request s with seq_len committed tokens has `topk` branches; at step `step` (iters =
// step + 1) branch k of request s is one sequence z = s * topk + k of seq_len + iters tokens:
// the request's seq_len prefix slots, shared by its branches, then iters draft slots read
// from the request's row at DraftSourcePosition(seq_len, k) onward. One query row per branch.
// Branch z's segment of kv_indices starts at kv_indptr[z] = sum over earlier branches of
// (seq_len + iters), which is the reference system's
// sum(seq_lens[:s]) * topk + s * iters * topk + k * (seq_lens[s] + iters); the step uses
// seq_lens_sum * topk + bs * topk * iters entries (the "seq_lens_sum * topk + bs * (step + 1)"
// of DESIGN.md section 2, bs counting branches), which must stay int32-addressable.

#ifndef ATTNMETA_ATTENTION_METADATA_DRAFT_DECODE_LAYOUT_H_
#define ATTNMETA_ATTENTION_METADATA_DRAFT_DECODE_LAYOUT_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "kvcache/req_to_token_pool.h"
#include "kvcache/units.h"

namespace attnmeta {

struct DraftDecodeShape {
  int32_t topk = 1;   // branches per request, >= 1
  int32_t steps = 1;  // draft steps, >= 1
};

// InvalidArgument unless topk >= 1 and steps >= 1.
absl::Status CheckDraftDecodeShape(DraftDecodeShape shape);

// Where branch `branch`'s draft tokens start in the request's row: seq_len + branch * steps
// when page_size == 1 or topk == 1, else each branch has its own page-aligned run of draft
// pages: (seq_len / ps) * ps + branch * ceil((seq_len % ps + steps) / ps) * ps + seq_len % ps.
// REQUIRES: CheckDraftDecodeShape(shape) passed, 0 <= branch < topk, seq_len >= 0.
TokenCount DraftSourcePosition(TokenLength seq_len, int32_t branch, DraftDecodeShape shape,
                               PageSize page_size);

// Positions of the request's row the draft steps read: DraftSourcePosition of the last
// branch plus steps.
TokenCount DraftRowTokens(TokenLength seq_len, DraftDecodeShape shape, PageSize page_size);

// The most positions DraftRowTokens needs for any seq_len <= max_seq_len: how wide
// req_to_token rows must be for draft-decode. REQUIRES: as DraftSourcePosition, max_seq_len >= 0.
TokenCount MaxDraftRowTokens(TokenLength max_seq_len, DraftDecodeShape shape, PageSize page_size);

// kv_indptr[bs * topk] of step `step`: seq_lens_sum * topk + bs * topk * (step + 1).
// REQUIRES: shape and seq_lens as CheckDraftDecodeBatch accepts them, 0 <= step < shape.steps
// (then the total stays within int32).
TokenCount DraftStepTokens(absl::Span<const TokenLength> seq_lens, DraftDecodeShape shape,
                           int32_t step);

// The arrays of one step, over bs * topk branches.
struct DraftDecodeStepSpans {
  absl::Span<TokenLength> kv_lens;           // [bs * topk], seq_len + step + 1
  absl::Span<TokenOffset> kv_indptr;         // [bs * topk + 1]
  absl::Span<TokenOffset> qo_indptr;         // [bs * topk + 1], [0, 1, 2, ...]
  absl::Span<TokenLength> kv_last_page_len;  // [bs * topk]
  absl::Span<TokenSlot> kv_indices;          // at least DraftStepTokens; the tail is not written
};

// Whether the draft-decode steps of requests `rows` with committed lengths `seq_lens` can be
// built, checked before any step is built or any step's arrays allocated. InvalidArgument:
// the shape, a seq_len count other than the rows', a negative seq_len; OutOfRange: more than
// INT32_MAX branches, more steps than a row holds, the last step's tokens beyond INT32_MAX
// (int32 offsets; every earlier step has fewer), draft positions past a row (DraftRowTokens >
// max_context_len) or a row outside the table; FailedPrecondition: a row that is not
// allocated.
absl::Status CheckDraftDecodeBatch(const ReqToTokenPool& pool, absl::Span<const ReqPoolIndex> rows,
                                   absl::Span<const TokenLength> seq_lens, DraftDecodeShape shape,
                                   PageSize page_size);

// Writes step `step` of requests `rows` with committed lengths `seq_lens`. Checks everything
// first and writes nothing on error: CheckDraftDecodeBatch's errors, then InvalidArgument for
// a step outside [0, steps) or outputs of other sizes than the step's. Rows listed twice are
// its callers' to refuse (CheckDistinctRows: BuildDraftDecodeMetadata, GraphState::Replay),
// so that a graph replay's steps allocate nothing.
absl::Status BuildDraftDecodeStep(const ReqToTokenPool& pool, absl::Span<const ReqPoolIndex> rows,
                                  absl::Span<const TokenLength> seq_lens, DraftDecodeShape shape,
                                  int32_t step, PageSize page_size,
                                  const DraftDecodeStepSpans& out);

}  // namespace attnmeta

#endif  // ATTNMETA_ATTENTION_METADATA_DRAFT_DECODE_LAYOUT_H_
