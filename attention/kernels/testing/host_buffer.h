// HostBuffer: host bytes aligned to 64 that stand in for a device buffer in CPU tests of the
// launchers' checks, which never read through the spans they are given.

#ifndef ATTNMETA_ATTENTION_KERNELS_TESTING_HOST_BUFFER_H_
#define ATTNMETA_ATTENTION_KERNELS_TESTING_HOST_BUFFER_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "attention/kernels/device_span.h"

namespace attnmeta {
namespace testing {

class HostBuffer {
 public:
  HostBuffer() : HostBuffer(0) {}
  // `bytes` of the buffer and 64 more for misaligned views of the same size.
  explicit HostBuffer(int64_t bytes)
      : blocks_(static_cast<size_t>((bytes + 64 + 63) / 64)), bytes_(bytes) {}

  uint8_t* data() { return blocks_.front().bytes; }
  int64_t size() const { return bytes_; }
  // The whole buffer as elements of T, or `n` of them from `offset_bytes` on.
  template <typename T>
  DeviceSpan<T> span() {
    return DeviceSpan<T>(reinterpret_cast<T*>(data()), static_cast<size_t>(bytes_) / sizeof(T));
  }
  template <typename T>
  DeviceSpan<T> span(int64_t offset_bytes, size_t n) {
    return DeviceSpan<T>(reinterpret_cast<T*>(data() + offset_bytes), n);
  }

 private:
  struct alignas(64) Block {
    uint8_t bytes[64];
  };
  std::vector<Block> blocks_;
  int64_t bytes_;
};

template <typename T>
DeviceSpan<const T> HostSpan(const std::vector<T>& v) {
  return DeviceSpan<const T>(v.data(), v.size());
}

}  // namespace testing
}  // namespace attnmeta

#endif  // ATTNMETA_ATTENTION_KERNELS_TESTING_HOST_BUFFER_H_
