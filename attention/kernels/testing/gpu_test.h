// gtest fixtures of the GPU tests: GpuTest fails when no GPU is visible; ViolationWordGpuTest
// adds a device violation word for launches to record into. UnderGpuSanitizer: whether the
// test runs under compute-sanitizer.

#ifndef ATTNMETA_ATTENTION_KERNELS_TESTING_GPU_TEST_H_
#define ATTNMETA_ATTENTION_KERNELS_TESTING_GPU_TEST_H_

#include <cstdlib>
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

// `run_all.sh --memcheck` sets ATTNMETA_GPU_SANITIZER. Tests skip under it what the sanitizer
// cannot judge: launches meant to overlap (it runs them one after the other), runtime calls
// meant to fail (it reports each as an error).
inline bool UnderGpuSanitizer() { return std::getenv("ATTNMETA_GPU_SANITIZER") != nullptr; }

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
