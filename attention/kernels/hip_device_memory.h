// HipDeviceMemory: the graph layer's DeviceMemory (attention/graph/device_memory.h) on the
// GPU. Allocations are hipMalloc'd; copies and fills are queued on one stream, the stream the
// metadata writer launches on, so that a replay's staged inputs arrive before its kernels run
// (CopyToHost waits for the stream).

#ifndef ATTNMETA_ATTENTION_KERNELS_HIP_DEVICE_MEMORY_H_
#define ATTNMETA_ATTENTION_KERNELS_HIP_DEVICE_MEMORY_H_

#include <cstdint>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "attention/graph/device_memory.h"
#include "attention/kernels/hip_port.h"

namespace attnmeta {

class HipDeviceMemory : public DeviceMemory {
 public:
  explicit HipDeviceMemory(hipStream_t stream) : stream_(stream) {}
  HipDeviceMemory(const HipDeviceMemory&) = delete;
  HipDeviceMemory& operator=(const HipDeviceMemory&) = delete;
  // Frees what is still allocated.
  ~HipDeviceMemory() override;

  absl::StatusOr<DeviceBuffer> Allocate(absl::string_view name, int64_t bytes) override;
  void Free(DeviceBuffer buffer) override;
  absl::Status CopyToDevice(DeviceBuffer dst, int64_t offset, const void* src,
                            int64_t bytes) override;
  absl::Status CopyToHost(void* dst, DeviceBuffer src, int64_t offset, int64_t bytes) override;
  absl::Status Fill(DeviceBuffer dst, int64_t offset, int64_t bytes, uint8_t value) override;
  bool host_accessible() const override { return false; }

  hipStream_t stream() const { return stream_; }
  int64_t live_allocations() const { return static_cast<int64_t>(live_.size()); }

 private:
  // OutOfRange unless [offset, offset + bytes) lies in a live allocation of this memory.
  absl::Status CheckRange(DeviceBuffer buffer, int64_t offset, int64_t bytes) const;

  hipStream_t stream_;
  absl::flat_hash_map<void*, int64_t> live_;  // pointer -> bytes
};

}  // namespace attnmeta

#endif  // ATTNMETA_ATTENTION_KERNELS_HIP_DEVICE_MEMORY_H_
