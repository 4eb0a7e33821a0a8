#include "attention/kernels/testing/stream_read.h"

namespace attnmeta {
namespace testing {
namespace {

constexpr int kThreads = 256;
constexpr int kUnroll = 8;

__global__ void __launch_bounds__(kThreads) StreamReadKernel(const uint4* data, int64_t words,
                                                             uint32_t* sink) {
  const int64_t stride = int64_t{gridDim.x} * kThreads;
  int64_t i = int64_t{blockIdx.x} * kThreads + threadIdx.x;
  uint32_t acc = 0;
  for (; i + (kUnroll - 1) * stride < words; i += kUnroll * stride) {
    uint4 v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) v[u] = __ldg(data + i + u * stride);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
  }
  for (; i < words; i += stride) {
    const uint4 v = __ldg(data + i);
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x9e3779b9u) *sink = acc;
}

}  // namespace

hipError_t LaunchStreamRead(const void* data, int64_t bytes, uint32_t* sink, int32_t blocks,
                            hipStream_t stream) {
  StreamReadKernel<<<blocks, kThreads, 0, stream>>>(static_cast<const uint4*>(data), bytes / 16,
                                                    sink);
  return hipGetLastError();
}

}  // namespace testing
}  // namespace attnmeta
