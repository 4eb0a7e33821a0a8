// The metadata launchers' checks on the CPU (metadata_kernel_args.h): every refusal, and the
// kernel arguments of calls that pass. The spans point into host memory: the checks never
// read through them.

#include "attention/kernels/metadata_kernel_args.h"

#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "attention/kernels/device_span.h"
#include "attention/kernels/internal/launch_checks.h"
#include "attention/kernels/metadata_kernels.h"
#include "attention/kernels/testing/host_buffer.h"
#include "attention/metadata/draft_decode_layout.h"
#include "attention/metadata/split_kv_planner.h"
#include "glog/logging.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kvcache/units.h"

namespace attnmeta {
namespace {

using testing::HostBuffer;

constexpr absl::StatusCode kInvalid = absl::StatusCode::kInvalidArgument;
constexpr absl::StatusCode kOutOfRange = absl::StatusCode::kOutOfRange;

// A span of the first `n` elements of `v` (the fixture sizes every vector once, so that no
// span of a case outlives its storage; the checks never read through it).
template <typename T>
DeviceSpan<T> Over(std::vector<T>& v, size_t n) {
  CHECK_LE(n, v.size());
  return DeviceSpan<T>(v.data(), n);
}

template <typename T>
DeviceSpan<T> Null(size_t n) {
  return DeviceSpan<T>(nullptr, n);
}

// A span of n elements (n past what is allocated: the checks refuse by size alone).
template <typename T>
DeviceSpan<T> Claimed(std::vector<T>& v, size_t n) {
  return DeviceSpan<T>(v.data(), n);
}

// An edit of good arguments and the code its check must return.
template <typename Args>
struct Refusal {
  const char* what;
  std::function<void(Args&)> edit;
  absl::StatusCode code;
  // The check that refuses it, not a later one that a wrong case would reach.
  const char* message;
};

// Runs each edit on `good` and expects its code and message; `good` itself passes.
template <typename Args, typename Check>
void ExpectRefusals(const Args& good, const Check& check,
                    const std::vector<Refusal<Args>>& cases) {
  ASSERT_TRUE(check(good).ok()) << check(good);
  for (const Refusal<Args>& c : cases) {
    SCOPED_TRACE(c.what);
    Args a = good;
    c.edit(a);
    const absl::Status s = check(a);
    EXPECT_EQ(s.code(), c.code) << s;
    ASSERT_NE(c.message, nullptr);
    EXPECT_THAT(std::string(s.message()), ::testing::HasSubstr(c.message));
  }
}

class MetadataKernelArgsTest : public ::testing::Test {
 protected:
  static constexpr int64_t kRows = 6;     // of req_to_token
  static constexpr int64_t kStride = 64;  // max_context_len
  static constexpr int64_t kBatch = 4;
  static constexpr size_t kEntries = 1024;  // of every host vector below

  MetadataKernelArgsTest()
      : table_(kEntries), rows_(kEntries), lens_(kEntries), lens2_(kEntries), lens3_(kEntries),
        indptr_(kEntries), indptr2_(kEntries), indices_(kEntries), pages_(kEntries),
        mask_indptr_(kEntries), bytes_(kEntries), bytes2_(kEntries), work_(kEntries),
        reduce_(kEntries), units_(kEntries) {}

  DeviceReqToToken ReqToToken() { return {Over(table_, kRows * kStride), TokenCount(kStride)}; }

