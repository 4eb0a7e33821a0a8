// GPU test of BuildTokenKvIndicesOnDevice: the device twin must produce exactly the arrays of
// the host builder BuildTokenKvIndices (which is itself checked against the request-to-token
// table read directly), for batches laid out by the real allocator with shuffled pages.
// Needs a GPU: fails when none is visible.

#include "attention/kernels/token_kv_indices.h"

#include <random>
#include <vector>

#include "attention/kernels/testing/device_buffer.h"
#include "attention/metadata/builders.h"
#include "gtest/gtest.h"
#include "kvcache/paged_token_allocator.h"
#include "kvcache/req_to_token_pool.h"

namespace attnmeta {
namespace {

using testing::DeviceBuffer;

constexpr TokenSlot kPoison(-7);

class TokenKvIndicesGpuTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(testing::RequireGpu().ok()) << testing::RequireGpu(); }
};

struct Batch {
  std::vector<ReqPoolIndex> rows;
  std::vector<TokenOffset> kv_indptr;
  std::vector<TokenPosition> kv_start_idx;  // empty: all zeros
  std::vector<TokenSlot> expected;        // [kv_indptr.back()]
  TokenCount max_kv_len;
};

// A batch of `bs` requests with random lengths up to max_len, allocated with shuffled pages
// and written to `pool`; each request's KV range starts at a random offset when with_start.
Batch MakeBatch(ReqToTokenPool& pool, int64_t page_size, int bs, int64_t max_len,
                bool with_start, uint64_t seed) {
  std::mt19937_64 rng(seed);
  const PageSize ps = *PageSize::Create(page_size);
  PagedTokenAllocator alloc =
      *PagedTokenAllocator::Create(PagesForTokensCeil(TokenCount(bs * max_len), ps) + PageCount(bs),
                                   ps, FreePagePolicy::Shuffled(seed));
  Batch b;
  b.kv_indptr.push_back(TokenOffset(0));
  for (int i = 0; i < bs; ++i) {
    const int64_t stored = std::uniform_int_distribution<int64_t>(0, max_len)(rng);
    const ReqPoolIndex row = *pool.Allocate();
    std::vector<TokenSlot> slots =
        *alloc.AllocateExtend({{TokenCount(0), TokenCount(stored), TokenSlot(0)}});
    EXPECT_TRUE(pool.Write(row, TokenCount(0), slots).ok());
    const int64_t start =
        with_start ? std::uniform_int_distribution<int64_t>(0, stored)(rng) : 0;
    const int64_t len = std::uniform_int_distribution<int64_t>(0, stored - start)(rng);
    b.rows.push_back(row);
    if (with_start) b.kv_start_idx.push_back(TokenPosition(static_cast<int32_t>(start)));
    b.kv_indptr.push_back(TokenOffset(static_cast<int32_t>(b.kv_indptr.back().value() + len)));
    b.expected.insert(b.expected.end(), slots.begin() + start, slots.begin() + start + len);
    b.max_kv_len = std::max(b.max_kv_len, TokenCount(len));
  }
  return b;
}

