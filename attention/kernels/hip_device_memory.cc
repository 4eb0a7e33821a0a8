#include "attention/kernels/hip_device_memory.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "attention/kernels/internal/device_queries.h"
#include "glog/logging.h"

namespace attnmeta {
using internal::RuntimeStatus;

HipDeviceMemory::~HipDeviceMemory() {
  if (!FlushUploads().ok()) uploads_->Discard();
  (void)hipStreamSynchronize(stream_);
  for (const auto& [ptr, bytes] : live_) (void)hipFree(ptr);
  for (PinnedSlot& slot : pinned_) {
    if (slot.host != nullptr) (void)hipHostFree(slot.host);
    if (slot.free_again != nullptr) (void)hipEventDestroy(slot.free_again);
  }
}

bool HipDeviceMemory::EnsurePinned() {
  if (pinned_tried_) return pinned_ok_;
  pinned_tried_ = true;
  for (PinnedSlot& slot : pinned_) {
    if (hipHostMalloc(&slot.host, kPinnedSlotBytes, hipHostMallocDefault) != hipSuccess ||
        hipEventCreateWithFlags(&slot.free_again, hipEventDisableTiming) != hipSuccess) {
      (void)hipGetLastError();
      return false;
    }
  }
  pinned_ok_ = true;
  return true;
}

absl::StatusOr<DeviceBuffer> HipDeviceMemory::Allocate(absl::string_view name, int64_t bytes) {
  if (bytes < 0) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": ", bytes, " bytes requested"));
  }
  void* ptr = nullptr;
  // hipMalloc of 0 bytes may return null; one byte keeps every buffer a distinct address.
  const hipError_t err = hipMalloc(&ptr, static_cast<size_t>(bytes == 0 ? 1 : bytes));
  if (err != hipSuccess) {
    (void)hipGetLastError();  // clear the sticky-free error state of a failed allocation
    return absl::ResourceExhaustedError(absl::StrCat(name, ": hipMalloc of ", bytes,
                                                     " bytes failed: ", hipGetErrorString(err)));
  }
  live_[ptr] = bytes;
  return DeviceBuffer{ptr, bytes};
}

void HipDeviceMemory::Free(DeviceBuffer buffer) {
  // Staged copies may target the buffer: they land first (hipFree waits for the device), or
  // are dropped when they cannot be launched. Free returns no status (a deallocation has no
  // caller to act on one), so what it drops or fails is logged.
  if (const absl::Status flushed = FlushUploads(); !flushed.ok()) {
    LOG(WARNING) << "device memory: staged copies discarded before a free: " << flushed;
    uploads_->Discard();
  }
  if (live_.erase(buffer.ptr) == 0) return;
  if (const hipError_t err = hipFree(buffer.ptr); err != hipSuccess) {
    (void)hipGetLastError();
    LOG(WARNING) << "device memory: hipFree of " << buffer.ptr
                 << " failed: " << hipGetErrorString(err);
  }
}

absl::Status HipDeviceMemory::CheckRange(DeviceBuffer buffer, int64_t offset, int64_t bytes) const {
  auto it = live_.find(buffer.ptr);
  if (it == live_.end()) {
    return absl::OutOfRangeError("device memory: not a live allocation of this memory");
  }
  if (offset < 0 || bytes < 0 || offset > it->second - bytes) {
    // offset + bytes is not formed: it can overflow.
    return absl::OutOfRangeError(absl::StrCat("device memory: ", bytes, " bytes at offset ", offset,
                                              " outside the ", it->second, "-byte buffer"));
  }
  return absl::OkStatus();
}

absl::Status HipDeviceMemory::FlushUploads() {
  return uploads_ != nullptr ? uploads_->Flush() : absl::OkStatus();
}

absl::Status HipDeviceMemory::CopyToDevice(DeviceBuffer dst, int64_t offset, const void* src,
                                           int64_t bytes) {
  if (absl::Status s = CheckRange(dst, offset, bytes); !s.ok()) return s;
  if (bytes == 0) return absl::OkStatus();
  char* to = static_cast<char*>(dst.ptr) + offset;
  if (uploads_ != nullptr && uploads_->attached() && uploads_->stream() == stream_) {
    absl::Status staged = uploads_->Stage(to, src, bytes);
    // No room, or a range another copy of the batch covers: the open batch goes first, then
    // this copy the ordinary way.
    if (!absl::IsResourceExhausted(staged)) return staged;
    if (absl::Status s = FlushUploads(); !s.ok()) return s;
  }
  return CopyThroughPinnedSlot(to, src, bytes);
}

absl::Status HipDeviceMemory::CopyThroughPinnedSlot(char* to, const void* src, int64_t bytes) {
  if (bytes > kPinnedSlotBytes || !EnsurePinned()) {
    return RuntimeStatus(hipMemcpyAsync(to, src, static_cast<size_t>(bytes), hipMemcpyHostToDevice, stream_),
                   "device memory: copy to device");
  }
  PinnedSlot& slot = pinned_[next_pinned_];
  next_pinned_ = (next_pinned_ + 1) % kPinnedSlots;
  if (slot.in_flight) {
    if (absl::Status s = RuntimeStatus(hipEventSynchronize(slot.free_again), "device memory: pinned slot");
        !s.ok()) {
      return s;
    }
  }
  std::memcpy(slot.host, src, static_cast<size_t>(bytes));
  if (absl::Status s = RuntimeStatus(hipMemcpyAsync(to, slot.host, static_cast<size_t>(bytes),
                                              hipMemcpyHostToDevice, stream_),
                               "device memory: copy to device");
      !s.ok()) {
    return s;
  }
  if (absl::Status s = RuntimeStatus(hipEventRecord(slot.free_again, stream_),
                                     "device memory: pinned slot event");
      !s.ok()) {
    // Without the event nothing tells when the copy has read the slot: wait for it here, so
    // that the slot's next use cannot overwrite what the copy has yet to read.
    (void)hipStreamSynchronize(stream_);
    slot.in_flight = false;
    return s;
  }
  slot.in_flight = true;
  return absl::OkStatus();
}

absl::Status HipDeviceMemory::CopyToHost(void* dst, DeviceBuffer src, int64_t offset,
                                         int64_t bytes) {
  if (absl::Status s = CheckRange(src, offset, bytes); !s.ok()) return s;
  if (bytes == 0) return absl::OkStatus();
  if (absl::Status s = FlushUploads(); !s.ok()) return s;
  if (absl::Status s = RuntimeStatus(hipMemcpyAsync(dst, static_cast<const char*>(src.ptr) + offset,
                                              static_cast<size_t>(bytes), hipMemcpyDeviceToHost,
                                              stream_),
                               "device memory: copy to host");
      !s.ok()) {
    return s;
  }
  return RuntimeStatus(hipStreamSynchronize(stream_), "device memory: sync");
}

absl::Status HipDeviceMemory::Fill(DeviceBuffer dst, int64_t offset, int64_t bytes, uint8_t value) {
  if (absl::Status s = CheckRange(dst, offset, bytes); !s.ok()) return s;
  if (bytes == 0) return absl::OkStatus();
  if (absl::Status s = FlushUploads(); !s.ok()) return s;
  return RuntimeStatus(hipMemsetAsync(static_cast<char*>(dst.ptr) + offset, value,
                                static_cast<size_t>(bytes), stream_),
                 "device memory: fill");
}

}  // namespace attnmeta
