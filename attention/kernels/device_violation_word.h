// DeviceViolationWord: the device memory a metadata kernel records its first violation in
// (device_violation.h), and its conversion to a Status on the host.

#ifndef ATTNMETA_ATTENTION_KERNELS_DEVICE_VIOLATION_WORD_H_
#define ATTNMETA_ATTENTION_KERNELS_DEVICE_VIOLATION_WORD_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "attention/kernels/device_violation.h"
#include "attention/kernels/hip_port.h"

namespace attnmeta {

class DeviceViolationWord {
 public:
  // Allocates and clears the word. Internal when the runtime fails.
  static absl::StatusOr<DeviceViolationWord> Create();
  DeviceViolationWord(DeviceViolationWord&&) noexcept;
  DeviceViolationWord& operator=(DeviceViolationWord&&) noexcept;
  ~DeviceViolationWord();

  // The device address kernels record into.
  kernels::DeviceViolation* device() const { return word_; }

  // Clears the word on `stream` (ordered before the launches that follow on it).
  absl::Status Reset(hipStream_t stream);
  // Waits for `stream`, then: OK when nothing was recorded, else OutOfRange naming the kind,
  // the entry, the value and the bound (DescribeViolation, for example "device metadata:
  // kv_lens entry 3: 9000 is past the row of 4096 positions of req_to_token"). Internal when
  // the runtime fails.
  absl::Status Check(hipStream_t stream) const;

 private:
  explicit DeviceViolationWord(kernels::DeviceViolation* word) : word_(word) {}
  kernels::DeviceViolation* word_ = nullptr;
};

}  // namespace attnmeta

#endif  // ATTNMETA_ATTENTION_KERNELS_DEVICE_VIOLATION_WORD_H_
