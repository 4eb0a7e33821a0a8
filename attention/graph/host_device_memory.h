// HostDeviceMemory: DeviceMemory on the host heap, for CPU tests and host replay. Every
// allocation starts poisoned (every byte 0xCD) and is surrounded by canary bytes, so tests can prove that nothing writes outside a
// buffer (VerifyCanaries), and allocations are counted, so tests can prove that a path
// allocates nothing.

#ifndef ATTNMETA_ATTENTION_GRAPH_HOST_DEVICE_MEMORY_H_
#define ATTNMETA_ATTENTION_GRAPH_HOST_DEVICE_MEMORY_H_

#include <cstdint>
#include <string>
#include <vector>

#include "attention/graph/device_memory.h"

namespace attnmeta {

class HostDeviceMemory : public DeviceMemory {
 public:
  // Canary bytes on each side of every allocation; keeps buffers 64-byte aligned.
  static constexpr int64_t kCanaryBytes = 64;

  HostDeviceMemory() = default;
  HostDeviceMemory(const HostDeviceMemory&) = delete;
  HostDeviceMemory& operator=(const HostDeviceMemory&) = delete;
  // Frees what is still allocated and logs it as leaked (tests check live_allocations()).
  ~HostDeviceMemory() override;

  absl::StatusOr<DeviceBuffer> Allocate(absl::string_view name, int64_t bytes) override;
  void Free(DeviceBuffer buffer) override;
  absl::Status CopyToDevice(DeviceBuffer dst, int64_t offset, const void* src,
                            int64_t bytes) override;
  absl::Status CopyToHost(void* dst, DeviceBuffer src, int64_t offset, int64_t bytes) override;
  absl::Status Fill(DeviceBuffer dst, int64_t offset, int64_t bytes, uint8_t value) override;
  MemorySpace space() const override { return MemorySpace::kHost; }

  // OK, or DataLoss naming the first live allocation whose canaries were overwritten.
  absl::Status VerifyCanaries() const;
  // Allocate calls that succeeded, ever.
  int64_t allocations() const { return allocations_; }
  int64_t live_allocations() const { return static_cast<int64_t>(live_.size()); }
  int64_t live_bytes() const;
  // Free calls with a buffer this memory did not hold (a second free, another memory's), ever.
  int64_t foreign_frees() const { return foreign_frees_; }

 private:
  struct Allocation {
    std::string name;
    char* base;     // canary, buffer, canary
    int64_t bytes;  // the buffer's
  };
  // The live allocation holding `buffer`, or null.
  const Allocation* Lookup(DeviceBuffer buffer) const;
  absl::Status CheckRange(DeviceBuffer buffer, int64_t offset, int64_t bytes) const;

  std::vector<Allocation> live_;
  int64_t allocations_ = 0;
  int64_t foreign_frees_ = 0;
};

}  // namespace attnmeta

#endif  // ATTNMETA_ATTENTION_GRAPH_HOST_DEVICE_MEMORY_H_