// Runs the kernel into a poisoned buffer with `slack` extra entries; checks every written
// entry and that the tail kept its poison.
void RunAndCheck(const ReqToTokenPool& pool, const Batch& b, size_t slack) {
  auto table = DeviceBuffer<TokenSlot>::FromHost(pool.table());
  auto rows = DeviceBuffer<ReqPoolIndex>::FromHost(b.rows);
  auto indptr = DeviceBuffer<TokenOffset>::FromHost(b.kv_indptr);
  auto start = DeviceBuffer<TokenPosition>::FromHost(b.kv_start_idx);
  std::vector<TokenSlot> poison(b.expected.size() + slack, kPoison);
  auto out = DeviceBuffer<TokenSlot>::FromHost(poison);
  ASSERT_TRUE(table.ok() && rows.ok() && indptr.ok() && start.ok() && out.ok());

  TokenKvIndicesDeviceInputs in;
  in.req_to_token = table->const_span();
  in.max_context_len = pool.max_context_len();
  in.req_pool_indices = rows->const_span();
  in.kv_indptr = indptr->const_span();
  in.kv_start_idx = start->const_span();
  in.max_kv_len = b.max_kv_len;
  ASSERT_TRUE(BuildTokenKvIndicesOnDevice(in, out->span(), nullptr).ok());
  ASSERT_EQ(hipDeviceSynchronize(), hipSuccess);
  auto got = out->ToHost();
  ASSERT_TRUE(got.ok()) << got.status();
  // The host builder on an identically poisoned buffer.
  std::vector<TokenSlot> host = poison;
  ASSERT_TRUE(BuildTokenKvIndices(pool, b.rows, b.kv_indptr, b.kv_start_idx, absl::MakeSpan(host)).ok());
  ASSERT_EQ(std::vector<TokenSlot>(host.begin(), host.begin() + b.expected.size()), b.expected);
  EXPECT_TRUE(*got == host) << "device and host builders differ";
  for (size_t k = 0; k < b.expected.size(); ++k) {
    ASSERT_EQ((*got)[k], b.expected[k]) << "kv_indices[" << k << "]";
  }
  for (size_t k = b.expected.size(); k < got->size(); ++k) {
    ASSERT_EQ((*got)[k], kPoison) << "kv_indices[" << k << "] past kv_indptr[bs] was written";
  }
}

TEST_F(TokenKvIndicesGpuTest, MatchesHostTableForShuffledPools) {
  for (int64_t ps : {1, 7, 16, 64}) {
    for (bool with_start : {false, true}) {
      const uint64_t seed = 1000 + ps * 2 + with_start;
      SCOPED_TRACE(::testing::Message() << "page_size " << ps << " with_start " << with_start
                                        << " seed " << seed);
      ReqToTokenPool pool = *ReqToTokenPool::Create(64, TokenCount(10000));
      const Batch b = MakeBatch(pool, ps, 37, 9000, with_start, seed);
      RunAndCheck(pool, b, 1000);
    }
  }
}

TEST_F(TokenKvIndicesGpuTest, LongSequenceSplitsOverManyBlocks) {
  ReqToTokenPool pool = *ReqToTokenPool::Create(2, TokenCount(300000));
  const Batch b = MakeBatch(pool, 16, 2, 300000, false, 7);
  ASSERT_GT(b.max_kv_len, TokenCount(4 * 4096));
  RunAndCheck(pool, b, 64);
}

TEST_F(TokenKvIndicesGpuTest, EmptyBatchAndZeroLengthsWriteNothing) {
  ReqToTokenPool pool = *ReqToTokenPool::Create(4, TokenCount(64));
  Batch empty;
  empty.kv_indptr = {TokenOffset(0)};
  RunAndCheck(pool, empty, 16);
  Batch zeros;
  for (int i = 0; i < 3; ++i) zeros.rows.push_back(*pool.Allocate());
  zeros.kv_indptr.assign(4, TokenOffset(0));
  RunAndCheck(pool, zeros, 16);
}

