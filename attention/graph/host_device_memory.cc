#include "attention/graph/host_device_memory.h"

#include <cstdlib>
#include <cstring>
#include <new>

#include "absl/strings/str_cat.h"
#include "glog/logging.h"

namespace attnmeta {
namespace {

constexpr unsigned char kCanary = 0xA5;
// New buffers are poisoned, so that a value read before it was written shows (as
// 0xCDCDCDCD, a negative int32).
constexpr unsigned char kPoison = 0xCD;

}  // namespace

HostDeviceMemory::~HostDeviceMemory() {
  if (!live_.empty()) {
    LOG(ERROR) << live_.size() << " host device allocations leaked, first: " << live_[0].name;
  }
  for (const Allocation& a : live_) std::free(a.base);
}

absl::StatusOr<DeviceBuffer> HostDeviceMemory::Allocate(absl::string_view name, int64_t bytes) {
  if (bytes < 0) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": allocation of ", bytes, " bytes"));
  }
  // Bounded so that the canaries and the rounding below stay inside int64.
  if (bytes > (int64_t{1} << 62)) {
    return absl::ResourceExhaustedError(
        absl::StrCat(name, ": cannot allocate ", bytes, " bytes of host memory"));
  }
  const int64_t total = bytes + 2 * kCanaryBytes;
  char* base = static_cast<char*>(std::aligned_alloc(kCanaryBytes, (total + 63) / 64 * 64));
  if (base == nullptr) {
    return absl::ResourceExhaustedError(
        absl::StrCat(name, ": cannot allocate ", bytes, " bytes of host memory"));
  }
  std::memset(base, kCanary, kCanaryBytes);
  std::memset(base + kCanaryBytes, kPoison, bytes);
  std::memset(base + kCanaryBytes + bytes, kCanary, kCanaryBytes);
  live_.push_back(Allocation{std::string(name), base, bytes});
  ++allocations_;
  return DeviceBuffer{base + kCanaryBytes, bytes};
}

void HostDeviceMemory::Free(DeviceBuffer buffer) {
  for (size_t i = 0; i < live_.size(); ++i) {
    if (live_[i].base + kCanaryBytes == buffer.ptr) {
      std::free(live_[i].base);
      live_.erase(live_.begin() + static_cast<std::ptrdiff_t>(i));
      return;
    }
  }
  ++foreign_frees_;
}

const HostDeviceMemory::Allocation* HostDeviceMemory::Lookup(DeviceBuffer buffer) const {
  for (const Allocation& a : live_) {
    if (a.base + kCanaryBytes == buffer.ptr) return &a;
  }
  return nullptr;
}

absl::Status HostDeviceMemory::CheckRange(DeviceBuffer buffer, int64_t offset,
                                          int64_t bytes) const {
  const Allocation* a = Lookup(buffer);
  if (a == nullptr) return absl::OutOfRangeError("not a live allocation of this memory");
  if (offset < 0 || bytes < 0 || offset > a->bytes - bytes) {
    return absl::OutOfRangeError(absl::StrCat(a->name, ": ", bytes, " bytes at offset ", offset,
                                              " outside the buffer of ", a->bytes));
  }
  return absl::OkStatus();
}

absl::Status HostDeviceMemory::CopyToDevice(DeviceBuffer dst, int64_t offset, const void* src,
                                            int64_t bytes) {
  if (absl::Status s = CheckRange(dst, offset, bytes); !s.ok()) return s;
  if (bytes > 0) std::memcpy(static_cast<char*>(dst.ptr) + offset, src, bytes);
  return absl::OkStatus();
}

absl::Status HostDeviceMemory::CopyToHost(void* dst, DeviceBuffer src, int64_t offset,
                                          int64_t bytes) {
  if (absl::Status s = CheckRange(src, offset, bytes); !s.ok()) return s;
  if (bytes > 0) std::memcpy(dst, static_cast<const char*>(src.ptr) + offset, bytes);
  return absl::OkStatus();
}

absl::Status HostDeviceMemory::Fill(DeviceBuffer dst, int64_t offset, int64_t bytes,
                                    uint8_t value) {
  if (absl::Status s = CheckRange(dst, offset, bytes); !s.ok()) return s;
  if (bytes > 0) std::memset(static_cast<char*>(dst.ptr) + offset, value, bytes);
  return absl::OkStatus();
}

absl::Status HostDeviceMemory::VerifyCanaries() const {
  for (const Allocation& a : live_) {
    const unsigned char* lo = reinterpret_cast<const unsigned char*>(a.base);
    const unsigned char* hi = lo + kCanaryBytes + a.bytes;
    for (int64_t k = 0; k < kCanaryBytes; ++k) {
      if (lo[k] != kCanary || hi[k] != kCanary) {
        return absl::DataLossError(absl::StrCat(
            a.name, ": canary ", lo[k] != kCanary ? "before" : "after", " the buffer overwritten (",
            lo[k] != kCanary ? kCanaryBytes - k : k + 1, " bytes ",
            lo[k] != kCanary ? "before its start" : "past its end", ")"));
      }
    }
  }
  return absl::OkStatus();
}

int64_t HostDeviceMemory::live_bytes() const {
  int64_t total = 0;
  for (const Allocation& a : live_) total += a.bytes;
  return total;
}

}  // namespace attnmeta