  std::vector<TokenSlot> table_;
  std::vector<ReqPoolIndex> rows_;
  std::vector<TokenLength> lens_, lens2_, lens3_;
  std::vector<TokenOffset> indptr_, indptr2_;
  std::vector<TokenSlot> indices_;
  std::vector<PageId> pages_;
  std::vector<int64_t> mask_indptr_;
  std::vector<uint8_t> bytes_, bytes2_;
  std::vector<SplitKvWorkItem> work_;
  std::vector<SplitKvReduceItem> reduce_;
  std::vector<int32_t> units_;
  kernels::DeviceViolation violation_{};
};

TEST_F(MetadataKernelArgsTest, TokenKvIndices) {
  std::vector<TokenPosition> starts(kEntries);
  struct Args {
    TokenKvIndicesDeviceInputs in;
    DeviceSpan<TokenSlot> kv_indices;
  };
  Args good;
  good.in.req_to_token = Over(table_, kRows * kStride);
  good.in.max_context_len = TokenCount(kStride);
  good.in.req_pool_indices = Over(rows_, kBatch);
  good.in.kv_indptr = Over(indptr_, kBatch + 1);
  good.in.kv_start_idx = Over(starts, kBatch);
  good.in.max_kv_len = TokenCount(kStride);
  good.in.pool_slots = TokenCount(1024);
  good.kv_indices = Over(indices_, 256);
  absl::StatusOr<kernels::TokenKvIndicesParams> p =
      TokenKvIndicesParamsFor(good.in, good.kv_indices, &violation_);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->batch_size, kBatch);
  EXPECT_EQ(p->kv_indices_capacity, 256);
  EXPECT_NE(p->kv_start_idx, nullptr);
  EXPECT_EQ(p->src.stride, kStride);
  EXPECT_EQ(p->src.page_size, 1);
  EXPECT_EQ(p->violation, &violation_);
  Args no_starts = good;
  no_starts.in.kv_start_idx = {};
  p = TokenKvIndicesParamsFor(no_starts.in, no_starts.kv_indices, nullptr);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->kv_start_idx, nullptr);
  // An empty batch: nothing to launch, whatever the table.
  Args empty = good;
  empty.in.req_pool_indices = {};
  empty.in.kv_start_idx = {};
  empty.in.kv_indptr = Over(indptr_, 1);
  empty.in.req_to_token = {};
  p = TokenKvIndicesParamsFor(empty.in, empty.kv_indices, nullptr);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->batch_size, 0);
  ExpectRefusals<Args>(
      good,
      [](const Args& a) { return TokenKvIndicesParamsFor(a.in, a.kv_indices, nullptr).status(); },
      {{"no kv_indptr", [](Args& a) { a.in.kv_indptr = {}; }, kInvalid,
        "kv_indptr must have batch_size + 1 >= 1 entries, got 0"},
       {"req_pool_indices of another batch",
        [&](Args& a) { a.in.req_pool_indices = Over(rows_, kBatch - 1); }, kInvalid,
        "req_pool_indices has 3 entries, kv_indptr implies batch_size 4"},
       {"kv_start_idx of another batch", [&](Args& a) { a.in.kv_start_idx = Over(starts, 1); },
        kInvalid, "kv_start_idx has 1 entries, want 0 or batch_size 4"},
       {"req_to_token not whole rows",
        [&](Args& a) { a.in.req_to_token = Over(table_, kRows * kStride - 1); }, kInvalid,
        "req_to_token has 383 entries, not a whole number of rows of 64"},
       {"a row stride of 0", [](Args& a) { a.in.max_context_len = TokenCount(0); }, kInvalid,
        "req_to_token has 384 entries, not a whole number of rows of 0"},
       {"negative max_kv_len", [](Args& a) { a.in.max_kv_len = TokenCount(-1); }, kOutOfRange,
        "max_kv_len -1 outside [0, max_context_len = 64]"},
       {"max_kv_len past a row", [](Args& a) { a.in.max_kv_len = TokenCount(kStride + 1); },
        kOutOfRange, "max_kv_len 65 outside [0, max_context_len = 64]"},
       {"a batch beyond int32",
        [&](Args& a) {
          const size_t huge = (size_t{1} << 31) + 1;
          a.in.req_pool_indices = Claimed(rows_, huge - 1);
          a.in.kv_indptr = Claimed(indptr_, huge);
          a.in.kv_start_idx = {};
        },
        kOutOfRange, "batch_size 2147483648 beyond 8388608"},
       {"a batch claimed past INT64_MAX",
        [&](Args& a) {
          // As int64 these sizes were negative and passed the grid bound as a batch of 3.
          a.in.req_pool_indices = Claimed(rows_, (size_t{1} << 63) + 3);
          a.in.kv_indptr = Claimed(indptr_, (size_t{1} << 63) + 4);
          a.in.kv_start_idx = {};
        },
        kOutOfRange, "batch_size 9223372036854775806 beyond 8388608"},
       {"more than 2^31 pool slots",
        [](Args& a) { a.in.pool_slots = TokenCount((int64_t{1} << 31) + 1); }, kOutOfRange,
        "req_to_token rows, pool slots or page size beyond int32"},
       {"null req_pool_indices",
        [](Args& a) { a.in.req_pool_indices = Null<const ReqPoolIndex>(kBatch); }, kInvalid,
        "req_pool_indices has 4 elements but a null pointer"},
       {"null kv_indptr", [](Args& a) { a.in.kv_indptr = Null<const TokenOffset>(kBatch + 1); },
        kInvalid, "kv_indptr has 5 elements but a null pointer"},
       {"null kv_start_idx", [](Args& a) { a.in.kv_start_idx = Null<const TokenPosition>(kBatch); },
        kInvalid, "kv_start_idx has 4 elements but a null pointer"},
       {"null kv_indices", [](Args& a) { a.kv_indices = Null<TokenSlot>(256); }, kInvalid,
        "kv_indices has 256 elements but a null pointer"},
       {"null req_to_token",
        [](Args& a) { a.in.req_to_token = Null<const TokenSlot>(kRows * kStride); }, kInvalid,
        "req_to_token has 384 elements but a null pointer"}});
}

TEST_F(MetadataKernelArgsTest, Indptr) {
  const PageSize ps = *PageSize::Create(16);
  auto check = [&](DeviceSpan<const TokenLength> lens, DeviceSpan<TokenOffset> indptr,
                   DeviceSpan<TokenLength> last) {
    return IndptrParamsFor(lens, indptr, last, ps, &violation_).status();
  };
  absl::StatusOr<kernels::IndptrParams> p =
      IndptrParamsFor(Over(lens_, 4), Over(indptr_, 5), Over(lens2_, 4), ps, &violation_);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->n, 4);
  EXPECT_EQ(p->page_size, 16);
  EXPECT_NE(p->last_page_len, nullptr);
  EXPECT_EQ(p->violation, &violation_);
  p = IndptrParamsFor(Over(lens_, 4), Over(indptr_, 5), {}, ps, nullptr);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->last_page_len, nullptr);
  // Each refusal with its check's message, not a later check's.
  const auto refused = [](const absl::Status& s, absl::StatusCode code, const std::string& what) {
    EXPECT_EQ(s.code(), code) << s;
    EXPECT_EQ(std::string(s.message()), what);
  };
  refused(check(Over(lens_, 4), Over(indptr_, 4), {}), kInvalid,
          "indptr has 4 entries, want lens + 1 = 5");
  refused(check(Over(lens_, 4), Over(indptr_, 5), Over(lens2_, 3)), kInvalid,
          "last_page_len has 3 entries, want 0 or 4");
  refused(check(Null<const TokenLength>(4), Over(indptr_, 5), {}), kInvalid,
          "lens has 4 elements but a null pointer");
  refused(check(Over(lens_, 4), Null<TokenOffset>(5), {}), kInvalid,
          "indptr has 5 elements but a null pointer");
  refused(check(Over(lens_, 4), Over(indptr_, 5), Null<TokenLength>(4)), kInvalid,
          "last_page_len has 4 elements but a null pointer");
  const size_t huge = size_t{1} << 31;
  refused(check(Claimed(lens_, huge), Claimed(indptr_, huge + 1), {}), kOutOfRange,
          "2147483648 lengths, beyond 1073741824");
}

