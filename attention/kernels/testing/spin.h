// A kernel that keeps the stream busy for a while, so that a test's host runs ahead of the GPU.

#ifndef ATTNMETA_ATTENTION_KERNELS_TESTING_SPIN_H_
#define ATTNMETA_ATTENTION_KERNELS_TESTING_SPIN_H_

#include <cstdint>

#include "attention/kernels/hip_port.h"

namespace attnmeta {
namespace testing {

// One thread spins for at least `cycles` clock cycles of its multiprocessor.
hipError_t LaunchSpin(int64_t cycles, hipStream_t stream);

}  // namespace testing
}  // namespace attnmeta

#endif  // ATTNMETA_ATTENTION_KERNELS_TESTING_SPIN_H_
