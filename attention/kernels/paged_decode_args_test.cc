// PagedDecodeLaunchFor on the CPU: every check the decode launcher makes before it launches,
// and the launches it makes for arguments that pass. The spans point into host memory: the
// checks never read through them (paged_decode_args.h).

#include "attention/kernels/paged_decode_args.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "attention/kernels/checked_metadata.h"
#include "attention/kernels/decode_split_planner.h"
#include "attention/kernels/device_span.h"
#include "attention/kernels/paged_decode_attention.h"
#include "attention/kernels/testing/host_buffer.h"
#include "attention/metadata/builders.h"
#include "attention/metadata/forward_metadata.h"
#include "attention/metadata/split_kv_planner.h"
#include "attention/metadata/testing/batch_fixture.h"
#include "attention/metadata/validator.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kvcache/units.h"

namespace attnmeta {
namespace {

using testing::BatchFixture;
using testing::HostBuffer;
using testing::HostSpan;

constexpr absl::StatusCode kInvalid = absl::StatusCode::kInvalidArgument;

DeviceSplitKvPlan DevicePlanOf(const SplitKvPlan& plan) {
  return DeviceSplitKvPlan{
      plan.layout, SplitKvPlanCounts{plan.chunk, static_cast<int64_t>(plan.work.size()),
                                     static_cast<int64_t>(plan.reduce.size()), plan.num_partials}};
}

// A decode batch of three sequences (page size 16, 32 query / 8 KV heads, head dim 128, bf16)
// with its host metadata, a split plan of it and host buffers of the launch's sizes.
class PagedDecodeArgsTest : public ::testing::Test {
 protected:
  static constexpr int32_t kQHeads = 32;
  static constexpr int32_t kKvHeads = 8;
  static constexpr int32_t kHeadDim = 128;

  PagedDecodeArgsTest()
      : fixture_(16, /*seed=*/71, /*num_pages=*/128, /*max_reqs=*/8, /*max_context=*/512) {
    for (int64_t len : {200, 50, 333}) fixture_.AddSequence(len - 1, 1);
    absl::StatusOr<ForwardMetadata> m = BuildForwardMetadata(
        fixture_.Batch(ForwardMode::kDecode), fixture_.pool(), fixture_.page_size());
    EXPECT_TRUE(m.ok()) << m.status();
    metadata_ = *std::move(m);
    bs_ = static_cast<int64_t>(metadata_.kv_lens.size());
    q_bytes_ = bs_ * kQHeads * kHeadDim * 2;
    pool_bytes_ = fixture_.pool_slots().value() * kKvHeads * kHeadDim * 2;
    absl::StatusOr<SplitKvPlan> plan =
        PlanDecodeSplitKv(metadata_.kv_indptr, KvLayout::LinearPerToken(),
                          DecodeSplitOptions{8, 8, /*blocks_per_multiprocessor=*/8});
    EXPECT_TRUE(plan.ok()) << plan.status();
    plan_ = *std::move(plan);
    EXPECT_GT(plan_.num_partials, 0);
    const absl::Span<const PageId> table = metadata_.page_table.span().entries();
    page_table_.assign(table.begin(), table.end());
    q_ = HostBuffer(q_bytes_);
    out_ = HostBuffer(q_bytes_);
    lse_ = HostBuffer(bs_ * kQHeads * 4);
    k_ = HostBuffer(pool_bytes_);
    v_ = HostBuffer(pool_bytes_);
    partial_out_ = HostBuffer(PartialFloats() * 4);
    partial_lse_ = HostBuffer(int64_t{plan_.num_partials} * kQHeads * 4);
    counters_ = HostBuffer(static_cast<int64_t>(plan_.reduce.size()) * kQHeads * 4);
  }

  DecodeAttentionDims Dims() const {
    DecodeAttentionDims d;
    d.num_q_heads = kQHeads;
    d.num_kv_heads = kKvHeads;
    d.head_dim = kHeadDim;
    d.dtype = KvElementType::kBf16;
    d.softmax_scale = 1.0f / std::sqrt(static_cast<float>(kHeadDim));
    return d;
  }
  DecodeKv TokenLevel() const {
    return DecodeTokenLevelKv{HostSpan(metadata_.kv_indptr), HostSpan(metadata_.kv_indices)};
  }
  DecodeKv PageLevel() const {
    return DecodePageTableKv{HostSpan(page_table_), PageCount(metadata_.page_table.cols()),
                             HostSpan(metadata_.kv_lens), fixture_.page_size()};
  }
  int64_t PartialFloats() const { return int64_t{plan_.num_partials} * kQHeads * kHeadDim; }

  // Arguments that pass: token-level KV and the host split plan, merged by a second launch.
  PagedDecodeArgs Good() {
    PagedDecodeArgs a;
    a.dims = Dims();
    a.q = q_.span<const uint8_t>();
    a.k_pool = k_.span<const uint8_t>();
    a.v_pool = v_.span<const uint8_t>();
    a.kv = TokenLevel();
    a.split = DecodeSplitKv{&plan_, HostSpan(plan_.work), HostSpan(plan_.reduce),
                            partial_out_.span<float>(), partial_lse_.span<float>()};
    a.out = out_.span<uint8_t>();
    a.lse = lse_.span<float>();
    return a;
  }