TEST_F(MetadataKernelArgsTest, PageTable) {
  struct Args {
    DeviceReqToToken req_to_token;
    TokenCount pool_slots;
    DeviceSpan<const ReqPoolIndex> rows;
    DeviceSpan<const TokenLength> kv_lens;
    PageSize page_size = *PageSize::Create(16);
    DeviceSpan<PageId> page_table;
    PageCount cols;
  };
  auto check = [&](const Args& a) {
    return PageTableParamsFor(a.req_to_token, a.pool_slots, a.rows, a.kv_lens, a.page_size,
                              a.page_table, a.cols, &violation_)
        .status();
  };
  Args good{ReqToToken(),         TokenCount(1024), Over(rows_, kBatch), Over(lens_, kBatch),
            *PageSize::Create(16), Over(pages_, kBatch * 4), PageCount(4)};
  absl::StatusOr<kernels::PageTableParams> p =
      PageTableParamsFor(good.req_to_token, good.pool_slots, good.rows, good.kv_lens,
                         good.page_size, good.page_table, good.cols, &violation_);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->batch_size, kBatch);
  EXPECT_EQ(p->cols, 4);
  EXPECT_EQ(p->src.stride, kStride);
  EXPECT_EQ(p->src.max_reqs, kRows);
  EXPECT_EQ(p->src.pool_slots, 1024);
  EXPECT_EQ(p->src.page_size, 16);
  EXPECT_EQ(p->src.page_size_log2, 4);
  EXPECT_EQ(p->violation, &violation_);
  ExpectRefusals<Args>(
      good, check,
      {{"req_to_token not whole rows",
        [&](Args& a) { a.req_to_token.table = Over(table_, kRows * kStride - 1); }, kInvalid,
        "req_to_token has 383 entries, not a whole number >= 1 of rows of 64"},
       {"no req_to_token", [](Args& a) { a.req_to_token.table = {}; }, kInvalid,
        "req_to_token has 0 entries, not a whole number >= 1 of rows of 64"},
       {"a row stride of 0", [](Args& a) { a.req_to_token.max_context_len = TokenCount(0); },
        kInvalid, "req_to_token has 384 entries, not a whole number >= 1 of rows of 0"},
       {"null req_to_token",
        [](Args& a) { a.req_to_token.table = Null<const TokenSlot>(kRows * kStride); }, kInvalid,
        "req_to_token has 384 elements but a null pointer"},
       {"more than 2^31 pool slots",
        [](Args& a) { a.pool_slots = TokenCount((int64_t{1} << 31) + 1); }, kOutOfRange,
        "req_to_token rows, pool slots or page size beyond int32"},
       {"negative pool slots", [](Args& a) { a.pool_slots = TokenCount(-1); }, kOutOfRange,
        "req_to_token rows, pool slots or page size beyond int32"},
       {"kv_lens of another batch", [&](Args& a) { a.kv_lens = Over(lens_, kBatch - 1); }, kInvalid,
        "4 rows but 3 kv_lens"},
       {"a table smaller than [bs][cols]",
        [&](Args& a) { a.page_table = Over(pages_, kBatch * 4 - 1); }, kInvalid,
        "page_table of 15 entries is not [4][4]"},
       {"negative columns", [](Args& a) { a.cols = PageCount(-1); }, kInvalid,
        "page_table of 16 entries is not [4][-1]"},
       {"columns beyond int32",
        [](Args& a) { a.cols = PageCount(int64_t{std::numeric_limits<int32_t>::max()} + 1); },
        kOutOfRange, "page_table of 2147483648 columns, beyond 1073741824"},
       {"a batch beyond int32",
        [&](Args& a) {
          a.rows = Claimed(rows_, (size_t{1} << 31) + 1);
          a.kv_lens = Claimed(lens_, (size_t{1} << 31) + 1);
          a.cols = PageCount(0);
        },
        kOutOfRange, "batch of 2147483649 beyond 8388608"},
       {"a batch claimed past INT64_MAX",
        [&](Args& a) {
          a.rows = Claimed(rows_, (size_t{1} << 63) + 3);
          a.kv_lens = Claimed(lens_, (size_t{1} << 63) + 3);
          a.cols = PageCount(1);
        },
        kOutOfRange, "batch of 9223372036854775807 beyond 8388608"},
       {"null rows", [](Args& a) { a.rows = Null<const ReqPoolIndex>(kBatch); }, kInvalid,
        "rows has 4 elements but a null pointer"},
       {"null kv_lens", [](Args& a) { a.kv_lens = Null<const TokenLength>(kBatch); }, kInvalid,
        "kv_lens has 4 elements but a null pointer"},
       {"null page table", [](Args& a) { a.page_table = Null<PageId>(kBatch * 4); }, kInvalid,
        "page_table has 16 elements but a null pointer"}});
}

