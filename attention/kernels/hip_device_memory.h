// HipDeviceMemory: the graph layer's DeviceMemory (attention/graph/device_memory.h) on the
// GPU. Allocations are hipMalloc'd; copies and fills are queued on one stream, the stream the
// metadata writer launches on, so that a replay's staged inputs arrive before its kernels run
// (CopyToHost waits for the stream).
//
// A replay stages a few kilobytes: a copy from pageable memory makes the runtime copy it
// through its own staging and wait, several microseconds of host time. With StagedUploads
// (staged_uploads.h) that a consumer such as DeviceMetadataWriter has attached to, such copies
// cost a memcpy: they are staged and land when the consumer's next launch applies them (before
// any other operation of this memory, which flushes them first). Otherwise copies up to
// kPinnedSlotBytes go through a small ring of pinned host slots (memcpy into the slot, an
// asynchronous copy from it, an event marking when the slot is free again), and a plain copy
// when pinned memory cannot be had.

#ifndef ATTNMETA_ATTENTION_KERNELS_HIP_DEVICE_MEMORY_H_
#define ATTNMETA_ATTENTION_KERNELS_HIP_DEVICE_MEMORY_H_

#include <cstdint>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "attention/graph/device_memory.h"
#include "attention/kernels/hip_port.h"
#include "attention/kernels/staged_uploads.h"

namespace attnmeta {

class HipDeviceMemory : public DeviceMemory {
 public:
  // `uploads` (may be null) must outlive this memory; it is used only when queued on `stream`.
  explicit HipDeviceMemory(hipStream_t stream, StagedUploads* uploads = nullptr)
      : stream_(stream), uploads_(uploads) {}
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
  MemorySpace space() const override { return MemorySpace::kDevice; }

  hipStream_t stream() const { return stream_; }
  int64_t live_allocations() const { return static_cast<int64_t>(live_.size()); }

  static constexpr int64_t kPinnedSlotBytes = 64 << 10;
  static constexpr int kPinnedSlots = 4;

 private:
  struct PinnedSlot {
    void* host = nullptr;
    hipEvent_t free_again = nullptr;
    bool in_flight = false;
  };
  // Allocates the ring on first use; false when pinned memory cannot be had.
  bool EnsurePinned();
  // OutOfRange unless [offset, offset + bytes) lies in a live allocation of this memory.
  absl::Status CheckRange(DeviceBuffer buffer, int64_t offset, int64_t bytes) const;
  // Queues the staged copies not yet launched, so that they land before what comes next.
  absl::Status FlushUploads();
  // The copy through the pinned ring (or a plain one).
  absl::Status CopyThroughPinnedSlot(char* to, const void* src, int64_t bytes);

  hipStream_t stream_;
  StagedUploads* uploads_;
  absl::flat_hash_map<void*, int64_t> live_;  // pointer -> bytes
  PinnedSlot pinned_[kPinnedSlots];
  int next_pinned_ = 0;
  bool pinned_tried_ = false;
  bool pinned_ok_ = false;
};

}  // namespace attnmeta

#endif  // ATTNMETA_ATTENTION_KERNELS_HIP_DEVICE_MEMORY_H_
