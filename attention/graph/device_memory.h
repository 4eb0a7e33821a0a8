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

// Where a memory's buffers live, and so who can touch them: the host (plain pointers) or the
// device (pointers only kernels and the memory's copies may use).
enum class MemorySpace { kHost, kDevice };

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
  // Frees a buffer of this memory's Allocate. A buffer it does not hold (freed already, or
  // another memory's) is left alone: a free has no caller to return a status to.
  virtual void Free(DeviceBuffer buffer) = 0;

  // OutOfRange unless `buffer` is a live allocation of this memory and [offset, offset + bytes)
  // lies in it.
  virtual absl::Status CopyToDevice(DeviceBuffer dst, int64_t offset, const void* src,
                                    int64_t bytes) = 0;
  virtual absl::Status CopyToHost(void* dst, DeviceBuffer src, int64_t offset, int64_t bytes) = 0;
  // Sets every byte of [offset, offset + bytes) to `value`.
  virtual absl::Status Fill(DeviceBuffer dst, int64_t offset, int64_t bytes, uint8_t value) = 0;

  // Where the buffers live. A metadata writer works in one space (MetadataWriter::space);
  // GraphState refuses to pair it with a memory of the other.
  virtual MemorySpace space() const = 0;
};

}  // namespace attnmeta

#endif  // ATTNMETA_ATTENTION_GRAPH_DEVICE_MEMORY_H_
