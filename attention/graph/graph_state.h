// GraphState: the fixed buffers of a BufferPlan, and capture and replay of the metadata a
// HIP/CUDA graph reads through them.
//
// A captured graph replays its kernels with the pointers it was captured with, so every
// metadata array lives in a buffer sized up front (BufferPlan) and is rewritten in place at
// every replay. Capture(bucket) writes the metadata of a padded batch of `bucket` requests
// and returns a handle; Replay(handle, batch) writes a real batch of at most `bucket`
// requests into the same buffers: real rows exactly as the eager path builds them, padded
// rows with safe values (the captured query rows, a KV length of PaddedRowKvLen on slots of
// the reserved padding page, page-table rows all padding). Every enabled consumer's buffers are
// written at every replay, for every page size, but for draft-decode, which is token-level only:
// its replays write only the draft_* arrays (and the staged inputs); every other buffer, the
// page table and the split-KV plan among them, keeps the last other replay's rows (so a kernel
// that reads any of them must not be captured for draft-decode).
//
// Reserve(capacity) regrows every per-batch buffer when an engine pads its capture batch
// past the current capacity (the reference system regrew some buffers and not others: DESIGN.md
// section 3, row 4), which moves the buffers: a handle captured before is refused by Replay
// (its graph would read freed memory).
//
// Every input and capacity is checked before anything is written; on error the buffers and
// the state are exactly as before (an Internal error of the memory or the writer after the
// checks, e.g. a device fault, is the exception: the buffers are then partly written; a writer
// that does not implement a request answers Unimplemented before it writes). Replay
// allocates nothing (host heap or device memory). GraphState does not validate what it wrote:
// a checked launcher runs ValidateForwardMetadata on ReplayResult::metadata, as the tests do.
//
// A padded row has the captured query rows (the handle's q_len_per_request: 1 for decode and
// per draft-decode branch, draft_tokens for target-verify), as the reference system gives them,
// so that qo_indptr[bucket] is the rows of the padded query tensor a captured kernel is given
// (DESIGN.md section 2: "equals the number of query rows the kernel is given, always"), and
// every such row belongs to a request: a kernel over the whole bucket (ReplayResult::padded)
// neither finds rows past the indptr nor reads garbage. Its KV length, PaddedRowKvLen, covers
// those rows (a target-verify padded row sees all of its KV, every token of it a padding slot),
// and its outputs are finite values that the engine drops. The variable-row form of extend
// and draft-extend (ReplayBatch::q_lens) is the exception: real requests with fewer rows than
// captured leave rows past qo_indptr[bucket] that belong to no request. No request can take
// them (a padded row has the captured rows already, the most a captured kernel's grid gives a
// sequence), so the kernel captured for such a bucket is launched with
// VarlenAttentionArgs::zero_unclaimed_rows, which writes them as rows that see nothing, and the
// bucket's view validates with ValidationContext::allow_unclaimed_rows. That launch's max_q_len
// is the handle's q_len_per_request: the view's max_q_len is the batch's true maximum, which is
// smaller when every request of a full bucket uses fewer rows.
// A padded row's request row is staged as kPaddedRow (-1): a writer must not read req_to_token
// for it. Row -1 addresses the entries before the table, which may be another allocation's
// memory, so nothing faults by itself: the host builders read rows through ReqToTokenPool's
// checked reads, and the device kernels check every row they read.
//
// Modes (Capture's q_len_per_request in brackets):
//  - decode [1], idle [0], extend [1 .. MaxQueryRowsPerRequest];
//  - draft-extend [1 .. max(MaxQueryRowsPerRequest, draft_tokens)]: a fixed number of rows per
//    request, or fewer per request through ReplayBatch::q_lens (the variable form);
//  - target-verify [draft_tokens]: kv_lens are seq_len + n (the draft slots in the row), and
//    ReplayBatch::tree_mask gives the tree; mask_indptr and the FULL mask are written too;
//  - draft-decode [1 per branch]: kv_lens are the committed seq_lens; every one of the
//    config's steps is written into its own arrays over bs * topk branches
//    (ReplayResult::draft_steps), as draft_decode_layout.h lays them out.
// Mixed batches run eagerly. Not thread-safe.

#ifndef ATTNMETA_ATTENTION_GRAPH_GRAPH_STATE_H_
#define ATTNMETA_ATTENTION_GRAPH_GRAPH_STATE_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "attention/graph/backend_config.h"
#include "attention/graph/buffer_plan.h"
#include "attention/graph/device_memory.h"
#include "attention/graph/metadata_writer.h"
#include "attention/metadata/forward_metadata.h"
#include "attention/metadata/forward_mode.h"
#include "kvcache/req_to_token_pool.h"
#include "kvcache/units.h"

