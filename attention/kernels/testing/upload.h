// Upload and Download: host vectors to and from DeviceBuffer in GPU tests, and Poison: outputs
// filled before a run so that what it leaves unwritten shows; a failed call is a test failure
// (gtest).

#ifndef ATTNMETA_ATTENTION_KERNELS_TESTING_UPLOAD_H_
#define ATTNMETA_ATTENTION_KERNELS_TESTING_UPLOAD_H_

#include <cstddef>
#include <utility>
#include <vector>

#include "attention/kernels/testing/device_buffer.h"
#include "gtest/gtest.h"

namespace attnmeta {
namespace testing {

template <typename T>
DeviceBuffer<T> Upload(const std::vector<T>& host) {
  auto b = DeviceBuffer<T>::FromHost(host);
  EXPECT_TRUE(b.ok()) << b.status();
  return *std::move(b);
}

// A failed copy (a kernel that faulted leaves every later runtime call failing) is a test
// failure and an empty vector, not an abort: the test's other checks still report.
template <typename T>
std::vector<T> Download(const DeviceBuffer<T>& b) {
  auto h = b.ToHost();
  EXPECT_TRUE(h.ok()) << h.status();
  return h.ok() ? *std::move(h) : std::vector<T>();
}

// Fills `bytes` bytes at `ptr` (device memory) with 0xFF: a NaN in bf16, fp16 and fp32.
inline void Poison(void* ptr, size_t bytes) {
  if (bytes > 0) {
    ASSERT_EQ(hipMemset(ptr, 0xff, bytes), hipSuccess);
  }
}

}  // namespace testing
}  // namespace attnmeta

#endif  // ATTNMETA_ATTENTION_KERNELS_TESTING_UPLOAD_H_