  BatchFixture fixture_;
  ForwardMetadata metadata_;
  std::vector<PageId> page_table_;
  SplitKvPlan plan_;
  int64_t bs_ = 0;
  int64_t q_bytes_ = 0;
  int64_t pool_bytes_ = 0;
  HostBuffer q_, out_, lse_, k_, v_, partial_out_, partial_lse_, counters_;
};

// The launch runs the variant it is asked for (variant 4 is the portable MMA path AMD runs).
TEST_F(PagedDecodeArgsTest, TheLaunchRunsItsVariant) {
  for (int32_t v = 0; v < kernels::kNumDecodeVariants; ++v) {
    PagedDecodeArgs a = Good();
    a.variant = v;
    absl::StatusOr<PagedDecodeLaunch> launch = PagedDecodeLaunchFor(a, nullptr);
    ASSERT_TRUE(launch.ok()) << "variant " << v << ": " << launch.status();
    EXPECT_EQ(launch->attention.variant, v);
  }
}

TEST_F(PagedDecodeArgsTest, AHostPlanLaunchesItsItemsAndAMerge) {
  kernels::DeviceViolation violation{};
  absl::StatusOr<PagedDecodeLaunch> launch = PagedDecodeLaunchFor(Good(), &violation);
  ASSERT_TRUE(launch.ok()) << launch.status();
  const kernels::PagedDecodeParams& p = launch->attention;
  EXPECT_EQ(p.q, q_.data());
  EXPECT_EQ(p.k_pool, k_.data());
  EXPECT_EQ(p.v_pool, v_.data());
  EXPECT_EQ(p.out, out_.data());
  EXPECT_EQ(p.lse, reinterpret_cast<float*>(lse_.data()));
  EXPECT_EQ(p.work, reinterpret_cast<const kernels::DecodeWorkItem*>(plan_.work.data()));
  EXPECT_EQ(p.partial_out, reinterpret_cast<float*>(partial_out_.data()));
  EXPECT_EQ(p.partial_lse, reinterpret_cast<float*>(partial_lse_.data()));
  EXPECT_EQ(p.num_q_heads, kQHeads);
  EXPECT_EQ(p.num_kv_heads, kKvHeads);
  EXPECT_EQ(p.head_dim, kHeadDim);
  EXPECT_EQ(p.variant, 0);
  EXPECT_EQ(p.softmax_scale, Dims().softmax_scale);
  EXPECT_EQ(p.violation, &violation);
  // A group of 4 query heads per KV head: one block of 4 heads per KV head and item.
  EXPECT_EQ(p.heads_per_block, 4);
  EXPECT_EQ(launch->blocks, static_cast<int64_t>(plan_.work.size()) * kQHeads / 4);
  EXPECT_EQ(p.num_work, static_cast<int32_t>(plan_.work.size()));
  EXPECT_EQ(p.batch_size, 3);
  EXPECT_EQ(p.kv.page_level, 0);
  EXPECT_EQ(p.kv.kv_indices_capacity, static_cast<int64_t>(metadata_.kv_indices.size()));
  EXPECT_EQ(p.kv.pool_slots, fixture_.pool_slots().value());
  EXPECT_EQ(p.partial_capacity, plan_.num_partials);
  EXPECT_EQ(p.merge_counters, nullptr);
  EXPECT_EQ(p.dtype, kernels::kElementBf16);
  EXPECT_FALSE(p.metadata_before_wait);
  EXPECT_FALSE(p.warm_l2_before_wait);
  ASSERT_TRUE(launch->merge_launch);
  EXPECT_EQ(launch->merge.num_reduce, static_cast<int32_t>(plan_.reduce.size()));
  EXPECT_EQ(launch->merge.partial_capacity, plan_.num_partials);
  EXPECT_EQ(launch->merge.reduce,
            reinterpret_cast<const kernels::DecodeReduceItem*>(plan_.reduce.data()));
  EXPECT_EQ(launch->merge.partial_out, reinterpret_cast<float*>(partial_out_.data()));
  EXPECT_EQ(launch->merge.partial_lse, reinterpret_cast<float*>(partial_lse_.data()));
  EXPECT_EQ(launch->merge.out, out_.data());
  EXPECT_EQ(launch->merge.lse, reinterpret_cast<float*>(lse_.data()));
  EXPECT_EQ(launch->merge.batch_size, 3);
  EXPECT_EQ(launch->merge.num_q_heads, kQHeads);
  EXPECT_EQ(launch->merge.head_dim, kHeadDim);
  EXPECT_EQ(launch->merge.dtype, kernels::kElementBf16);
  EXPECT_EQ(launch->merge.violation, &violation);
}

TEST_F(PagedDecodeArgsTest, MergeCountersMergeInTheAttentionLaunch) {
  PagedDecodeArgs a = Good();
  a.split->merge_counters = counters_.span<uint32_t>();
  a.overlap = DecodeLaunchOverlap::kMetadataFirst;
  absl::StatusOr<PagedDecodeLaunch> launch = PagedDecodeLaunchFor(a, nullptr);
  ASSERT_TRUE(launch.ok()) << launch.status();
  EXPECT_FALSE(launch->merge_launch);
  EXPECT_EQ(launch->attention.num_reduce, static_cast<int32_t>(plan_.reduce.size()));
  EXPECT_NE(launch->attention.merge_counters, nullptr);
  EXPECT_TRUE(launch->attention.metadata_before_wait);
  EXPECT_FALSE(launch->attention.warm_l2_before_wait);
}

// Each overlapping mode's two kernel flags: only kMetadataFirst reads before the wait, only
// kWarmL2First warms L2 before it.
TEST_F(PagedDecodeArgsTest, EachOverlapModeSetsItsKernelFlags) {
  for (const DecodeLaunchOverlap overlap :
       {DecodeLaunchOverlap::kNone, DecodeLaunchOverlap::kWaitFirst,
        DecodeLaunchOverlap::kMetadataFirst, DecodeLaunchOverlap::kWarmL2First}) {
    SCOPED_TRACE(static_cast<int>(overlap));
    PagedDecodeArgs a = Good();
    a.overlap = overlap;
    absl::StatusOr<PagedDecodeLaunch> launch = PagedDecodeLaunchFor(a, nullptr);
    ASSERT_TRUE(launch.ok()) << launch.status();
    EXPECT_EQ(launch->attention.metadata_before_wait,
              overlap == DecodeLaunchOverlap::kMetadataFirst);
    EXPECT_EQ(launch->attention.warm_l2_before_wait, overlap == DecodeLaunchOverlap::kWarmL2First);
  }
}

// A plan held only on the device runs its counts, not what its buffers (a graph's, sized to
// their capacity) could hold.
TEST_F(PagedDecodeArgsTest, ADevicePlanRunsItsCountsNotItsBuffers) {
  std::vector<SplitKvWorkItem> work(plan_.work);
  std::vector<SplitKvReduceItem> reduce(plan_.reduce);
  work.resize(work.size() + 5);
  reduce.resize(reduce.size() + 3);
  PagedDecodeArgs a = Good();
  a.split->plan = DevicePlanOf(plan_);
  a.split->work = HostSpan(work);
  a.split->reduce = HostSpan(reduce);
  absl::StatusOr<PagedDecodeLaunch> launch = PagedDecodeLaunchFor(a, nullptr);
  ASSERT_TRUE(launch.ok()) << launch.status();
  EXPECT_EQ(launch->attention.num_work, static_cast<int32_t>(plan_.work.size()));
  EXPECT_EQ(launch->blocks, static_cast<int64_t>(plan_.work.size()) * kQHeads / 4);
  ASSERT_TRUE(launch->merge_launch);
  EXPECT_EQ(launch->merge.num_reduce, static_cast<int32_t>(plan_.reduce.size()));
  a.split->merge_counters = counters_.span<uint32_t>();
  launch = PagedDecodeLaunchFor(a, nullptr);
  ASSERT_TRUE(launch.ok()) << launch.status();
  EXPECT_EQ(launch->attention.num_reduce, static_cast<int32_t>(plan_.reduce.size()));
}

// An empty batch with a device plan of work items would launch blocks for no sequence.
TEST_F(PagedDecodeArgsTest, AnEmptyBatchTakesNoDevicePlanItems) {
  PagedDecodeArgs a = Good();
  const std::vector<TokenOffset> zero = {TokenOffset(0)};
  a.kv = DecodeTokenLevelKv{HostSpan(zero), {}};
  a.q = {};
  a.out = {};
  a.lse = {};
  a.split->plan = DevicePlanOf(plan_);
  const absl::Status s = PagedDecodeLaunchFor(a, nullptr).status();
  EXPECT_EQ(s.code(), kInvalid) << s;
  EXPECT_NE(s.message().find("split-KV device plan: 6 work items for a batch of 0"),
            absl::string_view::npos)
      << s;
}

TEST_F(PagedDecodeArgsTest, WithoutAPlanEachSequenceIsOneItem) {
  PagedDecodeArgs a = Good();
  a.kv = PageLevel();
  a.split.reset();
  absl::StatusOr<PagedDecodeLaunch> launch = PagedDecodeLaunchFor(a, nullptr);
  ASSERT_TRUE(launch.ok()) << launch.status();
  EXPECT_EQ(launch->blocks, 3 * kQHeads / 4);
  EXPECT_EQ(launch->attention.work, nullptr);
  EXPECT_EQ(launch->attention.kv.page_level, 1);
  EXPECT_EQ(launch->attention.kv.page_size, 16);
  EXPECT_EQ(launch->attention.kv.page_table_cols, metadata_.page_table.cols().value());
  EXPECT_EQ(launch->attention.kv.kv_lens,
            reinterpret_cast<const int32_t*>(metadata_.kv_lens.data()));
  EXPECT_FALSE(launch->merge_launch);
  a.dims.dtype = KvElementType::kFp16;
  launch = PagedDecodeLaunchFor(a, nullptr);
  ASSERT_TRUE(launch.ok()) << launch.status();
  EXPECT_EQ(launch->attention.dtype, kernels::kElementFp16);
  // An empty batch launches nothing.
  const std::vector<TokenOffset> zero = {TokenOffset(0)};
  a.kv = DecodeTokenLevelKv{HostSpan(zero), {}};
  a.q = {};
  a.out = {};
  a.lse = {};
  launch = PagedDecodeLaunchFor(a, nullptr);
  ASSERT_TRUE(launch.ok()) << launch.status();
  EXPECT_EQ(launch->blocks, 0);
}

// What the host can see is refused, with the code the contract gives.
TEST_F(PagedDecodeArgsTest, BadArgumentsAreRefused) {
  std::vector<TokenOffset> longer(metadata_.kv_indptr);
  longer.push_back(longer.back() + TokenCount(10));
  absl::StatusOr<SplitKvPlan> plan4 = PlanDecodeSplitKv(
      longer, KvLayout::LinearPerToken(), DecodeSplitOptions{8, 8, /*blocks_per_multiprocessor=*/8});
  ASSERT_TRUE(plan4.ok()) << plan4.status();
  // The plan without the items of the last sequence.
  SplitKvPlan missing = plan_;
  missing.work.erase(std::remove_if(missing.work.begin(), missing.work.end(),
                                    [&](const SplitKvWorkItem& w) { return w.sequence == bs_ - 1; }),
                     missing.work.end());
  missing.reduce.erase(
      std::remove_if(missing.reduce.begin(), missing.reduce.end(),
                     [&](const SplitKvReduceItem& r) { return r.sequence == bs_ - 1; }),
      missing.reduce.end());
  // Its partial slots those of the items left, so that only the missing sequence is wrong.
  missing.num_partials = static_cast<int32_t>(
      std::count_if(missing.work.begin(), missing.work.end(),
                    [](const SplitKvWorkItem& w) { return w.partial_slot >= 0; }));
  // A plan claiming far more partial slots than it has items, and one whose first item starts
  // past position 0 (a gap).
  SplitKvPlan many = plan_;
  many.num_partials = std::numeric_limits<int32_t>::max();
  SplitKvPlan gap = plan_;
  gap.work[0].kv_begin = TokenPosition(gap.work[0].kv_begin.value() + 1);
  ASSERT_LE(gap.work[0].kv_begin.value(), gap.work[0].kv_end.value());

  // Checked mode: the host copy of the metadata, and copies that fail validation although
  // every slot is inside the pool (no kernel guard would see them) or belong to another batch.
  ValidationContext ctx{fixture_.pool_slots(), fixture_.page_size(), TokenCount(bs_)};
  ctx.check_slot_ownership = true;
  const CheckedMetadata checked{metadata_.view(), ctx};
  ForwardMetadata skewed = metadata_;  // kv_indptr no longer steps by kv_lens
  skewed.kv_indptr[1] = TokenOffset(skewed.kv_indptr[1].value() + 1);
  ForwardMetadata table = metadata_;  // a page-table entry that is not kv_indices' page
  PageId& entry = table.page_table.span().row(1)[0];
  entry = PageId(entry.value() + 1);
  const CheckedMetadata checked_skewed{skewed.view(), ctx};
  const CheckedMetadata checked_table{table.view(), ctx};
  ValidationContext fewer_rows = ctx;
  fewer_rows.num_query_rows = TokenCount(bs_ - 1);
  const CheckedMetadata checked_other{metadata_.view(), fewer_rows};
  // The plan of the step before: the last item of the last sequence ends one token short (it
  // still tiles from 0, so only checked mode, which knows the lengths, can tell).
  SplitKvPlan stale = plan_;
  SplitKvWorkItem* last_item = nullptr;
  for (SplitKvWorkItem& w : stale.work) {
    if (w.sequence == bs_ - 1 && (last_item == nullptr || w.kv_end > last_item->kv_end)) {
      last_item = &w;
    }
  }
  ASSERT_NE(last_item, nullptr);
  ASSERT_LT(last_item->kv_begin.value() + 1, last_item->kv_end.value());
  last_item->kv_end = TokenPosition(last_item->kv_end.value() - 1);

  const int64_t partial_floats = PartialFloats();
  const size_t counters = plan_.reduce.size() * kQHeads;
  const PageCount cols(metadata_.page_table.cols());
  using Edit = std::function<void(PagedDecodeArgs&)>;
  struct Case {
    const char* what;
    Edit edit;
    absl::StatusCode code;
    // The check that refuses it, not a later one that a wrong case would reach.
    const char* message;
  };
  const Case cases[] = {
      {"checked: kv_indptr not stepping by kv_lens",
       [&](PagedDecodeArgs& a) { a.checked = &checked_skewed; }, kInvalid,
       "checked mode: kv_indptr: step 0 = 201 differs from kv_lens[0] = 200"},
      {"checked: a context of another launch's query rows",
       [&](PagedDecodeArgs& a) { a.checked = &checked_other; }, kInvalid,
       "checked mode: the context's num_query_rows is 2, the launch's query"},
      {"checked: the host plan of the step before",
       [&](PagedDecodeArgs& a) {
         a.split->plan = &stale;
         a.checked = &checked;
       },
       kInvalid, "checked mode: the split-KV plan's items of sequence 2 end at 332, its"},
      {"checked: a page table that disagrees with kv_indices",
       [&](PagedDecodeArgs& a) {
         a.kv = PageLevel();
         a.split.reset();
         a.checked = &checked_table;
       },
       kInvalid, "checked mode: page_table: [1][0] = page 45 disagrees with kv_indices:"},
      {"heads that do not divide", [](PagedDecodeArgs& a) { a.dims.num_kv_heads = 5; }, kInvalid,
       "decode attention: num_q_heads 32 is not a positive multiple of"},
      {"no query heads", [](PagedDecodeArgs& a) { a.dims.num_q_heads = 0; }, kInvalid,
       "decode attention: num_q_heads 0 is not a positive multiple of"},
      {"no KV heads", [](PagedDecodeArgs& a) { a.dims.num_kv_heads = 0; }, kInvalid,
       "decode attention: num_q_heads 32 is not a positive multiple of"},
      {"more query heads than the merge grid",
       [](PagedDecodeArgs& a) {
         a.dims.num_q_heads = 65536;
         a.dims.num_kv_heads = 1;
       },
       absl::StatusCode::kOutOfRange, "decode attention: 65536 query heads, at most 65535"},
      {"head dim 96", [](PagedDecodeArgs& a) { a.dims.head_dim = 96; }, kInvalid,
       "decode attention: head_dim 96 is not 64, 128 or 256"},
      {"head dim 512", [](PagedDecodeArgs& a) { a.dims.head_dim = 512; }, kInvalid,
       "decode attention: head_dim 512 is not 64, 128 or 256"},
      {"unknown element type",
       [](PagedDecodeArgs& a) { a.dims.dtype = static_cast<KvElementType>(7); }, kInvalid,
       "decode attention: unknown element type"},
      {"NaN scale", [](PagedDecodeArgs& a) { a.dims.softmax_scale = std::nanf(""); }, kInvalid,
       "decode attention: softmax_scale nan is not finite and > 0"},
      {"zero scale", [](PagedDecodeArgs& a) { a.dims.softmax_scale = 0; }, kInvalid,
       "decode attention: softmax_scale 0 is not finite and > 0"},
      {"infinite scale",
       [](PagedDecodeArgs& a) { a.dims.softmax_scale = std::numeric_limits<float>::infinity(); },
       kInvalid, "decode attention: softmax_scale inf is not finite and > 0"},
      {"variant -1", [](PagedDecodeArgs& a) { a.variant = -1; }, kInvalid,
       "decode attention: variant -1 outside [0, 5)"},
      {"variant past the table",
       [](PagedDecodeArgs& a) { a.variant = kernels::kNumDecodeVariants; }, kInvalid,
       "decode attention: variant 5 outside [0, 5)"},
      {"variant not compiled for the group",
       [](PagedDecodeArgs& a) {
         a.variant = 1;
         a.dims.num_q_heads = 16;  // a group of 2
       },
       kInvalid, "decode attention: variant 1 is compiled only for head_dim 128 and"},
      {"variant not compiled for the head dim",
       [](PagedDecodeArgs& a) {
         a.variant = 1;
         a.dims.head_dim = 64;
       },
       kInvalid, "decode attention: variant 1 is compiled only for head_dim 128 and"},
      {"q misaligned",
       [&](PagedDecodeArgs& a) { a.q = DeviceSpan<const uint8_t>(q_.data() + 2, q_bytes_); },
       kInvalid, "decode attention: q, k_pool, v_pool and out must be 16-byte aligned"},
      {"k_pool misaligned",
       [&](PagedDecodeArgs& a) {
         a.k_pool = DeviceSpan<const uint8_t>(k_.data() + 8, pool_bytes_);
       },
       kInvalid, "decode attention: q, k_pool, v_pool and out must be 16-byte aligned"},
      {"v_pool misaligned",
       [&](PagedDecodeArgs& a) {
         a.v_pool = DeviceSpan<const uint8_t>(v_.data() + 4, pool_bytes_);
       },
       kInvalid, "decode attention: q, k_pool, v_pool and out must be 16-byte aligned"},
      {"out misaligned",
       [&](PagedDecodeArgs& a) { a.out = DeviceSpan<uint8_t>(out_.data() + 2, q_bytes_); },
       kInvalid, "decode attention: q, k_pool, v_pool and out must be 16-byte aligned"},
      {"partial_out misaligned",
       [&](PagedDecodeArgs& a) {
         a.split->partial_out =
             DeviceSpan<float>(reinterpret_cast<float*>(partial_out_.data()) + 1, partial_floats);
       },
       kInvalid, "split-KV: partial_out must be 16-byte aligned"},
      {"null q", [&](PagedDecodeArgs& a) { a.q = DeviceSpan<const uint8_t>(nullptr, q_bytes_); },
       kInvalid, "q has 24576 elements but a null pointer"},
      {"null k_pool",
       [&](PagedDecodeArgs& a) { a.k_pool = DeviceSpan<const uint8_t>(nullptr, pool_bytes_); },
       kInvalid, "k_pool has 4227072 elements but a null pointer"},
      {"null v_pool",
       [&](PagedDecodeArgs& a) { a.v_pool = DeviceSpan<const uint8_t>(nullptr, pool_bytes_); },
       kInvalid, "v_pool has 4227072 elements but a null pointer"},
      {"null out", [&](PagedDecodeArgs& a) { a.out = DeviceSpan<uint8_t>(nullptr, q_bytes_); },
       kInvalid, "out has 24576 elements but a null pointer"},
      {"null lse", [&](PagedDecodeArgs& a) { a.lse = DeviceSpan<float>(nullptr, bs_ * kQHeads); },
       kInvalid, "lse has 96 elements but a null pointer"},
      {"null kv_indptr",
       [&](PagedDecodeArgs& a) {
         a.kv = DecodeTokenLevelKv{DeviceSpan<const TokenOffset>(nullptr, bs_ + 1),
                                   HostSpan(metadata_.kv_indices)};
       },
       kInvalid, "kv_indptr has 4 elements but a null pointer"},
      {"null kv_indices",
       [&](PagedDecodeArgs& a) {
         a.kv = DecodeTokenLevelKv{HostSpan(metadata_.kv_indptr),
                                   DeviceSpan<const TokenSlot>(nullptr, metadata_.kv_indices.size())};
       },
       kInvalid, "kv_indices has 583 elements but a null pointer"},
      {"null page table",
       [&](PagedDecodeArgs& a) {
         a.kv = DecodePageTableKv{DeviceSpan<const PageId>(nullptr, page_table_.size()), cols,
                                  HostSpan(metadata_.kv_lens), fixture_.page_size()};
         a.split.reset();
       },
       kInvalid, "page_table has 63 elements but a null pointer"},
      {"null kv_lens",
       [&](PagedDecodeArgs& a) {
         a.kv = DecodePageTableKv{HostSpan(page_table_), cols,
                                  DeviceSpan<const TokenLength>(nullptr, bs_),
                                  fixture_.page_size()};
         a.split.reset();
       },
       kInvalid, "kv_lens has 3 elements but a null pointer"},
      {"no kv_indptr",
       [&](PagedDecodeArgs& a) {
         a.kv = DecodeTokenLevelKv{{}, HostSpan(metadata_.kv_indices)};
       },
       kInvalid, "decode attention: kv_indptr needs bs + 1 >= 1 entries"},
      {"q of another batch",
       [&](PagedDecodeArgs& a) { a.q = DeviceSpan<const uint8_t>(q_.data(), q_bytes_ - 512); },
       kInvalid, "decode attention: q of 24064 bytes, out of 24576 bytes and lse of 96"},
      {"out of another batch",
       [&](PagedDecodeArgs& a) { a.out = DeviceSpan<uint8_t>(out_.data(), q_bytes_ - 512); },
       kInvalid, "decode attention: q of 24576 bytes, out of 24064 bytes and lse of 96"},
      {"lse of another batch",
       [&](PagedDecodeArgs& a) {
         a.lse = DeviceSpan<float>(reinterpret_cast<float*>(lse_.data()), bs_ * kQHeads + 1);
       },
       kInvalid, "decode attention: q of 24576 bytes, out of 24576 bytes and lse of 97"},
      {"K and V pools of different sizes",
       [&](PagedDecodeArgs& a) {
         a.v_pool = DeviceSpan<const uint8_t>(v_.data(), pool_bytes_ - 2048);
       },
       kInvalid, "decode attention: K/V pools of 4227072 and 4225024 bytes are not the"},
      {"pools that are not whole rows",
       [&](PagedDecodeArgs& a) {
         a.k_pool = DeviceSpan<const uint8_t>(k_.data(), pool_bytes_ - 16);
         a.v_pool = DeviceSpan<const uint8_t>(v_.data(), pool_bytes_ - 16);
       },
       kInvalid, "decode attention: K/V pools of 4227056 and 4227056 bytes are not the"},
      {"a pool of more than 2^31 slots",
       [&](PagedDecodeArgs& a) {
         const size_t bytes = ((size_t{1} << 31) + 1) * kKvHeads * kHeadDim * 2;
         a.k_pool = DeviceSpan<const uint8_t>(k_.data(), bytes);
         a.v_pool = DeviceSpan<const uint8_t>(v_.data(), bytes);
       },
       absl::StatusCode::kOutOfRange, "decode attention: more than 2^31 pool slots"},
      {"pools whose claimed size passes INT64_MAX",
       [&](PagedDecodeArgs& a) {
         // A whole number of rows, negative as an int64 (-2048): once it passed as -1 slots,
         // which the kernel's unsigned slot check reads as no bound.
         a.k_pool = DeviceSpan<const uint8_t>(k_.data(), SIZE_MAX - 2047);
         a.v_pool = DeviceSpan<const uint8_t>(v_.data(), SIZE_MAX - 2047);
       },
       absl::StatusCode::kOutOfRange, "decode attention: more than 2^31 pool slots"},
      {"kv_indices whose claimed size passes INT64_MAX",
       [&](PagedDecodeArgs& a) {
         a.kv = DecodeTokenLevelKv{
             HostSpan(metadata_.kv_indptr),
             DeviceSpan<const TokenSlot>(metadata_.kv_indices.data(), (size_t{1} << 63) + 1)};
       },
       absl::StatusCode::kOutOfRange,
       "decode attention: kv_indices of 9223372036854775809 entries, at most"},
      {"a batch beyond int32",
       [&](PagedDecodeArgs& a) {
         a.kv = DecodeTokenLevelKv{
             DeviceSpan<const TokenOffset>(metadata_.kv_indptr.data(), (size_t{1} << 31) + 2),
             HostSpan(metadata_.kv_indices)};
         a.split.reset();
       },
       absl::StatusCode::kOutOfRange, "decode attention: batch beyond int32"},
      {"kv_indices beyond 2^30 entries",
       [&](PagedDecodeArgs& a) {
         a.kv = DecodeTokenLevelKv{HostSpan(metadata_.kv_indptr),
                                   DeviceSpan<const TokenSlot>(metadata_.kv_indices.data(),
                                                               (size_t{1} << 30) + 1)};
       },
       absl::StatusCode::kOutOfRange,
       "decode attention: kv_indices of 1073741825 entries, at most 1073741824"},
      {"page table smaller than the batch",
       [&](PagedDecodeArgs& a) {
         a.kv = DecodePageTableKv{DeviceSpan<const PageId>(page_table_.data(), page_table_.size() - 1),
                                  cols, HostSpan(metadata_.kv_lens), fixture_.page_size()};
         a.split.reset();
       },
       kInvalid, "decode attention: page_table of 62 entries is not [3][21]"},
      {"page table beyond int32 tokens",
       [&](PagedDecodeArgs& a) {
         a.kv = DecodePageTableKv{HostSpan(page_table_), PageCount(int64_t{1} << 27),
                                  HostSpan(metadata_.kv_lens), fixture_.page_size()};
         a.split.reset();
       },
       absl::StatusCode::kOutOfRange,
       "decode attention: a page table of 134217728 columns of page_size 16"},
      {"page table of negative columns",
       [&](PagedDecodeArgs& a) {
         a.kv = DecodePageTableKv{HostSpan(page_table_), PageCount(-1), HostSpan(metadata_.kv_lens),
                                  fixture_.page_size()};
         a.split.reset();
       },
       kInvalid, "decode attention: a page table of -1 columns (negative)"},
      {"partial_out too small",
       [&](PagedDecodeArgs& a) {
         a.split->partial_out =
             DeviceSpan<float>(reinterpret_cast<float*>(partial_out_.data()), partial_floats - 1);
       },
       absl::StatusCode::kResourceExhausted,
       "split-KV: partial_out holds 20479 floats and partial_lse 160; the"},
      {"partial_lse too small",
       [&](PagedDecodeArgs& a) {
         a.split->partial_lse = DeviceSpan<float>(reinterpret_cast<float*>(partial_lse_.data()), 1);
       },
       absl::StatusCode::kResourceExhausted,
       "split-KV: partial_out holds 20480 floats and partial_lse 1; the plan's"},
      {"merge counters too small",
       [&](PagedDecodeArgs& a) {
         a.split->merge_counters =
             DeviceSpan<uint32_t>(reinterpret_cast<uint32_t*>(counters_.data()), counters - 1);
       },
       absl::StatusCode::kResourceExhausted,
       "split-KV: merge_counters holds 63 counters; the plan's 2 reduce items x"},
      {"merge counters null with a size",
       [&](PagedDecodeArgs& a) {
         a.split->merge_counters = DeviceSpan<uint32_t>(nullptr, counters);
       },
       kInvalid, "merge_counters has 64 elements but a null pointer"},
      {"null work items",
       [&](PagedDecodeArgs& a) {
         a.split->work = DeviceSpan<const SplitKvWorkItem>(nullptr, plan_.work.size());
       },
       kInvalid, "work has 6 elements but a null pointer"},
      {"null partial_lse",
       [&](PagedDecodeArgs& a) {
         a.split->partial_lse =
             DeviceSpan<float>(nullptr, static_cast<size_t>(plan_.num_partials) * kQHeads);
       },
       kInvalid, "partial_lse has 160 elements but a null pointer"},
      {"no plan", [&](PagedDecodeArgs& a) { a.split->plan = nullptr; }, kInvalid,
       "split-KV: no plan"},
      {"device copy of another plan",
       [&](PagedDecodeArgs& a) { a.split->work = HostSpan(plan4->work); }, kInvalid,
       "split-KV: the device copy holds 4 work and 2 reduce items, the plan 6"},
      {"plan for a larger batch",
       [&](PagedDecodeArgs& a) {
         a.split = DecodeSplitKv{&*plan4, HostSpan(plan4->work), HostSpan(plan4->reduce),
                                 partial_out_.span<float>(), partial_lse_.span<float>()};
       },
       kInvalid, "split-KV plan: work item 3 (sequence 3, rows [3, 4), KV [0, 10),"},
      {"plan with more partial slots than items",
       [&](PagedDecodeArgs& a) { a.split->plan = &many; }, kInvalid,
       "split-KV plan: 2147483647 partial slots for 6 work items"},
      {"plan whose items leave a gap", [&](PagedDecodeArgs& a) { a.split->plan = &gap; }, kInvalid,
       "split-KV plan: the items of sequence 0 do not tile its KV from 0: an"},
      {"plan missing a sequence",
       [&](PagedDecodeArgs& a) {
         a.split = DecodeSplitKv{&missing, HostSpan(missing.work), HostSpan(missing.reduce),
                                 partial_out_.span<float>(), partial_lse_.span<float>()};
       },
       kInvalid, "split-KV plan: sequence 2 has 0 direct items, 0 split items and 0 reduce items"},
      {"plan for another layout", [&](PagedDecodeArgs& a) { a.kv = PageLevel(); }, kInvalid,
       "split-KV plan: made for layout LinearPerToken, but this decode reads"},
      {"device plan for another layout",
       [&](PagedDecodeArgs& a) {
         DeviceSplitKvPlan dp = DevicePlanOf(plan_);
         dp.layout = KvLayout::Paged(fixture_.page_size());
         a.split->plan = dp;
       },
       kInvalid, "split-KV device plan: made for layout Paged(page_size 16), but this"},
      {"device plan with more items than its buffers",
       [&](PagedDecodeArgs& a) {
         DeviceSplitKvPlan dp = DevicePlanOf(plan_);
         ++dp.counts.work_items;
         a.split->plan = dp;
       },
       kInvalid, "split-KV device plan: 7 work and 2 reduce items, but the device buffers"},
      {"device plan with more reduce items than its buffer",
       [&](PagedDecodeArgs& a) {
         DeviceSplitKvPlan dp = DevicePlanOf(plan_);
         dp.counts.reduce_items = static_cast<int64_t>(plan_.reduce.size()) + 1;
         a.split->plan = dp;
       },
       kInvalid, "split-KV device plan: 6 work and 3 reduce items, but the device buffers"},
      {"device plan with more partial slots than items",
       [&](PagedDecodeArgs& a) {
         DeviceSplitKvPlan dp = DevicePlanOf(plan_);
         dp.counts.num_partials = static_cast<int32_t>(dp.counts.work_items) + 1;
         a.split->plan = dp;
       },
       kInvalid, "split-KV device plan: counts of 6 work items, 2 reduce items and 7"},
      {"device plan with partial slots that nothing merges",
       [&](PagedDecodeArgs& a) {
         DeviceSplitKvPlan dp = DevicePlanOf(plan_);
         dp.counts.reduce_items = 0;
         a.split->plan = dp;
       },
       kInvalid, "split-KV device plan: counts of 6 work items, 0 reduce items and 5"},
      {"device plan with no work item for the batch",
       [&](PagedDecodeArgs& a) {
         a.split->plan = DeviceSplitKvPlan{KvLayout::LinearPerToken(), SplitKvPlanCounts{}};
       },
       kInvalid, "split-KV device plan: 0 work items for a batch of 3"},
      {"device plan with more reduce items than partial slots",
       [&](PagedDecodeArgs& a) {
         DeviceSplitKvPlan dp = DevicePlanOf(plan_);
         dp.counts.reduce_items = dp.counts.num_partials + 1;
         a.split->plan = dp;
       },
       kInvalid, "split-KV device plan: counts of 6 work items, 6 reduce items and 5"},
      {"device plan with reduce items and no partial slot",
       [&](PagedDecodeArgs& a) {
         DeviceSplitKvPlan dp = DevicePlanOf(plan_);
         dp.counts.num_partials = 0;
         a.split->plan = dp;
       },
       kInvalid, "split-KV device plan: counts of 6 work items, 2 reduce items and 0"},
      {"device plan beyond the grid",
       [&](PagedDecodeArgs& a) {
         DeviceSplitKvPlan dp = DevicePlanOf(plan_);
         dp.counts.work_items = (int64_t{1} << 23) + 1;
         a.split->plan = dp;
       },
       absl::StatusCode::kOutOfRange, "split-KV device plan: 8388609 work items, at most 8388608"},
      {"device plan with negative counts",
       [&](PagedDecodeArgs& a) {
         DeviceSplitKvPlan dp = DevicePlanOf(plan_);
         dp.counts.work_items = -1;
         a.split->plan = dp;
       },
       kInvalid, "split-KV device plan: counts of -1 work items, 2 reduce items and 5"},
      {"device plan with partial buffers too small",
       [&](PagedDecodeArgs& a) {
         a.split->plan = DevicePlanOf(plan_);
         a.split->partial_lse = DeviceSpan<float>(reinterpret_cast<float*>(partial_lse_.data()), 1);
       },
       absl::StatusCode::kResourceExhausted,
       "split-KV: partial_out holds 20480 floats and partial_lse 1; the plan's"},
      {"device plan with merge counters too small",
       [&](PagedDecodeArgs& a) {
         a.split->plan = DevicePlanOf(plan_);
         a.split->merge_counters =
             DeviceSpan<uint32_t>(reinterpret_cast<uint32_t*>(counters_.data()), counters - 1);
       },
       absl::StatusCode::kResourceExhausted,
       "split-KV: merge_counters holds 63 counters; the plan's 2 reduce items x"},
      {"a grid of more than 2^23 blocks",
       [&](PagedDecodeArgs& a) {
         DeviceSplitKvPlan dp = DevicePlanOf(plan_);
         dp.counts.work_items = (int64_t{1} << 23) / 8 + 1;
         a.split->plan = dp;
         a.split->work = DeviceSpan<const SplitKvWorkItem>(plan_.work.data(), size_t{1} << 23);
       },
       absl::StatusCode::kOutOfRange,
       "decode attention: 8388616 blocks, at most 8388608 (fewer work items or"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    PagedDecodeArgs a = Good();
    c.edit(a);
    const absl::StatusOr<PagedDecodeLaunch> launch = PagedDecodeLaunchFor(a, nullptr);
    EXPECT_EQ(launch.status().code(), c.code) << launch.status();
    ASSERT_NE(c.message, nullptr);
    EXPECT_THAT(std::string(launch.status().message()), ::testing::HasSubstr(c.message));
  }
  // The unedited arguments pass, also checked, through both sources, and with the device plan.
  PagedDecodeArgs a = Good();
  a.checked = &checked;
  EXPECT_TRUE(PagedDecodeLaunchFor(a, nullptr).ok());
  a.split->plan = DevicePlanOf(plan_);
  EXPECT_TRUE(PagedDecodeLaunchFor(a, nullptr).ok());
  a.kv = PageLevel();
  a.split.reset();
  EXPECT_TRUE(PagedDecodeLaunchFor(a, nullptr).ok());
}

// Checked mode names what the validator found.
TEST_F(PagedDecodeArgsTest, CheckedModeNamesTheViolation) {
  ValidationContext ctx{fixture_.pool_slots(), fixture_.page_size(), TokenCount(bs_)};
  ctx.check_slot_ownership = true;
  // Sequence 0's new token in a slot of sequence 2; without the page table, which would
  // disagree first (the launch reads kv_indices).
  ForwardMetadata twice = metadata_;
  twice.kv_indices[twice.kv_indptr[1].value() - 1] = twice.kv_indices[twice.kv_indptr[2].value()];
  twice.page_table = PageTable();
  const CheckedMetadata checked_twice{twice.view(), ctx};
  PagedDecodeArgs a = Good();
  a.checked = &checked_twice;
  const absl::Status s = PagedDecodeLaunchFor(a, nullptr).status();
  EXPECT_EQ(s.code(), kInvalid) << s;
  EXPECT_NE(s.message().find("a slot handed out twice"), absl::string_view::npos) << s;
}

TEST_F(PagedDecodeArgsTest, BlocksPerWorkItemAndHeadsPerBlock) {
  DecodeAttentionDims d = Dims();
  EXPECT_EQ(*DecodeBlocksPerWorkItem(d, 0), 8);  // 32 query heads, 4 per block
  EXPECT_EQ(*DecodeQueryHeadsPerBlock(d, 0), 4);
  d.num_q_heads = 64;  // a group of 8
  EXPECT_EQ(*DecodeQueryHeadsPerBlock(d, 0), 8);
  EXPECT_EQ(*DecodeQueryHeadsPerBlock(d, 2), kernels::kVariantQueryHeads);
  EXPECT_EQ(*DecodeBlocksPerWorkItem(d, 2), 64 / kernels::kVariantQueryHeads);
  d.num_q_heads = 24;  // a group of 3
  EXPECT_EQ(*DecodeQueryHeadsPerBlock(d, 0), 1);
  EXPECT_EQ(*DecodeBlocksPerWorkItem(d, 0), 24);
  d.num_q_heads = 128;  // a group of 16: two chunks of 8
  EXPECT_EQ(*DecodeBlocksPerWorkItem(d, 0), 16);
  d.num_kv_heads = 3;
  EXPECT_EQ(DecodeBlocksPerWorkItem(d, 0).status().code(), kInvalid);
}

}  // namespace
}  // namespace attnmeta
