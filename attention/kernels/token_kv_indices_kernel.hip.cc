#include "attention/kernels/token_kv_indices_kernel.h"

namespace attnmeta {
namespace kernels {
namespace {

// Whole waves on every target (a multiple of 64), and the same in the host and device passes.
constexpr int kThreads = 256;

// Consecutive-thread elements each thread loads before it stores: several loads in flight
// per thread hide memory latency.
constexpr int kUnroll = 4;

// Grid: (batch_size, num_chunks). Block (i, c) copies tokens [c * chunk, (c + 1) * chunk)
// of request i, so long sequences are split over many blocks.
__global__ void __launch_bounds__(kThreads) TokenKvIndicesKernel(TokenKvIndicesParams p) {
  const int32_t i = blockIdx.x;
  const int32_t begin = p.kv_indptr[i];
  const int32_t len = p.kv_indptr[i + 1] - begin;
  const int32_t chunk_begin = blockIdx.y * kTokenKvIndicesChunk;
  if (chunk_begin >= len) return;
  const int32_t chunk_end = min(len, chunk_begin + kTokenKvIndicesChunk);
  const int64_t start = p.kv_start_idx != nullptr ? p.kv_start_idx[i] : 0;
  const int32_t* src = p.req_to_token + p.req_pool_indices[i] * p.req_to_token_stride + start;
  int32_t* dst = p.kv_indices + begin;
  for (int32_t t0 = chunk_begin + threadIdx.x; t0 < chunk_end; t0 += kThreads * kUnroll) {
    int32_t v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int32_t t = t0 + u * kThreads;
      if (t < chunk_end) v[u] = src[t];
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int32_t t = t0 + u * kThreads;
      if (t < chunk_end) dst[t] = v[u];
    }
  }
}

}  // namespace

hipError_t LaunchTokenKvIndicesKernel(const TokenKvIndicesParams& params, hipStream_t stream) {
  TokenKvIndicesKernel<<<dim3(params.batch_size, params.num_chunks), kThreads, 0, stream>>>(
      params);
  return hipGetLastError();
}

}  // namespace kernels
}  // namespace attnmeta
