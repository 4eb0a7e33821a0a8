// Host launchers of the metadata kernels: the device twins of the host builders
// (attention/metadata/builders.h), the fused decode-metadata launch a graph replay runs, the
// target-verify mask and the paged-to-linear K/V gather.
//
// Each launcher checks what the host can see (sizes that agree, non-null pointers for non-empty
// spans, alignment, the grid's limits: metadata_kernel_args.h, tested on the CPU) and returns
// InvalidArgument / OutOfRange before launching anything; then launches on `stream` and returns
// Internal if the launch failed. What lives in device memory (rows, lengths, slots) is
// bounds-checked by the kernels: they never read or write outside a buffer and record the first
// violation in `violation` (DeviceViolationWord; may be null), which the caller checks after the
// stream.
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
#include "attention/kernels/metadata_kernel_args.h"
#include "kvcache/units.h"

namespace attnmeta {

// The device twin of BuildIndptr and BuildKvLastPageLen: indptr = [0, lens[0], ...] and, when
// last_page_len is not empty, the last page's length of each. Errors: IndptrParamsFor's.
absl::Status BuildIndptrOnDevice(DeviceSpan<const TokenLength> lens, DeviceSpan<TokenOffset> indptr,
                                 DeviceSpan<TokenLength> last_page_len, PageSize page_size,
                                 kernels::DeviceViolation* violation, hipStream_t stream,
                                 bool overlap_preceding_kernel = true);

// The device twin of BuildPageTable: rows [0, bs) of `page_table` ([>= bs][cols] row-major),
// the padding page past each row's pages. `pool_slots` bounds the slots read (0: unchecked).
// Errors: PageTableParamsFor's.
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
// do (so do the tree mask's and a draft step's launchers below for their indptrs). Errors:
// FusedMetadataParamsFor's (metadata_kernel_args.h, where each launcher's checks are: a
// caller that launches several kernels checks them all before it enqueues anything).
absl::Status BuildDecodeMetadataOnDevice(const DecodeMetadataDeviceArgs& args,
                                         kernels::DeviceViolation* violation, hipStream_t stream);

// Target-verify's FULL mask and mask_indptr from tree rows (the device twin of
// BuildMaskIndptr + BuildCustomMask with MaskLayout::kFull) for a padded batch of B rows.
// Errors: TreeMaskParamsFor's.
absl::Status BuildTreeMaskOnDevice(const TreeMaskDeviceArgs& args,
                                   kernels::DeviceViolation* violation, hipStream_t stream);

// One draft-decode step on the device (kernels::DraftStepParams): BuildDraftDecodeStep's
// arrays for the real requests, and for the padded requests (rows kernels::kPaddedRow) their
// branches as a graph writer pads them (seq_lens tokens on the padding page, one query row).
// Errors: DraftStepParamsFor's.
absl::Status BuildDraftStepOnDevice(const DraftStepDeviceArgs& args,
                                    kernels::DeviceViolation* violation, hipStream_t stream);

// PlanSplitKvInto on the device: the split-KV plan of the sequences of qo_indptr / kv_indptr
// (device arrays, e.g. the fused launch's) written into the fixed buffers, bit for bit the
// plan the host planner writes for the same indptrs, without a host round trip. The counts
// (CountSplitKvPlan) come from the host's lengths. Errors: SplitKvPlanParamsFor's. On the
// device: a negative or decreasing indptr entry, q_len > kv_len and items past the work or
// reduce spans are recorded (kernels::SplitKvPlanParams).
absl::Status BuildSplitKvPlanOnDevice(const SplitKvPlanDeviceArgs& args,
                                      kernels::DeviceViolation* violation, hipStream_t stream);

// The context-prefill gather on the device: row r < cu_k[bs] of k_out / v_out is pool row
// tok_idx[r] (ContextGather's arrays). Errors: GatherKvParamsFor's.
absl::Status GatherKvOnDevice(const GatherKvDeviceArgs& args, kernels::DeviceViolation* violation,
                              hipStream_t stream);

}  // namespace attnmeta

#endif  // ATTNMETA_ATTENTION_KERNELS_METADATA_LAUNCHERS_H_
