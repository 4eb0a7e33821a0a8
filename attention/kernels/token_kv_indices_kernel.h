// The device side of BuildTokenKvIndicesOnDevice, shared by the host launcher and the
// device source. Plain types only: no Abseil, no glog.

#ifndef ATTNMETA_ATTENTION_KERNELS_TOKEN_KV_INDICES_KERNEL_H_
#define ATTNMETA_ATTENTION_KERNELS_TOKEN_KV_INDICES_KERNEL_H_

#include <cstdint>

#include "attention/kernels/hip_port.h"

namespace attnmeta {
namespace kernels {

// Tokens one block copies for one request.
inline constexpr int32_t kTokenKvIndicesChunk = 1024;

struct TokenKvIndicesParams {
  const int32_t* req_to_token;      // [max_reqs * req_to_token_stride], row-major
  int64_t req_to_token_stride;      // max_context_len, > 0
  const int32_t* req_pool_indices;  // [batch_size], each in [0, max_reqs)
  const int32_t* kv_indptr;         // [batch_size + 1], kv_indptr[0] == 0, non-decreasing
  const int32_t* kv_start_idx;      // [batch_size], or null for all zeros
  int32_t* kv_indices;              // [>= kv_indptr[batch_size]]; entries past it untouched
  int32_t batch_size;               // >= 1
  int32_t num_chunks;               // ceil(max_kv_len / kTokenKvIndicesChunk), >= 1
};

// kv_indices[kv_indptr[i] + t] = req_to_token[req_pool_indices[i]][kv_start_idx[i] + t]
// for t in [0, kv_indptr[i + 1] - kv_indptr[i]). Returns the launch error.
hipError_t LaunchTokenKvIndicesKernel(const TokenKvIndicesParams& params, hipStream_t stream);

}  // namespace kernels
}  // namespace attnmeta

#endif  // ATTNMETA_ATTENTION_KERNELS_TOKEN_KV_INDICES_KERNEL_H_
