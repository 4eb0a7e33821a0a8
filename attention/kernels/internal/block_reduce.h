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
  int64_t wave[2][kThreads / 32];
  int64_t total[2];
};

// The sums of every thread's `a` and `b`, returned to every thread (one pass of
// synchronization for both).
template <int kThreads>
__device__ inline void BlockSum2(int64_t& a, int64_t& b, BlockScratch<kThreads>& scratch) {
  for (int d = kWaveSize / 2; d > 0; d /= 2) {
    a += ATTNMETA_SHFL_DOWN(a, d);
    b += ATTNMETA_SHFL_DOWN(b, d);
  }
  const int lane = threadIdx.x % kWaveSize;
  const int wave = threadIdx.x / kWaveSize;
  if (lane == 0) {
    scratch.wave[0][wave] = a;
    scratch.wave[1][wave] = b;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    int64_t ta = 0, tb = 0;
    for (int w = 0; w < kThreads / kWaveSize; ++w) {
      ta += scratch.wave[0][w];
      tb += scratch.wave[1][w];
    }
    scratch.total[0] = ta;
    scratch.total[1] = tb;
  }
  __syncthreads();
  a = scratch.total[0];
  b = scratch.total[1];
  __syncthreads();  // scratch may be reused at once
}

// The sums of every thread's `a` and `b`, returned to every thread with a single barrier:
// each wave reduces by shuffles, and every thread adds up the waves' partials.
// REQUIRES: `scratch` is not used again in the kernel (no barrier after the partials are read).
template <int kThreads>
__device__ inline void BlockSum2Once(int64_t& a, int64_t& b, BlockScratch<kThreads>& scratch) {
  for (int d = kWaveSize / 2; d > 0; d /= 2) {
    a += ATTNMETA_SHFL_DOWN(a, d);
    b += ATTNMETA_SHFL_DOWN(b, d);
  }
  if (threadIdx.x % kWaveSize == 0) {
    scratch.wave[0][threadIdx.x / kWaveSize] = a;
    scratch.wave[1][threadIdx.x / kWaveSize] = b;
  }
  __syncthreads();
  a = 0;
  b = 0;
  for (int w = 0; w < kThreads / kWaveSize; ++w) {
    a += scratch.wave[0][w];
    b += scratch.wave[1][w];
  }
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
  if (lane == kWaveSize - 1) scratch.wave[0][wave] = value;
  __syncthreads();
  if (threadIdx.x == 0) {
    int64_t run = 0;
    for (int w = 0; w < kThreads / kWaveSize; ++w) {
      const int64_t v = scratch.wave[0][w];
      scratch.wave[0][w] = run;
      run += v;
    }
    scratch.total[0] = run;
  }
  __syncthreads();
  value += scratch.wave[0][wave];
  *block_total = scratch.total[0];
  __syncthreads();
  return value;
}

}  // namespace internal
}  // namespace kernels
}  // namespace attnmeta

#endif  // ATTNMETA_ATTENTION_KERNELS_INTERNAL_BLOCK_REDUCE_H_
