#include "attention/kernels/varlen_attention_launcher.h"

#include "absl/status/statusor.h"
#include "attention/kernels/internal/device_queries.h"
#include "attention/kernels/varlen_attention_launch.h"

namespace attnmeta {

absl::Status VarlenAttention(const VarlenAttentionArgs& a, kernels::DeviceViolation* violation,
                             hipStream_t stream) {
  absl::StatusOr<VarlenAttentionLaunch> launch =
      VarlenAttentionLaunchFor(a, kNativeMmaM16N8K16, violation);
  if (!launch.ok()) return launch.status();
  if (launch->blocks == 0) return absl::OkStatus();
  const absl::StatusOr<bool> overlap = internal::OverlapIfAsked(a.overlap_preceding_kernel);
  if (!overlap.ok()) return overlap.status();
  return internal::LaunchResult(
      kernels::LaunchVarlenAttentionKernel(launch->params, *overlap, stream), "varlen attention");
}

}  // namespace attnmeta
