// gtest fixtures of the GPU tests: GpuTest fails when no GPU is visible; ViolationWordGpuTest
// adds a device violation word for launches to record into.

#ifndef ATTNMETA_ATTENTION_KERNELS_TESTING_GPU_TEST_H_
#define ATTNMETA_ATTENTION_KERNELS_TESTING_GPU_TEST_H_

#include <memory>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "attention/kernels/device_violation_word.h"
#include "attention/kernels/testing/device_buffer.h"
#include "gtest/gtest.h"

namespace attnmeta {
namespace testing {

class GpuTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(RequireGpu().ok()) << RequireGpu(); }
};

class ViolationWordGpuTest : public GpuTest {
 protected:
  void SetUp() override {
    GpuTest::SetUp();
    if (HasFatalFailure()) return;
    auto w = DeviceViolationWord::Create();
    ASSERT_TRUE(w.ok()) << w.status();
    word_ = std::make_unique<DeviceViolationWord>(*std::move(w));
  }
  // The word holds an out-of-range violation whose message says `words`; then it is cleared
  // for the next launch.
  void ExpectViolation(const std::string& words) {
    const absl::Status s = word_->Check(nullptr);
    EXPECT_EQ(s.code(), absl::StatusCode::kOutOfRange) << s;
    EXPECT_NE(s.message().find(words), absl::string_view::npos) << s;
    EXPECT_TRUE(word_->Reset(nullptr).ok());
  }
  std::unique_ptr<DeviceViolationWord> word_;
};

}  // namespace testing
}  // namespace attnmeta

#endif  // ATTNMETA_ATTENTION_KERNELS_TESTING_GPU_TEST_H_
