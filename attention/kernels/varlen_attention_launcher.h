// VarlenAttention: unified attention over ragged query rows (qo_indptr) on the GPU: extend /
// prefill with a cached prefix, draft-extend and target-verify, causal with prefix or under a
// custom mask (FULL, QLEN_ONLY or bit-packed, custom_mask.h), GQA or MHA, bf16 or fp16, K/V read
// through token-level kv_indices or through the page table (any page size). What it computes,
// including the log-sum-exp output and the rule for a row that sees nothing, is in
// varlen_attention.h. The KV sources and dims are the decode launcher's
// (paged_decode_args.h): the same pools, read the same two ways.
//
// The launcher checks what the host can see (dims, sizes that agree, 16-byte alignment of the
// vector-loaded buffers, null pointers with nonzero sizes, max_q_len against the query rows, a mask
// layout against its arrays: varlen_attention_args.h, tested on the CPU, where every error is
// listed) and returns an error before launching anything; then launches on `stream` and returns
// Internal if the launch failed. What lives in device memory (qo_indptr, kv_indptr, lengths, slots,
// page ids, mask_indptr) is bounds-checked by the kernel: it never reads or writes outside a
// buffer, skips a position whose slot is outside the pool, and records the first violation in
// `violation` (DeviceViolationWord; may be null).

#ifndef ATTNMETA_ATTENTION_KERNELS_VARLEN_ATTENTION_LAUNCHER_H_
#define ATTNMETA_ATTENTION_KERNELS_VARLEN_ATTENTION_LAUNCHER_H_

#include <cstdint>

#include "absl/status/status.h"
#include "attention/kernels/device_violation.h"
#include "attention/kernels/hip_port.h"
#include "attention/kernels/varlen_attention_args.h"

namespace attnmeta {

// Errors, before anything is launched (nothing written): VarlenAttentionLaunchFor's
// (varlen_attention_args.h). Internal: the launch failed, or the runtime did not say whether
// launches overlap here. What lives in device memory is not an error here: the kernel records
// it in `violation` (may be null; varlen_attention.h lists the kinds).
absl::Status VarlenAttention(const VarlenAttentionArgs& args, kernels::DeviceViolation* violation,
                             hipStream_t stream);

}  // namespace attnmeta

#endif  // ATTNMETA_ATTENTION_KERNELS_VARLEN_ATTENTION_LAUNCHER_H_