TEST_F(MetadataKernelArgsTest, FusedDecodeMetadata) {
  DecodeMetadataDeviceArgs good;
  good.req_to_token = ReqToToken();
  good.pool_slots = TokenCount(1024);
  good.page_size = *PageSize::Create(16);
  good.rows = Over(rows_, kBatch);
  good.kv_lens = Over(lens_, kBatch);
  good.q_lens = Over(lens2_, kBatch);
  good.kv_indptr = Over(indptr_, kBatch + 1);
  good.qo_indptr = Over(indptr2_, kBatch + 1);
  good.kv_last_page_len = Over(lens3_, kBatch);
  good.kv_indices = Over(indices_, 256);
  good.page_table = Over(pages_, kBatch * 4);
  good.page_table_cols = PageCount(4);
  good.max_kv_len = TokenCount(kStride);
  absl::StatusOr<kernels::FusedMetadataParams> p = FusedMetadataParamsFor(good, &violation_);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->padded_batch, kBatch);
  EXPECT_EQ(p->kv_indices_capacity, 256);
  EXPECT_EQ(p->page_table_cols, 4);
  EXPECT_NE(p->page_table, nullptr);
  EXPECT_EQ(p->violation, &violation_);
  DecodeMetadataDeviceArgs no_table = good;
  no_table.page_table = {};
  p = FusedMetadataParamsFor(no_table, nullptr);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->page_table, nullptr);
  using A = DecodeMetadataDeviceArgs;
  ExpectRefusals<A>(
      good, [](const A& a) { return FusedMetadataParamsFor(a, nullptr).status(); },
      {{"no req_to_token", [](A& a) { a.req_to_token.table = {}; }, kInvalid,
        "req_to_token has 0 entries, not a whole number >= 1 of rows of 64"},
       {"kv_lens of another batch", [&](A& a) { a.kv_lens = Over(lens_, kBatch - 1); }, kInvalid,
        "decode metadata: 4 rows, 3 kv_lens, 4 q_lens, 5 kv_indptr, 5 qo_indptr,"},
       {"q_lens of another batch", [&](A& a) { a.q_lens = Over(lens2_, kBatch + 1); }, kInvalid,
        "decode metadata: 4 rows, 4 kv_lens, 5 q_lens, 5 kv_indptr, 5 qo_indptr,"},
       {"kv_indptr of another batch", [&](A& a) { a.kv_indptr = Over(indptr_, kBatch); }, kInvalid,
        "decode metadata: 4 rows, 4 kv_lens, 4 q_lens, 4 kv_indptr, 5 qo_indptr,"},
       {"qo_indptr of another batch", [&](A& a) { a.qo_indptr = Over(indptr2_, kBatch + 2); },
        kInvalid, "decode metadata: 4 rows, 4 kv_lens, 4 q_lens, 5 kv_indptr, 6 qo_indptr,"},
       {"kv_last_page_len of another batch",
        [&](A& a) { a.kv_last_page_len = Over(lens3_, kBatch - 1); }, kInvalid,
        "decode metadata: 4 rows, 4 kv_lens, 4 q_lens, 5 kv_indptr, 5 qo_indptr,"},
       {"a page table smaller than [B][cols]",
        [&](A& a) { a.page_table = Over(pages_, kBatch * 4 - 1); }, kInvalid,
        "page_table of 15 entries is not [4][4]"},
       {"a page table of no columns", [](A& a) { a.page_table_cols = PageCount(0); }, kInvalid,
        "page_table of 16 entries is not [4][0]"},
       {"max_kv_len 0", [](A& a) { a.max_kv_len = TokenCount(0); }, kOutOfRange,
        "max_kv_len 0 outside [1, max_context_len = 64]"},
       {"max_kv_len past a row", [](A& a) { a.max_kv_len = TokenCount(kStride + 1); }, kOutOfRange,
        "max_kv_len 65 outside [1, max_context_len = 64]"},
       {"a batch beyond int32",
        [&](A& a) {
          const size_t huge = size_t{1} << 31;
          a.rows = Claimed(rows_, huge);
          a.kv_lens = Claimed(lens_, huge);
          a.q_lens = Claimed(lens2_, huge);
          a.kv_indptr = Claimed(indptr_, huge + 1);
          a.qo_indptr = Claimed(indptr2_, huge + 1);
          a.kv_last_page_len = Claimed(lens3_, huge);
          a.page_table = {};
        },
        kOutOfRange, "batch of 2147483648 beyond 8388608"},
       {"req_to_token claimed past INT64_MAX",
        [&](A& a) {
          // Whole rows: as int64 the size was negative and passed as 5 rows.
          a.req_to_token.table = Claimed(table_, (size_t{1} << 63) + 5 * kStride);
        },
        kOutOfRange, "req_to_token rows, pool slots or page size beyond int32"},
       {"null rows", [](A& a) { a.rows = Null<const ReqPoolIndex>(kBatch); }, kInvalid,
        "rows has 4 elements but a null pointer"},
       {"null kv_lens", [](A& a) { a.kv_lens = Null<const TokenLength>(kBatch); }, kInvalid,
        "kv_lens has 4 elements but a null pointer"},
       {"null q_lens", [](A& a) { a.q_lens = Null<const TokenLength>(kBatch); }, kInvalid,
        "q_lens has 4 elements but a null pointer"},
       {"null kv_indptr", [](A& a) { a.kv_indptr = Null<TokenOffset>(kBatch + 1); }, kInvalid,
        "kv_indptr has 5 elements but a null pointer"},
       {"null qo_indptr", [](A& a) { a.qo_indptr = Null<TokenOffset>(kBatch + 1); }, kInvalid,
        "qo_indptr has 5 elements but a null pointer"},
       {"null kv_last_page_len", [](A& a) { a.kv_last_page_len = Null<TokenLength>(kBatch); },
        kInvalid, "kv_last_page_len has 4 elements but a null pointer"},
       {"null kv_indices", [](A& a) { a.kv_indices = Null<TokenSlot>(256); }, kInvalid,
        "kv_indices has 256 elements but a null pointer"},
       {"null page table", [](A& a) { a.page_table = Null<PageId>(kBatch * 4); }, kInvalid,
        "page_table has 16 elements but a null pointer"}});
}

TEST_F(MetadataKernelArgsTest, TreeMask) {
  TreeMaskDeviceArgs good;
  good.q_lens = Over(lens_, kBatch);
  good.kv_lens = Over(lens2_, kBatch);
  good.tree = Over(bytes_, 64);
  good.mask_indptr = Over(mask_indptr_, kBatch + 1);
  good.mask = Over(bytes2_, 1024);
  good.max_mask_bytes_per_row = 32;
  absl::StatusOr<kernels::TreeMaskParams> p = TreeMaskParamsFor(good, &violation_);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->padded_batch, kBatch);
  EXPECT_EQ(p->tree_capacity, 64);
  EXPECT_EQ(p->mask_capacity, 1024);
  EXPECT_EQ(p->violation, &violation_);
  EXPECT_EQ(p->rows, nullptr) << "no rows: none padded";
  TreeMaskDeviceArgs with_rows = good;
  with_rows.rows = Over(rows_, kBatch);
  p = TreeMaskParamsFor(with_rows, &violation_);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->rows, reinterpret_cast<const int32_t*>(rows_.data()));
  using A = TreeMaskDeviceArgs;
  ExpectRefusals<A>(
      good, [](const A& a) { return TreeMaskParamsFor(a, nullptr).status(); },
      {{"kv_lens of another batch", [&](A& a) { a.kv_lens = Over(lens2_, kBatch - 1); }, kInvalid,
        "tree mask: 4 q_lens, 3 kv_lens, 5 mask_indptr"},
       {"mask_indptr of another batch", [&](A& a) { a.mask_indptr = Over(mask_indptr_, kBatch); },
        kInvalid, "tree mask: 4 q_lens, 4 kv_lens, 4 mask_indptr"},
       {"rows of another batch", [&](A& a) { a.rows = Over(rows_, kBatch - 1); }, kInvalid,
        "tree mask: 4 q_lens, 4 kv_lens, 5 mask_indptr, 3 rows"},
       {"null rows", [](A& a) { a.rows = Null<const ReqPoolIndex>(kBatch); }, kInvalid,
        "rows has 4 elements but a null pointer"},
       {"no mask bytes per row", [](A& a) { a.max_mask_bytes_per_row = 0; }, kOutOfRange,
        "tree mask: max_mask_bytes_per_row must be >= 1"},
       {"a batch beyond int32",
        [&](A& a) {
          const size_t huge = size_t{1} << 31;
          a.q_lens = Claimed(lens_, huge);
          a.kv_lens = Claimed(lens2_, huge);
          a.mask_indptr = Claimed(mask_indptr_, huge + 1);
        },
        kOutOfRange, "tree mask: batch of 2147483648 beyond 8388608"},
       {"null q_lens", [](A& a) { a.q_lens = Null<const TokenLength>(kBatch); }, kInvalid,
        "q_lens has 4 elements but a null pointer"},
       {"null kv_lens", [](A& a) { a.kv_lens = Null<const TokenLength>(kBatch); }, kInvalid,
        "kv_lens has 4 elements but a null pointer"},
       {"null tree", [](A& a) { a.tree = Null<const uint8_t>(64); }, kInvalid,
        "tree has 64 elements but a null pointer"},
       {"null mask_indptr", [](A& a) { a.mask_indptr = Null<int64_t>(kBatch + 1); }, kInvalid,
        "mask_indptr has 5 elements but a null pointer"},
       {"null mask", [](A& a) { a.mask = Null<uint8_t>(1024); }, kInvalid,
        "mask has 1024 elements but a null pointer"}});
}

