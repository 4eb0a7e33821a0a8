// VarlenAttention: unified attention over ragged query rows (qo_indptr) on the GPU: extend /
// prefill with a cached prefix, draft-extend and target-verify, causal with prefix or under a
// custom mask (FULL, QLEN_ONLY or bit-packed, custom_mask.h), GQA or MHA, bf16 or fp16, K/V read
// through token-level kv_indices or through the page table (any page size). What it computes,
// including the log-sum-exp output and the rule for a row that sees nothing, is in
// varlen_attention.h. The KV sources and dims are the decode launcher's
// (paged_decode_launcher.h): the same pools, read the same two ways.
//
// The launcher checks what the host can see (dims, sizes that agree, 16-byte alignment of the
// vector-loaded buffers, null pointers with nonzero sizes, max_q_len against the query rows, a
// mask layout against its arrays) and returns an error before launching anything; then
// launches on `stream` and returns Internal if the launch failed. What lives in device memory
// (qo_indptr, kv_indptr, lengths, slots, page ids, mask_indptr) is bounds-checked by the
// kernel: it never reads or writes outside a buffer, skips a position whose slot is outside the
// pool, and records the first violation in `violation` (DeviceViolationWord; may be null).

#ifndef ATTNMETA_ATTENTION_KERNELS_VARLEN_ATTENTION_LAUNCHER_H_
#define ATTNMETA_ATTENTION_KERNELS_VARLEN_ATTENTION_LAUNCHER_H_

#include <cstdint>

#include "absl/status/status.h"
#include "attention/kernels/device_span.h"
#include "attention/kernels/device_violation.h"
#include "attention/kernels/hip_port.h"
#include "attention/kernels/paged_decode_launcher.h"
#include "attention/metadata/custom_mask.h"
#include "kvcache/units.h"

namespace attnmeta {

// The custom mask of a batch (custom_mask.h's CustomMaskView, in device memory). Layout kNone:
// causal with prefix, and both arrays empty.
struct VarlenMask {
  MaskLayout layout = MaskLayout::kNone;
  // [>= mask_indptr[bs]] bytes: the blocks of the layout, 0/1 bytes or bit-packed words.
  DeviceSpan<const uint8_t> mask;
  // [bs + 1] byte offsets, mask_indptr[0] == 0, step i == MaskBlockBytes(layout, q_len_i,
  // kv_len_i, MaskWordBytes(max_q_len)); 8-byte aligned.
  DeviceSpan<const int64_t> mask_indptr;
};

struct VarlenAttentionArgs {
  DecodeAttentionDims dims;
  // [q_rows][num_q_heads][head_dim] of dtype, 16-byte aligned; q_rows <= INT32_MAX.
  DeviceSpan<const uint8_t> q;
  // [bs + 1] (bs: the KV source's batch), qo_indptr[0] == 0, non-decreasing,
  // qo_indptr[bs] <= q_rows; sequence i's rows are its last q_len_i positions.
  DeviceSpan<const TokenOffset> qo_indptr;
  // The largest q_len of the batch (ForwardMetadataView::max_q_len), at most q_rows: the grid
  // covers this many rows per sequence. The kernel still bounds itself by the device
  // qo_indptr (a longer sequence is recorded, not read past).
  TokenCount max_q_len;
  DeviceSpan<const uint8_t> k_pool;  // [pool_slots][num_kv_heads][head_dim] of dtype, aligned
  DeviceSpan<const uint8_t> v_pool;  // like k_pool, the same size; pool_slots <= 2^31
  DecodeKv kv;
  VarlenMask mask;
  DeviceSpan<uint8_t> out;  // [q_rows][num_q_heads][head_dim] of dtype, 16-byte aligned
  DeviceSpan<float> lse;    // [q_rows][num_q_heads]
};

// Errors, before anything is launched: InvalidArgument for dims (head counts that do not
// divide, a head dim other than 64/128/256, an unknown element type, a scale that is not
// finite and positive), a qo_indptr that is not the KV source's bs + 1 entries, q / out / lse
// sizes that disagree, K/V pools that are not the same whole rows, a max_q_len that is negative
// or past q's rows, a pointer not 16-byte aligned (q, k_pool, v_pool, out) or mask_indptr not
// 8-byte aligned, a null pointer with a nonzero size, a mask layout without its mask_indptr,
// mask arrays without a layout, a bit-packed mask with max_q_len > kMaxBitPackedRows;
// OutOfRange for q rows, a pool, a table or a grid beyond the kernel's int32 arithmetic.
// Internal: the launch failed.
absl::Status VarlenAttention(const VarlenAttentionArgs& args, kernels::DeviceViolation* violation,
                             hipStream_t stream);

}  // namespace attnmeta

#endif  // ATTNMETA_ATTENTION_KERNELS_VARLEN_ATTENTION_LAUNCHER_H_
