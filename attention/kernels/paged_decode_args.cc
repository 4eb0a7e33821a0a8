#include "attention/kernels/paged_decode_args.h"

#include <cstddef>
#include <cstdint>
#include <limits>
#include <variant>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "attention/kernels/internal/launch_checks.h"

namespace attnmeta {

using internal::Aligned;
using internal::CheckNotNull;
using internal::kVectorBytes;

// The plan's items are uploaded as they are and read through the kernels' plain structs.
static_assert(sizeof(SplitKvWorkItem) == sizeof(kernels::DecodeWorkItem) &&
              offsetof(SplitKvWorkItem, sequence) == offsetof(kernels::DecodeWorkItem, sequence) &&
              offsetof(SplitKvWorkItem, q_begin) == offsetof(kernels::DecodeWorkItem, q_begin) &&
              offsetof(SplitKvWorkItem, q_end) == offsetof(kernels::DecodeWorkItem, q_end) &&
              offsetof(SplitKvWorkItem, kv_begin) == offsetof(kernels::DecodeWorkItem, kv_begin) &&
              offsetof(SplitKvWorkItem, kv_end) == offsetof(kernels::DecodeWorkItem, kv_end) &&
              offsetof(SplitKvWorkItem, partial_slot) ==
                  offsetof(kernels::DecodeWorkItem, partial_slot));
static_assert(
    sizeof(SplitKvReduceItem) == sizeof(kernels::DecodeReduceItem) &&
    offsetof(SplitKvReduceItem, sequence) == offsetof(kernels::DecodeReduceItem, sequence) &&
    offsetof(SplitKvReduceItem, q_begin) == offsetof(kernels::DecodeReduceItem, q_begin) &&
    offsetof(SplitKvReduceItem, q_end) == offsetof(kernels::DecodeReduceItem, q_end) &&
    offsetof(SplitKvReduceItem, partial_begin) ==
        offsetof(kernels::DecodeReduceItem, partial_begin) &&
    offsetof(SplitKvReduceItem, partial_end) == offsetof(kernels::DecodeReduceItem, partial_end));

namespace {

// Blocks of one launch: within NVIDIA's grid x and, at 256 threads, HIP's 2^32 threads.
constexpr int64_t kMaxBlocks = int64_t{1} << 23;
// The merge kernel's grid y is the query heads over its 4 warps per block; at most 65535.
constexpr int64_t kMaxQueryHeads = 65535;

}  // namespace

// The largest of 8, 4, 2, 1 dividing the group (kernel instantiations); variants other than 0
// run 4.
absl::StatusOr<int32_t> DecodeQueryHeadsPerBlock(const DecodeAttentionDims& d, int32_t variant) {
  if (absl::Status s = internal::CheckAttentionDims("decode attention", d); !s.ok()) return s;
  if (d.num_q_heads > kMaxQueryHeads) {
    return absl::OutOfRangeError(absl::StrCat("decode attention: ", d.num_q_heads,
                                              " query heads, at most ", kMaxQueryHeads));
  }
  const int32_t group = d.num_q_heads / d.num_kv_heads;
  if (variant < 0 || variant >= kernels::kNumDecodeVariants) {
    return absl::InvalidArgumentError(absl::StrCat("decode attention: variant ", variant,
                                                   " outside [0, ", kernels::kNumDecodeVariants,
                                                   ")"));
  }
  if (variant != 0) {
    if (d.head_dim != kernels::kVariantHeadDim || group % kernels::kVariantQueryHeads != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "decode attention: variant ", variant, " is compiled only for head_dim ",
          kernels::kVariantHeadDim, " and groups of a multiple of ", kernels::kVariantQueryHeads,
          " query heads, got head_dim ", d.head_dim, " and a group of ", group));
    }
    return kernels::kVariantQueryHeads;
  }
  return internal::HeadsPerBlock(group);
}

