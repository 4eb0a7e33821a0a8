// The arguments of the metadata kernels' host launchers (metadata_launchers.h) and the checks
// they make before anything is launched, each of which gives the kernel's argument struct
// (metadata_kernels.h) when the arguments pass. Host code without the GPU runtime: the checks
// are tested on the CPU (spans over host memory: nothing here reads through them).
//
// Errors name the argument: InvalidArgument for sizes that disagree, a null pointer with a
// nonzero size, a pointer not aligned for the kernel's loads, options out of range; mostly
// OutOfRange for what is beyond the kernels' int32 arithmetic or their grid (each function
// says which). A count that the kernels step through in int32 (a batch, its draft branches,
// page-table columns, req_to_token's row length) is at most 2^30 (kMaxMetadataCount,
// internal/launch_checks.h), so that adding a grid's stride to it cannot wrap. The rows (or
// draft branches) of a launch are blocks along its grid's x dimension: at most 2^23
// (kMaxMetadataRows, metadata_kernels.h), within HIP's threads per grid dimension.

#ifndef ATTNMETA_ATTENTION_KERNELS_METADATA_KERNEL_ARGS_H_
#define ATTNMETA_ATTENTION_KERNELS_METADATA_KERNEL_ARGS_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "attention/kernels/device_span.h"
#include "attention/kernels/device_violation.h"
#include "attention/kernels/metadata_kernels.h"
#include "attention/metadata/draft_decode_layout.h"
#include "attention/metadata/split_kv_planner.h"
#include "kvcache/req_to_token_pool.h"
#include "kvcache/units.h"