namespace attnmeta {

// What Capture returns and Replay needs: the padded batch a graph was captured for, and the
// buffer generation its pointers belong to.
struct CaptureHandle {
  int64_t bucket = 0;
  ForwardMode mode = ForwardMode::kDecode;
  // Query rows of every request: decode 1, draft-decode 1 a branch, idle 0, target-verify
  // draft_tokens, extend and draft-extend the value Capture was given.
  TokenLength q_len_per_request;
  uint64_t generation = 0;
};

// A real batch to replay.
struct ReplayBatch {
  absl::Span<const ReqPoolIndex> req_rows;  // [bs], allocated rows of req_to_token
  // [bs], KV tokens including this step's; draft-decode: the committed seq_lens.
  absl::Span<const TokenLength> kv_lens;
  // Extend and draft-extend only: [bs] query rows per request, each in [1, the handle's
  // q_len_per_request]; empty: the handle's for every request.
  absl::Span<const TokenLength> q_lens;
  // Target-verify only: [bs][n][n] 0/1 tree rows (VerifyTree::sees).
  absl::Span<const uint8_t> tree_mask;
};

struct ReplayResult {
  // The real rows' metadata over the fixed buffers (bs = the batch's size; the page table is
  // [bs][page_table_cols]). Device addresses: dereference only when the memory is
  // host-accessible.
  // Draft-decode: step 0's arrays (every step is in draft_steps).
  ForwardMetadataView metadata;
  // What the split-KV plan wrote (zero when disabled). The plan covers the whole bucket,
  // padded rows included: a split launch reads it with `padded`, not `metadata` (whose batch
  // its items for padded rows are outside).
  SplitKvPlanCounts split_kv;
  // Draft-decode: [steps] the real branches' metadata of each step (valid until the next
  // Replay or Capture); empty for the other modes.
  absl::Span<const ForwardMetadataView> draft_steps;
  // The same over the whole padded batch (bs = the bucket; draft-decode: bucket * topk
  // branches), as a kernel captured for the bucket reads it: its qo_indptr ends at bucket *
  // q_len_per_request (at most that in the variable-row form, whose tail no request claims:
  // see the top), and the split-KV plan, which covers the
  // padded rows too, is this batch's. Idle: the empty batch, as `metadata` (an idle graph's
  // kernels are given no query rows; its padded rows in the buffers have none).
  ForwardMetadataView padded;
  absl::Span<const ForwardMetadataView> padded_draft_steps;
};

class GraphState {
 public:
  // The least KV length of a padded row: one token, on the padding page.
  static constexpr TokenLength kPaddedKvLen{1};
  // The KV length of a padded row of q_len_per_request query rows: enough for its rows (a
  // kernel refuses a sequence with more query rows than KV tokens), at least kPaddedKvLen.
  static constexpr TokenLength PaddedRowKvLen(TokenLength q_len_per_request) {
    return q_len_per_request.value() > kPaddedKvLen.value() ? q_len_per_request : kPaddedKvLen;
  }
  // The request row staged for padded rows.
  static constexpr ReqPoolIndex kPaddedRow{-1};

  // Allocates the buffers of the config's plan for config.max_batch_size requests.
  // InvalidArgument: the config does not validate; FailedPrecondition: the writer and the
  // memory work in different spaces (a host writer over device buffers, or the reverse),
  // the KV pool's page size is not the config's, or req_to_token's rows are narrower than
  // max_context_len + draft_tokens or than the draft-decode runs of a request at max_context_len;
  // OutOfRange: max_batch_size requests (or, with topk, their draft branches) beyond the
  // writer's max_write_rows; InvalidArgument: a null req_to_token, memory or writer; Internal:
  // the memory returned a buffer shorter than asked, or at null; the plan's and the memory's
  // errors. `req_to_token`, `memory` and
  // `writer` must outlive the state.
  static absl::StatusOr<std::unique_ptr<GraphState>> Create(const BackendConfig& config,
                                                            const ReqToTokenPool* req_to_token,
                                                            PageSize pool_page_size,
                                                            DeviceMemory* memory,
                                                            MetadataWriter* writer);
  GraphState(const GraphState&) = delete;
  GraphState& operator=(const GraphState&) = delete;
  ~GraphState();

  // Regrows every per-batch buffer to hold `batch_capacity` requests when it exceeds the
  // current capacity (no-op otherwise), and bumps the generation. All or nothing: on error
  // (InvalidArgument for batch_capacity < 1; OutOfRange for a capacity, or its draft branches,
  // beyond the writer's max_write_rows; Internal for a buffer shorter than asked; the plan's,
  // the memory's) the old buffers stay.
  absl::Status Reserve(int64_t batch_capacity);

