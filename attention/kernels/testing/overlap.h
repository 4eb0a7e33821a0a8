// What the GPU tests of launches that overlap the kernel ahead (LaunchKernelAfterPreceding in
// hip_port.h) share: whether launches overlap here, the proof that an overlapping launch does
// start before the kernel ahead ends, and the copies a kernel ahead makes (testing/spin.h).

#ifndef ATTNMETA_ATTENTION_KERNELS_TESTING_OVERLAP_H_
#define ATTNMETA_ATTENTION_KERNELS_TESTING_OVERLAP_H_

#include <cstdint>
#include <cstdlib>
#include <vector>

#include "absl/status/statusor.h"
#include "attention/kernels/hip_port.h"
#include "attention/kernels/metadata_launchers.h"
#include "attention/kernels/testing/device_buffer.h"
#include "attention/kernels/testing/spin.h"
#include "attention/kernels/testing/upload.h"
#include "gtest/gtest.h"

namespace attnmeta {
namespace testing {

// About half a millisecond of spinning for a kernel ahead: long enough that a launch
// overlapping it runs its start while that kernel has yet to write.
inline constexpr int64_t kAheadSpinCycles = 1000000;

inline constexpr char kNoOverlapHere[] =
    "no overlapping launches here (AMD, a GPU before compute capability 9.0, a build for "
    "targets before 9.0, or under compute-sanitizer)";

// Whether this binary's device code that runs here waits for the kernel ahead (a build for
// targets before 9.0, run on a newer GPU through the driver's JIT, does not), as a kernel
// compiled with it reports.
inline bool CompiledKernelsWait() {
  DeviceBuffer<int32_t> waits = Upload(std::vector<int32_t>{-1});
  EXPECT_EQ(LaunchCompiledWaitProbe(waits.data(), nullptr), hipSuccess);
  EXPECT_EQ(hipDeviceSynchronize(), hipSuccess);
  const std::vector<int32_t> w = Download(waits);
  EXPECT_TRUE(w[0] == 0 || w[0] == 1) << w[0];
  return w[0] == 1;
}

// Whether launches overlap here: a device that can (DeviceOverlapsLaunches), and not under
// compute-sanitizer, which runs launches one after the other (seen with memcheck on the H200):
// `run_all.sh --memcheck` sets ATTNMETA_GPU_SANITIZER, and the tests that need an overlap skip
// under it. DeviceOverlapsLaunches is held to what the device and the compiled code say: yes
// on a GPU of compute capability 9.0 or later running code built to wait (the default
// cuda_archs; a no there is a broken check that would make the overlap tests skip), and no
// wherever the code does not wait (an overlapping launch would then read what the kernel
// ahead has yet to write).
inline bool LaunchesOverlap() {
  absl::StatusOr<bool> can = DeviceOverlapsLaunches();
  EXPECT_TRUE(can.ok()) << can.status();
  int major = 0;
  EXPECT_EQ(hipDeviceGetAttribute(&major, hipDeviceAttributeComputeCapabilityMajor, 0),
            hipSuccess);
  const bool waits = CompiledKernelsWait();
  if (kOverlappingLaunches && major >= 9 && waits) {
    EXPECT_TRUE(can.ok() && *can) << "compute capability " << major
                                  << ", kernels built to wait, but DeviceOverlapsLaunches says no";
  }
  if (!waits) {
    EXPECT_FALSE(can.ok() && *can)
        << "the kernels do not wait for the kernel ahead, but DeviceOverlapsLaunches says yes";
  }
  return can.ok() && *can && std::getenv("ATTNMETA_GPU_SANITIZER") == nullptr;
}

// A copy of all of `src` over `dst`, as a kernel ahead makes it at its end.
template <typename T>
SpinCopy CopyOf(const DeviceBuffer<T>& dst, const DeviceBuffer<T>& src) {
  return SpinCopy{dst.data(), src.data(), static_cast<int64_t>(src.size() * sizeof(T))};
}

// Up to kMaxSpinCopies copies, in order.
inline SpinCopies CopiesOf(std::initializer_list<SpinCopy> copies) {
  SpinCopies c;
  EXPECT_LE(copies.size(), static_cast<size_t>(kMaxSpinCopies));
  for (const SpinCopy& copy : copies) {
    if (c.count == kMaxSpinCopies) break;
    c.copy[c.count++] = copy;
  }
  return c;
}

// An overlapping probe starts before the kernel ahead on `stream` ends: it reads the flag that
// kernel sets at its end before waiting for it. Both kernels run once first: a kernel is loaded
// at its first launch (lazy loading), which waits for the kernels running.
inline void ExpectAnOverlappingProbeStartsFirst(hipStream_t stream) {
  DeviceBuffer<int32_t> flag = Upload(std::vector<int32_t>{0});
  DeviceBuffer<int32_t> one = Upload(std::vector<int32_t>{1});
  DeviceBuffer<int32_t> seen = Upload(std::vector<int32_t>{-1});
  ASSERT_EQ(LaunchSpinThenCopy(0, SpinCopies{}, stream), hipSuccess);
  ASSERT_EQ(LaunchOverlapProbe(flag.data(), seen.data(), stream), hipSuccess);
  ASSERT_EQ(hipStreamSynchronize(stream), hipSuccess);
  ASSERT_EQ(Download(seen), std::vector<int32_t>{0});
  ASSERT_EQ(hipMemset(seen.data(), 0xff, sizeof(int32_t)), hipSuccess);
  ASSERT_EQ(LaunchSpinThenCopy(kAheadSpinCycles, CopiesOf({CopyOf(flag, one)}), stream),
            hipSuccess);
  ASSERT_EQ(LaunchOverlapProbe(flag.data(), seen.data(), stream), hipSuccess);
  ASSERT_EQ(hipStreamSynchronize(stream), hipSuccess);
  EXPECT_EQ(Download(seen), std::vector<int32_t>{0}) << "the probe saw the flag set: no overlap";
  EXPECT_EQ(Download(flag), std::vector<int32_t>{1});
}

}  // namespace testing
}  // namespace attnmeta

#endif  // ATTNMETA_ATTENTION_KERNELS_TESTING_OVERLAP_H_