namespace {

// The launch's blocks per work item (kernels::DecodeBlocksPerItem, which the kernel's grid
// uses): what DecodeBlocksPerWorkItem reports and the grid check below counts.
int32_t BlocksPerItem(const DecodeAttentionDims& d, int32_t heads_per_block) {
  return static_cast<int32_t>(kernels::DecodeBlocksPerItem(d.num_q_heads, heads_per_block));
}

// The batch size the KV source describes, its shapes checked, and its part of the kernel's
// arguments.
absl::StatusOr<int64_t> CheckKv(const DecodeKv& kv, kernels::PagedDecodeParams& p) {
  return internal::CheckKvSource("decode attention", kv, p);
}

// q, out, lse and the pools against the batch; the pool slots.
absl::StatusOr<int64_t> CheckBuffers(const PagedDecodeArgs& a, int64_t bs) {
  const DecodeAttentionDims& d = a.dims;
  const int64_t q_bytes = bs * d.num_q_heads * d.head_dim * internal::kElementBytes;
  if (internal::ClaimedSize(a.q) != q_bytes || internal::ClaimedSize(a.out) != q_bytes ||
      internal::ClaimedSize(a.lse) != bs * d.num_q_heads) {
    return absl::InvalidArgumentError(absl::StrCat(
        "decode attention: q of ", a.q.size(), " bytes, out of ", a.out.size(), " bytes and lse of ",
        a.lse.size(), " floats; a batch of ", bs, " wants ", q_bytes, ", ", q_bytes, " and ",
        bs * d.num_q_heads));
  }
  return internal::CheckAttentionBuffers("decode attention", a.q, a.k_pool, a.v_pool, a.out, a.lse,
                                         d.num_kv_heads, d.head_dim);
}

// The counts of the plan the launch runs (work items: the grid). A host plan: checked item by
// item, and its device copy the same size. A device plan: its layout, and counts that are
// consistent and fit the device buffers.
absl::StatusOr<SplitKvPlanCounts> CheckPlanOf(const DecodeSplitKv& s, const KvLayout& layout,
                                              int64_t bs) {
  if (const auto* host = std::get_if<const SplitKvPlan*>(&s.plan)) {
    if (*host == nullptr) return absl::InvalidArgumentError("split-KV: no plan");
    const SplitKvPlan& plan = **host;
    if (absl::Status st = CheckDecodeSplitPlan(plan, layout, bs); !st.ok()) return st;
    if (s.work.size() != plan.work.size() || s.reduce.size() != plan.reduce.size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "split-KV: the device copy holds ", s.work.size(), " work and ", s.reduce.size(),
          " reduce items, the plan ", plan.work.size(), " and ", plan.reduce.size()));
    }
    return SplitKvPlanCounts{plan.chunk, static_cast<int64_t>(plan.work.size()),
                             static_cast<int64_t>(plan.reduce.size()), plan.num_partials};
  }
  const DeviceSplitKvPlan& plan = std::get<DeviceSplitKvPlan>(s.plan);
  if (plan.layout != layout) {
    return absl::InvalidArgumentError(
        absl::StrCat("split-KV device plan: made for layout ", KvLayoutName(plan.layout),
                     ", but this decode reads ", KvLayoutName(layout),
                     " (the graph's split-KV consumer layout must match the KV source)"));
  }
  const SplitKvPlanCounts& c = plan.counts;
  // Every partial slot is one work item's, and partials exist exactly when something merges
  // them.
  if (c.work_items < 0 || c.reduce_items < 0 || c.num_partials < 0 ||
      c.num_partials > c.work_items || (c.num_partials == 0) != (c.reduce_items == 0) ||
      c.reduce_items > c.num_partials) {
    return absl::InvalidArgumentError(absl::StrCat(
        "split-KV device plan: counts of ", c.work_items, " work items, ", c.reduce_items,
        " reduce items and ", c.num_partials, " partial slots are not a plan's"));
  }
  // A decode plan gives every sequence of the batch an item; none when there is no batch.
  if ((bs > 0) != (c.work_items > 0)) {
    return absl::InvalidArgumentError(absl::StrCat("split-KV device plan: ", c.work_items,
                                                   " work items for a batch of ", bs));
  }
  if (c.work_items > kMaxBlocks) {
    return absl::OutOfRangeError(absl::StrCat("split-KV device plan: ", c.work_items,
                                              " work items, at most ", kMaxBlocks));
  }
  if (c.work_items > internal::ClaimedSize(s.work) ||
      c.reduce_items > internal::ClaimedSize(s.reduce)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "split-KV device plan: ", c.work_items, " work and ", c.reduce_items,
        " reduce items, but the device buffers hold ", s.work.size(), " and ", s.reduce.size()));
  }
  return c;
}