  // Writes the metadata of a padded batch of `bucket` requests (all padding) and returns the
  // handle to replay it. `q_len_per_request`: as listed at the top (required for extend and
  // draft-extend; the others default to theirs). InvalidArgument: bucket < 1, a mixed batch
  // (mixed batches run eagerly), a query-row count the mode does not allow;
  // FailedPrecondition: bucket > the capacity (Reserve first), a speculative mode the config
  // does not plan for (target-verify needs draft_tokens, draft-decode topk and steps);
  // ResourceExhausted: a per-batch buffer smaller than the bucket (names it).
  absl::StatusOr<CaptureHandle> Capture(int64_t bucket, ForwardMode mode,
                                        std::optional<TokenLength> q_len_per_request = {});

  // Writes `batch` into the buffers `handle` was captured with. Errors, all before any write:
  //   FailedPrecondition: the handle's generation is not the current one (Reserve moved the
  //     buffers after the capture, or it is another state's handle), or a row that is not
  //     allocated;
  //   a handle whose shape Capture would refuse (a forged one): Capture's code for it
  //     (InvalidArgument, or FailedPrecondition for a bucket past the capacity or a
  //     speculative mode the config does not plan for);
  //   InvalidArgument: rows and lengths of different sizes, more rows than the bucket, a
  //     request row listed twice (two requests would write one row's slots), an idle
  //     handle given rows or another handle none, a KV length below the query rows per
  //     request (draft-decode: a negative committed length), q_lens outside [1, the handle's] or
  //     given to another mode, a tree mask missing, of the wrong size, given to another mode, or
  //     with rows CheckTreeRows refuses as a draft tree's (a byte other than 0/1, a row not seeing
  //     itself or the root);
  //   OutOfRange: a row outside req_to_token, a KV length beyond max_context_len +
  //     draft_tokens (draft-decode: a committed length beyond max_context_len), or beyond the
  //     row (draft-decode: its branches' draft runs beyond the row);
  //   ResourceExhausted: a buffer too small for the batch (the message names the buffer, the
  //     need and the capacity).
  absl::StatusOr<ReplayResult> Replay(const CaptureHandle& handle, const ReplayBatch& batch);

  const BackendConfig& config() const { return config_; }
  const BufferPlan& plan() const { return plan_; }
  uint64_t generation() const { return generation_; }
  int64_t batch_capacity() const { return plan_.batch_capacity; }
  // The buffer named `name` (buffer_plan.h), or an empty buffer when the plan has none.
  DeviceBuffer buffer(absl::string_view name) const;
  // The buffers as typed spans (device addresses).
  const GraphBuffers& buffers() const { return views_; }

 private:
  GraphState(const BackendConfig& config, const ReqToTokenPool* req_to_token, PageSize page_size,
             DeviceMemory* memory, MetadataWriter* writer);
  // Allocates every buffer of `plan` (all or nothing) into `out`.
  absl::Status AllocateAll(const BufferPlan& plan, std::vector<DeviceBuffer>& out);
  void FreeAll(std::vector<DeviceBuffer>& buffers);
  // Rebuilds views_ over allocated_.
  void BuildViews();
  // OK when (bucket, mode, q_len_per_request) is a shape this state captures: the rules of
  // Capture, shared by Replay so that a forged handle is refused too. InvalidArgument for a
  // shape no state captures; FailedPrecondition for a speculative mode the config does not
  // plan for, or a bucket past the batch capacity.
  absl::Status CheckShape(int64_t bucket, ForwardMode mode, TokenLength q_len_per_request) const;
  // Stages the inputs of a padded batch and runs the writer.
  absl::StatusOr<SplitKvPlanCounts> Write(const CaptureHandle& handle, const ReplayBatch& batch);

  BackendConfig config_;
  const ReqToTokenPool* req_to_token_;
  PageSize page_size_;
  DeviceMemory* memory_;
  MetadataWriter* writer_;
  BufferPlan plan_;
  std::vector<DeviceBuffer> allocated_;  // parallel to plan_.buffers
  GraphBuffers views_;
  uint64_t generation_;  // unique in the process: a handle of another state never matches
  // [req_to_token max_reqs], all 0 between replays: CheckDistinctRows's scratch, so that
  // Replay allocates nothing.
  std::vector<uint8_t> row_marks_;
  // Host staging of the padded inputs, [batch capacity] each: sized by Reserve, so that
  // Replay allocates nothing.
  std::vector<ReqPoolIndex> staged_rows_;
  std::vector<TokenLength> staged_kv_lens_;
  std::vector<TokenLength> staged_q_lens_;
  // staged_inputs' layout on the host ([B] rows, kv_lens, q_lens), copied in one go.
  std::vector<uint8_t> staging_;
  // The device buffers the staged inputs are copied to, looked up once per (re)allocation.
  DeviceBuffer staged_buffer_, tree_mask_buffer_;
  // [steps] the views ReplayResult::draft_steps and padded_draft_steps point at, sized once.
  std::vector<ForwardMetadataView> draft_step_views_;
  std::vector<ForwardMetadataView> padded_draft_step_views_;
};

}  // namespace attnmeta

#endif  // ATTNMETA_ATTENTION_GRAPH_GRAPH_STATE_H_
