// Checks every host launcher shares (no device code).

#ifndef ATTNMETA_ATTENTION_KERNELS_INTERNAL_LAUNCH_CHECKS_H_
#define ATTNMETA_ATTENTION_KERNELS_INTERNAL_LAUNCH_CHECKS_H_

#include <algorithm>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/status/statusor.h"
#include "attention/kernels/device_span.h"
#include "attention/kernels/hip_port.h"
#include "attention/kernels/metadata_kernels.h"
#include "kvcache/units.h"

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

// The kernels' view of req_to_token ([rows][stride], row-major) and the KV pool, checked:
// InvalidArgument unless the table is a whole number >= 1 of rows with a pointer; OutOfRange
// for rows, pool slots or a page size beyond int32.
inline absl::StatusOr<kernels::SlotSource> CheckedSlotSource(DeviceSpan<const TokenSlot> table,
                                                             TokenCount stride,
                                                             TokenCount pool_slots,
                                                             PageSize page_size) {
  const int64_t cols = stride.value();
  if (cols < 1 || table.empty() || table.size() % cols != 0) {
    return absl::InvalidArgumentError(absl::StrCat("req_to_token has ", table.size(),
                                                   " entries, not a whole number >= 1 of rows of ",
                                                   cols));
  }
  if (absl::Status s = CheckNotNull("req_to_token", table); !s.ok()) return s;
  const int64_t rows = static_cast<int64_t>(table.size()) / cols;
  if (rows > INT32_MAX || pool_slots.value() < 0 || pool_slots.value() > (int64_t{1} << 31) ||
      page_size.tokens() > (int64_t{1} << 30)) {
    return absl::OutOfRangeError("req_to_token rows, pool slots or page size beyond int32");
  }
  kernels::SlotSource s;
  s.req_to_token = reinterpret_cast<const int32_t*>(table.data());
  s.stride = cols;
  s.max_reqs = static_cast<int32_t>(rows);
  s.pool_slots = pool_slots.value();
  s.page_size = static_cast<int32_t>(page_size.tokens());
  s.page_size_log2 = page_size.log2();
  return s;
}

// Grid passes (grid dimension y) to cover `n` items at `per_pass` per block: at least 1, at
// most 65535 (the y limit on NVIDIA; blocks then loop over the rest).
inline int32_t Passes(int64_t n, int64_t per_pass) {
  return static_cast<int32_t>(std::clamp<int64_t>((n + per_pass - 1) / per_pass, 1, 65535));
}

}  // namespace internal
}  // namespace attnmeta

#endif  // ATTNMETA_ATTENTION_KERNELS_INTERNAL_LAUNCH_CHECKS_H_
