// What a graph replay leaves for a kernel captured for the bucket, as the checked varlen
// launcher takes it: the cross-layer proof that GraphState's whole-bucket view of an extend or
// draft-extend replay (ReplayResult::padded) is what VarlenAttention accepts in checked mode
// with the launch a captured graph makes (the bucket's query tensor, the captured rows per
// request as max_q_len), the variable-row form's tail of unclaimed rows included. CPU only: the
// launcher's checks and the kernel arguments they give (VarlenAttentionLaunchFor) over the
// host-memory graph buffers; forward_step_gpu_test runs the kernels on such replays.

#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "attention/graph/graph_state.h"
#include "attention/graph/testing/graph_harness.h"
#include "attention/kernels/checked_metadata.h"
#include "attention/kernels/device_span.h"
#include "attention/kernels/paged_decode_args.h"
#include "attention/kernels/testing/host_buffer.h"
#include "attention/kernels/varlen_attention_args.h"
#include "attention/metadata/forward_metadata.h"
#include "attention/metadata/forward_mode.h"
#include "attention/metadata/testing/batch_fixture.h"
#include "attention/metadata/validator.h"
#include "gtest/gtest.h"
#include "kvcache/units.h"

namespace attnmeta {
namespace {

using testing::BatchFixture;
using testing::GraphHarness;
using testing::HostBuffer;
using testing::MakeTestConfig;

constexpr int64_t kBucket = 8;
constexpr int32_t kRows = 4;  // captured query rows per request
constexpr int32_t kQHeads = 32;
constexpr int32_t kKvHeads = 8;
constexpr int32_t kHeadDim = 128;
constexpr int64_t kQRowBytes = int64_t{kQHeads} * kHeadDim * 2;
constexpr int64_t kBucketRows = kBucket * kRows;

class GraphVarlenLaunchTest : public ::testing::TestWithParam<int64_t> {
 protected:
  GraphVarlenLaunchTest()
      : fixture_(GetParam(), /*seed=*/4600 + GetParam(), /*num_pages=*/4096 / GetParam() + 64,
                 /*max_reqs=*/16, /*max_context=*/1024),
        q_(kBucketRows * kQRowBytes),
        out_(kBucketRows * kQRowBytes),
        lse_(kBucketRows * kQHeads * 4) {
    std::mt19937_64 rng(4600 + GetParam());
    for (int i = 0; i < 10; ++i) {
      fixture_.AddSequence(std::uniform_int_distribution<int64_t>(0, 200)(rng), kRows);
    }
    const int64_t pool_bytes = fixture_.pool_slots().value() * kKvHeads * kHeadDim * 2;
    k_ = HostBuffer(pool_bytes);
    v_ = HostBuffer(pool_bytes);
    harness_ = std::make_unique<GraphHarness>(
        MakeTestConfig(GetParam(), {.draft_tokens = kRows, .topk = 1, .steps = 1}), fixture_);
  }

  // The launch a graph captured for the bucket makes over `view`, through kv_indices or the
  // page table.
  VarlenAttentionArgs BucketLaunch(const ForwardMetadataView& view, bool page_table) {
    VarlenAttentionArgs a;
    a.dims = DecodeAttentionDims{kQHeads, kKvHeads, kHeadDim, KvElementType::kBf16, 0.088f};
    a.q = q_.span<const uint8_t>();
    a.qo_indptr = DeviceSpan<const TokenOffset>(view.qo_indptr.data(), view.qo_indptr.size());
    a.max_q_len = TokenCount(kRows);
    a.k_pool = k_.span<const uint8_t>();
    a.v_pool = v_.span<const uint8_t>();
    if (page_table) {
      a.kv =
          DecodePageTableKv{DeviceSpan<const PageId>(view.page_table.entries().data(),
                                                     view.page_table.entries().size()),
                            view.page_table.cols(),
                            DeviceSpan<const TokenLength>(view.kv_lens.data(), view.kv_lens.size()),
                            fixture_.page_size()};
    } else {
      a.kv = DecodeTokenLevelKv{
          DeviceSpan<const TokenOffset>(view.kv_indptr.data(), view.kv_indptr.size()),
          DeviceSpan<const TokenSlot>(view.kv_indices.data(), view.kv_indices.size())};
    }
    a.out = out_.span<uint8_t>();
    a.lse = lse_.span<float>();
    return a;
  }

  // What a checked launch validates the bucket's view against: the bucket's query tensor, the
  // padding page, slot ownership, and, in the variable-row form, the tail.
  ValidationContext BucketContext(bool variable_rows) const {
    ValidationContext ctx{fixture_.pool_slots(), fixture_.page_size(), TokenCount(kBucketRows)};
    ctx.allow_padding_page = true;
    ctx.allow_unclaimed_rows = variable_rows;
    ctx.check_slot_ownership = true;
    return ctx;
  }

