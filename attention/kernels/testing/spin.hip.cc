#include "attention/kernels/testing/spin.h"

namespace attnmeta {
namespace testing {
namespace {

__global__ void SpinKernel(int64_t cycles) {
  const long long start = clock64();
  while (clock64() - start < cycles) {
  }
}

}  // namespace

hipError_t LaunchSpin(int64_t cycles, hipStream_t stream) {
  SpinKernel<<<1, 1, 0, stream>>>(cycles);
  return hipGetLastError();
}

}  // namespace testing
}  // namespace attnmeta
