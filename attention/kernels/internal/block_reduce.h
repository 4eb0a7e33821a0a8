// Block-wide sums and scans for the metadata kernels (device code only). Every thread of the
// block must call them (they synchronize); the block size is a multiple of the wave size and at
// most 1024.

#ifndef ATTNMETA_ATTENTION_KERNELS_INTERNAL_BLOCK_REDUCE_H_
#define ATTNMETA_ATTENTION_KERNELS_INTERNAL_BLOCK_REDUCE_H_

#include <cstdint>

#include "attention/kernels/hip_port.h"

namespace attnmeta {
namespace kernels {
namespace internal {

// Shared memory for kThreads / 32 wave partials: enough for waves of 32 and of 64.
template <int kThreads>
struct BlockScratch {
  int64_t wave[kThreads / 32];
  int64_t total;
};

// The sum of every thread's `value`, returned to every thread.
template <int kThreads>
__device__ inline int64_t BlockSum(int64_t value, BlockScratch<kThreads>& scratch) {
  for (int d = kWaveSize / 2; d > 0; d /= 2) value += ATTNMETA_SHFL_DOWN(value, d);
  const int lane = threadIdx.x % kWaveSize;
  const int wave = threadIdx.x / kWaveSize;
  if (lane == 0) scratch.wave[wave] = value;
  __syncthreads();
  if (threadIdx.x == 0) {
    int64_t total = 0;
    for (int w = 0; w < kThreads / kWaveSize; ++w) total += scratch.wave[w];
    scratch.total = total;
  }
  __syncthreads();
  const int64_t total = scratch.total;
  __syncthreads();  // scratch may be reused at once
  return total;
}

// The inclusive prefix sum of `value` over threads 0..threadIdx.x; *block_total receives the
// sum over the block.
template <int kThreads>
__device__ inline int64_t BlockInclusiveScan(int64_t value, BlockScratch<kThreads>& scratch,
                                             int64_t* block_total) {
  const int lane = threadIdx.x % kWaveSize;
  const int wave = threadIdx.x / kWaveSize;
  for (int d = 1; d < kWaveSize; d *= 2) {
    const int64_t up = ATTNMETA_SHFL_UP(value, d);
    if (lane >= d) value += up;
  }
  if (lane == kWaveSize - 1) scratch.wave[wave] = value;
  __syncthreads();
  if (threadIdx.x == 0) {
    int64_t run = 0;
    for (int w = 0; w < kThreads / kWaveSize; ++w) {
      const int64_t v = scratch.wave[w];
      scratch.wave[w] = run;
      run += v;
    }
    scratch.total = run;
  }
  __syncthreads();
  value += scratch.wave[wave];
  *block_total = scratch.total;
  __syncthreads();
  return value;
}

}  // namespace internal
}  // namespace kernels
}  // namespace attnmeta

#endif  // ATTNMETA_ATTENTION_KERNELS_INTERNAL_BLOCK_REDUCE_H_
