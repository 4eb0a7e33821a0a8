// MetadataWriter: writes a replay's metadata into the graph's fixed buffers. GraphState checks
// every input and capacity first and stages the batch's inputs (request rows, KV lengths,
// query rows per request) into device buffers, so a writer reads everything it needs from
// buffers: a device writer builds every array from device-resident lengths, in kernels. The
// host writer (host_metadata_writer.h) calls the span builders of attention/metadata/.

#ifndef ATTNMETA_ATTENTION_GRAPH_METADATA_WRITER_H_
#define ATTNMETA_ATTENTION_GRAPH_METADATA_WRITER_H_

#include <cstdint>
#include <limits>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "attention/graph/device_memory.h"
#include "attention/metadata/custom_mask.h"
#include "attention/metadata/draft_decode_layout.h"
#include "attention/metadata/forward_mode.h"
#include "attention/metadata/page_table.h"
#include "attention/metadata/split_kv_planner.h"
#include "kvcache/req_to_token_pool.h"
#include "kvcache/units.h"

namespace attnmeta {

// One draft-decode step's arrays over B * topk branches (empty without top-k).
struct DraftStepBuffers {
  absl::Span<TokenOffset> kv_indptr;         // [B * topk + 1]
  absl::Span<TokenLength> kv_lens;           // [B * topk]
  absl::Span<TokenLength> kv_last_page_len;  // [B * topk]
  absl::Span<TokenSlot> kv_indices;          // [B * topk * draft_branch_tokens]
};

// The fixed buffers as typed spans, each as long as its capacity (BufferPlan). The spans hold
// device addresses; only a writer whose memory is host-accessible dereferences them.
struct GraphBuffers {
  // Inputs, staged by GraphState for the padded batch: [B].
  absl::Span<ReqPoolIndex> req_rows;   // real rows, then GraphState::kPaddedRow (-1): a
                                       // writer never reads req_to_token for padded rows
  absl::Span<TokenLength> kv_lens;     // real lengths, then the fill length
  absl::Span<TokenLength> q_lens;      // query rows per request (padded rows: the captured)
  absl::Span<uint8_t> tree_mask;       // target-verify: [B * n * n], the real rows' [n][n]
                                       // tree rows first
  // Outputs.
  absl::Span<TokenOffset> kv_indptr;        // [B + 1]
  absl::Span<TokenOffset> qo_indptr;        // [B + 1]
  absl::Span<TokenLength> kv_last_page_len; // [B]
  absl::Span<TokenSlot> kv_indices;         // [B * kv_row_tokens]
  PageTableSpan<PageId> page_table;         // [B][page_table_cols]; 0 x 0 when disabled
  SplitKvPlanSpans split_kv;                // empty spans when disabled
  absl::Span<int64_t> mask_indptr;          // [B + 1] (draft_tokens > 0)
  // FULL layout (n = draft_tokens > 0): [mask_indptr[B]] bytes used of
  // [B * n * (max_context_len + n)].
  absl::Span<uint8_t> custom_mask;
  absl::Span<TokenOffset> draft_qo_indptr;  // [B * topk + 1], shared by the steps (topk > 0)
  std::vector<DraftStepBuffers> draft_steps;  // [steps] (topk > 0)
};

// One replay (or capture) to write. Rows [0, real_batch_size) are the batch's; rows
// [real_batch_size, padded_batch_size) are padding: q_len_per_request query rows and a KV
// length of `padded_kv_len` (GraphState::PaddedRowKvLen) on slots of the reserved padding page.
// Per mode: target-verify also writes mask_indptr and the FULL custom mask from tree_mask, whose
// rows are the real requests' only (a padded row's block is all ones: it sees all of its KV).
// Draft-decode writes the draft arrays of every step from the staged committed lengths
// (kv_lens) instead of the token-level kv_indices: real branches as draft_decode_layout.h lays
// them out, padded branches (the padded requests' topk each) `padded_kv_len` tokens on the
// padding page and one query row.
struct MetadataWriteRequest {
  ForwardMode mode = ForwardMode::kDecode;
  int64_t real_batch_size = 0;
  int64_t padded_batch_size = 0;
  TokenLength padded_kv_len;
  PageSize page_size = *PageSize::Create(1);
  const ReqToTokenPool* req_to_token = nullptr;  // the table the real rows index
  bool page_table = false;                       // write the page table
  bool split_kv = false;                         // plan split-KV work
  SplitKvOptions split_kv_options;
  MaskLayout mask_layout = MaskLayout::kNone;    // kFull for target-verify
  DraftDecodeShape draft_decode;                 // the config's topk and steps (draft-decode)
  TokenLength q_len_per_request;                 // the captured rows per request (a bound)
  // Host copies of the staged kv_lens and q_lens ([padded_batch_size]), for a writer that
  // works on the device but reports host-side counts (the split-KV plan's).
  absl::Span<const TokenLength> host_kv_lens;
  absl::Span<const TokenLength> host_q_lens;
  // The buffers' generation (GraphState::generation): a writer that keeps per-buffer state,
  // such as captured device graphs, must drop it when this changes.
  uint64_t generation = 0;
};

// OK when `r` is a request the buffers can hold, else InvalidArgument naming the first buffer
// that cannot (`writer` starts the message): 0 <= real_batch_size <= padded_batch_size,
// req_to_token set, every per-batch buffer at least the padded batch (indptrs one more), a
// requested page table of as many rows and a mask_indptr of padded + 1; draft-decode: a valid
// shape, buffers for its steps, and each step's and draft_qo_indptr's for padded * topk
// branches. GraphState only makes such requests; a writer called directly checks this before
// it reads or writes a buffer. The per-token buffers (kv_indices, the mask) follow from the
// lengths, which the writers check as they build.
absl::Status CheckWriteFitsBuffers(const MetadataWriteRequest& r, const GraphBuffers& b,
                                   absl::string_view writer);

class MetadataWriter {
 public:
  virtual ~MetadataWriter() = default;