TEST_F(MetadataKernelArgsTest, DraftStep) {
  const int64_t branches = kBatch * 2;
  DraftStepDeviceArgs good;
  good.req_to_token = ReqToToken();
  good.pool_slots = TokenCount(1024);
  good.rows = Over(rows_, kBatch);
  good.seq_lens = Over(lens_, kBatch);
  good.shape = DraftDecodeShape{2, 3};
  good.step = 2;
  good.kv_lens = Over(lens2_, branches);
  good.kv_indptr = Over(indptr_, branches + 1);
  good.qo_indptr = Over(indptr2_, branches + 1);
  good.kv_last_page_len = Over(lens3_, branches);
  good.kv_indices = Over(indices_, 512);
  absl::StatusOr<kernels::DraftStepParams> p = DraftStepParamsFor(good, &violation_);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->padded_batch, kBatch);
  EXPECT_EQ(p->topk, 2);
  EXPECT_EQ(p->steps, 3);
  EXPECT_EQ(p->step, 2);
  EXPECT_EQ(p->kv_indices_capacity, 512);
  EXPECT_EQ(p->violation, &violation_);
  using A = DraftStepDeviceArgs;
  ExpectRefusals<A>(
      good, [](const A& a) { return DraftStepParamsFor(a, nullptr).status(); },
      {{"no req_to_token", [](A& a) { a.req_to_token.table = {}; }, kInvalid,
        "req_to_token has 0 entries, not a whole number >= 1 of rows of 64"},
       {"topk 0", [](A& a) { a.shape.topk = 0; }, kInvalid,
        "draft-decode: topk 0 and steps 3 must be >= 1"},
       {"no steps", [](A& a) { a.shape.steps = 0; }, kInvalid,
        "draft-decode: topk 2 and steps 0 must be >= 1"},
       {"step past the steps", [](A& a) { a.step = 3; }, kInvalid, "draft step 3 outside [0, 3)"},
       {"negative step", [](A& a) { a.step = -1; }, kInvalid, "draft step -1 outside [0, 3)"},
       {"seq_lens of another batch", [&](A& a) { a.seq_lens = Over(lens_, kBatch - 1); }, kInvalid,
        "draft step: 4 rows, 3 seq_lens, and outputs of 8/9/9/8 entries for 8"},
       {"kv_lens of the requests, not the branches",
        [&](A& a) { a.kv_lens = Over(lens2_, kBatch); }, kInvalid,
        "draft step: 4 rows, 4 seq_lens, and outputs of 4/9/9/8 entries for 8"},
       {"kv_indptr of another batch", [&](A& a) { a.kv_indptr = Over(indptr_, branches); },
        kInvalid, "draft step: 4 rows, 4 seq_lens, and outputs of 8/8/9/8 entries for 8"},
       {"qo_indptr of another batch", [&](A& a) { a.qo_indptr = Over(indptr2_, branches + 2); },
        kInvalid, "draft step: 4 rows, 4 seq_lens, and outputs of 8/9/10/8 entries for 8"},
       {"kv_last_page_len of another batch",
        [&](A& a) { a.kv_last_page_len = Over(lens3_, branches - 1); }, kInvalid,
        "draft step: 4 rows, 4 seq_lens, and outputs of 8/9/9/7 entries for 8"},
       {"branches beyond int32",
        [&](A& a) {
          a.rows = Claimed(rows_, size_t{1} << 30);
          a.shape.topk = 2;
        },
        kOutOfRange, "draft step: 1073741824 rows of 2 branches, beyond 8388608"},
       {"null rows", [](A& a) { a.rows = Null<const ReqPoolIndex>(kBatch); }, kInvalid,
        "rows has 4 elements but a null pointer"},
       {"null seq_lens", [](A& a) { a.seq_lens = Null<const TokenLength>(kBatch); }, kInvalid,
        "seq_lens has 4 elements but a null pointer"},
       {"null kv_lens", [&](A& a) { a.kv_lens = Null<TokenLength>(branches); }, kInvalid,
        "kv_lens has 8 elements but a null pointer"},
       {"null kv_indptr", [&](A& a) { a.kv_indptr = Null<TokenOffset>(branches + 1); }, kInvalid,
        "kv_indptr has 9 elements but a null pointer"},
       {"null qo_indptr", [&](A& a) { a.qo_indptr = Null<TokenOffset>(branches + 1); }, kInvalid,
        "qo_indptr has 9 elements but a null pointer"},
       {"null kv_last_page_len", [&](A& a) { a.kv_last_page_len = Null<TokenLength>(branches); },
        kInvalid, "kv_last_page_len has 8 elements but a null pointer"},
       {"null kv_indices", [](A& a) { a.kv_indices = Null<TokenSlot>(512); }, kInvalid,
        "kv_indices has 512 elements but a null pointer"}});
}