namespace attnmeta {

// req_to_token in device memory: [max_reqs][max_context_len], row-major.
struct DeviceReqToToken {
  DeviceSpan<const TokenSlot> table;
  TokenCount max_context_len;  // the row stride, >= 1
};

// Token-level kv_indices from req_to_token (BuildTokenKvIndicesOnDevice, token_kv_indices.h).
struct TokenKvIndicesDeviceInputs {
  DeviceSpan<const TokenSlot> req_to_token;         // [max_reqs * max_context_len], row-major
  TokenCount max_context_len;                       // the row stride of req_to_token, >= 1
  DeviceSpan<const ReqPoolIndex> req_pool_indices;  // [batch_size]
  DeviceSpan<const TokenOffset> kv_indptr;          // [batch_size + 1], [0] == 0, non-decreasing
  DeviceSpan<const TokenPosition> kv_start_idx;     // [batch_size], or empty for all zeros
  // The largest KV length of the batch (the host derives it from the real lengths); it sizes
  // the grid (rows longer than it are still written in full, by fewer blocks).
  // 0 <= max_kv_len <= max_context_len.
  TokenCount max_kv_len;
  // Slots of the KV pool: slots read are checked against it (0: not checked).
  TokenCount pool_slots;
  // The launch's blocks may start under the tail of the kernel ahead on the stream (where
  // DeviceOverlapsLaunches in metadata_launchers.h says so; a plain launch elsewhere) and wait
  // for it before they read anything: right after any kernel, including one that writes these
  // inputs (see metadata_launchers.h for the kernel ahead's part). False: a plain launch.
  bool overlap_preceding_kernel = true;
};
// InvalidArgument: sizes that disagree (kv_indptr not batch_size + 1, kv_start_idx neither
// empty nor batch_size, req_to_token not a whole number of rows, a null pointer with a
// nonzero size); OutOfRange: max_kv_len outside [0, max_context_len], a batch beyond 2^23, a
// row length beyond 2^30, rows or pool slots beyond int32. An empty batch: arguments of batch_size
// 0 (no launch).
absl::StatusOr<kernels::TokenKvIndicesParams> TokenKvIndicesParamsFor(
    const TokenKvIndicesDeviceInputs& in, DeviceSpan<TokenSlot> kv_indices,
    kernels::DeviceViolation* violation);

// BuildIndptrOnDevice's arguments: InvalidArgument for indptr not lens.size() + 1 entries,
// last_page_len neither empty nor lens.size(), a null pointer; OutOfRange for more than 2^30
// lengths.
absl::StatusOr<kernels::IndptrParams> IndptrParamsFor(DeviceSpan<const TokenLength> lens,
                                                      DeviceSpan<TokenOffset> indptr,
                                                      DeviceSpan<TokenLength> last_page_len,
                                                      PageSize page_size,
                                                      kernels::DeviceViolation* violation);

// BuildPageTableOnDevice's arguments: InvalidArgument for req_to_token that is not whole rows,
// rows and kv_lens of different sizes, negative columns, a table smaller than [bs][cols], a
// null pointer; OutOfRange for a batch beyond 2^23, columns or a row length beyond 2^30,
// req_to_token rows or pool slots beyond int32.
absl::StatusOr<kernels::PageTableParams> PageTableParamsFor(
    const DeviceReqToToken& req_to_token, TokenCount pool_slots,
    DeviceSpan<const ReqPoolIndex> rows, DeviceSpan<const TokenLength> kv_lens,
    PageSize page_size, DeviceSpan<PageId> page_table, PageCount cols,
    kernels::DeviceViolation* violation);

// Every array of a decode (or fixed-row extend) replay from the staged inputs of a padded
// batch of B rows (BuildDecodeMetadataOnDevice).
struct DecodeMetadataDeviceArgs {
  DeviceReqToToken req_to_token;
  TokenCount pool_slots;                      // bounds the slots read; 0: unchecked
  PageSize page_size = *PageSize::Create(1);
  DeviceSpan<const ReqPoolIndex> rows;        // [B], kernels::kPaddedRow for padded rows
  DeviceSpan<const TokenLength> kv_lens;      // [B]
  DeviceSpan<const TokenLength> q_lens;       // [B]
  DeviceSpan<TokenOffset> kv_indptr;          // [B + 1]
  DeviceSpan<TokenOffset> qo_indptr;          // [B + 1]
  DeviceSpan<TokenLength> kv_last_page_len;   // [B]
  DeviceSpan<TokenSlot> kv_indices;           // capacity; entries past kv_indptr[B] untouched
  DeviceSpan<PageId> page_table;              // [>= B][page_table_cols], or empty: none
  PageCount page_table_cols;
  // The longest row the grid covers: a captured graph passes max_context_len so that it
  // replays any batch; 1 <= max_kv_len <= max_context_len (OutOfRange otherwise).
  TokenCount max_kv_len;
  bool overlap_preceding_kernel = true;  // metadata_launchers.h: "Overlapping the kernel ahead"
};
// InvalidArgument for sizes that disagree with B, a page table smaller than [B][cols], a null
// pointer; OutOfRange for max_kv_len outside [1, max_context_len], a batch beyond 2^23,
// page-table columns or a row length beyond 2^30.
absl::StatusOr<kernels::FusedMetadataParams> FusedMetadataParamsFor(
    const DecodeMetadataDeviceArgs& args, kernels::DeviceViolation* violation);

// Target-verify's FULL mask and mask_indptr from tree rows for a padded batch of B rows
// (BuildTreeMaskOnDevice).
struct TreeMaskDeviceArgs {
  DeviceSpan<const TokenLength> q_lens;   // [B]
  DeviceSpan<const TokenLength> kv_lens;  // [B]
  DeviceSpan<const uint8_t> tree;         // per request [q_len][q_len], back to back
  DeviceSpan<int64_t> mask_indptr;        // [B + 1]
  DeviceSpan<uint8_t> mask;               // capacity
  int64_t max_mask_bytes_per_row = 1;     // the grid's bound: max q_len * kv_len of a request
  bool overlap_preceding_kernel = true;   // metadata_launchers.h: "Overlapping the kernel ahead"
  // [B], kernels::kPaddedRow for padded rows (no tree rows: all ones), or empty: none padded.
  DeviceSpan<const ReqPoolIndex> rows;
};
// InvalidArgument for sizes that disagree with B, a null pointer; OutOfRange for
// max_mask_bytes_per_row < 1 or a batch beyond 2^23.
absl::StatusOr<kernels::TreeMaskParams> TreeMaskParamsFor(const TreeMaskDeviceArgs& args,
                                                          kernels::DeviceViolation* violation);

// One draft-decode step for a padded batch of B rows (BuildDraftStepOnDevice).
struct DraftStepDeviceArgs {
  DeviceReqToToken req_to_token;
  TokenCount pool_slots;                      // bounds the slots read; 0: unchecked
  PageSize page_size = *PageSize::Create(1);
  DeviceSpan<const ReqPoolIndex> rows;        // [B]
  DeviceSpan<const TokenLength> seq_lens;     // [B] committed lengths
  DraftDecodeShape shape;
  int32_t step = 0;
  DeviceSpan<TokenLength> kv_lens;            // [B * topk]
  DeviceSpan<TokenOffset> kv_indptr;          // [B * topk + 1]
  DeviceSpan<TokenOffset> qo_indptr;          // [B * topk + 1]
  DeviceSpan<TokenLength> kv_last_page_len;   // [B * topk]
  // The capacity; entries past kv_indptr[B * topk] are left untouched.
  DeviceSpan<TokenSlot> kv_indices;
  bool overlap_preceding_kernel = true;  // metadata_launchers.h: "Overlapping the kernel ahead"
};
// InvalidArgument for the shape or step, sizes that disagree, a null pointer; OutOfRange for
// B * topk branches beyond 2^23 or a row length beyond 2^30.
absl::StatusOr<kernels::DraftStepParams> DraftStepParamsFor(const DraftStepDeviceArgs& args,
                                                            kernels::DeviceViolation* violation);

// The split-KV plan of qo_indptr / kv_indptr written into fixed buffers
// (BuildSplitKvPlanOnDevice).
struct SplitKvPlanDeviceArgs {
  DeviceSpan<const TokenOffset> qo_indptr;  // [B + 1]
  DeviceSpan<const TokenOffset> kv_indptr;  // [B + 1]
  SplitKvOptions options;
  DeviceSpan<SplitKvWorkItem> work;         // the work buffer's capacity
  DeviceSpan<int32_t> unit_indptr;          // >= num_units + 1
  DeviceSpan<SplitKvReduceItem> reduce;     // the reduce buffer's capacity
  bool overlap_preceding_kernel = true;     // metadata_launchers.h: "Overlapping the kernel ahead"
};
// InvalidArgument for options out of range, indptrs empty or of different sizes, unit_indptr
// shorter than num_units + 1, a null pointer; OutOfRange for a batch beyond 2^30.
absl::StatusOr<kernels::SplitKvPlanParams> SplitKvPlanParamsFor(
    const SplitKvPlanDeviceArgs& args, kernels::DeviceViolation* violation);

// The element type of the attention kernels' Q, K, V and out and of the gathered K/V.
enum class KvElementType { kBf16, kFp16 };

// The context-prefill gather on the device: row r < cu_k[bs] of k_out / v_out is pool row
// tok_idx[r] (ContextGather's arrays), each [num_kv_heads][head_dim] of `dtype`.
// InvalidArgument: head_dim outside [1, 256], num_kv_heads < 1, pools that are not whole
// rows or differ in size, outputs that are not whole rows, a pointer not aligned to the
// element size, null pointers; OutOfRange: more than INT32_MAX sequences, pools or outputs of
// more than 2^31 rows.
struct GatherKvDeviceArgs {
  DeviceSpan<const uint8_t> k_pool;  // [pool_slots][num_kv_heads][head_dim]
  DeviceSpan<const uint8_t> v_pool;  // [pool_slots][num_kv_heads][head_dim], k_pool's size
  int32_t num_kv_heads = 1;
  int32_t head_dim = 1;
  KvElementType dtype = KvElementType::kBf16;
  DeviceSpan<const TokenSlot> tok_idx;  // [>= cu_k[bs]]
  DeviceSpan<const TokenOffset> cu_k;   // [bs + 1]
  DeviceSpan<uint8_t> k_out;            // [rows][num_kv_heads][head_dim]
  DeviceSpan<uint8_t> v_out;            // [rows][num_kv_heads][head_dim]
  bool overlap_preceding_kernel = true;  // metadata_launchers.h: "Overlapping the kernel ahead"
};
absl::StatusOr<kernels::GatherKvParams> GatherKvParamsFor(const GatherKvDeviceArgs& args,
                                                          kernels::DeviceViolation* violation);

}  // namespace attnmeta

#endif  // ATTNMETA_ATTENTION_KERNELS_METADATA_KERNEL_ARGS_H_
