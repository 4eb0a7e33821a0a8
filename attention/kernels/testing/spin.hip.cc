#include "attention/kernels/testing/spin.h"

namespace attnmeta {
namespace testing {
namespace {

constexpr int kCopyThreads = 256;

__device__ void SpinFor(int64_t cycles) {
  const long long start = clock64();
  while (clock64() - start < cycles) {
  }
}

__global__ void SpinKernel(int64_t cycles) { SpinFor(cycles); }

__global__ void __launch_bounds__(kCopyThreads) SpinThenCopyKernel(int64_t cycles, SpinCopies copies) {
  AllowDependentGridLaunch();
  if (threadIdx.x == 0) SpinFor(cycles);
  __syncthreads();
  for (int32_t c = 0; c < copies.count; ++c) {
    const SpinCopy& k = copies.copy[c];
    const bool words = (reinterpret_cast<uintptr_t>(k.dst) | reinterpret_cast<uintptr_t>(k.src) |
                        static_cast<uintptr_t>(k.bytes)) % 16 == 0;
    if (words) {  // a K/V pool of a few MB in 16-byte words, not bytes
      for (int64_t i = threadIdx.x; i < k.bytes / 16; i += kCopyThreads) {
        static_cast<uint4*>(k.dst)[i] = static_cast<const uint4*>(k.src)[i];
      }
    } else {
      for (int64_t i = threadIdx.x; i < k.bytes; i += kCopyThreads) {
        static_cast<uint8_t*>(k.dst)[i] = static_cast<const uint8_t*>(k.src)[i];
      }
    }
    __syncthreads();
  }
}

__global__ void OverlapProbeKernel(const int32_t* flag, int32_t* seen) {
  const int32_t before = *static_cast<const volatile int32_t*>(flag);
  WaitForPrecedingGrid();
  *seen = before;
}

__global__ void CompiledWaitProbeKernel(int32_t* waits) {
  *waits = CompiledToWaitForPrecedingGrid() ? 1 : 0;
}

}  // namespace

hipError_t LaunchSpin(int64_t cycles, hipStream_t stream) {
  SpinKernel<<<1, 1, 0, stream>>>(cycles);
  return hipGetLastError();
}

hipError_t LaunchSpinThenCopy(int64_t cycles, const SpinCopies& copies, hipStream_t stream) {
  if (copies.count < 0 || copies.count > kMaxSpinCopies) return hipErrorInvalidValue;
  SpinThenCopyKernel<<<1, kCopyThreads, 0, stream>>>(cycles, copies);
  return hipGetLastError();
}

hipError_t LaunchOverlapProbe(const int32_t* flag, int32_t* seen, hipStream_t stream) {
  return LaunchKernelAfterPreceding(true, OverlapProbeKernel, dim3(1), dim3(1), 0, stream, flag,
                                    seen);
}

hipError_t LaunchCompiledWaitProbe(int32_t* waits, hipStream_t stream) {
  CompiledWaitProbeKernel<<<1, 1, 0, stream>>>(waits);
  return hipGetLastError();
}

}  // namespace testing
}  // namespace attnmeta