TEST_F(MetadataKernelArgsTest, SplitKvPlan) {
  SplitKvPlanDeviceArgs good;
  good.qo_indptr = Over(indptr_, kBatch + 1);
  good.kv_indptr = Over(indptr2_, kBatch + 1);
  good.options = SplitKvOptions{KvLayout::Paged(*PageSize::Create(16)), 8, TokenCount(100),
                                TokenCount(64)};
  good.work = Over(work_, 32);
  good.unit_indptr = Over(units_, 9);
  good.reduce = Over(reduce_, 16);
  absl::StatusOr<kernels::SplitKvPlanParams> p = SplitKvPlanParamsFor(good, &violation_);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->n, kBatch);
  EXPECT_EQ(p->num_units, 8);
  // Split boundaries: the granularity rounded up to whole pages.
  EXPECT_EQ(p->chunk, 112);
  EXPECT_EQ(p->q_tile, 64);
  EXPECT_EQ(p->work_capacity, 32);
  EXPECT_EQ(p->reduce_capacity, 16);
  EXPECT_EQ(p->violation, &violation_);
  using A = SplitKvPlanDeviceArgs;
  ExpectRefusals<A>(
      good, [](const A& a) { return SplitKvPlanParamsFor(a, nullptr).status(); },
      {{"no units", [](A& a) { a.options.num_units = 0; }, kInvalid,
        "split-KV options: need num_units in [1, 1048576] and kv_granularity,"},
       {"q_tile 0", [](A& a) { a.options.q_tile = TokenCount(0); }, kInvalid,
        "split-KV options: need num_units in [1, 1048576] and kv_granularity,"},
       {"granularity 0", [](A& a) { a.options.kv_granularity = TokenCount(0); }, kInvalid,
        "split-KV options: need num_units in [1, 1048576] and kv_granularity,"},
       {"no qo_indptr",
        [](A& a) {
          a.qo_indptr = {};
          a.kv_indptr = {};
        },
        kInvalid, "split-KV plan: qo_indptr has 0 entries, kv_indptr 0"},
       {"indptrs of different batches", [&](A& a) { a.kv_indptr = Over(indptr2_, kBatch); },
        kInvalid, "split-KV plan: qo_indptr has 5 entries, kv_indptr 4"},
       {"unit_indptr short of num_units + 1", [&](A& a) { a.unit_indptr = Over(units_, 8); },
        kInvalid, "split-KV plan: unit_indptr holds 8 entries, 9 needed"},
       {"a batch beyond int32",
        [&](A& a) {
          a.qo_indptr = Claimed(indptr_, (size_t{1} << 31) + 1);
          a.kv_indptr = Claimed(indptr2_, (size_t{1} << 31) + 1);
        },
        kOutOfRange, "split-KV plan: batch of 2147483648 beyond 1073741824"},
       {"null qo_indptr", [](A& a) { a.qo_indptr = Null<const TokenOffset>(kBatch + 1); }, kInvalid,
        "qo_indptr has 5 elements but a null pointer"},
       {"null kv_indptr", [](A& a) { a.kv_indptr = Null<const TokenOffset>(kBatch + 1); }, kInvalid,
        "kv_indptr has 5 elements but a null pointer"},
       {"null work", [](A& a) { a.work = Null<SplitKvWorkItem>(32); }, kInvalid,
        "work has 32 elements but a null pointer"},
       {"null unit_indptr", [](A& a) { a.unit_indptr = Null<int32_t>(9); }, kInvalid,
        "unit_indptr has 9 elements but a null pointer"},
       {"null reduce", [](A& a) { a.reduce = Null<SplitKvReduceItem>(16); }, kInvalid,
        "reduce has 16 elements but a null pointer"}});
}

