#include "attention/kernels/metadata_launchers.h"

#include <algorithm>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "attention/kernels/fused_metadata_grid.h"
#include "attention/kernels/internal/device_queries.h"
#include "attention/kernels/internal/device_value_cache.h"
#include "attention/kernels/internal/launch_checks.h"
#include "attention/kernels/metadata_kernels_launch.h"

namespace attnmeta {

using internal::LaunchResult;
using internal::OverlapIfAsked;
using internal::Passes;
using internal::RuntimeStatus;

namespace {

// An empty batch launches no kernel, but its indptrs are still [0], as the host builders write
// them (a graph's fixed buffers may hold another batch's entries).
template <typename T>
absl::Status ZeroFirstEntry(DeviceSpan<T> indptr, absl::string_view what, hipStream_t stream) {
  return RuntimeStatus(hipMemsetAsync(indptr.data(), 0, sizeof(T), stream),
                       absl::StrCat("empty batch: ", what, "[0]"));
}

// The fused kernel's blocks that fit on one multiprocessor of the current device, asked of the
// runtime once per device.
absl::StatusOr<int32_t> FusedMetadataOccupancy() {
  static internal::DeviceValueCache* const cache = new internal::DeviceValueCache();
  return internal::CachedDeviceQuery(
      *cache, 0, "decode metadata occupancy",
      [](int, int32_t* blocks) { return kernels::FusedMetadataBlocksPerMultiprocessor(blocks); });
}

// hipDeviceGetAttribute(attr) of the current device, asked of the runtime once per device.
absl::StatusOr<int32_t> CachedDeviceAttribute(hipDeviceAttribute_t attr, absl::string_view what) {
  static internal::DeviceValueCache* const cache = new internal::DeviceValueCache();
  const auto query = [attr](int device, int32_t* value) {
    int n = 0;
    const hipError_t err = hipDeviceGetAttribute(&n, attr, device);
    *value = n;
    return err;
  };
  return internal::CachedDeviceQuery(*cache, static_cast<int64_t>(attr), what, query);
}

}  // namespace

absl::Status BuildIndptrOnDevice(DeviceSpan<const TokenLength> lens, DeviceSpan<TokenOffset> indptr,
                                 DeviceSpan<TokenLength> last_page_len, PageSize page_size,
                                 kernels::DeviceViolation* violation, hipStream_t stream,
                                 bool overlap_preceding_kernel) {
  absl::StatusOr<kernels::IndptrParams> p =
      IndptrParamsFor(lens, indptr, last_page_len, page_size, violation);
  if (!p.ok()) return p.status();
  absl::StatusOr<bool> overlap = OverlapIfAsked(overlap_preceding_kernel);
  if (!overlap.ok()) return overlap.status();
  return LaunchResult(kernels::LaunchIndptrKernel(*p, *overlap, stream), "indptr");
}

absl::Status BuildPageTableOnDevice(const DeviceReqToToken& req_to_token, TokenCount pool_slots,
                                    DeviceSpan<const ReqPoolIndex> rows,
                                    DeviceSpan<const TokenLength> kv_lens, PageSize page_size,
                                    DeviceSpan<PageId> page_table, PageCount cols,
                                    kernels::DeviceViolation* violation, hipStream_t stream,
                                    bool overlap_preceding_kernel) {
  absl::StatusOr<kernels::PageTableParams> p = PageTableParamsFor(
      req_to_token, pool_slots, rows, kv_lens, page_size, page_table, cols, violation);
  if (!p.ok()) return p.status();
  if (p->batch_size == 0) return absl::OkStatus();
  absl::StatusOr<bool> overlap = OverlapIfAsked(overlap_preceding_kernel);
  if (!overlap.ok()) return overlap.status();
  return LaunchResult(kernels::LaunchPageTableKernel(
                          *p, Passes(p->cols, kernels::kPageTableColumnsPerPass), *overlap, stream),
                      "page table");
}

absl::StatusOr<int32_t> DeviceMultiprocessorCount() {
  return CachedDeviceAttribute(hipDeviceAttributeMultiprocessorCount,
                               "hipDeviceGetAttribute(multiprocessor count)");
}

absl::StatusOr<bool> DeviceOverlapsLaunches() { return internal::DeviceOverlapsLaunches(); }

absl::Status BuildDecodeMetadataOnDevice(const DecodeMetadataDeviceArgs& a,
                                         kernels::DeviceViolation* violation, hipStream_t stream) {
  absl::StatusOr<kernels::FusedMetadataParams> p = FusedMetadataParamsFor(a, violation);
  if (!p.ok()) return p.status();
  if (p->padded_batch == 0) {
    if (absl::Status s = ZeroFirstEntry(a.kv_indptr, "kv_indptr", stream); !s.ok()) return s;
    return ZeroFirstEntry(a.qo_indptr, "qo_indptr", stream);
  }
  // Every block sums the lengths before its row, then covers its share of the row's passes
  // (FusedMetadataRowBlocks: how many blocks share a row).
  absl::StatusOr<int32_t> multiprocessors = DeviceMultiprocessorCount();
  if (!multiprocessors.ok()) return multiprocessors.status();
  absl::StatusOr<int32_t> per_multiprocessor = FusedMetadataOccupancy();
  if (!per_multiprocessor.ok()) return per_multiprocessor.status();
  const int32_t wave_blocks = *multiprocessors * std::max<int32_t>(1, *per_multiprocessor);
  const int32_t needed =
      std::max(Passes(a.max_kv_len.value(), kernels::kFusedMetadataTokensPerPass),
               p->page_table == nullptr
                   ? 1
                   : Passes(p->page_table_cols, kernels::kFusedMetadataPageTableColumnsPerPass));
  const int32_t row_blocks = FusedMetadataRowBlocks(p->padded_batch, needed, wave_blocks);
  absl::StatusOr<bool> overlap = OverlapIfAsked(a.overlap_preceding_kernel);
  if (!overlap.ok()) return overlap.status();
  return LaunchResult(kernels::LaunchFusedMetadataKernel(*p, row_blocks, *overlap, stream),
                      "decode metadata");
}

absl::Status BuildTreeMaskOnDevice(const TreeMaskDeviceArgs& a, kernels::DeviceViolation* violation,
                                   hipStream_t stream) {
  absl::StatusOr<kernels::TreeMaskParams> p = TreeMaskParamsFor(a, violation);
  if (!p.ok()) return p.status();
  if (p->padded_batch == 0) return ZeroFirstEntry(a.mask_indptr, "mask_indptr", stream);
  absl::StatusOr<bool> overlap = OverlapIfAsked(a.overlap_preceding_kernel);
  if (!overlap.ok()) return overlap.status();
  return LaunchResult(
      kernels::LaunchTreeMaskKernel(*p, Passes(a.max_mask_bytes_per_row, kernels::kMetadataThreads),
                                    *overlap, stream),
      "tree mask");
}

absl::Status BuildDraftStepOnDevice(const DraftStepDeviceArgs& a,
                                    kernels::DeviceViolation* violation, hipStream_t stream) {
  absl::StatusOr<kernels::DraftStepParams> p = DraftStepParamsFor(a, violation);
  if (!p.ok()) return p.status();
  if (p->padded_batch == 0) {
    if (absl::Status s = ZeroFirstEntry(a.kv_indptr, "kv_indptr", stream); !s.ok()) return s;
    return ZeroFirstEntry(a.qo_indptr, "qo_indptr", stream);
  }
  // A branch is at most a row of req_to_token; the grid-stride loop covers any length.
  const int32_t passes = std::min<int32_t>(64, Passes(p->src.stride, kernels::kMetadataThreads));
  absl::StatusOr<bool> overlap = OverlapIfAsked(a.overlap_preceding_kernel);
  if (!overlap.ok()) return overlap.status();
  return LaunchResult(kernels::LaunchDraftStepKernels(*p, passes, *overlap, stream), "draft step");
}

absl::Status BuildSplitKvPlanOnDevice(const SplitKvPlanDeviceArgs& a,
                                      kernels::DeviceViolation* violation, hipStream_t stream) {
  absl::StatusOr<kernels::SplitKvPlanParams> p = SplitKvPlanParamsFor(a, violation);
  if (!p.ok()) return p.status();
  absl::StatusOr<bool> overlap = OverlapIfAsked(a.overlap_preceding_kernel);
  if (!overlap.ok()) return overlap.status();
  return LaunchResult(kernels::LaunchSplitKvPlanKernel(*p, *overlap, stream), "split-KV plan");
}

absl::Status GatherKvOnDevice(const GatherKvDeviceArgs& a, kernels::DeviceViolation* violation,
                              hipStream_t stream) {
  absl::StatusOr<kernels::GatherKvParams> p = GatherKvParamsFor(a, violation);
  if (!p.ok()) return p.status();
  // Enough blocks to fill a large GPU; each loops over rows.
  const int32_t blocks =
      static_cast<int32_t>(std::max<int64_t>(1, std::min<int64_t>(p->out_rows, 4096)));
  absl::StatusOr<bool> overlap = OverlapIfAsked(a.overlap_preceding_kernel);
  if (!overlap.ok()) return overlap.status();
  return LaunchResult(kernels::LaunchGatherKvKernel(*p, blocks, *overlap, stream), "K/V gather");
}

}  // namespace attnmeta