absl::StatusOr<SplitKvPlanCounts> CheckSplit(const DecodeSplitKv& s, const DecodeAttentionDims& d,
                                             const KvLayout& layout, int64_t bs) {
  absl::StatusOr<SplitKvPlanCounts> counts = CheckPlanOf(s, layout, bs);
  if (!counts.ok()) return counts.status();
  const SplitKvPlanCounts& plan = *counts;
  const int64_t need_out = int64_t{plan.num_partials} * d.num_q_heads * d.head_dim;
  const int64_t need_lse = int64_t{plan.num_partials} * d.num_q_heads;
  if (internal::ClaimedSize(s.partial_out) < need_out ||
      internal::ClaimedSize(s.partial_lse) < need_lse) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "split-KV: partial_out holds ", s.partial_out.size(), " floats and partial_lse ",
        s.partial_lse.size(), "; the plan's ", plan.num_partials, " partial slots need ", need_out,
        " and ", need_lse));
  }
  const int64_t need_counters = plan.reduce_items * d.num_q_heads;
  if (!s.merge_counters.empty() && internal::ClaimedSize(s.merge_counters) < need_counters) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "split-KV: merge_counters holds ", s.merge_counters.size(), " counters; the plan's ",
        plan.reduce_items, " reduce items x ", d.num_q_heads, " query heads need ", need_counters));
  }
  if (!Aligned(s.partial_out.data(), kVectorBytes)) {
    return absl::InvalidArgumentError("split-KV: partial_out must be 16-byte aligned");
  }
  for (absl::Status st : {CheckNotNull("work", s.work), CheckNotNull("reduce", s.reduce),
                          CheckNotNull("partial_out", s.partial_out),
                          CheckNotNull("partial_lse", s.partial_lse),
                          CheckNotNull("merge_counters", s.merge_counters)}) {
    if (!st.ok()) return st;
  }
  return plan;
}

}  // namespace

KvLayout DecodeKvLayout(const DecodeKv& kv) {
  if (const auto* pt = std::get_if<DecodePageTableKv>(&kv)) return KvLayout::Paged(pt->page_size);
  return KvLayout::LinearPerToken();
}


absl::StatusOr<int32_t> DecodeBlocksPerWorkItem(const DecodeAttentionDims& dims, int32_t variant) {
  absl::StatusOr<int32_t> heads_per_block = DecodeQueryHeadsPerBlock(dims, variant);
  if (!heads_per_block.ok()) return heads_per_block.status();
  return BlocksPerItem(dims, *heads_per_block);
}

