// BufferPlan: the capacity of every fixed buffer a captured graph reads, computed from a
// BackendConfig and a batch capacity, in one place, in the units each buffer is addressed in.
//
// Token-level buffers are sized in tokens whatever the page size (the reference system sized
// its graph kv_indices buffer max_bs * pages_per_seq and filled it per token: DESIGN.md
// section 3, rows 1 and 6); the page table is its own buffer (row 2); rows carry the
// draft-token slack (row 7); the draft-decode buffer carries the top-k factor (row 10); every
// buffer a kernel addresses with int32 offsets is checked to fit them.
//
// The buffers, for a batch capacity B (config.max_batch_size, or more after a regrow):
//   staged_inputs    int32   [3 * B]      the replayed batch's inputs, one copy per replay:
//                                         [B] request rows, [B] KV lengths (padded rows:
//                                         GraphState::PaddedRowKvLen), [B] query rows
//                                         (padded rows: the captured)
//   kv_indptr        int32   [B + 1]
//   qo_indptr        int32   [B + 1]
//   kv_last_page_len int32   [B]
//   kv_indices       int32   [B * R], R = ceil(max_context_len / ps) * ps + draft_tokens
//   page_table       int32   [B][C],  C = ceil((max_context_len + draft_tokens) / ps)   (if enabled)
//   tree_mask        uint8   [B * n * n]  target-verify's tree rows (input), n = draft_tokens
//   mask_indptr      int64   [B + 1]                                         (draft_tokens > 0)
//   custom_mask      uint8   [B * n * (max_context_len + n)], the FULL layout (int64 offsets)
//   With topk > 0, draft-decode: every step has its own arrays (a graph captures all steps),
//   over B * topk branches; a branch holds at most max_context_len + steps tokens:
//   draft_qo_indptr  int32   [B * topk + 1]
//   draft_kv_indptr  int32   [steps][B * topk + 1]
//   draft_kv_lens    int32   [steps][B * topk]
//   draft_kv_last_page_len int32 [steps][B * topk]
//   draft_kv_indices int32   [steps][B * topk * (ceil(max_context_len / ps) * ps + steps)]
//   split_kv_work, split_kv_unit_indptr, split_kv_reduce, split_kv_partial_out (float32
//   [partials * q_tile * num_q_heads * head_dim]), split_kv_partial_lse (float32
//   [partials * q_tile * num_q_heads]): SplitKvCapacityFor(B * ceil(Q / q_tile), units),
//   Q = max(max_query_rows_per_request, draft_tokens)                        (if enabled)

#ifndef ATTNMETA_ATTENTION_GRAPH_BUFFER_PLAN_H_
#define ATTNMETA_ATTENTION_GRAPH_BUFFER_PLAN_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "attention/graph/backend_config.h"
#include "kvcache/units.h"

namespace attnmeta {

enum class BufferElement { kInt32, kInt64, kUint8, kFloat32, kSplitKvWorkItem, kSplitKvReduceItem };
int64_t ElementBytes(BufferElement element);
absl::string_view ElementName(BufferElement element);

// The buffers' names, shared by the plan, the graph state and the tests.
namespace graph_buffer {
inline constexpr absl::string_view kStagedInputs = "staged_inputs";
inline constexpr absl::string_view kKvIndptr = "kv_indptr";
inline constexpr absl::string_view kQoIndptr = "qo_indptr";
inline constexpr absl::string_view kKvLastPageLen = "kv_last_page_len";
inline constexpr absl::string_view kKvIndices = "kv_indices";
inline constexpr absl::string_view kPageTable = "page_table";
inline constexpr absl::string_view kMaskIndptr = "mask_indptr";
inline constexpr absl::string_view kCustomMask = "custom_mask";
inline constexpr absl::string_view kTreeMask = "tree_mask";
inline constexpr absl::string_view kDraftQoIndptr = "draft_qo_indptr";
inline constexpr absl::string_view kDraftKvIndptr = "draft_kv_indptr";
inline constexpr absl::string_view kDraftKvLens = "draft_kv_lens";
inline constexpr absl::string_view kDraftKvLastPageLen = "draft_kv_last_page_len";
inline constexpr absl::string_view kDraftKvIndices = "draft_kv_indices";
inline constexpr absl::string_view kSplitKvWork = "split_kv_work";
inline constexpr absl::string_view kSplitKvUnitIndptr = "split_kv_unit_indptr";
inline constexpr absl::string_view kSplitKvReduce = "split_kv_reduce";
inline constexpr absl::string_view kSplitKvPartialOut = "split_kv_partial_out";
inline constexpr absl::string_view kSplitKvPartialLse = "split_kv_partial_lse";
}  // namespace graph_buffer

struct BufferSpec {
  std::string name;
  BufferElement element;
  std::string shape;      // how the capacity is derived, as in the table above
  int64_t capacity = 0;   // elements
  int64_t bytes = 0;
  bool int32_addressed = true;  // kernels index it with int32 offsets
};

struct BufferPlan {
  int64_t batch_capacity = 0;     // B
  TokenCount kv_row_tokens;       // R: token slots per request in kv_indices
  PageCount page_table_cols;      // C, 0 without a page table
  TokenCount draft_branch_tokens;  // per draft-decode step, token slots per branch; 0 without
  std::vector<BufferSpec> buffers;
  int64_t total_bytes = 0;

  // The buffer named `name`, or null when the config does not use it.
  const BufferSpec* Find(absl::string_view name) const;
};

// The plan of `config` for a batch capacity of `batch_capacity` requests. InvalidArgument: the
// config does not validate, or batch_capacity outside [1, INT32_MAX); OutOfRange naming the buffer: an
// int32-addressed buffer of more than INT32_MAX elements, or any buffer beyond 2^62 bytes.
absl::StatusOr<BufferPlan> ComputeBufferPlan(const BackendConfig& config, int64_t batch_capacity);

// A human-readable table: one line per buffer (name, element, shape, capacity, bytes), then
// the total.
std::string PlanTable(const BufferPlan& plan);

}  // namespace attnmeta

#endif  // ATTNMETA_ATTENTION_GRAPH_BUFFER_PLAN_H_
