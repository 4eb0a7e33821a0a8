// One regression test per field bug of DESIGN.md section 3 that the graph layer owns (rows 1,
// 2, 4, 6, 7 and 12) or configures (row 5: the split-KV consumer's layout). Each runs the real
// capture/replay path at the shape that broke the reference system and states the buggy
// formula beside the right one; the mutation gate (tests/mutants/field_bug_row{1,2,4,5,6,7,12}_
// *.patch) puts each bug back into the real code and shows the test failing.

#include <algorithm>
#include <type_traits>
#include <vector>

#include "attention/graph/testing/graph_harness.h"
#include "attention/metadata/builders.h"
#include "attention/metadata/testing/batch_fixture.h"
#include "attention/metadata/validator.h"
#include "gtest/gtest.h"

namespace attnmeta {
namespace {

using testing::BatchFixture;
using testing::GraphHarness;
using testing::MakeTestConfig;

// A decode batch of `bs` requests at exactly `ctx` KV tokens each, at page size `ps`.
BatchFixture FullContext(int64_t ps, int bs, int64_t ctx, int64_t new_tokens = 1) {
  BatchFixture f(ps, 77, /*num_pages=*/bs * ((ctx + ps - 1) / ps + 1) + 8);
  for (int i = 0; i < bs; ++i) f.AddSequence(ctx - new_tokens, new_tokens);
  return f;
}

// Replays `f`'s whole batch through a capture of its size; checks it against the eager path
// and the validator, and that no buffer was written outside its bounds. The host writer calls
// the eager builders, so "equals eager" checks the graph layer's sizing and plumbing, not the
// builders; dense attention checks those (graph_replay_oracle_test, metadata_oracle_test).
void ReplayMatchesEager(GraphHarness& h, const BatchFixture& f, ForwardMode mode,
                        int64_t q_per_request) {
  GraphState& g = h.state();
  const int64_t bs = static_cast<int64_t>(f.rows().size());
  auto handle = g.Capture(bs, mode, TokenLength(static_cast<int32_t>(q_per_request)));
  ASSERT_TRUE(handle.ok()) << handle.status();
  auto r = g.Replay(*handle, ReplayBatch{f.rows(), f.kv_lens()});
  ASSERT_TRUE(r.ok()) << r.status();
  auto eager = BuildForwardMetadata(f.Batch(mode), f.pool(), f.page_size());
  ASSERT_TRUE(eager.ok()) << eager.status();
  const ForwardMetadataView& v = r->metadata;
  EXPECT_EQ(std::vector<TokenSlot>(v.kv_indices.begin(), v.kv_indices.end()), eager->kv_indices);
  // A page table exactly when the config asks for one: a replay that dropped it would
  // otherwise skip the comparison below.
  ASSERT_EQ(v.page_table.rows() > 0, g.config().consumers().page_table());
  if (v.page_table.rows() > 0) {
    for (int64_t i = 0; i < bs; ++i) {
      const absl::Span<const PageId> want = eager->page_table.span().row(i);
      ASSERT_GE(v.page_table.row(i).size(), want.size()) << "page-table row " << i;
      EXPECT_EQ(std::vector<PageId>(v.page_table.row(i).begin(),
                                    v.page_table.row(i).begin() + want.size()),
                std::vector<PageId>(want.begin(), want.end()))
          << "page-table row " << i;
    }
  }
  ValidationContext ctx{f.pool_slots(), f.page_size(), f.num_query_rows()};
  ctx.check_slot_ownership = true;
  EXPECT_TRUE(ValidateForwardMetadata(v, ctx).ok()) << ValidateForwardMetadata(v, ctx);
  EXPECT_TRUE(h.memory().VerifyCanaries().ok()) << h.memory().VerifyCanaries();
}

// Row 1: the graph kv_indices buffer sized max_bs * pages_per_seq and filled per token; an
// illegal memory access once the batch's tokens grew (page_size > 1).
TEST(GraphFieldBugTest, Row1_TokenBuffersAreSizedInTokens) {
  constexpr int64_t ps = 16, ctx = 256;
  constexpr int bs = 4;
  const BatchFixture f = FullContext(ps, bs, ctx);
  GraphHarness h(MakeTestConfig(ps, {.max_batch_size = bs, .max_context_len = ctx,
                                     .page_table = false, .split_kv = false}),
                 f);
  constexpr int64_t need = bs * ctx;                     // one slot per token
  constexpr int64_t buggy = bs * ((ctx + ps - 1) / ps);  // max_bs * pages_per_seq
  static_assert(buggy < need, "the shape must make the buggy formula too small");
  EXPECT_EQ(h.state().plan().Find("kv_indices")->capacity, need);
  ReplayMatchesEager(h, f, ForwardMode::kDecode, 1);
}

// Row 2: the page table taken as a view of the token buffer. Here it is its own type (a
// token span does not convert to it) and its own buffer.
TEST(GraphFieldBugTest, Row2_PageTableIsItsOwnBufferAndType) {
  // A token-level span cannot make a page table, nor can a token count be its width; a
  // page-level span of PageCount columns can.
  static_assert(!std::is_invocable_v<decltype(&PageTableSpan<PageId>::Create),
                                     absl::Span<TokenSlot>, int64_t, PageCount>);
  static_assert(!std::is_invocable_v<decltype(&PageTableSpan<PageId>::Create), absl::Span<PageId>,
                                     int64_t, TokenCount>);
  static_assert(!std::is_invocable_v<decltype(&PageTableSpan<PageId>::Create), absl::Span<PageId>,
                                     int64_t, int64_t>);
  static_assert(std::is_invocable_v<decltype(&PageTableSpan<PageId>::Create), absl::Span<PageId>,
                                    int64_t, PageCount>);
  const int64_t ps = 16, ctx = 200;
  const BatchFixture f = FullContext(ps, 3, ctx);
  GraphHarness h(MakeTestConfig(ps, {.max_batch_size = 3, .max_context_len = ctx}), f);
  const DeviceBuffer table = h.state().buffer("page_table");
  const DeviceBuffer tokens = h.state().buffer("kv_indices");
  const char* t0 = static_cast<const char*>(table.ptr);
  const char* k0 = static_cast<const char*>(tokens.ptr);
  EXPECT_TRUE(t0 + table.bytes <= k0 || k0 + tokens.bytes <= t0) << "the buffers overlap";
  EXPECT_EQ(h.state().buffers().page_table.entries().data(),
            static_cast<const PageId*>(table.ptr));
  ReplayMatchesEager(h, f, ForwardMode::kDecode, 1);
}

// Row 4: indptr buffers (and kv_last_page_len) not regrown when the capture batch was padded
// past the request pool; a size mismatch at capture. Reserve regrows every per-batch buffer.
TEST(GraphFieldBugTest, Row4_ReserveRegrowsEveryPerBatchBuffer) {
  const int64_t ps = 16, ctx = 100;
  const BatchFixture f = FullContext(ps, 9, ctx);
  GraphHarness h(MakeTestConfig(ps, {.max_batch_size = 4, .max_context_len = ctx}), f);
  GraphState& g = h.state();
  // Without a regrow, a padded capture of 9 is a clear error, not a write past the buffers.
  EXPECT_EQ(g.Capture(9, ForwardMode::kDecode).status().code(),
            absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(g.Reserve(9).ok());
  const GraphBuffers& b = g.buffers();
  EXPECT_GE(b.req_rows.size(), 9u);
  EXPECT_GE(b.kv_lens.size(), 9u);
  EXPECT_GE(b.q_lens.size(), 9u);
  EXPECT_GE(b.kv_last_page_len.size(), 9u);
  EXPECT_GE(b.kv_indptr.size(), 10u);
  EXPECT_GE(b.qo_indptr.size(), 10u);
  EXPECT_GE(b.page_table.rows(), 9);
  ReplayMatchesEager(h, f, ForwardMode::kDecode, 1);
}

// Row 6: the graph kv_indices buffer of the MLA (non-unified) path sized in pages; silent
// overflow at page_size 64.
TEST(GraphFieldBugTest, Row6_MlaTokenBufferIsSizedInTokensAtPageSize64) {
  constexpr int64_t ps = 64, ctx = 1024;
  constexpr int bs = 4;
  const BatchFixture f = FullContext(ps, bs, ctx);
  GraphHarness h(MakeTestConfig(ps, {.max_batch_size = bs, .max_context_len = ctx,
                                     .split_kv = false, .num_kv_heads = 1}),
                 f);
  constexpr int64_t buggy = bs * (ctx / ps);  // pages, read as slots
  static_assert(buggy < bs * ctx, "the shape must make the buggy formula too small");
  EXPECT_EQ(h.state().plan().Find("kv_indices")->capacity, bs * ctx);
  ReplayMatchesEager(h, f, ForwardMode::kDecode, 1);
}

// Row 7: the verify buffer without the draft-token slack; overflow near full context. A
// request at max_context_len plus its draft tokens fits.
TEST(GraphFieldBugTest, Row7_RowsCarryTheDraftTokenSlack) {
  constexpr int64_t ps = 16, ctx = 160;
  constexpr int32_t draft = 4;
  constexpr int bs = 3;
  const BatchFixture f = FullContext(ps, bs, ctx + draft, /*new_tokens=*/draft);
  GraphHarness h(MakeTestConfig(ps, {.max_batch_size = bs, .max_context_len = ctx,
                                     .draft_tokens = draft, .max_query_rows_per_request = draft}),
                 f);
  constexpr int64_t buggy = bs * ctx;  // no slack
  static_assert(buggy < bs * (ctx + draft), "the shape must make the buggy formula too small");
  EXPECT_EQ(h.state().plan().Find("kv_indices")->capacity, bs * (ctx + draft));
  ReplayMatchesEager(h, f, ForwardMode::kExtend, draft);
}

// Row 5 through the config: a graph whose split-KV consumer reads K/V per token plans its
// replays in tokens (chunks of the configured 32 tokens, cut inside pages of 64), not in the
// pool's pages; the paged consumer of the same pool gets whole pages.
TEST(GraphFieldBugTest, Row5_LinearConsumerFromTheConfigIsPlannedInTokens) {
  for (int64_t ps : {16, 64}) {
    SCOPED_TRACE(::testing::Message() << "page size " << ps);
    BatchFixture f = FullContext(ps, 2, 480);
    for (SplitKvLayout layout : {SPLIT_KV_LAYOUT_LINEAR_PER_TOKEN, SPLIT_KV_LAYOUT_PAGED}) {
      const bool linear = layout == SPLIT_KV_LAYOUT_LINEAR_PER_TOKEN;
      GraphHarness h(MakeTestConfig(ps, {.max_batch_size = 2, .split_layout = layout}), f);
      GraphState& g = h.state();
      auto handle = g.Capture(2, ForwardMode::kDecode);
      ASSERT_TRUE(handle.ok()) << handle.status();
      auto r = g.Replay(*handle, ReplayBatch{f.rows(), f.kv_lens()});
      ASSERT_TRUE(r.ok()) << r.status();
      const TokenCount want_chunk(linear ? 32 : std::max<int64_t>(32, ps));
      EXPECT_EQ(r->split_kv.chunk, want_chunk) << (linear ? "linear" : "paged");
      ASSERT_GT(r->split_kv.reduce_items, 0) << "the batch must actually be split";
      bool cut_inside_a_page = false;
      for (int64_t k = 0; k < r->split_kv.work_items; ++k) {
        const SplitKvWorkItem& w = g.buffers().split_kv.work[k];
        EXPECT_EQ(w.kv_begin.value() % want_chunk.value(), 0) << "item " << k;
        cut_inside_a_page |= w.kv_begin.value() % ps != 0;
      }
      EXPECT_EQ(cut_inside_a_page, linear && ps > 32);
    }
  }
}

// Row 12: the unified decode page table not copied under graph replay when page_size == 1;
// wrong output under graph. Every enabled consumer's buffers are written at every replay.
TEST(GraphFieldBugTest, Row12_PageTableRewrittenAtEveryReplayAtPageSize1) {
  BatchFixture f(1, 5, 4096);
  for (int64_t cached : {30, 7, 51, 12}) f.AddSequence(cached, 1);
  GraphHarness h(MakeTestConfig(1, {.max_batch_size = 4, .max_context_len = 64}), f);
  GraphState& g = h.state();
  auto handle = g.Capture(4, ForwardMode::kDecode);
  ASSERT_TRUE(handle.ok()) << handle.status();
  const std::vector<ReqPoolIndex> rows_a = {f.rows()[0], f.rows()[1]};
  const std::vector<TokenLength> lens_a = {f.kv_lens()[0], f.kv_lens()[1]};
  const std::vector<ReqPoolIndex> rows_b = {f.rows()[2], f.rows()[3]};
  const std::vector<TokenLength> lens_b = {f.kv_lens()[2], f.kv_lens()[3]};
  const std::vector<TokenLength> q = {TokenLength(1), TokenLength(1)};
  // Shorter, longer, then shorter again: the last replay's rows end before the second's, so
  // a column the replay leaves as it was would still hold the longer batch's page.
  for (const auto& [rows, lens] :
       {std::pair{rows_a, lens_a}, std::pair{rows_b, lens_b}, std::pair{rows_a, lens_a}}) {
    auto r = g.Replay(*handle, ReplayBatch{rows, lens});
    ASSERT_TRUE(r.ok()) << r.status();
    auto eager = BuildForwardMetadata(ForwardBatch{ForwardMode::kDecode, rows, lens, q, {}},
                                      f.pool(), f.page_size());
    ASSERT_TRUE(eager.ok()) << eager.status();
    // A replay that returned no page table (or a narrow one) would skip the loop below.
    ASSERT_EQ(r->metadata.page_table.rows(), 2);
    for (int64_t i = 0; i < 2; ++i) {
      const absl::Span<const PageId> want = eager->page_table.span().row(i);
      const absl::Span<const PageId> got = r->metadata.page_table.row(i);
      ASSERT_GE(got.size(), want.size()) << "row " << i;
      for (size_t j = 0; j < got.size(); ++j) {
        ASSERT_EQ(got[j], j < want.size() ? want[j] : kPaddingPage)
            << "row " << i << " column " << j << " of " << want.size() << " pages";
      }
    }
    ValidationContext ctx{f.pool_slots(), f.page_size(), TokenCount(2)};
    EXPECT_TRUE(ValidateForwardMetadata(r->metadata, ctx).ok())
        << ValidateForwardMetadata(r->metadata, ctx);
  }
}

}  // namespace
}  // namespace attnmeta
