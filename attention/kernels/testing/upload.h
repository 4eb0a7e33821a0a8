// Upload and Download: host vectors to and from DeviceBuffer in GPU tests, a failed copy being
// a test failure (gtest).

#ifndef ATTNMETA_ATTENTION_KERNELS_TESTING_UPLOAD_H_
#define ATTNMETA_ATTENTION_KERNELS_TESTING_UPLOAD_H_

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

template <typename T>
std::vector<T> Download(const DeviceBuffer<T>& b) {
  auto h = b.ToHost();
  EXPECT_TRUE(h.ok()) << h.status();
  return *std::move(h);
}

}  // namespace testing
}  // namespace attnmeta

#endif  // ATTNMETA_ATTENTION_KERNELS_TESTING_UPLOAD_H_
