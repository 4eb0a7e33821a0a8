#include "attention/kernels/token_kv_indices.h"

#include <cstdint>

#include "absl/strings/str_cat.h"
#include "attention/kernels/internal/device_queries.h"
#include "attention/kernels/internal/launch_checks.h"
#include "attention/kernels/metadata_kernels_launch.h"

namespace attnmeta {
using internal::CheckNotNull;

absl::Status BuildTokenKvIndicesOnDevice(const TokenKvIndicesDeviceInputs& in,
                                         DeviceSpan<TokenSlot> kv_indices, hipStream_t stream,
                                         kernels::DeviceViolation* violation) {
  if (in.kv_indptr.empty()) {
    return absl::InvalidArgumentError("kv_indptr must have batch_size + 1 >= 1 entries, got 0");
  }
  const int64_t bs = static_cast<int64_t>(in.kv_indptr.size()) - 1;
  if (static_cast<int64_t>(in.req_pool_indices.size()) != bs) {
    return absl::InvalidArgumentError(
        absl::StrCat("req_pool_indices has ", in.req_pool_indices.size(),
                     " entries, kv_indptr implies batch_size ", bs));
  }
  if (!in.kv_start_idx.empty() && static_cast<int64_t>(in.kv_start_idx.size()) != bs) {
    return absl::InvalidArgumentError(absl::StrCat("kv_start_idx has ", in.kv_start_idx.size(),
                                                   " entries, want 0 or batch_size ", bs));
  }
  const int64_t stride = in.max_context_len.value();
  if (stride < 1 || in.req_to_token.size() % stride != 0) {
    return absl::InvalidArgumentError(absl::StrCat("req_to_token has ", in.req_to_token.size(),
                                                   " entries, not a whole number of rows of ",
                                                   stride));
  }
  if (in.max_kv_len.value() < 0 || in.max_kv_len.value() > stride) {
    return absl::OutOfRangeError(absl::StrCat("max_kv_len ", in.max_kv_len.value(),
                                              " outside [0, max_context_len = ", stride, "]"));
  }
  if (bs > INT32_MAX) {
    return absl::OutOfRangeError(absl::StrCat("batch_size ", bs, " exceeds the grid"));
  }
  for (absl::Status s : {CheckNotNull("req_pool_indices", in.req_pool_indices),
                         CheckNotNull("kv_indptr", in.kv_indptr),
                         CheckNotNull("kv_start_idx", in.kv_start_idx),
                         CheckNotNull("kv_indices", kv_indices)}) {
    if (!s.ok()) return s;
  }
  if (bs == 0) return absl::OkStatus();
  // Token-level: no page arithmetic, so the slots are read as pages of one.
  absl::StatusOr<kernels::SlotSource> src = internal::CheckedSlotSource(
      in.req_to_token, in.max_context_len, in.pool_slots, *PageSize::Create(1));
  if (!src.ok()) return src.status();

  kernels::TokenKvIndicesParams params;
  params.src = *src;
  params.rows = reinterpret_cast<const int32_t*>(in.req_pool_indices.data());
  params.kv_indptr = reinterpret_cast<const int32_t*>(in.kv_indptr.data());
  // An empty span means all zeros, whatever its pointer: the kernel reads starts only when
  // given a pointer.
  params.kv_start_idx = in.kv_start_idx.empty()
                            ? nullptr
                            : reinterpret_cast<const int32_t*>(in.kv_start_idx.data());
  params.kv_indices = reinterpret_cast<int32_t*>(kv_indices.data());
  params.kv_indices_capacity = static_cast<int64_t>(kv_indices.size());
  params.batch_size = static_cast<int32_t>(bs);
  params.violation = violation;
  absl::StatusOr<bool> overlap = internal::OverlapIfAsked(in.overlap_preceding_kernel);
  if (!overlap.ok()) return overlap.status();
  return internal::LaunchResult(
      kernels::LaunchTokenKvIndicesKernel(
          params, internal::Passes(in.max_kv_len.value(), kernels::kTokenKvIndicesTokensPerPass),
          *overlap, stream),
      "token kv_indices");
}

}  // namespace attnmeta
