// Host launchers of the metadata kernels: the device twins of the host builders
// (attention/metadata/builders.h), the fused decode-metadata launch a graph replay runs, the
// target-verify mask and the paged-to-linear K/V gather.
//
// Each launcher checks what the host can see (sizes that agree, non-null pointers for
// non-empty spans, alignment, the grid's limits) and returns InvalidArgument / OutOfRange
// before launching anything; then launches on `stream` and returns Internal if the launch
// failed. What lives in device memory (rows, lengths, slots) is bounds-checked by the kernels:
// they never read or write outside a buffer and record the first violation in `violation`
// (DeviceViolationWord; may be null), which the caller checks after the stream.
//
// Overlapping the kernel ahead: every launcher here takes `overlap_preceding_kernel` (in its
// args, or as its last parameter), on by default. Its launches' blocks may then start under the
// tail of the kernel ahead on the stream where DeviceOverlapsLaunches says so (a plain launch
// elsewhere), and each block waits for that kernel before it reads anything: right after any
// kernel, including one that writes these inputs, provided that a kernel ahead which was
// itself launched to overlap waits before it ends (every kernel of this project does; the
// wait covers the kernel directly ahead only). False: plain launches.

#ifndef ATTNMETA_ATTENTION_KERNELS_METADATA_LAUNCHERS_H_
#define ATTNMETA_ATTENTION_KERNELS_METADATA_LAUNCHERS_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "attention/kernels/device_span.h"
#include "attention/kernels/device_violation.h"
#include "attention/kernels/hip_port.h"
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

// The device twin of BuildIndptr and BuildKvLastPageLen: indptr = [0, lens[0], ...] and, when
// last_page_len is not empty, the last page's length of each. InvalidArgument: indptr not
// lens.size() + 1, last_page_len neither empty nor lens.size(), a null pointer; OutOfRange: more
// than INT32_MAX lengths.
absl::Status BuildIndptrOnDevice(DeviceSpan<const TokenLength> lens, DeviceSpan<TokenOffset> indptr,
                                 DeviceSpan<TokenLength> last_page_len, PageSize page_size,
                                 kernels::DeviceViolation* violation, hipStream_t stream,
                                 bool overlap_preceding_kernel = true);

// The device twin of BuildPageTable: rows [0, bs) of `page_table` ([>= bs][cols] row-major),
// the padding page past each row's pages. `pool_slots` bounds the slots read (0: unchecked).
// InvalidArgument: sizes, null pointers, a table smaller than bs rows.
absl::Status BuildPageTableOnDevice(const DeviceReqToToken& req_to_token, TokenCount pool_slots,
                                    DeviceSpan<const ReqPoolIndex> rows,
                                    DeviceSpan<const TokenLength> kv_lens, PageSize page_size,
                                    DeviceSpan<PageId> page_table, PageCount cols,
                                    kernels::DeviceViolation* violation, hipStream_t stream,
                                    bool overlap_preceding_kernel = true);

// The multiprocessor count of the current device, asked of the runtime once per device (a
// launcher sizes its grid by it on every call). Internal when the runtime fails.
absl::StatusOr<int32_t> DeviceMultiprocessorCount();

// Whether a launch on the current device can overlap the kernel ahead of it
// (LaunchKernelAfterPreceding in hip_port.h): an NVIDIA GPU of compute capability 9.0 or
// later, running code of this build compiled for such a target (kernels that wait:
// KernelsWaitForPrecedingGrids). Asked of the runtime once per device. Internal when the
// runtime fails.
absl::StatusOr<bool> DeviceOverlapsLaunches();

// Every array of a decode (or fixed-row extend) replay from the staged inputs of a padded
// batch of B rows, in one kernel launch (kernels/metadata_kernels.h, FusedMetadataParams).
// B = 0 launches no kernel and writes kv_indptr[0] = qo_indptr[0] = 0, as the host builders
// do (so do the tree mask's and a draft step's launchers below for their indptrs).
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
  bool overlap_preceding_kernel = true;  // see "Overlapping the kernel ahead" above
};
// The checks BuildDecodeMetadataOnDevice makes before it launches, alone: a caller that
// launches several kernels checks them all before it enqueues anything.
absl::Status CheckDecodeMetadataArgs(const DecodeMetadataDeviceArgs& args);
absl::Status BuildDecodeMetadataOnDevice(const DecodeMetadataDeviceArgs& args,
                                         kernels::DeviceViolation* violation, hipStream_t stream);