// Every count a metadata kernel steps through in int32 stops at kMaxMetadataCount = 2^30
// (launch_checks.h): 2^30 is taken and one more refused. Near INT32_MAX, a count plus a block's
// or a grid's stride wrapped negative on the device and indexed before its buffer. A launch's
// rows (or draft branches), blocks along its grid's x dimension, stop at kMaxMetadataRows =
// 2^23 (metadata_kernels.h): 2^25 rows of 128 threads are 2^32 threads along x, which HIP on
// AMD does not support, so the launch itself would fail after the checks.
TEST_F(MetadataKernelArgsTest, CountsStopAt2To30AndRowsAt2To23) {
  constexpr size_t kLimit = size_t{1} << 30;
  constexpr size_t kRowLimit = size_t{1} << 23;
  const PageSize ps = *PageSize::Create(16);
  const auto stops_at = [&](size_t limit, const char* what, const auto& check,
                            const char* refusal) {
    SCOPED_TRACE(what);
    const absl::Status at = check(limit);
    EXPECT_TRUE(at.ok()) << at;
    const absl::Status past = check(limit + 1);
    EXPECT_EQ(past.code(), kOutOfRange) << past;
    EXPECT_EQ(std::string(past.message()), refusal);
  };
  stops_at(
      kRowLimit, "kv_indices: the batch",
      [&](size_t n) {
        TokenKvIndicesDeviceInputs in;
        in.req_to_token = Over(table_, kRows * kStride);
        in.max_context_len = TokenCount(kStride);
        in.req_pool_indices = Claimed(rows_, n);
        in.kv_indptr = Claimed(indptr_, n + 1);
        in.max_kv_len = TokenCount(kStride);
        in.pool_slots = TokenCount(1024);
        return TokenKvIndicesParamsFor(in, Over(indices_, 256), nullptr).status();
      },
      "batch_size 8388609 beyond 8388608");
  stops_at(
      kLimit, "indptr: the lengths",
      [&](size_t n) {
        return IndptrParamsFor(Claimed(lens_, n), Claimed(indptr_, n + 1), {}, ps, nullptr)
            .status();
      },
      "1073741825 lengths, beyond 1073741824");
  stops_at(
      kRowLimit, "page table: the batch",
      [&](size_t n) {
        return PageTableParamsFor(ReqToToken(), TokenCount(1024), Claimed(rows_, n),
                                  Claimed(lens_, n), ps, Claimed(pages_, n), PageCount(1), nullptr)
            .status();
      },
      "batch of 8388609 beyond 8388608");
  stops_at(
      kLimit, "page table: the columns",
      [&](size_t n) {
        return PageTableParamsFor(ReqToToken(), TokenCount(1024), Over(rows_, kBatch),
                                  Over(lens_, kBatch), ps, Claimed(pages_, kBatch * n),
                                  PageCount(static_cast<int64_t>(n)), nullptr)
            .status();
      },
      "page_table of 1073741825 columns, beyond 1073741824");
  stops_at(
      kLimit, "req_to_token: a row's tokens",
      [&](size_t n) {
        const DeviceReqToToken one_row{Claimed(table_, n), TokenCount(static_cast<int64_t>(n))};
        return PageTableParamsFor(one_row, TokenCount(1024), Over(rows_, kBatch),
                                  Over(lens_, kBatch), ps, Over(pages_, kBatch), PageCount(1),
                                  nullptr)
            .status();
      },
      "req_to_token rows of 1073741825 tokens, beyond 1073741824");
  const auto fused = [&](size_t n, size_t cols) {
    DecodeMetadataDeviceArgs a;
    a.req_to_token = ReqToToken();
    a.pool_slots = TokenCount(1024);
    a.page_size = ps;
    a.rows = Claimed(rows_, n);
    a.kv_lens = Claimed(lens_, n);
    a.q_lens = Claimed(lens2_, n);
    a.kv_indptr = Claimed(indptr_, n + 1);
    a.qo_indptr = Claimed(indptr2_, n + 1);
    a.kv_last_page_len = Claimed(lens3_, n);
    a.kv_indices = Over(indices_, 256);
    a.page_table = Claimed(pages_, n * cols);
    a.page_table_cols = PageCount(static_cast<int64_t>(cols));
    a.max_kv_len = TokenCount(kStride);
    return FusedMetadataParamsFor(a, nullptr).status();
  };
  stops_at(
      kRowLimit, "fused: the batch", [&](size_t n) { return fused(n, 1); },
      "batch of 8388609 beyond 8388608");
  stops_at(
      kLimit, "fused: the page table's columns", [&](size_t n) { return fused(kBatch, n); },
      "page_table of 1073741825 columns, beyond 1073741824");
  stops_at(
      kRowLimit, "tree mask: the batch",
      [&](size_t n) {
        TreeMaskDeviceArgs a;
        a.q_lens = Claimed(lens_, n);
        a.kv_lens = Claimed(lens2_, n);
        a.tree = Over(bytes_, 64);
        a.mask_indptr = Claimed(mask_indptr_, n + 1);
        a.mask = Over(bytes2_, 1024);
        a.max_mask_bytes_per_row = 32;
        return TreeMaskParamsFor(a, nullptr).status();
      },
      "tree mask: batch of 8388609 beyond 8388608");
  stops_at(
      kRowLimit, "draft step: the branches",
      [&](size_t n) {
        DraftStepDeviceArgs a;
        a.req_to_token = ReqToToken();
        a.pool_slots = TokenCount(1024);
        a.rows = Claimed(rows_, n);
        a.seq_lens = Claimed(lens_, n);
        a.shape = DraftDecodeShape{1, 3};
        a.step = 0;
        a.kv_lens = Claimed(lens2_, n);
        a.kv_indptr = Claimed(indptr_, n + 1);
        a.qo_indptr = Claimed(indptr2_, n + 1);
        a.kv_last_page_len = Claimed(lens3_, n);
        a.kv_indices = Over(indices_, 512);
        return DraftStepParamsFor(a, nullptr).status();
      },
      "draft step: 8388609 rows of 1 branches, beyond 8388608");
  stops_at(
      kLimit, "split-KV plan: the batch",
      [&](size_t n) {
        SplitKvPlanDeviceArgs a;
        a.qo_indptr = Claimed(indptr_, n + 1);
        a.kv_indptr = Claimed(indptr2_, n + 1);
        a.options = SplitKvOptions{KvLayout::Paged(ps), 8, TokenCount(100), TokenCount(64)};
        a.work = Over(work_, 32);
        a.unit_indptr = Over(units_, 9);
        a.reduce = Over(reduce_, 16);
        return SplitKvPlanParamsFor(a, nullptr).status();
      },
      "split-KV plan: batch of 1073741825 beyond 1073741824");
}

// The grid's passes for any count: 1 for none, whole passes, at most 65535, and no overflow
// for the largest count a caller can pass (a tree mask's bytes per row are only checked to be
// >= 1; INT64_MAX + 255 wrapped negative and gave 1 pass).
TEST(LaunchChecksTest, PassesCoverAnyCount) {
  using internal::Passes;
  EXPECT_EQ(Passes(0, 256), 1);
  EXPECT_EQ(Passes(1, 256), 1);
  EXPECT_EQ(Passes(256, 256), 1);
  EXPECT_EQ(Passes(257, 256), 2);
  EXPECT_EQ(Passes(int64_t{65535} * 256, 256), 65535);
  EXPECT_EQ(Passes(int64_t{65535} * 256 + 1, 256), 65535);
  EXPECT_EQ(Passes(std::numeric_limits<int64_t>::max(), 256), 65535);
  EXPECT_EQ(Passes(std::numeric_limits<int64_t>::max(), 1), 65535);
}

