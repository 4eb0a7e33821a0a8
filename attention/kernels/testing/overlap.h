// What the GPU tests of launches that overlap the kernel ahead (LaunchKernelAfterPreceding in
// hip_port.h) share: whether launches overlap here, the proof that an overlapping launch does
// start before the kernel ahead ends, the copies a kernel ahead makes (testing/spin.h), and
// the check that a launch waits for a kernel ahead that writes its inputs late.

#ifndef ATTNMETA_ATTENTION_KERNELS_TESTING_OVERLAP_H_
#define ATTNMETA_ATTENTION_KERNELS_TESTING_OVERLAP_H_

#include <cstdint>
#include <functional>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "attention/kernels/hip_port.h"
#include "attention/kernels/metadata_launchers.h"
#include "attention/kernels/testing/device_buffer.h"
#include "attention/kernels/testing/gpu_test.h"
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
// compute-sanitizer, which runs launches one after the other (seen with memcheck on the H200;
// UnderGpuSanitizer), and the tests that need an overlap skip under it. DeviceOverlapsLaunches
// is held to what the device and the compiled code say: yes on a GPU of compute capability 9.0
// or later running code built to wait (the default cuda_archs; a no there is a broken check
// that would make the overlap tests skip), and no wherever the code does not wait (an
// overlapping launch would then read what the kernel ahead has yet to write).
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
  return can.ok() && *can && !UnderGpuSanitizer();
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

// Runs a captured graph once on `stream` and waits for it, then destroys the graph.
inline void LaunchGraphOnce(hipGraph_t graph, hipStream_t stream) {
  hipGraphExec_t exec = nullptr;
  ASSERT_EQ(hipGraphInstantiate(&exec, graph, nullptr, nullptr, 0), hipSuccess);
  EXPECT_EQ(hipGraphLaunch(exec, stream), hipSuccess);
  EXPECT_EQ(hipStreamSynchronize(stream), hipSuccess);
  EXPECT_EQ(hipGraphExecDestroy(exec), hipSuccess);
  EXPECT_EQ(hipGraphDestroy(graph), hipSuccess);
}

// A device buffer's bytes, for ExpectTheLaunchWaitsForItsInputs.
struct DeviceBytes {
  void* data;
  size_t size;
};
template <typename T>
inline DeviceBytes BytesOf(const DeviceBuffer<T>& b) {
  return DeviceBytes{b.data(), b.size() * sizeof(T)};
}
inline std::vector<uint8_t> ReadBytes(DeviceBytes b) {
  std::vector<uint8_t> host(b.size);
  EXPECT_EQ(hipMemcpy(host.data(), b.data, b.size, hipMemcpyDeviceToHost), hipSuccess);
  return host;
}

// `launch(overlap, stream)` makes `launches` kernel launches that read `inputs` (at most
// testing::kMaxSpinCopies buffers) and write `outputs`. A plain launch on the inputs gives the
// reference outputs. Then the launch runs after a kernel that spins for about half a
// millisecond and only then writes the inputs (zero until then): overlapping and plain, on the
// stream and captured in a graph (which holds `launches` programmatic edges when the launch
// overlaps where DeviceOverlapsLaunches says so, none when it is plain), outputs poisoned
// first. They must equal the reference. Where launches cannot overlap, or under
// compute-sanitizer (which runs launches one after another), this compares plain launches.
// `violations()` returns what the launches recorded (and clears it): it must be OK after each.
inline void ExpectTheLaunchWaitsForItsInputs(
    std::vector<DeviceBytes> inputs, std::vector<DeviceBytes> outputs, int64_t launches,
    const std::function<absl::Status(bool, hipStream_t)>& launch,
    const std::function<absl::Status()>& violations) {
  ASSERT_LE(inputs.size(), static_cast<size_t>(kMaxSpinCopies));
  hipStream_t stream = nullptr;
  ASSERT_EQ(hipStreamCreate(&stream), hipSuccess);
  const auto poison = [&] {
    for (const DeviceBytes& o : outputs) ASSERT_EQ(hipMemset(o.data, 0xa5, o.size), hipSuccess);
  };
  poison();
  ASSERT_TRUE(launch(false, stream).ok());
  ASSERT_EQ(hipStreamSynchronize(stream), hipSuccess);
  ASSERT_TRUE(violations().ok()) << violations();
  std::vector<std::vector<uint8_t>> want;
  for (const DeviceBytes& o : outputs) want.push_back(ReadBytes(o));
  std::vector<DeviceBuffer<uint8_t>> real;
  SpinCopies copies;
  for (const DeviceBytes& in : inputs) {
    real.push_back(Upload(ReadBytes(in)));
    copies.copy[copies.count++] =
        SpinCopy{in.data, real.back().data(), static_cast<int64_t>(in.size)};
  }
  const absl::StatusOr<bool> can = DeviceOverlapsLaunches();
  ASSERT_TRUE(can.ok()) << can.status();
  for (bool overlap : {true, false}) {
    for (bool captured : {false, true}) {
      SCOPED_TRACE(::testing::Message() << (overlap ? "overlapping" : "plain")
                                        << (captured ? ", captured" : ", on the stream"));
      for (const DeviceBytes& in : inputs) ASSERT_EQ(hipMemset(in.data, 0, in.size), hipSuccess);
      poison();
      if (captured) {
        ASSERT_EQ(hipStreamBeginCapture(stream, hipStreamCaptureModeThreadLocal), hipSuccess);
      }
      const hipError_t spun = LaunchSpinThenCopy(kAheadSpinCycles, copies, stream);
      const absl::Status launched = launch(overlap, stream);
      if (captured) {
        hipGraph_t graph = nullptr;
        ASSERT_EQ(hipStreamEndCapture(stream, &graph), hipSuccess);
        int64_t programmatic = -1;
        EXPECT_EQ(CountProgrammaticGraphEdges(graph, &programmatic), hipSuccess);
        EXPECT_EQ(programmatic, overlap && *can ? launches : 0);
        LaunchGraphOnce(graph, stream);
      }
      ASSERT_EQ(spun, hipSuccess);
      ASSERT_TRUE(launched.ok()) << launched;
      ASSERT_EQ(hipStreamSynchronize(stream), hipSuccess);
      for (size_t i = 0; i < outputs.size(); ++i) {
        EXPECT_EQ(ReadBytes(outputs[i]), want[i]) << "output " << i;
      }
      EXPECT_TRUE(violations().ok()) << violations();
    }
  }
  EXPECT_EQ(hipStreamDestroy(stream), hipSuccess);
}

}  // namespace testing
}  // namespace attnmeta

#endif  // ATTNMETA_ATTENTION_KERNELS_TESTING_OVERLAP_H_
