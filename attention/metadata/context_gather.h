// The context-prefill gather: for kernels that read K/V as one linear per-token buffer
// (e.g. MLA prefill over a cached prefix), the slot of every KV token, sequence-major, and
// its prefix sum.
//
// Token-level in, token-level out: kv_indices entries are token slots and are copied as
// they are (the reference system once applied `// page_size` and `% page_size` to them and
// lost most of its accuracy at page_size 64). OutOfRange means "this batch cannot take the
// linear path": the caller falls back to the paged kernel, and a WARNING is logged with the
// mode, batch size, offending value and table length; InvalidArgument is a malformed call.
// Nothing is ever read out of bounds.

#ifndef ATTNMETA_ATTENTION_METADATA_CONTEXT_GATHER_H_
#define ATTNMETA_ATTENTION_METADATA_CONTEXT_GATHER_H_

#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "attention/metadata/forward_mode.h"
#include "kvcache/units.h"

namespace attnmeta {

struct ContextGatherInputs {
  ForwardMode mode = ForwardMode::kExtend;  // for the warning only
  absl::Span<const TokenOffset> kv_indptr;  // [bs + 1], token-level
  absl::Span<const TokenSlot> kv_indices;   // token-level slots
  absl::Span<const TokenLength> kv_lens;    // [bs]; tokens to gather from each sequence
  TokenCount pool_slots;                    // slots in the KV pool
};

struct ContextGather {
  std::vector<TokenSlot> tok_idx;  // [cu_k[bs]]; tok_idx[cu_k[i] + t] = slot of token t of sequence i
  std::vector<TokenOffset> cu_k;   // [bs + 1]; cu_k[0] == 0, non-decreasing
};

// Sequence i contributes min(kv_lens[i], kv_indptr[i + 1] - kv_indptr[i]) tokens (a negative
// length counts as 0): tok_idx[cu_k[i] + t] = kv_indices[kv_indptr[i] + t].
// Errors (the outputs are unchanged):
//   InvalidArgument: pool_slots outside [0, 2^31], kv_lens.size() + 1 != kv_indptr.size(), a
//     kv_indptr that does not start at 0 or decreases, or output spans of the wrong size (cu_k must
//     be bs + 1, tok_idx at least the total);
//   OutOfRange, with the WARNING: an index kv_indptr[i] + t outside kv_indices, or a slot
//     outside [0, pool_slots).
// The checks run before anything is allocated or written.
// `total` (may be null) receives cu_k[bs].
absl::Status GatherContextTokens(const ContextGatherInputs& in, absl::Span<TokenSlot> tok_idx,
                                 absl::Span<TokenOffset> cu_k, TokenCount* total);
absl::StatusOr<ContextGather> GatherContextTokens(const ContextGatherInputs& in);

}  // namespace attnmeta

#endif  // ATTNMETA_ATTENTION_METADATA_CONTEXT_GATHER_H_
