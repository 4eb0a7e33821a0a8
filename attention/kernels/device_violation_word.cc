#include "attention/kernels/device_violation_word.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "attention/kernels/device_violation_message.h"
#include "attention/kernels/internal/device_queries.h"

namespace attnmeta {
using internal::RuntimeStatus;

absl::StatusOr<DeviceViolationWord> DeviceViolationWord::Create() {
  kernels::DeviceViolation* word = nullptr;
  if (absl::Status s = RuntimeStatus(hipMalloc(&word, sizeof(kernels::DeviceViolation)),
                               "violation word: hipMalloc");
      !s.ok()) {
    return s;
  }
  DeviceViolationWord w(word);
  if (absl::Status s = RuntimeStatus(hipMemset(word, 0, sizeof(kernels::DeviceViolation)),
                               "violation word: hipMemset");
      !s.ok()) {
    return s;
  }
  return w;
}

DeviceViolationWord::DeviceViolationWord(DeviceViolationWord&& o) noexcept
    : word_(std::exchange(o.word_, nullptr)) {}

DeviceViolationWord& DeviceViolationWord::operator=(DeviceViolationWord&& o) noexcept {
  std::swap(word_, o.word_);
  return *this;
}

DeviceViolationWord::~DeviceViolationWord() {
  if (word_ != nullptr) (void)hipFree(word_);
}

absl::Status DeviceViolationWord::Reset(hipStream_t stream) {
  return RuntimeStatus(hipMemsetAsync(word_, 0, sizeof(kernels::DeviceViolation), stream),
                 "violation word: hipMemsetAsync");
}

absl::Status DeviceViolationWord::Check(hipStream_t stream) const {
  if (absl::Status s = RuntimeStatus(hipStreamSynchronize(stream), "violation word: sync"); !s.ok()) {
    return s;
  }
  kernels::DeviceViolation v{};
  if (absl::Status s = RuntimeStatus(hipMemcpy(&v, word_, sizeof(v), hipMemcpyDeviceToHost),
                               "violation word: copy to host");
      !s.ok()) {
    return s;
  }
  if (v.recorded == 0) return absl::OkStatus();
  return absl::OutOfRangeError(absl::StrCat("device metadata: ", DescribeViolation(v)));
}

}  // namespace attnmeta
