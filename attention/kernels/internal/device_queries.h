// What the host launchers ask of the GPU runtime: a runtime call's or a launch's error as a
// Status, per-device answers kept (multiprocessors, occupancy), and whether a launch may
// overlap the kernel ahead (DeviceOverlapsLaunches, OverlapIfAsked).

#ifndef ATTNMETA_ATTENTION_KERNELS_INTERNAL_DEVICE_QUERIES_H_
#define ATTNMETA_ATTENTION_KERNELS_INTERNAL_DEVICE_QUERIES_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "attention/kernels/hip_port.h"
#include "attention/kernels/internal/device_value_cache.h"
#include "attention/kernels/metadata_kernels_launch.h"

namespace attnmeta {
namespace internal {

// Internal naming `what` when a runtime call failed, else OK. The error is reported here, so
// it is cleared from the runtime's last error: a later launch's check (which reads the last
// error, as after <<<>>>) must not take it for its own.
inline absl::Status RuntimeStatus(hipError_t err, absl::string_view what) {
  if (err == hipSuccess) return absl::OkStatus();
  (void)hipGetLastError();
  return absl::InternalError(absl::StrCat(what, ": ", hipGetErrorString(err)));
}

// What `query(device, &value)` (a runtime call returning hipError_t) writes for the current
// device, asked of the runtime once per device and `key` and kept in `cache`: launchers need the
// multiprocessor count and kernels' occupancy on every call. Internal naming `what` when the
// runtime fails (nothing is kept then).
template <typename Query>
absl::StatusOr<int32_t> CachedDeviceQuery(DeviceValueCache& cache, int64_t key,
                                          absl::string_view what, const Query& query) {
  int device = 0;
  if (absl::Status s = RuntimeStatus(hipGetDevice(&device), "hipGetDevice"); !s.ok()) return s;
  return cache.Get(device, key, [&]() -> absl::StatusOr<int32_t> {
    int32_t value = 0;
    if (absl::Status s = RuntimeStatus(query(device, &value), what); !s.ok()) return s;
    return value;
  });
}

// DeviceOverlapsLaunches (metadata_launchers.h), for every launcher: one answer per device. A
// build for older targets only runs on a newer device through the driver's JIT, and its
// kernels do not wait: an overlapping launch would read what the kernel ahead has yet to write.
inline absl::StatusOr<bool> DeviceOverlapsLaunches() {
  if (!kOverlappingLaunches) return false;
  static DeviceValueCache* const cache = new DeviceValueCache();
  absl::StatusOr<int32_t> overlaps = CachedDeviceQuery(
      *cache, 0, "the compute capability or the kernels' compiled target",
      [](int device, int32_t* value) {
        *value = 0;
        int major = 0;
        if (const hipError_t err =
                hipDeviceGetAttribute(&major, hipDeviceAttributeComputeCapabilityMajor, device);
            err != hipSuccess || major < 9) {
          return err;
        }
        bool waits = false;
        const hipError_t err = kernels::KernelsWaitForPrecedingGrids(&waits);
        *value = waits ? 1 : 0;
        return err;
      });
  if (!overlaps.ok()) return overlaps.status();
  return *overlaps != 0;
}

// Whether a launch asked to overlap the kernel ahead (overlap_preceding_kernel) does: where
// the device allows it.
inline absl::StatusOr<bool> OverlapIfAsked(bool asked) {
  if (!asked) return false;
  return DeviceOverlapsLaunches();
}

// Internal naming the kernel when its launch failed.
inline absl::Status LaunchResult(hipError_t err, absl::string_view kernel) {
  if (err == hipSuccess) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(kernel, " kernel launch failed: ", hipGetErrorString(err)));
}

}  // namespace internal
}  // namespace attnmeta

#endif  // ATTNMETA_ATTENTION_KERNELS_INTERNAL_DEVICE_QUERIES_H_
