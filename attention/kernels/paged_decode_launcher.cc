#include "attention/kernels/paged_decode_launcher.h"

#include <cstdint>

#include "attention/kernels/internal/device_queries.h"
#include "attention/kernels/internal/device_value_cache.h"
#include "attention/kernels/internal/launch_checks.h"
#include "attention/kernels/metadata_launchers.h"
#include "attention/kernels/paged_decode_attention_launch.h"

namespace attnmeta {

using internal::LaunchResult;

absl::Status PagedDecodeAttention(const PagedDecodeArgs& a, kernels::DeviceViolation* violation,
                                  hipStream_t stream) {
  absl::StatusOr<PagedDecodeLaunch> launch = PagedDecodeLaunchFor(a, violation);
  if (!launch.ok()) return launch.status();
  if (launch->blocks == 0) return absl::OkStatus();
  bool overlap = false;
  if (a.overlap != DecodeLaunchOverlap::kNone) {
    absl::StatusOr<bool> can = DeviceOverlapsLaunches();
    if (!can.ok()) return can.status();
    overlap = *can;
  }
  // The warm-up only pays under the kernel ahead's tail.
  if (!overlap) launch->attention.warm_l2_before_wait = false;
  if (absl::Status s = LaunchResult(
          kernels::LaunchPagedDecodeKernel(launch->attention, overlap, stream), "paged decode");
      !s.ok() || !launch->merge_launch) {
    return s;
  }
  return LaunchResult(kernels::LaunchDecodeMergeKernel(launch->merge, overlap, stream),
                      "decode merge");
}

absl::StatusOr<DecodeSplitOptions> DecodeSplitOptionsForDevice(const DecodeAttentionDims& dims,
                                                               int32_t variant) {
  absl::StatusOr<int32_t> heads_per_block = DecodeQueryHeadsPerBlock(dims, variant);
  if (!heads_per_block.ok()) return heads_per_block.status();
  absl::StatusOr<int32_t> blocks_per_item = DecodeBlocksPerWorkItem(dims, variant);
  if (!blocks_per_item.ok()) return blocks_per_item.status();
  absl::StatusOr<int32_t> multiprocessors = DeviceMultiprocessorCount();
  if (!multiprocessors.ok()) return multiprocessors.status();
  kernels::PagedDecodeParams p{};
  p.dtype = internal::ElementDtypeOf(dims.dtype);
  p.head_dim = dims.head_dim;
  p.heads_per_block = *heads_per_block;
  p.variant = variant;
  // One kernel per (dtype, head dim, heads per block, variant); DecodeQueryHeadsPerBlock
  // bounds each field.
  const int64_t kernel =
      ((int64_t{p.dtype} * 1024 + p.head_dim) * 64 + p.heads_per_block) * 64 + p.variant;
  static internal::DeviceValueCache* const occupancy = new internal::DeviceValueCache();
  absl::StatusOr<int32_t> per_multiprocessor = internal::CachedDeviceQuery(
      *occupancy, kernel, "decode attention occupancy",
      [&](int, int32_t* blocks) { return kernels::PagedDecodeBlocksPerMultiprocessor(p, blocks); });
  if (!per_multiprocessor.ok()) return per_multiprocessor.status();
  if (*per_multiprocessor < 1) {
    return absl::FailedPreconditionError(
        "decode attention: no block of the kernel fits on a multiprocessor of this device");
  }
  DecodeSplitOptions o;
  o.multiprocessor_count = *multiprocessors;
  o.blocks_per_item = *blocks_per_item;
  o.blocks_per_multiprocessor = *per_multiprocessor;
  return o;
}

}  // namespace attnmeta
