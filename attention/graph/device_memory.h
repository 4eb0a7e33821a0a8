// DeviceMemory: the graph layer's only way to allocate and move the memory of its fixed
// buffers. HostDeviceMemory (host_device_memory.h) implements it on the host for CPU tests and
// host replay; the GPU implementation comes with the device kernels (attention/kernels/).

#ifndef ATTNMETA_ATTENTION_GRAPH_DEVICE_MEMORY_H_
#define ATTNMETA_ATTENTION_GRAPH_DEVICE_MEMORY_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace attnmeta {

// One allocation: its address in the memory's address space and its size.
struct DeviceBuffer {
  void* ptr = nullptr;
  int64_t bytes = 0;
};

class DeviceMemory {
 public:
  virtual ~DeviceMemory() = default;

  // `name` labels the allocation in errors and diagnostics. InvalidArgument for bytes < 0;
  // ResourceExhausted when the memory cannot be had.
  virtual absl::StatusOr<DeviceBuffer> Allocate(absl::string_view name, int64_t bytes) = 0;
  // REQUIRES: `buffer` came from Allocate of this memory and was not freed.
  virtual void Free(DeviceBuffer buffer) = 0;

  // OutOfRange unless [offset, offset + bytes) lies in the buffer.
  virtual absl::Status CopyToDevice(DeviceBuffer dst, int64_t offset, const void* src,
                                    int64_t bytes) = 0;
  virtual absl::Status CopyToHost(void* dst, DeviceBuffer src, int64_t offset, int64_t bytes) = 0;
  // Sets every byte of [offset, offset + bytes) to `value`.
  virtual absl::Status Fill(DeviceBuffer dst, int64_t offset, int64_t bytes, uint8_t value) = 0;

  // True when buffers are addressable from the host (then metadata writers may use them as
  // host spans).
  virtual bool host_accessible() const = 0;
};

}  // namespace attnmeta

#endif  // ATTNMETA_ATTENTION_GRAPH_DEVICE_MEMORY_H_