  // Where the buffers it writes must live: a host writer dereferences them, a device writer
  // hands them to kernels.
  virtual MemorySpace space() const = 0;

  // OK when the writer can write `request`; else Unimplemented for a request it does not
  // implement, or InvalidArgument for one it cannot take (each writer lists which). GraphState
  // asks before it stages anything, so that a request the writer cannot write leaves every
  // buffer as it was.
  virtual absl::Status CheckSupported(const MetadataWriteRequest& request) const {
    (void)request;
    return absl::OkStatus();
  }
  // The most rows one write can cover: requests, or draft-decode branches (requests * topk).
  // GraphState refuses a batch capacity beyond it (Create, Reserve) before it allocates, so
  // that a plan the writer could never write fails at startup, not at the first capture.
  virtual int64_t max_write_rows() const { return std::numeric_limits<int64_t>::max(); }

  // Per-batch arrays, O(padded batch size): kv_indptr, qo_indptr and kv_last_page_len over
  // rows [0, padded_batch_size] from the staged kv_lens and q_lens, and mask_indptr when the
  // request has a mask layout (target-verify). Draft-decode has none of these: the host writer
  // writes every draft step in WriteTokenArrays, the device writer here. InvalidArgument first
  // for a request CheckWriteFitsBuffers refuses.
  // REQUIRES: the staged inputs hold the request's batch.
  virtual absl::Status WriteBatchArrays(const MetadataWriteRequest& request,
                                        const GraphBuffers& buffers) = 0;

  // Per-token arrays, O(tokens): kv_indices (real rows from req_to_token, padded rows on the
  // padding page), the page table (real rows' pages and padding past them, padded rows all
  // padding) when enabled, for every page size, and the split-KV plan when enabled.
  // REQUIRES: the last WriteBatchArrays of this writer succeeded, for the same request.
  // `split_kv_counts` (may be null) receives what the split-KV plan wrote.
  virtual absl::Status WriteTokenArrays(const MetadataWriteRequest& request,
                                        const GraphBuffers& buffers,
                                        SplitKvPlanCounts* split_kv_counts) = 0;
};

}  // namespace attnmeta

#endif  // ATTNMETA_ATTENTION_GRAPH_METADATA_WRITER_H_