TEST_F(MetadataKernelArgsTest, GatherKv) {
  constexpr int64_t kRow = 2 * 128 * 2;  // 2 KV heads of 128 bf16 elements
  HostBuffer pool_k(100 * kRow), pool_v(100 * kRow), out_k(10 * kRow), out_v(10 * kRow);
  GatherKvDeviceArgs good;
  good.k_pool = pool_k.span<const uint8_t>();
  good.v_pool = pool_v.span<const uint8_t>();
  good.num_kv_heads = 2;
  good.head_dim = 128;
  good.tok_idx = Over(indices_, 10);
  good.cu_k = Over(indptr_, kBatch + 1);
  good.k_out = out_k.span<uint8_t>();
  good.v_out = out_v.span<uint8_t>();
  absl::StatusOr<kernels::GatherKvParams> p = GatherKvParamsFor(good, &violation_);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->pool_slots, 100);
  EXPECT_EQ(p->row_bytes, kRow);
  EXPECT_EQ(p->out_rows, 10);
  EXPECT_EQ(p->batch_size, kBatch);
  EXPECT_EQ(p->tok_capacity, 10);
  EXPECT_EQ(p->violation, &violation_);
  using A = GatherKvDeviceArgs;
  ExpectRefusals<A>(
      good, [](const A& a) { return GatherKvParamsFor(a, nullptr).status(); },
      {{"head dim 0", [](A& a) { a.head_dim = 0; }, kInvalid,
        "gather: head_dim 0 outside [1, 256] or num_kv_heads 2 < 1"},
       {"head dim 257", [](A& a) { a.head_dim = 257; }, kInvalid,
        "gather: head_dim 257 outside [1, 256] or num_kv_heads 2 < 1"},
       {"no KV heads", [](A& a) { a.num_kv_heads = 0; }, kInvalid,
        "gather: head_dim 128 outside [1, 256] or num_kv_heads 0 < 1"},
       {"unknown element type", [](A& a) { a.dtype = static_cast<KvElementType>(5); }, kInvalid,
        "gather: unknown K/V element type"},
       {"pools of different sizes",
        [&](A& a) { a.v_pool = pool_v.span<const uint8_t>(0, 99 * kRow); }, kInvalid,
        "gather: K/V pools of 51200 and 50688 bytes and outputs of 5120 and 5120"},
       {"pools that are not whole rows",
        [&](A& a) {
          a.k_pool = pool_k.span<const uint8_t>(0, 100 * kRow - 2);
          a.v_pool = pool_v.span<const uint8_t>(0, 100 * kRow - 2);
        },
        kInvalid, "gather: K/V pools of 51198 and 51198 bytes and outputs of 5120 and 5120"},
       {"outputs of different sizes", [&](A& a) { a.v_out = out_v.span<uint8_t>(0, 9 * kRow); },
        kInvalid, "gather: K/V pools of 51200 and 51200 bytes and outputs of 5120 and 4608"},
       {"outputs that are not whole rows",
        [&](A& a) {
          a.k_out = out_k.span<uint8_t>(0, 10 * kRow - 2);
          a.v_out = out_v.span<uint8_t>(0, 10 * kRow - 2);
        },
        kInvalid, "gather: K/V pools of 51200 and 51200 bytes and outputs of 5118 and 5118"},
       {"no cu_k", [](A& a) { a.cu_k = {}; }, kInvalid, "gather: cu_k needs bs + 1 >= 1 entries"},
       {"more than INT32_MAX sequences",
        [&](A& a) { a.cu_k = Claimed(indptr_, (size_t{1} << 31) + 1); }, kOutOfRange,
        "gather: more than INT32_MAX sequences"},
       {"pools of more than 2^31 rows",
        [&](A& a) {
          a.k_pool = pool_k.span<const uint8_t>(0, ((size_t{1} << 31) + 1) * kRow);
          a.v_pool = pool_v.span<const uint8_t>(0, ((size_t{1} << 31) + 1) * kRow);
        },
        kOutOfRange, "gather: K/V pools or outputs of more than 2^31 rows"},
       {"pools claimed past INT64_MAX",
        [&](A& a) {
          a.k_pool = pool_k.span<const uint8_t>(0, size_t{1} << 63);
          a.v_pool = pool_v.span<const uint8_t>(0, size_t{1} << 63);
        },
        kOutOfRange, "gather: K/V pools or outputs of more than 2^31 rows"},
       {"outputs of more than 2^31 rows",
        [&](A& a) {
          a.k_out = out_k.span<uint8_t>(0, ((size_t{1} << 31) + 1) * kRow);
          a.v_out = out_v.span<uint8_t>(0, ((size_t{1} << 31) + 1) * kRow);
        },
        kOutOfRange, "gather: K/V pools or outputs of more than 2^31 rows"},
       {"k_pool off the element",
        [&](A& a) { a.k_pool = pool_k.span<const uint8_t>(1, 100 * kRow); }, kInvalid,
        "gather: a K/V pointer is not aligned to the 2-byte element"},
       {"v_pool off the element",
        [&](A& a) { a.v_pool = pool_v.span<const uint8_t>(1, 100 * kRow); }, kInvalid,
        "gather: a K/V pointer is not aligned to the 2-byte element"},
       {"k_out off the element", [&](A& a) { a.k_out = out_k.span<uint8_t>(1, 10 * kRow); },
        kInvalid, "gather: a K/V pointer is not aligned to the 2-byte element"},
       {"v_out off the element", [&](A& a) { a.v_out = out_v.span<uint8_t>(1, 10 * kRow); },
        kInvalid, "gather: a K/V pointer is not aligned to the 2-byte element"},
       {"null k_pool", [](A& a) { a.k_pool = Null<const uint8_t>(100 * kRow); }, kInvalid,
        "k_pool has 51200 elements but a null pointer"},
       {"null v_pool", [](A& a) { a.v_pool = Null<const uint8_t>(100 * kRow); }, kInvalid,
        "v_pool has 51200 elements but a null pointer"},
       {"null tok_idx", [](A& a) { a.tok_idx = Null<const TokenSlot>(10); }, kInvalid,
        "tok_idx has 10 elements but a null pointer"},
       {"null cu_k", [](A& a) { a.cu_k = Null<const TokenOffset>(kBatch + 1); }, kInvalid,
        "cu_k has 5 elements but a null pointer"},
       {"null k_out", [](A& a) { a.k_out = Null<uint8_t>(10 * kRow); }, kInvalid,
        "k_out has 5120 elements but a null pointer"},
       {"null v_out", [](A& a) { a.v_out = Null<uint8_t>(10 * kRow); }, kInvalid,
        "v_out has 5120 elements but a null pointer"}});
}

}  // namespace
}  // namespace attnmeta
