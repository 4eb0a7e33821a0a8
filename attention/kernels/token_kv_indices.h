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
#include "kvcache/req_to_token_pool.h"
#include "kvcache/units.h"

namespace attnmeta {

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

// Checks the shapes, launches on `stream` and returns the launch error.
// InvalidArgument: sizes that disagree (kv_indptr not batch_size + 1, kv_start_idx neither
// empty nor batch_size, req_to_token not a whole number of rows, a null pointer with a
// nonzero size); OutOfRange: max_kv_len outside [0, max_context_len] or a grid too large;
// Internal: the launch failed. Nothing is launched unless the checks pass.
// What the launcher cannot see (the device arrays' contents) the kernel bounds-checks: a row
// outside the table, a range past its row, an indptr past kv_indices or decreasing, a slot
// outside the pool are recorded in `violation` (may be null) and never read or written out of
// bounds. The padded row (-1) of a graph batch is not accepted here: it is a row outside the
// table.
absl::Status BuildTokenKvIndicesOnDevice(const TokenKvIndicesDeviceInputs& in,
                                         DeviceSpan<TokenSlot> kv_indices, hipStream_t stream,
                                         kernels::DeviceViolation* violation = nullptr);

}  // namespace attnmeta

#endif  // ATTNMETA_ATTENTION_KERNELS_TOKEN_KV_INDICES_H_