  BatchFixture fixture_;
  HostBuffer q_, out_, lse_, k_, v_;
  std::unique_ptr<GraphHarness> harness_;
};

TEST_P(GraphVarlenLaunchTest, TheBucketViewIsWhatTheCheckedLauncherTakes) {
  std::mt19937_64 rng(4700 + GetParam());
  for (ForwardMode mode : {ForwardMode::kExtend, ForwardMode::kDraftExtend}) {
    auto handle = harness_->state().Capture(kBucket, mode, TokenLength(kRows));
    ASSERT_TRUE(handle.ok()) << handle.status();
    // A part-full bucket, and a full one whose every request uses fewer rows than captured
    // (its view's max_q_len is then below the captured rows).
    for (int64_t bs : {int64_t{5}, kBucket}) {
      std::vector<ReqPoolIndex> rows;
      std::vector<TokenLength> kv, q_lens;
      for (int64_t i = 0; i < bs; ++i) {
        rows.push_back(fixture_.rows()[i]);
        kv.push_back(fixture_.kv_lens()[i]);
        const int32_t hi = bs == kBucket ? kRows - 1 : kRows;
        q_lens.push_back(TokenLength(std::uniform_int_distribution<int32_t>(1, hi)(rng)));
      }
      q_lens[0] = TokenLength(1);  // at least one row left unclaimed
      std::string drawn;
      for (TokenLength q : q_lens) absl::StrAppend(&drawn, drawn.empty() ? "" : ",", q.value());
      SCOPED_TRACE(::testing::Message()
                   << ForwardModeName(mode) << " page_size " << GetParam() << " bs " << bs
                   << " seed " << 4700 + GetParam() << " q_lens " << drawn
                   << "; rerun: --gtest_filter=*TheBucketViewIsWhatTheCheckedLauncherTakes/*");
      // The padded rows take the captured rows each; the real requests' unused rows are the
      // tail.
      int64_t claimed = (kBucket - bs) * kRows;
      for (const TokenLength q : q_lens) claimed += q.value();
      absl::StatusOr<ReplayResult> r =
          harness_->state().Replay(*handle, ReplayBatch{rows, kv, q_lens, {}});
      ASSERT_TRUE(r.ok()) << r.status();
      const ForwardMetadataView& view = r->padded;
      ASSERT_EQ(view.batch_size(), kBucket);
      const int64_t tail_start = view.qo_indptr[kBucket].value();
      ASSERT_EQ(tail_start, claimed);
      ASSERT_LT(tail_start, kBucketRows);
      // The view's max_q_len is the batch's true maximum: the captured rows where a padded row
      // has them, fewer in the full bucket.
      if (bs == kBucket) {
        ASSERT_LT(view.max_q_len.value(), kRows);
      } else {
        ASSERT_EQ(view.max_q_len.value(), kRows);
      }
      for (bool page_table : {false, true}) {
        SCOPED_TRACE(page_table ? "page table" : "kv_indices");
        const CheckedMetadata checked{view, BucketContext(/*variable_rows=*/true)};
        VarlenAttentionArgs a = BucketLaunch(view, page_table);
        a.checked = &checked;
        a.zero_unclaimed_rows = true;
        absl::StatusOr<VarlenAttentionLaunch> launch = VarlenAttentionLaunchFor(a, true, nullptr);
        ASSERT_TRUE(launch.ok()) << launch.status();
        EXPECT_EQ(launch->params.zero_unclaimed_rows, 1);
        EXPECT_EQ(launch->params.q_rows, kBucketRows);
        EXPECT_EQ(launch->params.batch_size, kBucket);
        EXPECT_EQ(launch->params.max_q_len, kRows);
        // A launch that leaves the tail: the validator's error, before any launch.
        a.zero_unclaimed_rows = false;
        const absl::Status unwritten = VarlenAttentionLaunchFor(a, true, nullptr).status();
        EXPECT_EQ(unwritten.code(), absl::StatusCode::kInvalidArgument);
        EXPECT_EQ(unwritten.message(),
                  absl::StrCat("checked mode: qo_indptr: qo_indptr[bs] = ", tail_start,
                               " but the query tensor has ", kBucketRows, " rows"));
        // The view's own max_q_len, below the captured rows in the full bucket, does not cover
        // the bucket's query tensor: a captured launch passes the captured rows.
        if (bs == kBucket) {
          a.zero_unclaimed_rows = true;
          a.max_q_len = view.max_q_len;
          const absl::Status narrow = VarlenAttentionLaunchFor(a, true, nullptr).status();
          EXPECT_EQ(narrow.code(), absl::StatusCode::kInvalidArgument);
          EXPECT_EQ(narrow.message(),
                    absl::StrCat("varlen attention: max_q_len ", view.max_q_len.value(),
                                 " does not fit ", kBucketRows, " query rows over ", kBucket,
                                 " sequences (want max_q_len <= q_rows <= bs * max_q_len)"));
        }
      }

      // The fixed form: every row claimed, no tail to declare.
      absl::StatusOr<ReplayResult> fixed = harness_->state().Replay(*handle, ReplayBatch{rows, kv});
      ASSERT_TRUE(fixed.ok()) << fixed.status();
      ASSERT_EQ(fixed->padded.qo_indptr[kBucket].value(), kBucketRows);
      const CheckedMetadata strict{fixed->padded, BucketContext(/*variable_rows=*/false)};
      for (bool page_table : {false, true}) {
        VarlenAttentionArgs b = BucketLaunch(fixed->padded, page_table);
        b.checked = &strict;
        EXPECT_TRUE(VarlenAttentionLaunchFor(b, true, nullptr).ok())
            << (page_table ? "page table: " : "kv_indices: ")
            << VarlenAttentionLaunchFor(b, true, nullptr).status();
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(PageSizes, GraphVarlenLaunchTest, ::testing::Values(1, 7, 16, 64));

}  // namespace
}  // namespace attnmeta