// Target-verify's FULL mask and mask_indptr from tree rows (the device twin of
// BuildMaskIndptr + BuildCustomMask with MaskLayout::kFull) for a padded batch of B rows.
struct TreeMaskDeviceArgs {
  DeviceSpan<const TokenLength> q_lens;   // [B]
  DeviceSpan<const TokenLength> kv_lens;  // [B]
  DeviceSpan<const uint8_t> tree;         // per request [q_len][q_len], back to back
  DeviceSpan<int64_t> mask_indptr;        // [B + 1]
  DeviceSpan<uint8_t> mask;               // capacity
  int64_t max_mask_bytes_per_row = 1;     // the grid's bound: max q_len * kv_len of a request
  bool overlap_preceding_kernel = true;   // see "Overlapping the kernel ahead" above
};
absl::Status CheckTreeMaskArgs(const TreeMaskDeviceArgs& args);  // BuildTreeMaskOnDevice's checks
absl::Status BuildTreeMaskOnDevice(const TreeMaskDeviceArgs& args,
                                   kernels::DeviceViolation* violation, hipStream_t stream);

// One draft-decode step on the device (kernels::DraftStepParams): BuildDraftDecodeStep's
// arrays for the real requests, and for the padded requests (rows kernels::kPaddedRow) their
// branches as a graph writer pads them (seq_lens tokens on the padding page, no query row).
// InvalidArgument: the shape or step, sizes that disagree, null pointers; OutOfRange: a batch
// beyond the grid.
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
  DeviceSpan<TokenSlot> kv_indices;           // capacity; entries past kv_indptr[B * topk] untouched
  bool overlap_preceding_kernel = true;       // see "Overlapping the kernel ahead" above
};
absl::Status CheckDraftStepArgs(const DraftStepDeviceArgs& args);  // BuildDraftStepOnDevice's checks
absl::Status BuildDraftStepOnDevice(const DraftStepDeviceArgs& args,
                                    kernels::DeviceViolation* violation, hipStream_t stream);

// PlanSplitKvInto on the device: the split-KV plan of the sequences of qo_indptr / kv_indptr
// (device arrays, e.g. the fused launch's) written into the fixed buffers, bit for bit the
// plan the host planner writes for the same indptrs, without a host round trip. The counts
// (CountSplitKvPlan) come from the host's lengths. InvalidArgument: options out of range,
// indptrs empty or of different sizes, unit_indptr shorter than num_units + 1, null
// pointers. On the device: a negative or decreasing indptr entry, q_len > kv_len and items
// past the work or reduce spans are recorded (kernels::SplitKvPlanParams).
struct SplitKvPlanDeviceArgs {
  DeviceSpan<const TokenOffset> qo_indptr;  // [B + 1]
  DeviceSpan<const TokenOffset> kv_indptr;  // [B + 1]
  SplitKvOptions options;
  DeviceSpan<SplitKvWorkItem> work;         // the work buffer's capacity
  DeviceSpan<int32_t> unit_indptr;          // >= num_units + 1
  DeviceSpan<SplitKvReduceItem> reduce;     // the reduce buffer's capacity
  bool overlap_preceding_kernel = true;     // see "Overlapping the kernel ahead" above
};
// BuildSplitKvPlanOnDevice's checks, alone.
absl::Status CheckSplitKvPlanArgs(const SplitKvPlanDeviceArgs& args);
absl::Status BuildSplitKvPlanOnDevice(const SplitKvPlanDeviceArgs& args,
                                      kernels::DeviceViolation* violation, hipStream_t stream);

enum class KvElementType { kBf16, kFp16 };

// The context-prefill gather on the device: row r < cu_k[bs] of k_out / v_out is pool row
// tok_idx[r] (ContextGather's arrays), each [num_kv_heads][head_dim] of `dtype`.
// InvalidArgument: head_dim outside [1, 256], num_kv_heads < 1, pools that are not whole
// rows or differ in size, outputs that are not whole rows, a pointer not aligned to the
// element size, null pointers; OutOfRange: more than INT32_MAX sequences.
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
  bool overlap_preceding_kernel = true;  // see "Overlapping the kernel ahead" above
};
absl::Status GatherKvOnDevice(const GatherKvDeviceArgs& args, kernels::DeviceViolation* violation,
                              hipStream_t stream);

}  // namespace attnmeta

#endif  // ATTNMETA_ATTENTION_KERNELS_METADATA_LAUNCHERS_H_
