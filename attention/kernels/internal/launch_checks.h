// Checks every host launcher shares (no device code).

#ifndef ATTNMETA_ATTENTION_KERNELS_INTERNAL_LAUNCH_CHECKS_H_
#define ATTNMETA_ATTENTION_KERNELS_INTERNAL_LAUNCH_CHECKS_H_

#include <algorithm>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "attention/kernels/device_span.h"
#include "attention/kernels/hip_port.h"

namespace attnmeta {
namespace internal {

// InvalidArgument for a span with elements but no pointer.
template <typename T>
absl::Status CheckNotNull(absl::string_view name, DeviceSpan<T> span) {
  if (!span.empty() && span.data() == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, " has ", span.size(), " elements but a null pointer"));
  }
  return absl::OkStatus();
}

// Internal naming `what` when a runtime call failed, else OK.
inline absl::Status RuntimeStatus(hipError_t err, absl::string_view what) {
  if (err == hipSuccess) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(what, ": ", hipGetErrorString(err)));
}

// Internal naming the kernel when its launch failed.
inline absl::Status LaunchResult(hipError_t err, absl::string_view kernel) {
  if (err == hipSuccess) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(kernel, " kernel launch failed: ", hipGetErrorString(err)));
}

// Grid passes (grid dimension y) to cover `n` items at `per_pass` per block: at least 1, at
// most 65535 (the y limit on NVIDIA; blocks then loop over the rest).
inline int32_t Passes(int64_t n, int64_t per_pass) {
  return static_cast<int32_t>(std::clamp<int64_t>((n + per_pass - 1) / per_pass, 1, 65535));
}

}  // namespace internal
}  // namespace attnmeta

#endif  // ATTNMETA_ATTENTION_KERNELS_INTERNAL_LAUNCH_CHECKS_H_
