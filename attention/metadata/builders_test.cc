#include "attention/metadata/builders.h"

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "attention/metadata/testing/batch_fixture.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tools/bench/heap_counter.h"

namespace attnmeta {
namespace {

using testing::BatchFixture;

std::vector<TokenLength> Lens(std::initializer_list<int32_t> v) {
  std::vector<TokenLength> out;
  for (int32_t x : v) out.push_back(TokenLength(x));
  return out;
}

TEST(BuildIndptrTest, PrefixSum) {
  std::vector<TokenOffset> out(4);
  ASSERT_TRUE(BuildIndptr(Lens({3, 0, 5}), absl::MakeSpan(out)).ok());
  EXPECT_EQ(out, (std::vector<TokenOffset>{TokenOffset(0), TokenOffset(3), TokenOffset(3),
                                           TokenOffset(8)}));
  std::vector<TokenOffset> one(1, TokenOffset(9));
  ASSERT_TRUE(BuildIndptr({}, absl::MakeSpan(one)).ok());
  EXPECT_EQ(one[0], TokenOffset(0));
}

TEST(BuildIndptrTest, ErrorsLeaveOutputUnchanged) {
  std::vector<TokenOffset> out(3, TokenOffset(-5));
  const std::vector<TokenOffset> before = out;
  EXPECT_EQ(BuildIndptr(Lens({1, 2, 3}), absl::MakeSpan(out)).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(BuildIndptr(Lens({1, -2}), absl::MakeSpan(out)).code(),
            absl::StatusCode::kInvalidArgument);
  // A total beyond int32 is OutOfRange, not a wrap.
  EXPECT_EQ(BuildIndptr(Lens({2000000000, 2000000000}), absl::MakeSpan(out)).code(),
            absl::StatusCode::kOutOfRange);
  EXPECT_EQ(out, before);
}

TEST(BuildIndptrTest, TotalExactlyAtTheInt32Limit) {
  std::vector<TokenOffset> out(3);
  ASSERT_TRUE(BuildIndptr(Lens({2147483600, 47}), absl::MakeSpan(out)).ok());
  EXPECT_EQ(out[2], TokenOffset(2147483647));
  EXPECT_EQ(BuildIndptr(Lens({2147483600, 48}), absl::MakeSpan(out)).code(),
            absl::StatusCode::kOutOfRange);
}

TEST(MaxLengthTest, FromRealLengths) {
  EXPECT_EQ(MaxLength({}), TokenCount(0));
  EXPECT_EQ(MaxLength(Lens({3, 17, 5})), TokenCount(17));
}

TEST(BuildKvLastPageLenTest, UnalignedAndEmpty) {
  const PageSize ps = *PageSize::Create(16);
  std::vector<TokenLength> out(5);
  ASSERT_TRUE(BuildKvLastPageLen(Lens({0, 1, 16, 17, 33}), ps, absl::MakeSpan(out)).ok());
  EXPECT_EQ(out, Lens({0, 1, 16, 1, 1}));
  std::vector<TokenLength> small(2);
  EXPECT_EQ(BuildKvLastPageLen(Lens({1, 2, 3}), ps, absl::MakeSpan(small)).code(),
            absl::StatusCode::kInvalidArgument);
  // A negative length: refused, nothing written.
  std::vector<TokenLength> two(2, TokenLength(-7));
  EXPECT_EQ(BuildKvLastPageLen(Lens({3, -1}), ps, absl::MakeSpan(two)).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(two, Lens({-7, -7}));
  // A page size that is not a power of two (the division path), page size 1, the largest page
  // and the longest sequence.
  const auto last = [](int32_t kv_len, int64_t page) {
    return LastPageLen(TokenLength(kv_len), *PageSize::Create(page)).value();
  };
  EXPECT_EQ(last(7, 7), 7);
  EXPECT_EQ(last(8, 7), 1);
  EXPECT_EQ(last(20, 7), 6);
  EXPECT_EQ(last(5, 1), 1);
  EXPECT_EQ(last(0, 7), 0);
  // A negative length (the builders refuse it first) has no last page either.
  EXPECT_EQ(last(-5, 16), 0);
  EXPECT_EQ(last(std::numeric_limits<int32_t>::min(), 16), 0);
  EXPECT_EQ(last(std::numeric_limits<int32_t>::min(), 7), 0);
  // 2^31 - 1 tokens: 2047 whole pages of 2^20 and one of 2^20 - 1; 715827882 pages of 3 and
  // one token.
  EXPECT_EQ(last(INT32_MAX, 1 << 20), 1048575);
  EXPECT_EQ(last(INT32_MAX, 3), 1);
}

TEST(BuildTokenKvIndicesTest, CopiesRowsWithStartOffsetsAndKeepsTail) {
  BatchFixture f(7, 1);
  f.AddSequence(10, 3);
  f.AddSequence(0, 20);
  const std::vector<TokenSlot> a = f.SlotsOf(0);
  const std::vector<TokenSlot> b = f.SlotsOf(1);
  // Sequence 0: positions 4..12 (9 tokens); sequence 1: positions 2..6 (5 tokens).
  const std::vector<TokenOffset> indptr = {TokenOffset(0), TokenOffset(9), TokenOffset(14)};
  const std::vector<TokenPosition> start = {TokenPosition(4), TokenPosition(2)};
  std::vector<TokenSlot> out(20, TokenSlot(-1));
  ASSERT_TRUE(BuildTokenKvIndices(f.pool(), f.rows(), indptr, start, absl::MakeSpan(out)).ok());
  std::vector<TokenSlot> want(a.begin() + 4, a.begin() + 13);
  want.insert(want.end(), b.begin() + 2, b.begin() + 7);
  EXPECT_EQ(std::vector<TokenSlot>(out.begin(), out.begin() + 14), want);
  for (size_t k = 14; k < out.size(); ++k) EXPECT_EQ(out[k], TokenSlot(-1)) << k;
}

TEST(BuildTokenKvIndicesTest, BadInputsWriteNothing) {
  BatchFixture f(16, 2);
  f.AddSequence(5, 5);
  std::vector<TokenSlot> out(32, TokenSlot(-1));
  const std::vector<TokenSlot> before = out;
  auto code = [&](std::vector<ReqPoolIndex> rows, std::vector<TokenOffset> indptr,
                  std::vector<TokenPosition> start, size_t out_size) {
    return BuildTokenKvIndices(f.pool(), rows, indptr, start,
                               absl::MakeSpan(out).subspan(0, out_size))
        .code();
  };
  const ReqPoolIndex r = f.rows()[0];
  const TokenOffset z(0);
  EXPECT_EQ(code({r}, {}, {}, 32), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code({r, r}, {z, TokenOffset(3)}, {}, 32), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code({r}, {TokenOffset(1), TokenOffset(3)}, {}, 32),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code({r, r}, {z, TokenOffset(3), TokenOffset(2)}, {}, 32),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code({r}, {z, TokenOffset(3)}, {TokenPosition(-1)}, 32),
            absl::StatusCode::kOutOfRange);
  EXPECT_EQ(code({r}, {z, TokenOffset(10)}, {}, 9), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code({ReqPoolIndex(64)}, {z, TokenOffset(3)}, {}, 32), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(code({ReqPoolIndex(-1)}, {z, TokenOffset(3)}, {}, 32), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(code({ReqPoolIndex(5)}, {z, TokenOffset(3)}, {}, 32),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(code({r}, {z, TokenOffset(5)}, {TokenPosition(8190)}, 32),
            absl::StatusCode::kOutOfRange);
  EXPECT_EQ(out, before);
}

TEST(BuildPageTableTest, PagesThenPadding) {
  for (int64_t ps : {1, 2, 7, 16, 64}) {
    SCOPED_TRACE(::testing::Message() << "page_size " << ps);
    BatchFixture f(ps, 3);
    f.AddSequence(3 * ps + 1, 2);
    f.AddSequence(0, 1);
    const std::vector<TokenLength>& lens = f.kv_lens();
    const int64_t cols = PagesForTokensCeil(MaxLength(lens), f.page_size()).value() + 2;
    PageTable table(3, PageCount(cols));
    // A reused buffer holds stale pages everywhere; row 2 is past the batch and must keep
    // them, rows 0 and 1 get the padding page past their own pages.
    std::fill(table.span().entries().begin(), table.span().entries().end(), PageId(99));
    ASSERT_TRUE(BuildPageTable(f.pool(), f.rows(), lens, f.page_size(), table.span()).ok());
    for (int i = 0; i < 2; ++i) {
      const std::vector<TokenSlot> slots = f.SlotsOf(i);
      for (int64_t t = 0; t < static_cast<int64_t>(slots.size()); ++t) {
        ASSERT_EQ(table.span().row(i)[t / ps], PageOf(slots[t], f.page_size()));
      }
      for (int64_t j = PagesForTokensCeil(lens[i].count(), f.page_size()).value(); j < cols; ++j) {
        ASSERT_EQ(table.span().row(i)[j], kPaddingPage);
      }
    }
    for (PageId p : table.span().row(2)) ASSERT_EQ(p, PageId(99));
    PageTable narrow(2, PageCount(cols - 3));
    EXPECT_EQ(BuildPageTable(f.pool(), f.rows(), lens, f.page_size(), narrow.span()).code(),
              absl::StatusCode::kInvalidArgument);
  }
}

TEST(BuildForwardMetadataTest, ExtendWithPrefixIsValidInCheckedMode) {
  BatchFixture f(16, 4);
  f.AddSequence(37, 5);
  f.AddSequence(0, 70);
  f.AddSequenceSharingPrefix(0, 32, 40, 3);
  BuildOptions opts;
  opts.check = MetadataCheck{f.pool_slots(), f.num_query_rows()};
  auto m = BuildForwardMetadata(f.Batch(ForwardMode::kExtend), f.pool(), f.page_size(), opts);
  ASSERT_TRUE(m.ok()) << m.status();
  // Checked mode against a query tensor of the wrong size (field bug 8) fails before use.
  opts.check = MetadataCheck{f.pool_slots(), f.num_query_rows() + TokenCount(1)};
  EXPECT_EQ(
      BuildForwardMetadata(f.Batch(ForwardMode::kExtend), f.pool(), f.page_size(), opts)
          .status()
          .code(),
      absl::StatusCode::kInvalidArgument);
  // ... and against a pool too small for the slots.
  opts.check = MetadataCheck{TokenCount(64), f.num_query_rows()};
  EXPECT_EQ(
      BuildForwardMetadata(f.Batch(ForwardMode::kExtend), f.pool(), f.page_size(), opts)
          .status()
          .code(),
      absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(m->max_kv_len, TokenCount(70));
  EXPECT_EQ(m->max_q_len, TokenCount(70));
  EXPECT_EQ(m->qo_indptr.back(), TokenOffset(78));
  EXPECT_EQ(m->kv_indptr.back(), TokenOffset(42 + 70 + 43));
  EXPECT_EQ(m->page_table.cols(), PageCount(5));
  // Prefix reuse: sequence 2's first 32 slots are sequence 0's.
  EXPECT_EQ(std::vector<TokenSlot>(m->kv_indices.begin(), m->kv_indices.begin() + 32),
            std::vector<TokenSlot>(m->kv_indices.begin() + 112, m->kv_indices.begin() + 144));
}

TEST(BuildForwardMetadataTest, LengthsPastTheRowFailBeforeAllocating) {
  BatchFixture f(16, 6);
  f.AddSequence(10, 2);
  std::vector<TokenLength> huge = {TokenLength(2000000000)};
  std::vector<TokenLength> q = {TokenLength(1)};
  ForwardBatch b{ForwardMode::kDecode, f.rows(), huge, q, {}};
  const int64_t live = bench::HeapLiveBytes();
  bench::ResetHeapPeak();
  EXPECT_EQ(BuildForwardMetadata(b, f.pool(), f.page_size()).status().code(),
            absl::StatusCode::kOutOfRange);
  // kv_indices sized by the lengths would be 8 GB.
  if (bench::HeapCounterIsLive()) {
    EXPECT_LT(bench::HeapPeakBytes() - live, 64 << 10);
  }
}

// A request row listed twice is refused before anything is sized: the page table of 1025
// requests reading up to 8192 tokens of a two-row pool would be 1025 x 8192 entries.
TEST(BuildForwardMetadataTest, ARepeatedRequestRowIsRefusedBeforeAllocating) {
  BatchFixture f(1, 3, /*num_pages=*/16384, /*max_reqs=*/2, /*max_context=*/8192);
  f.AddSequence(8191, 1);
  f.AddSequence(0, 1);
  std::vector<ReqPoolIndex> rows(1025, f.rows()[1]);
  rows[0] = f.rows()[0];
  std::vector<TokenLength> kv(1025, TokenLength(1));
  kv[0] = TokenLength(8192);
  const std::vector<TokenLength> q(1025, TokenLength(1));
  const ForwardBatch b{ForwardMode::kDecode, rows, kv, q, {}};
  const int64_t live = bench::HeapLiveBytes();
  bench::ResetHeapPeak();
  const absl::Status s = BuildForwardMetadata(b, f.pool(), f.page_size()).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_EQ(s.message(), absl::StrCat("requests 1 and 2 share req row ", f.rows()[1].value(),
                                      " (a row holds one request's tokens)"));
  if (bench::HeapCounterIsLive()) {
    EXPECT_LT(bench::HeapPeakBytes() - live, 64 << 10);
  }
  // The same lengths over distinct rows are built.
  const ForwardBatch two{ForwardMode::kDecode,
                         f.rows(),
                         absl::MakeConstSpan(kv).subspan(0, 2),
                         absl::MakeConstSpan(q).subspan(0, 2),
                         {}};
  EXPECT_TRUE(BuildForwardMetadata(two, f.pool(), f.page_size()).ok());
}

// A custom mask's tree rows are checked before the mask is allocated: 8 requests of 60,000
// query rows over as many KV tokens would size the mask at 28.8 GB, more than the test
// machines hold, and their tree rows are missing.
TEST(BuildForwardMetadataTest, MissingTreeRowsFailBeforeTheMaskIsAllocated) {
  BatchFixture f(16, 6, /*num_pages=*/8 * 60000 / 16 + 64, /*max_reqs=*/8, /*max_context=*/60000);
  for (int i = 0; i < 8; ++i) f.AddSequence(0, 60000);
  BuildOptions options;
  options.mask_layout = MaskLayout::kFull;
  const ForwardBatch batch = f.Batch(ForwardMode::kExtend);
  const int64_t live = bench::HeapLiveBytes();
  bench::ResetHeapPeak();
  const absl::Status s = BuildForwardMetadata(batch, f.pool(), f.page_size(), options).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("tree rows"), absl::string_view::npos) << s;
  // Whatever the other arrays take (kv_indices: 1.9 MB), far below the mask's 28.8 GB.
  if (bench::HeapCounterIsLive()) {
    EXPECT_LT(bench::HeapPeakBytes() - live, int64_t{64} << 20);
  }
}

// Every input array's size is checked before it is read: a kv_start_idx shorter or longer
// than the batch is an error, not a read past its end.
TEST(BuildForwardMetadataTest, StartOffsetsOfTheWrongSizeAreRejected) {
  BatchFixture f(16, 7);
  f.AddSequence(10, 2);
  f.AddSequence(20, 3);
  f.AddSequence(5, 1);
  BuildOptions no_table;
  no_table.page_table = false;
  for (size_t n : {1, 2, 4}) {
    const std::vector<TokenPosition> starts(n, TokenPosition(0));
    ForwardBatch b = f.Batch(ForwardMode::kExtend);
    b.kv_start_idx = starts;
    const absl::Status s = BuildForwardMetadata(b, f.pool(), f.page_size(), no_table).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << n;
    EXPECT_NE(s.message().find("kv_start_idx"), absl::string_view::npos) << s;
  }
  const std::vector<TokenPosition> starts(3, TokenPosition(1));
  std::vector<TokenLength> kv = {TokenLength(11), TokenLength(22), TokenLength(5)};
  ForwardBatch b = f.Batch(ForwardMode::kExtend);
  b.kv_start_idx = starts;
  b.kv_lens = kv;
  EXPECT_TRUE(BuildForwardMetadata(b, f.pool(), f.page_size(), no_table).ok());
  // The same batch with the page table: its rows start at position 0, so a start offset would
  // make it disagree with kv_indices. Refused, naming both.
  const absl::Status s = BuildForwardMetadata(b, f.pool(), f.page_size()).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("drop kv_start_idx or the page table"), absl::string_view::npos) << s;
}

TEST(BuildForwardMetadataTest, ModeRules) {
  BatchFixture f(16, 5);
  f.AddSequence(10, 2);
  f.AddSequence(10, 1);
  EXPECT_EQ(BuildForwardMetadata(f.Batch(ForwardMode::kDecode), f.pool(), f.page_size())
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(
      BuildForwardMetadata(f.Batch(ForwardMode::kIdle), f.pool(), f.page_size()).status().code(),
      absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(BuildForwardMetadata(f.Batch(ForwardMode::kMixed), f.pool(), f.page_size()).ok());
  ForwardBatch idle;
  idle.mode = ForwardMode::kIdle;
  auto m = BuildForwardMetadata(idle, f.pool(), f.page_size());
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->kv_indptr.size(), 1u);
  EXPECT_EQ(m->max_kv_len, TokenCount(0));
  // Decode is exactly one query row per sequence: none is as wrong as two.
  std::vector<TokenLength> no_query = {TokenLength(0), TokenLength(1)};
  ForwardBatch decode_without_query = f.Batch(ForwardMode::kDecode);
  decode_without_query.q_lens = no_query;
  EXPECT_EQ(BuildForwardMetadata(decode_without_query, f.pool(), f.page_size()).status().code(),
            absl::StatusCode::kInvalidArgument);
  std::vector<TokenLength> q = {TokenLength(13), TokenLength(1)};
  ForwardBatch longer_query = f.Batch(ForwardMode::kExtend);
  longer_query.q_lens = q;
  EXPECT_EQ(BuildForwardMetadata(longer_query, f.pool(), f.page_size()).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(ForwardModeTest, NamesRoundTripAndSpeculativeRules) {
  for (ForwardMode m : {ForwardMode::kDecode, ForwardMode::kExtend, ForwardMode::kMixed,
                        ForwardMode::kIdle, ForwardMode::kDraftExtend, ForwardMode::kTargetVerify,
                        ForwardMode::kDraftDecode}) {
    auto back = ParseForwardMode(ForwardModeName(m));
    ASSERT_TRUE(back.ok()) << ForwardModeName(m);
    EXPECT_EQ(*back, m);
  }
  EXPECT_EQ(ParseForwardMode("verify").status().code(), absl::StatusCode::kInvalidArgument);
  BatchFixture f(16, 8);
  f.AddSequence(30, 4);
  f.AddSequence(50, 4);
  // Draft-extend and target-verify: several query rows per request.
  EXPECT_TRUE(BuildForwardMetadata(f.Batch(ForwardMode::kDraftExtend), f.pool(), f.page_size()).ok());
  // Target-verify reads its query rows through the tree mask, so it needs one.
  EXPECT_EQ(BuildForwardMetadata(f.Batch(ForwardMode::kTargetVerify), f.pool(), f.page_size())
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  std::vector<uint8_t> chains(2 * 4 * 4, 0);
  for (int b = 0; b < 2; ++b) {
    for (int r = 0; r < 4; ++r) {
      for (int c = 0; c <= r; ++c) chains[(b * 4 + r) * 4 + c] = 1;
    }
  }
  ForwardBatch verify = f.Batch(ForwardMode::kTargetVerify);
  verify.tree_mask = chains;
  BuildOptions with_mask;
  with_mask.mask_layout = MaskLayout::kFull;
  auto built = BuildForwardMetadata(verify, f.pool(), f.page_size(), with_mask);
  ASSERT_TRUE(built.ok()) << built.status();
  EXPECT_EQ(built->mask_indptr, (std::vector<int64_t>{0, 4 * 34, 4 * 34 + 4 * 54}));  // kv_len = cached + 4
  // A verify row that drops the root is refused unchecked too (CheckTreeRows); the same rows
  // are an extend's custom mask, which need not see the first query row.
  std::vector<uint8_t> rootless = chains;
  rootless[(1 * 4 + 3) * 4 + 0] = 0;
  verify.tree_mask = rootless;
  const absl::Status no_root =
      BuildForwardMetadata(verify, f.pool(), f.page_size(), with_mask).status();
  EXPECT_EQ(no_root.code(), absl::StatusCode::kInvalidArgument) << no_root;
  EXPECT_THAT(std::string(no_root.message()),
              ::testing::HasSubstr("row 3 of sequence 1 does not see the root"));
  ForwardBatch extend = f.Batch(ForwardMode::kDraftExtend);
  extend.tree_mask = rootless;
  EXPECT_TRUE(BuildForwardMetadata(extend, f.pool(), f.page_size(), with_mask).ok());
  verify.tree_mask = chains;
  // A mask in a mode that takes none, and a tree without a layout.
  std::vector<TokenLength> one_row = {TokenLength(1), TokenLength(1)};
  ForwardBatch decode = f.Batch(ForwardMode::kDecode);
  decode.q_lens = one_row;
  std::vector<uint8_t> single_rows = {1, 1};
  decode.tree_mask = single_rows;
  EXPECT_EQ(BuildForwardMetadata(decode, f.pool(), f.page_size(), with_mask).status().code(),
            absl::StatusCode::kInvalidArgument);
  ForwardBatch decode_with_tree = f.Batch(ForwardMode::kDraftExtend);
  decode_with_tree.tree_mask = chains;
  EXPECT_EQ(BuildForwardMetadata(decode_with_tree, f.pool(), f.page_size()).status().code(),
            absl::StatusCode::kInvalidArgument);
  // Draft-decode: one query row per branch.
  EXPECT_EQ(BuildForwardMetadata(f.Batch(ForwardMode::kDraftDecode), f.pool(), f.page_size())
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  std::vector<TokenLength> one = {TokenLength(1), TokenLength(1)};
  ForwardBatch draft_decode = f.Batch(ForwardMode::kDraftDecode);
  draft_decode.q_lens = one;
  EXPECT_TRUE(BuildForwardMetadata(draft_decode, f.pool(), f.page_size()).ok());
  // Target-verify with a sequence of no query rows, its mask otherwise in order (the second
  // sequence's 4 x 4 chain), so that only the q_len rule can refuse it.
  std::vector<TokenLength> none = {TokenLength(0), TokenLength(4)};
  ForwardBatch verify_without_rows = f.Batch(ForwardMode::kTargetVerify);
  verify_without_rows.q_lens = none;
  const std::vector<uint8_t> second_chain(chains.begin() + 16, chains.end());
  verify_without_rows.tree_mask = second_chain;
  const absl::Status no_rows =
      BuildForwardMetadata(verify_without_rows, f.pool(), f.page_size(), with_mask).status();
  EXPECT_EQ(no_rows.code(), absl::StatusCode::kInvalidArgument) << no_rows;
  EXPECT_THAT(std::string(no_rows.message()), ::testing::HasSubstr("needs q_len >= 1, got 0"));
  // The other modes with query rows per sequence refuse an empty one too.
  for (ForwardMode mode : {ForwardMode::kExtend, ForwardMode::kMixed, ForwardMode::kDraftExtend}) {
    ForwardBatch b = f.Batch(mode);
    b.q_lens = none;
    const absl::Status s = BuildForwardMetadata(b, f.pool(), f.page_size()).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << ForwardModeName(mode) << ": " << s;
    EXPECT_THAT(std::string(s.message()), ::testing::HasSubstr("needs q_len >= 1, got 0"))
        << ForwardModeName(mode);
  }
}

}  // namespace
}  // namespace attnmeta
