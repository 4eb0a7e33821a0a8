// PagedDecodeAttention: decode attention (one query row per sequence) over the paged KV pool
// on the GPU, GQA, bf16 or fp16, reading each token's K/V row through token-level kv_indices or
// through the page table, optionally split over the KV of long sequences by a SplitKvPlan
// (flash-decoding: partial results merged by log-sum-exp). What it computes, including the
// log-sum-exp output and the empty-sequence rule, is in paged_decode_attention.h.
//
// The launcher checks what the host can see (dims, sizes that agree, 16-byte alignment of the
// vector-loaded buffers, null pointers with nonzero sizes, the plan against the batch and the KV
// layout, or the counts of a plan held only on the device, the partial buffers against the
// plan: paged_decode_args.h, tested on the CPU) and returns an error before launching anything;
// then launches on `stream` (the
// attention kernel, then, when the plan splits a sequence and no merge counters are given, the
// merge kernel) and returns Internal if a launch failed. What lives in device memory (indptr,
// lengths, slots, page ids, the device copy of the plan) is bounds-checked by the kernels: they
// never read or write outside a buffer, skip a token whose slot is outside the pool, and record
// the first violation in `violation` (DeviceViolationWord; may be null). After a graph replay
// (GraphState on the GPU), the replay's device metadata and split-KV plan are read as they
// are: tests/forward_step_gpu_test.cc.

#ifndef ATTNMETA_ATTENTION_KERNELS_PAGED_DECODE_LAUNCHER_H_
#define ATTNMETA_ATTENTION_KERNELS_PAGED_DECODE_LAUNCHER_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "attention/kernels/decode_split_planner.h"
#include "attention/kernels/device_violation.h"
#include "attention/kernels/hip_port.h"
#include "attention/kernels/paged_decode_args.h"

namespace attnmeta {

// Errors, before anything is launched (nothing written): PagedDecodeLaunchFor's
// (paged_decode_args.h). Internal: a launch failed, or the runtime did not say whether
// launches overlap here.
absl::Status PagedDecodeAttention(const PagedDecodeArgs& args, kernels::DeviceViolation* violation,
                                  hipStream_t stream);

// PlanDecodeSplitKv's options for the current device and these dims: its multiprocessors, the
// decode kernel's blocks that fit on one of them (the occupancy the runtime reports for the
// kernel of these dims and variant), DecodeBlocksPerWorkItem, and the default min_chunk. A plan
// made with them fills at most one wave of the launch. Errors: DecodeBlocksPerWorkItem's;
// Internal when the runtime cannot tell, FailedPrecondition when no block fits.
absl::StatusOr<DecodeSplitOptions> DecodeSplitOptionsForDevice(const DecodeAttentionDims& dims,
                                                               int32_t variant);

}  // namespace attnmeta

#endif  // ATTNMETA_ATTENTION_KERNELS_PAGED_DECODE_LAUNCHER_H_
