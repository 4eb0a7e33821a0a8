// Builders of ForwardMetadata: pure host functions over spans, so that the destination can be
// a fixed graph buffer, plus BuildForwardMetadata, which allocates.
//
// Every builder checks all of its inputs before it writes anything: on error its outputs are
// unchanged, and nothing is ever written past an output span or past the part of it that the
// builder documents (the tail of a fixed buffer keeps its contents).

#ifndef ATTNMETA_ATTENTION_METADATA_BUILDERS_H_
#define ATTNMETA_ATTENTION_METADATA_BUILDERS_H_

#include <optional>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "attention/metadata/custom_mask.h"
#include "attention/metadata/forward_metadata.h"
#include "attention/metadata/forward_mode.h"
#include "attention/metadata/lengths.h"
#include "attention/metadata/page_table.h"
#include "kvcache/req_to_token_pool.h"
#include "kvcache/units.h"

namespace attnmeta {

// out = [0, lens[0], lens[0] + lens[1], ...]: kv_indptr from KV lengths, qo_indptr from
// query lengths. InvalidArgument: out.size() != lens.size() + 1, or a negative length;
// OutOfRange: the total exceeds INT32_MAX (int32 offsets would wrap).
absl::Status BuildIndptr(absl::Span<const TokenLength> lens, absl::Span<TokenOffset> out);

// out[i] = LastPageLen(kv_lens[i], page_size) (lengths.h).
// InvalidArgument: sizes differ, or a negative length.
absl::Status BuildKvLastPageLen(absl::Span<const TokenLength> kv_lens, PageSize page_size,
                                absl::Span<TokenLength> out);

// Token-level kv_indices: out[kv_indptr[i] + t] = pool row rows[i], position
// kv_start_idx[i] + t (kv_start_idx empty: 0), for t < kv_indptr[i + 1] - kv_indptr[i].
// Entries of `out` past kv_indptr[bs] are not written.
// InvalidArgument: rows.size() != bs (= kv_indptr.size() - 1), kv_start_idx neither empty
// nor bs, kv_indptr not starting at 0 or decreasing, out.size() < kv_indptr[bs];
// OutOfRange: a row outside the pool, or a range (negative start included) outside
// [0, max_context_len); FailedPrecondition: a row that is not allocated.
absl::Status BuildTokenKvIndices(const ReqToTokenPool& pool, absl::Span<const ReqPoolIndex> rows,
                                 absl::Span<const TokenOffset> kv_indptr,
                                 absl::Span<const TokenPosition> kv_start_idx,
                                 absl::Span<TokenSlot> out);

// The page table of sequences that start at position 0 of their rows: out[i][j] = the page
// of the slot at position j * page_size of row rows[i] for j < ceil(kv_lens[i] / page_size),
// kPaddingPage for the other columns. Writes rows [0, bs) of `out`; rows past bs keep their
// contents. InvalidArgument: sizes differ, a negative length, out.rows() < bs or
// out.cols() < ceil(max kv_len / page_size); OutOfRange / FailedPrecondition: as
// BuildTokenKvIndices for rows and lengths.
absl::Status BuildPageTable(const ReqToTokenPool& pool, absl::Span<const ReqPoolIndex> rows,
                            absl::Span<const TokenLength> kv_lens, PageSize page_size,
                            PageTableSpan<PageId> out);

// The batch the scheduler picked.
struct ForwardBatch {
  ForwardMode mode = ForwardMode::kIdle;
  absl::Span<const ReqPoolIndex> req_rows;    // [bs]
  absl::Span<const TokenLength> kv_lens;      // [bs] KV tokens incl. this step's new ones
  absl::Span<const TokenLength> q_lens;       // [bs] query rows (decode: 1 each)
  absl::Span<const TokenPosition> kv_start_idx; // [bs] or empty (all 0)
  // Target-verify's tree (custom_mask.h): per sequence a [q_len][q_len] block of 0/1 bytes,
  // row r's byte c set when query row r sees query row c; empty without a custom mask.
  absl::Span<const uint8_t> tree_mask;
};

// What checked mode validates the metadata against: the KV pool and the query tensor the
// kernel will be given (not the batch's own q_lens, so that a query tensor of the wrong
// size is caught).
struct MetadataCheck {
  TokenCount pool_slots;      // slots in the KV pool, padding page included
  TokenCount num_query_rows;  // rows of the query tensor
};

struct BuildOptions {
  // Build the page table (for a page-level consumer); otherwise it is 0 x 0.
  bool page_table = true;
  // The layout of the custom mask built from ForwardBatch::tree_mask; kNone: no mask.
  MaskLayout mask_layout = MaskLayout::kNone;
  // Checked mode: when set, the result is validated (validator.h, slot ownership included)
  // before it is returned.
  std::optional<MetadataCheck> check;
};

// All the metadata of `batch`. Errors: those of the builders above and of BuildMaskIndptr /
// BuildCustomMask, and InvalidArgument for batch arrays of different sizes (kv_start_idx may be
// empty), a page table asked for with kv_start_idx, a batch or mask layout its mode does not allow
// (mode_rules.h), a tree mask without a layout, tree rows CheckTreeRows refuses (target-verify:
// also a row that does not see the root), or a request row listed twice (CheckDistinctRows,
// as graph replay refuses it); in checked mode, the validator's error. The tree rows and the
// rows are checked before any array is allocated.
absl::StatusOr<ForwardMetadata> BuildForwardMetadata(const ForwardBatch& batch,
                                                     const ReqToTokenPool& pool,
                                                     PageSize page_size,
                                                     const BuildOptions& options = {});

}  // namespace attnmeta

#endif  // ATTNMETA_ATTENTION_METADATA_BUILDERS_H_
