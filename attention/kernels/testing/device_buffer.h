// DeviceBuffer: owned device memory for GPU tests and benchmarks.

#ifndef ATTNMETA_ATTENTION_KERNELS_TESTING_DEVICE_BUFFER_H_
#define ATTNMETA_ATTENTION_KERNELS_TESTING_DEVICE_BUFFER_H_

#include <cstddef>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "attention/kernels/device_span.h"
#include "attention/kernels/hip_port.h"

namespace attnmeta {
namespace testing {

// An error status for a failed runtime call, naming the call.
inline absl::Status GpuStatus(hipError_t err, const char* what) {
  if (err == hipSuccess) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(what, ": ", hipGetErrorString(err)));
}

// FailedPrecondition unless at least one GPU is visible.
inline absl::Status RequireGpu() {
  int n = 0;
  const hipError_t err = hipGetDeviceCount(&n);
  if (err != hipSuccess || n == 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "no GPU visible (", err == hipSuccess ? "0 devices" : hipGetErrorString(err), ")"));
  }
  return absl::OkStatus();
}

template <typename T>
class DeviceBuffer {
 public:
  static absl::StatusOr<DeviceBuffer> Create(size_t n) {
    DeviceBuffer b;
    b.size_ = n;
    if (n > 0) {
      absl::Status s = GpuStatus(hipMalloc(&b.data_, n * sizeof(T)), "hipMalloc");
      if (!s.ok()) return s;
    }
    return b;
  }
  static absl::StatusOr<DeviceBuffer> FromHost(absl::Span<const T> host) {
    absl::StatusOr<DeviceBuffer> b = Create(host.size());
    if (!b.ok()) return b.status();
    absl::Status s = b->CopyFrom(host);
    if (!s.ok()) return s;
    return b;
  }

  DeviceBuffer(DeviceBuffer&& o) noexcept
      : data_(std::exchange(o.data_, nullptr)), size_(std::exchange(o.size_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    std::swap(data_, o.data_);
    std::swap(size_, o.size_);
    return *this;
  }
  ~DeviceBuffer() {
    if (data_ != nullptr) (void)hipFree(data_);
  }

  absl::Status CopyFrom(absl::Span<const T> host) {
    if (host.size() != size_) {
      return absl::InvalidArgumentError(
          absl::StrCat("copy of ", host.size(), " elements into a buffer of ", size_));
    }
    if (size_ == 0) return absl::OkStatus();
    return GpuStatus(hipMemcpy(data_, host.data(), size_ * sizeof(T), hipMemcpyHostToDevice),
                     "hipMemcpy to device");
  }
  absl::StatusOr<std::vector<T>> ToHost() const {
    std::vector<T> out(size_);
    if (size_ == 0) return out;
    absl::Status s = GpuStatus(
        hipMemcpy(out.data(), data_, size_ * sizeof(T), hipMemcpyDeviceToHost), "hipMemcpy to host");
    if (!s.ok()) return s;
    return out;
  }

  T* data() const { return data_; }
  size_t size() const { return size_; }
  DeviceSpan<T> span() const { return DeviceSpan<T>(data_, size_); }
  DeviceSpan<const T> const_span() const { return DeviceSpan<const T>(data_, size_); }

 private:
  DeviceBuffer() = default;
  T* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace testing
}  // namespace attnmeta

#endif  // ATTNMETA_ATTENTION_KERNELS_TESTING_DEVICE_BUFFER_H_
