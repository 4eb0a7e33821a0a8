#include "attention/kernels/token_kv_indices.h"

#include <cstdint>

#include "attention/kernels/internal/device_queries.h"
#include "attention/kernels/internal/launch_checks.h"
#include "attention/kernels/metadata_kernels_launch.h"

namespace attnmeta {

absl::Status BuildTokenKvIndicesOnDevice(const TokenKvIndicesDeviceInputs& in,
                                         DeviceSpan<TokenSlot> kv_indices, hipStream_t stream,
                                         kernels::DeviceViolation* violation) {
  absl::StatusOr<kernels::TokenKvIndicesParams> params =
      TokenKvIndicesParamsFor(in, kv_indices, violation);
  if (!params.ok()) return params.status();
  if (params->batch_size == 0) return absl::OkStatus();
  absl::StatusOr<bool> overlap = internal::OverlapIfAsked(in.overlap_preceding_kernel);
  if (!overlap.ok()) return overlap.status();
  return internal::LaunchResult(
      kernels::LaunchTokenKvIndicesKernel(
          *params, internal::Passes(in.max_kv_len.value(), kernels::kTokenKvIndicesTokensPerPass),
          *overlap, stream),
      "token kv_indices");
}

}  // namespace attnmeta