absl::StatusOr<PagedDecodeLaunch> PagedDecodeLaunchFor(const PagedDecodeArgs& a,
                                                       kernels::DeviceViolation* violation) {
  absl::StatusOr<int32_t> heads_per_block = DecodeQueryHeadsPerBlock(a.dims, a.variant);
  if (!heads_per_block.ok()) return heads_per_block.status();
  PagedDecodeLaunch launch;
  kernels::PagedDecodeParams& p = launch.attention;
  absl::StatusOr<int64_t> bs = CheckKv(a.kv, p);
  if (!bs.ok()) return bs.status();
  if (*bs > std::numeric_limits<int32_t>::max()) {
    return absl::OutOfRangeError("decode attention: batch beyond int32");
  }
  absl::StatusOr<int64_t> pool_slots = CheckBuffers(a, *bs);
  if (!pool_slots.ok()) return pool_slots.status();
  SplitKvPlanCounts split;
  if (a.split.has_value()) {
    absl::StatusOr<SplitKvPlanCounts> checked =
        CheckSplit(*a.split, a.dims, DecodeKvLayout(a.kv), *bs);
    if (!checked.ok()) return checked.status();
    split = *checked;
  }
  if (a.checked != nullptr) {
    LaunchedMetadataShape shape = internal::LaunchedKvShape(a.kv, *bs, *bs, *pool_slots);
    shape.max_q_len = TokenCount(*bs > 0 ? 1 : 0);
    if (a.split.has_value()) {
      if (const auto* host = std::get_if<const SplitKvPlan*>(&a.split->plan)) {
        shape.split_plan = *host;
      }
    }
    if (absl::Status s = CheckLaunchedMetadata(*a.checked, shape); !s.ok()) return s;
  }
  const int64_t items = a.split.has_value() ? split.work_items : *bs;
  const int64_t blocks = items * BlocksPerItem(a.dims, *heads_per_block);
  if (blocks > kMaxBlocks) {
    return absl::OutOfRangeError(absl::StrCat("decode attention: ", blocks, " blocks, at most ",
                                              kMaxBlocks, " (fewer work items or heads)"));
  }
  launch.blocks = blocks;
  if (blocks == 0) return launch;

  p.q = a.q.data();
  p.k_pool = a.k_pool.data();
  p.v_pool = a.v_pool.data();
  p.kv.pool_slots = *pool_slots;
  p.num_work = static_cast<int32_t>(items);
  if (a.split.has_value()) {
    p.work = reinterpret_cast<const kernels::DecodeWorkItem*>(a.split->work.data());
    p.partial_out = a.split->partial_out.data();
    p.partial_lse = a.split->partial_lse.data();
    p.partial_capacity = split.num_partials;
    if (!a.split->merge_counters.empty() && split.reduce_items > 0) {
      p.reduce = reinterpret_cast<const kernels::DecodeReduceItem*>(a.split->reduce.data());
      p.num_reduce = static_cast<int32_t>(split.reduce_items);
      p.merge_counters = a.split->merge_counters.data();
    }
  }
  p.out = a.out.data();
  p.lse = a.lse.data();
  p.batch_size = static_cast<int32_t>(*bs);
  p.num_q_heads = a.dims.num_q_heads;
  p.num_kv_heads = a.dims.num_kv_heads;
  p.head_dim = a.dims.head_dim;
  p.heads_per_block = *heads_per_block;
  p.dtype = internal::ElementDtypeOf(a.dims.dtype);
  p.variant = a.variant;
  p.softmax_scale = a.dims.softmax_scale;
  p.violation = violation;
  p.metadata_before_wait = a.overlap == DecodeLaunchOverlap::kMetadataFirst;
  p.warm_l2_before_wait = a.overlap == DecodeLaunchOverlap::kWarmL2First;
  if (!a.split.has_value() || split.reduce_items == 0 || p.merge_counters != nullptr) {
    return launch;
  }
  launch.merge_launch = true;
  kernels::DecodeMergeParams& m = launch.merge;
  m.reduce = reinterpret_cast<const kernels::DecodeReduceItem*>(a.split->reduce.data());
  m.num_reduce = static_cast<int32_t>(split.reduce_items);
  m.partial_out = p.partial_out;
  m.partial_lse = p.partial_lse;
  m.partial_capacity = p.partial_capacity;
  m.out = p.out;
  m.lse = p.lse;
  m.batch_size = p.batch_size;
  m.num_q_heads = p.num_q_heads;
  m.head_dim = p.head_dim;
  m.dtype = p.dtype;
  m.violation = violation;
  return launch;
}

}  // namespace attnmeta