TEST_F(TokenKvIndicesGpuTest, RejectsInconsistentShapesWithoutLaunching) {
  auto table = *DeviceBuffer<TokenSlot>::Create(4 * 8);
  auto rows = *DeviceBuffer<ReqPoolIndex>::Create(2);
  auto indptr = *DeviceBuffer<TokenOffset>::Create(3);
  auto out = *DeviceBuffer<TokenSlot>::Create(16);
  TokenKvIndicesDeviceInputs good;
  good.req_to_token = table.const_span();
  good.max_context_len = TokenCount(8);
  good.req_pool_indices = rows.const_span();
  good.kv_indptr = indptr.const_span();
  good.max_kv_len = TokenCount(8);

  TokenKvIndicesDeviceInputs in = good;
  in.kv_indptr = DeviceSpan<const TokenOffset>(indptr.data(), 2);
  EXPECT_EQ(BuildTokenKvIndicesOnDevice(in, out.span(), nullptr).code(),
            absl::StatusCode::kInvalidArgument);
  in = good;
  in.kv_indptr = DeviceSpan<const TokenOffset>();
  EXPECT_EQ(BuildTokenKvIndicesOnDevice(in, out.span(), nullptr).code(),
            absl::StatusCode::kInvalidArgument);
  in = good;
  auto one_start = *DeviceBuffer<TokenPosition>::Create(1);
  in.kv_start_idx = one_start.const_span();
  EXPECT_EQ(BuildTokenKvIndicesOnDevice(in, out.span(), nullptr).code(),
            absl::StatusCode::kInvalidArgument);
  in = good;
  in.max_context_len = TokenCount(7);
  EXPECT_EQ(BuildTokenKvIndicesOnDevice(in, out.span(), nullptr).code(),
            absl::StatusCode::kInvalidArgument);
  in = good;
  in.max_kv_len = TokenCount(9);
  EXPECT_EQ(BuildTokenKvIndicesOnDevice(in, out.span(), nullptr).code(),
            absl::StatusCode::kOutOfRange);
  in = good;
  in.req_pool_indices = DeviceSpan<const ReqPoolIndex>(nullptr, 2);
  EXPECT_EQ(BuildTokenKvIndicesOnDevice(in, out.span(), nullptr).code(),
            absl::StatusCode::kInvalidArgument);
}

// A rejected call launches nothing: with valid device arrays whose contents would make the
// kernel write, a shape error leaves the poisoned output untouched.
TEST_F(TokenKvIndicesGpuTest, RejectedCallWritesNothing) {
  ReqToTokenPool pool = *ReqToTokenPool::Create(4, TokenCount(64));
  PagedTokenAllocator alloc = *PagedTokenAllocator::Create(
      PageCount(16), *PageSize::Create(16), FreePagePolicy::Shuffled(9));
  Batch b;
  b.kv_indptr.push_back(TokenOffset(0));
  for (int32_t len : {5, 40, 17}) {
    const ReqPoolIndex row = *pool.Allocate();
    const std::vector<TokenSlot> slots =
        *alloc.AllocateExtend({{TokenCount(0), TokenCount(len), TokenSlot(0)}});
    ASSERT_TRUE(pool.Write(row, TokenCount(0), slots).ok());
    b.rows.push_back(row);
    b.kv_indptr.push_back(TokenOffset(b.kv_indptr.back().value() + len));
    b.expected.insert(b.expected.end(), slots.begin(), slots.end());
    b.max_kv_len = std::max(b.max_kv_len, TokenCount(len));
  }
  auto table = *DeviceBuffer<TokenSlot>::FromHost(pool.table());
  auto rows = *DeviceBuffer<ReqPoolIndex>::FromHost(b.rows);
  auto indptr = *DeviceBuffer<TokenOffset>::FromHost(b.kv_indptr);
  const std::vector<TokenSlot> poison(b.expected.size() + 8, kPoison);
  auto out = *DeviceBuffer<TokenSlot>::FromHost(poison);
  TokenKvIndicesDeviceInputs in;
  in.req_to_token = table.const_span();
  in.max_context_len = pool.max_context_len();
  in.req_pool_indices = DeviceSpan<const ReqPoolIndex>(rows.data(), 2);  // bs is 3
  in.kv_indptr = indptr.const_span();
  in.max_kv_len = b.max_kv_len;
  ASSERT_EQ(BuildTokenKvIndicesOnDevice(in, out.span(), nullptr).code(),
            absl::StatusCode::kInvalidArgument);
  ASSERT_EQ(hipDeviceSynchronize(), hipSuccess);
  EXPECT_EQ(*out.ToHost(), poison);
  // The same arrays with the right shape do write (the negative control of this test).
  in.req_pool_indices = rows.const_span();
  ASSERT_TRUE(BuildTokenKvIndicesOnDevice(in, out.span(), nullptr).ok());
  ASSERT_EQ(hipDeviceSynchronize(), hipSuccess);
  const std::vector<TokenSlot> got = *out.ToHost();
  EXPECT_EQ(std::vector<TokenSlot>(got.begin(), got.begin() + b.expected.size()), b.expected);
}

}  // namespace
}  // namespace attnmeta
