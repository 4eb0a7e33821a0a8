// BuildTokenKvIndicesOnDevice: token-level kv_indices from req_to_token, on the GPU.
//
// For each request i of the batch, the KV tokens t in [0, kv_len_i), kv_len_i =
// kv_indptr[i + 1] - kv_indptr[i]:
//   kv_indices[kv_indptr[i] + t] = req_to_token[req_pool_indices[i]][kv_start_idx[i] + t].
// Token-level whatever the page size: no page arithmetic is applied. Entries of kv_indices
// past kv_indptr[batch_size] keep their contents (a fixed graph buffer's tail).

#ifndef ATTNMETA_ATTENTION_KERNELS_TOKEN_KV_INDICES_H_
#define ATTNMETA_ATTENTION_KERNELS_TOKEN_KV_INDICES_H_

#include "absl/status/status.h"
#include "attention/kernels/device_span.h"
#include "attention/kernels/device_violation.h"
#include "attention/kernels/hip_port.h"
#include "attention/kernels/metadata_kernel_args.h"
#include "kvcache/units.h"

namespace attnmeta {

// Checks the shapes (TokenKvIndicesParamsFor, metadata_kernel_args.h, whose errors it
// returns), launches on `stream` and returns the launch error (Internal). Nothing is launched
// unless the checks pass.
// What the launcher cannot see (the device arrays' contents) the kernel bounds-checks: a row
// outside the table or a start outside its row (the sequence's entries written as the padding
// page's slots), a range past its row, an indptr past kv_indices or decreasing, a slot
// outside the pool are recorded in `violation` (may be null) and never read or written out of
// bounds. The padded row (-1) of a graph batch is not accepted here: it is a row outside the
// table.
absl::Status BuildTokenKvIndicesOnDevice(const TokenKvIndicesDeviceInputs& in,
                                         DeviceSpan<TokenSlot> kv_indices, hipStream_t stream,
                                         kernels::DeviceViolation* violation = nullptr);

}  // namespace attnmeta

#endif  // ATTNMETA_ATTENTION_KERNELS_TOKEN_KV_INDICES_H_
