// Kernels that keep the stream busy for a while: so that a test's host runs ahead of the GPU,
// and so that a launch overlapping the kernel ahead of it (LaunchKernelAfterPreceding in
// hip_port.h) starts while that kernel has yet to write.

#ifndef ATTNMETA_ATTENTION_KERNELS_TESTING_SPIN_H_
#define ATTNMETA_ATTENTION_KERNELS_TESTING_SPIN_H_

#include <cstdint>

#include "attention/kernels/hip_port.h"

namespace attnmeta {
namespace testing {

// One thread spins for at least `cycles` clock cycles of its multiprocessor.
hipError_t LaunchSpin(int64_t cycles, hipStream_t stream);

// Byte copies a kernel makes at its end.
struct SpinCopy {
  void* dst = nullptr;
  const void* src = nullptr;
  int64_t bytes = 0;
};
inline constexpr int kMaxSpinCopies = 4;
struct SpinCopies {
  SpinCopy copy[kMaxSpinCopies];
  int32_t count = 0;  // <= kMaxSpinCopies
};

// One block that lets the kernel after it start at once (AllowDependentGridLaunch), spins for
// at least `cycles`, then makes `copies` in order.
hipError_t LaunchSpinThenCopy(int64_t cycles, const SpinCopies& copies, hipStream_t stream);

// Launched to overlap the kernel ahead of it: one thread reads *flag before it waits for that
// kernel (WaitForPrecedingGrid) and stores the value it read in *seen after. When the kernel
// ahead sets *flag only at its end, *seen keeps its old value exactly when this launch started
// before that kernel ended.
hipError_t LaunchOverlapProbe(const int32_t* flag, int32_t* seen, hipStream_t stream);

// One thread stores in *waits whether the device code of this binary that runs here has
// WaitForPrecedingGrid's instruction (CompiledToWaitForPrecedingGrid): 1 or 0.
hipError_t LaunchCompiledWaitProbe(int32_t* waits, hipStream_t stream);

}  // namespace testing
}  // namespace attnmeta

#endif  // ATTNMETA_ATTENTION_KERNELS_TESTING_SPIN_H_
