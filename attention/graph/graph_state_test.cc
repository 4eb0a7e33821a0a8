#include "attention/graph/graph_state.h"

#include <algorithm>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "attention/graph/testing/graph_harness.h"
#include "attention/metadata/builders.h"
#include "attention/metadata/testing/batch_fixture.h"
#include "attention/metadata/validator.h"
#include "gtest/gtest.h"
#include "tools/bench/heap_counter.h"


namespace attnmeta {
namespace {

using testing::BatchFixture;
using testing::GraphHarness;
using testing::MakeTestConfig;

// Decode sequences of various lengths at page size 16.
class GraphStateTest : public ::testing::Test {
 protected:
  GraphStateTest() {
    for (int64_t cached : {100, 3, 47, 0, 255, 16}) f_.AddSequence(cached, 1);
  }
  ReplayBatch Batch(size_t n) const {
    return ReplayBatch{absl::MakeConstSpan(f_.rows()).subspan(0, n),
                       absl::MakeConstSpan(f_.kv_lens()).subspan(0, n)};
  }
  ValidationContext Context(int64_t query_rows) const {
    ValidationContext ctx{f_.pool_slots(), f_.page_size(), TokenCount(query_rows)};
    ctx.check_slot_ownership = true;
    return ctx;
  }

  BatchFixture f_{16, 5, 512};
  GraphHarness h_{MakeTestConfig(16), f_};
};

TEST_F(GraphStateTest, CaptureThenReplayValidatesAndKeepsCanaries) {
  GraphState& g = h_.state();
  auto handle = g.Capture(8, ForwardMode::kDecode);
  ASSERT_TRUE(handle.ok()) << handle.status();
  EXPECT_TRUE(h_.memory().VerifyCanaries().ok());
  for (size_t n : {6, 1, 4}) {
    auto r = g.Replay(*handle, Batch(n));
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_TRUE(ValidateForwardMetadata(r->metadata, Context(n)).ok())
        << ValidateForwardMetadata(r->metadata, Context(n));
    EXPECT_EQ(r->metadata.batch_size(), static_cast<int64_t>(n));
    EXPECT_GT(r->split_kv.work_items, 0);
    EXPECT_TRUE(h_.memory().VerifyCanaries().ok()) << h_.memory().VerifyCanaries();
  }
}

// Padded rows: the fill length, slots on the padding page, one query row each (so that the
// bucket's qo_indptr ends at the rows of the padded query tensor), page-table rows all
// padding; the padded view holds the whole bucket and validates against its rows.
TEST_F(GraphStateTest, PaddedRowsGetSafeValues) {
  GraphState& g = h_.state();
  auto handle = g.Capture(8, ForwardMode::kDecode);
  ASSERT_TRUE(handle.ok());
  auto r = g.Replay(*handle, Batch(3));
  ASSERT_TRUE(r.ok()) << r.status();
  const GraphBuffers& b = g.buffers();
  for (int64_t i = 3; i < 8; ++i) {
    EXPECT_EQ(b.kv_lens[i], GraphState::kPaddedKvLen) << i;
    EXPECT_EQ(b.q_lens[i], TokenLength(1)) << i;
    EXPECT_EQ(b.qo_indptr[i + 1].value(), i + 1) << i;
    EXPECT_EQ(b.kv_last_page_len[i], TokenLength(1)) << i;
    // The loop below reads the row's kv_indices: it must have some.
    EXPECT_EQ(b.kv_indptr[i + 1] - b.kv_indptr[i], GraphState::kPaddedKvLen.count()) << i;
    for (int32_t k = b.kv_indptr[i].value(); k < b.kv_indptr[i + 1].value(); ++k) {
      EXPECT_LT(b.kv_indices[k].value(), 16) << "padded row " << i << " leaves the padding page";
      EXPECT_GE(b.kv_indices[k].value(), 0);
    }
    for (PageId p : b.page_table.row(i)) EXPECT_EQ(p, kPaddingPage) << i;
  }
  EXPECT_EQ(r->metadata.batch_size(), 3);
  EXPECT_EQ(r->padded.batch_size(), 8);
  EXPECT_EQ(r->padded.qo_indptr[8].value(), 8);
  EXPECT_EQ(r->padded.kv_indices.size(), r->metadata.kv_indices.size() + 5);
  EXPECT_EQ(r->padded.page_table.rows(), 8);
  ValidationContext ctx = Context(8);
  ctx.allow_padding_page = true;
  EXPECT_TRUE(ValidateForwardMetadata(r->padded, ctx).ok())
      << ValidateForwardMetadata(r->padded, ctx);
}

// An extend graph's padded rows hold the captured query rows over as many padding slots (a
// kernel refuses q_len > kv_len), and the bucket validates against bucket * q rows.
TEST_F(GraphStateTest, PaddedExtendRowsCoverTheirQueryRows) {
  GraphState& g = h_.state();
  constexpr int32_t kRows = 3;
  auto handle = g.Capture(8, ForwardMode::kExtend, TokenLength(kRows));
  ASSERT_TRUE(handle.ok()) << handle.status();
  // Sequences 0 and 2 hold at least kRows tokens.
  const std::vector<ReqPoolIndex> rows = {f_.rows()[0], f_.rows()[2]};
  const std::vector<TokenLength> kv = {f_.kv_lens()[0], f_.kv_lens()[2]};
  auto r = g.Replay(*handle, ReplayBatch{rows, kv});
  ASSERT_TRUE(r.ok()) << r.status();
  const GraphBuffers& b = g.buffers();
  for (int64_t i = 2; i < 8; ++i) {
    EXPECT_EQ(b.q_lens[i].value(), kRows) << i;
    EXPECT_EQ(b.kv_lens[i], GraphState::PaddedRowKvLen(TokenLength(kRows))) << i;
    EXPECT_EQ(b.kv_lens[i].value(), kRows) << i;
    EXPECT_EQ(b.kv_indptr[i + 1] - b.kv_indptr[i], TokenCount(kRows)) << i;
    for (int32_t k = b.kv_indptr[i].value(); k < b.kv_indptr[i + 1].value(); ++k) {
      EXPECT_EQ(PageOf(b.kv_indices[k], f_.page_size()), kPaddingPage) << i;
    }
  }
  EXPECT_EQ(r->padded.qo_indptr[8].value(), 8 * kRows);
  EXPECT_EQ(r->padded.max_q_len, TokenCount(kRows));
  ValidationContext ctx = Context(8 * kRows);
  ctx.allow_padding_page = true;
  EXPECT_TRUE(ValidateForwardMetadata(r->padded, ctx).ok())
      << ValidateForwardMetadata(r->padded, ctx);
  // A real row that reaches the padding page is refused, ownership checked or not.
  std::vector<TokenSlot> indices(r->padded.kv_indices.begin(), r->padded.kv_indices.end());
  indices[r->padded.kv_indptr[1].value() - 1] = indices[r->padded.kv_indptr[3].value() - 1];
  ForwardMetadataView bad = r->padded;
  bad.kv_indices = indices;
  bad.page_table = {};  // which would disagree first
  for (bool ownership : {true, false}) {
    ctx.check_slot_ownership = ownership;
    const absl::Status s = ValidateForwardMetadata(bad, ctx);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_NE(s.message().find("only a padded row"), absl::string_view::npos) << s;
  }
}

// A bucket the batch fills has no padded rows: its max_kv_len is the batch's longest, even
// below a padded row's length (extend of 3 rows, a request of 1 token and 1 row).
TEST_F(GraphStateTest, AFullBucketOfShortRowsKeepsItsOwnLongest) {
  GraphState& g = h_.state();
  auto handle = g.Capture(1, ForwardMode::kExtend, TokenLength(3));
  ASSERT_TRUE(handle.ok()) << handle.status();
  const std::vector<ReqPoolIndex> rows = {f_.rows()[3]};
  const std::vector<TokenLength> kv = {TokenLength(1)};
  const std::vector<TokenLength> q = {TokenLength(1)};
  ASSERT_EQ(f_.kv_lens()[3], TokenLength(1));
  auto r = g.Replay(*handle, ReplayBatch{rows, kv, q});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->padded.max_kv_len, TokenCount(1));
  EXPECT_EQ(r->metadata.max_kv_len, TokenCount(1));
  ValidationContext ctx = Context(3);
  ctx.allow_unclaimed_rows = true;
  EXPECT_TRUE(ValidateForwardMetadata(r->padded, ctx).ok())
      << ValidateForwardMetadata(r->padded, ctx);
}

// The variable-row form: real requests with fewer rows than captured leave a tail of the
// bucket's query tensor that no request claims (a padded row already has the captured rows,
// the most a captured kernel's grid gives a sequence). The bucket validates against its
// query tensor only with allow_unclaimed_rows.
TEST_F(GraphStateTest, VariableRowExtendLeavesATailOfUnclaimedRows) {
  GraphState& g = h_.state();
  constexpr int32_t kRows = 3;
  auto handle = g.Capture(8, ForwardMode::kExtend, TokenLength(kRows));
  ASSERT_TRUE(handle.ok()) << handle.status();
  const std::vector<ReqPoolIndex> rows = {f_.rows()[0], f_.rows()[2]};
  const std::vector<TokenLength> kv = {f_.kv_lens()[0], f_.kv_lens()[2]};
  const std::vector<TokenLength> q = {TokenLength(1), TokenLength(2)};
  auto r = g.Replay(*handle, ReplayBatch{rows, kv, q});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->padded.qo_indptr[2].value(), 3);
  EXPECT_EQ(r->padded.qo_indptr[8].value(), 3 + 6 * kRows);
  ValidationContext ctx = Context(8 * kRows);
  ctx.allow_padding_page = true;
  const absl::Status strict = ValidateForwardMetadata(r->padded, ctx);
  EXPECT_EQ(strict.code(), absl::StatusCode::kInvalidArgument) << strict;
  EXPECT_EQ(strict.message(), "qo_indptr: qo_indptr[bs] = 21 but the query tensor has 24 rows");
  ctx.allow_unclaimed_rows = true;
  EXPECT_TRUE(ValidateForwardMetadata(r->padded, ctx).ok())
      << ValidateForwardMetadata(r->padded, ctx);
  // Every request at the captured rows: no tail.
  auto fixed = g.Replay(*handle, ReplayBatch{rows, kv});
  ASSERT_TRUE(fixed.ok()) << fixed.status();
  EXPECT_EQ(fixed->padded.qo_indptr[8].value(), 8 * kRows);
}

// The per-batch host arrays of a padded batch whose first rows are a fixture's (the others
// padded: row -1, `padded_len` tokens, `q` query rows), outputs poisoned, and a direct write
// request for it, as GraphState would make one; a test adds what its mode needs.
struct DirectWrite {
  DirectWrite(const BatchFixture& f, ForwardMode mode, int64_t padded, TokenLength q,
              TokenLength padded_len)
      : rows(padded, ReqPoolIndex(-1)),
        kv_lens(padded, padded_len),
        q_lens(padded, q),
        kv_indptr(padded + 1, TokenOffset(-7)),
        qo_indptr(padded + 1, TokenOffset(-7)),
        last(padded, TokenLength(-7)) {
    const size_t real = f.rows().size();
    std::copy(f.rows().begin(), f.rows().end(), rows.begin());
    std::copy(f.kv_lens().begin(), f.kv_lens().end(), kv_lens.begin());
    request.mode = mode;
    request.real_batch_size = static_cast<int64_t>(real);
    request.padded_batch_size = padded;
    request.padded_kv_len = padded_len;
    request.page_size = f.page_size();
    request.req_to_token = &f.pool();
    request.q_len_per_request = q;
  }
  GraphBuffers Buffers() {
    GraphBuffers b;
    b.req_rows = absl::MakeSpan(rows);
    b.kv_lens = absl::MakeSpan(kv_lens);
    b.q_lens = absl::MakeSpan(q_lens);
    b.kv_indptr = absl::MakeSpan(kv_indptr);
    b.qo_indptr = absl::MakeSpan(qo_indptr);
    b.kv_last_page_len = absl::MakeSpan(last);
    return b;
  }
  std::vector<ReqPoolIndex> rows;
  std::vector<TokenLength> kv_lens, q_lens;
  std::vector<TokenOffset> kv_indptr, qo_indptr;
  std::vector<TokenLength> last;
  MetadataWriteRequest request;
};

// A host writer called directly with a request its buffers cannot hold refuses it before it
// reads or writes a buffer (CheckWriteFitsBuffers, which the device writer runs too).
TEST(HostMetadataWriterTest, RequestsPastTheBuffersAreRefusedBeforeAnyAccess) {
  BatchFixture f(16, 3, 64, 4, 256);
  f.AddSequence(30, 1);
  DirectWrite w(f, ForwardMode::kDecode, 4, TokenLength(1), TokenLength(1));
  w.request.page_table = true;
  std::vector<TokenSlot> indices(64, TokenSlot(-7));
  std::vector<PageId> table(4 * 4, PageId(-7));
  const auto buffers = [&] {
    GraphBuffers b = w.Buffers();
    b.kv_indices = absl::MakeSpan(indices);
    b.page_table = *PageTableSpan<PageId>::Create(absl::MakeSpan(table), 4, PageCount(4));
    return b;
  };
  struct Case {
    const char* what;
    std::function<void(MetadataWriteRequest&, GraphBuffers&)> edit;
    const char* message;
  } cases[] = {
      {"no req_to_token", [](MetadataWriteRequest& r, GraphBuffers&) { r.req_to_token = nullptr; },
       "host metadata writer: no req_to_token"},
      {"more real rows than padded",
       [](MetadataWriteRequest& r, GraphBuffers&) { r.real_batch_size = 5; },
       "host metadata writer: a real batch of 5 in a padded batch of 4"},
      {"a negative real batch",
       [](MetadataWriteRequest& r, GraphBuffers&) { r.real_batch_size = -1; },
       "host metadata writer: a real batch of -1"},
      {"a padded batch of INT64_MAX (its indptrs' + 1 must not be formed)",
       [](MetadataWriteRequest& r, GraphBuffers&) {
         r.padded_batch_size = std::numeric_limits<int64_t>::max();
       },
       "host metadata writer: req_rows holds 4 entries, 9223372036854775807 needed"},
      {"req_rows short of the padded batch",
       [](MetadataWriteRequest&, GraphBuffers& b) { b.req_rows = b.req_rows.subspan(0, 3); },
       "host metadata writer: req_rows holds 3 entries, 4 needed"},
      {"kv_indptr short of the padded batch",
       [](MetadataWriteRequest&, GraphBuffers& b) { b.kv_indptr = b.kv_indptr.subspan(0, 2); },
       "host metadata writer: kv_indptr holds 2 entries, 5 needed"},
      {"the page table asked of an empty buffer",
       [](MetadataWriteRequest&, GraphBuffers& b) { b.page_table = PageTableSpan<PageId>(); },
       "host metadata writer: the request asks for the page table, whose buffer is 0 x 0"},
      {"the page table a row short",
       [&](MetadataWriteRequest&, GraphBuffers& b) {
         b.page_table = *PageTableSpan<PageId>::Create(absl::MakeSpan(table), 3, PageCount(4));
       },
       "host metadata writer: the request asks for the page table, whose buffer is 3 x 4"},
      {"a mask without its indptr",
       [](MetadataWriteRequest& r, GraphBuffers&) { r.mask_layout = MaskLayout::kFull; },
       "host metadata writer: mask_indptr holds 0 entries, 5 needed"},
      {"draft-decode without step buffers",
       [](MetadataWriteRequest& r, GraphBuffers&) {
         r.mode = ForwardMode::kDraftDecode;
         r.draft_decode = DraftDecodeShape{1, 1};
       },
       "host metadata writer: 1 draft steps, 0 steps' buffers"},
  };
  HostMetadataWriter writer;
  for (const Case& c : cases) {
    MetadataWriteRequest r = w.request;
    GraphBuffers b = buffers();
    c.edit(r, b);
    for (bool token_arrays : {false, true}) {
      const absl::Status s =
          token_arrays ? writer.WriteTokenArrays(r, b, nullptr) : writer.WriteBatchArrays(r, b);
      EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.what << ": " << s;
      EXPECT_EQ(std::string(s.message()).rfind(c.message, 0), 0u) << c.what << ": " << s;
    }
  }
  EXPECT_EQ(w.kv_indptr, std::vector<TokenOffset>(5, TokenOffset(-7)));
  EXPECT_EQ(indices, std::vector<TokenSlot>(64, TokenSlot(-7)));
  EXPECT_EQ(table, std::vector<PageId>(16, PageId(-7)));
  // The request as GraphState would make it is written.
  GraphBuffers b = buffers();
  ASSERT_TRUE(writer.WriteBatchArrays(w.request, b).ok());
  ASSERT_TRUE(writer.WriteTokenArrays(w.request, b, nullptr).ok());
  EXPECT_EQ(w.kv_indptr[4], w.kv_indptr[1] + TokenCount(3));
}

// Draft-decode's padded branches need their steps' buffers and slots: a step's lengths short
// of the padded branches, or a kv_indices with room for the real branches only, is refused
// before any step is written.
TEST(HostMetadataWriterTest, DraftBranchesPastTheBuffersAreRefused) {
  BatchFixture f(16, 3, 64, 4, 256);
  const DraftDecodeShape shape{2, 2};
  const TokenLength len(30);
  f.AddSequence(len.value(), DraftRowTokens(len, shape, f.page_size()).value() - len.value());
  DirectWrite w(f, ForwardMode::kDraftDecode, 3, TokenLength(1), TokenLength(1));
  w.request.draft_decode = shape;
  w.kv_lens[0] = len;  // the committed length, not the row's
  std::vector<TokenOffset> draft_qo(7, TokenOffset(-7));
  const int64_t real_tokens = DraftStepTokens({len}, shape, 1).value();
  struct Step {
    std::vector<TokenLength> kv_lens = std::vector<TokenLength>(6), last = kv_lens;
    std::vector<TokenOffset> kv_indptr = std::vector<TokenOffset>(7, TokenOffset(-7));
    std::vector<TokenSlot> kv_indices;
  };
  std::vector<Step> steps(2);
  for (Step& s : steps) s.kv_indices.assign(real_tokens + 4 - 1, TokenSlot(-7));  // one short
  GraphBuffers b = w.Buffers();
  b.draft_qo_indptr = absl::MakeSpan(draft_qo);
  for (Step& s : steps) {
    b.draft_steps.push_back(DraftStepBuffers{absl::MakeSpan(s.kv_indptr), absl::MakeSpan(s.kv_lens),
                                             absl::MakeSpan(s.last), absl::MakeSpan(s.kv_indices)});
  }
  HostMetadataWriter writer;
  absl::Status s = writer.WriteTokenArrays(w.request, b, nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("the padded batch needs"), absl::string_view::npos) << s;
  for (const Step& st : steps) {
    EXPECT_EQ(st.kv_indices, std::vector<TokenSlot>(real_tokens + 3, TokenSlot(-7)));
    EXPECT_EQ(st.kv_indptr, std::vector<TokenOffset>(7, TokenOffset(-7)));
  }
  // A step's lengths short of the 6 branches.
  GraphBuffers short_lens = b;
  short_lens.draft_steps[1].kv_lens = short_lens.draft_steps[1].kv_lens.subspan(0, 5);
  s = writer.WriteTokenArrays(w.request, short_lens, nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("a draft step's kv_lens holds 5 entries, 6 needed"),
            absl::string_view::npos)
      << s;
  // With room for every branch: written.
  for (Step& st : steps) st.kv_indices.push_back(TokenSlot(-7));
  for (size_t i = 0; i < steps.size(); ++i) {
    b.draft_steps[i].kv_indices = absl::MakeSpan(steps[i].kv_indices);
  }
  ASSERT_TRUE(writer.WriteTokenArrays(w.request, b, nullptr).ok());
  EXPECT_EQ(steps[1].kv_indptr[6].value(), real_tokens + 4);
}

// A host writer called directly over buffers too short for the padded rows refuses before it
// writes (GraphState never asks that; on the device the kernels clamp such writes and record
// the violation).
TEST(HostMetadataWriterTest, PaddedRowsPastTheBuffersAreRefused) {
  BatchFixture f(16, 3, 64, 4, 256);
  f.AddSequence(30, 4);
  DirectWrite w(f, ForwardMode::kTargetVerify, 3, TokenLength(4), TokenLength(4));
  w.request.mask_layout = MaskLayout::kFull;
  std::vector<int64_t> mask_indptr(4);
  std::vector<uint8_t> tree(16, 1), mask(34 * 4 + 2 * 16, 9);
  std::vector<TokenSlot> indices(34 + 2 * 4 - 1, TokenSlot(-9));  // one slot short
  GraphBuffers b = w.Buffers();
  b.kv_indices = absl::MakeSpan(indices);
  b.mask_indptr = absl::MakeSpan(mask_indptr);
  b.tree_mask = absl::MakeSpan(tree);
  b.custom_mask = absl::MakeSpan(mask);
  HostMetadataWriter writer;
  ASSERT_TRUE(writer.WriteBatchArrays(w.request, b).ok());
  ASSERT_EQ(w.kv_indptr[3].value(), 34 + 2 * 4);
  absl::Status s = writer.WriteTokenArrays(w.request, b, nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("kv_indices"), absl::string_view::npos) << s;
  // The mask one byte short, kv_indices long enough.
  indices.push_back(TokenSlot(-9));
  b.kv_indices = absl::MakeSpan(indices);
  b.custom_mask = absl::MakeSpan(mask).subspan(0, mask_indptr[3] - 1);
  s = writer.WriteTokenArrays(w.request, b, nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("custom_mask"), absl::string_view::npos) << s;
  EXPECT_TRUE(std::all_of(indices.begin(), indices.end(), [](TokenSlot t) {
    return t == TokenSlot(-9);
  })) << "a refused write writes nothing";
  EXPECT_TRUE(std::all_of(mask.begin(), mask.end(), [](uint8_t x) { return x == 9; }));
}

TEST_F(GraphStateTest, ReplayAllocatesNothing) {
  if (!bench::HeapCounterIsLive()) {
    GTEST_SKIP() << "operator new is not replaceable in this build (a sanitizer's runtime "
                    "owns it); the plain build runs this test";
  }
  GraphState& g = h_.state();
  auto handle = g.Capture(8, ForwardMode::kDecode);
  ASSERT_TRUE(handle.ok());
  const int64_t device_before = h_.memory().allocations();
  const ReplayBatch batch = Batch(6);
  const int64_t heap_before = bench::HeapAllocations();
  for (int rep = 0; rep < 3; ++rep) {
    absl::StatusOr<ReplayResult> r = g.Replay(*handle, batch);
    if (!r.ok()) ADD_FAILURE() << r.status();
  }
  const int64_t heap_after = bench::HeapAllocations();
  EXPECT_EQ(heap_after, heap_before) << "Replay allocated on the heap";
  EXPECT_EQ(h_.memory().allocations(), device_before) << "Replay allocated device memory";
}

// Reserve regrows every per-batch buffer, moves the buffers, and bumps the generation: a
// handle captured before is refused.
TEST_F(GraphStateTest, RegrowInvalidatesEarlierCaptures) {
  GraphState& g = h_.state();
  auto old_handle = g.Capture(8, ForwardMode::kDecode);
  ASSERT_TRUE(old_handle.ok());
  const uint64_t gen = g.generation();
  EXPECT_TRUE(g.Reserve(8).ok());
  EXPECT_EQ(g.generation(), gen) << "no regrow, no new generation";
  EXPECT_EQ(g.Capture(12, ForwardMode::kDecode).status().code(),
            absl::StatusCode::kFailedPrecondition);
  const void* old_indices = g.buffer("kv_indices").ptr;
  ASSERT_TRUE(g.Reserve(12).ok());
  EXPECT_EQ(g.generation(), gen + 1);
  EXPECT_EQ(g.batch_capacity(), 12);
  EXPECT_NE(g.buffer("kv_indices").ptr, old_indices);
  EXPECT_TRUE(h_.memory().VerifyCanaries().ok());
  const absl::Status refused = g.Replay(*old_handle, Batch(2)).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition) << refused;
  EXPECT_NE(refused.message().find("capture it again"), absl::string_view::npos) << refused;
  auto handle = g.Capture(12, ForwardMode::kDecode);
  ASSERT_TRUE(handle.ok()) << handle.status();
  auto r = g.Replay(*handle, Batch(6));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(ValidateForwardMetadata(r->metadata, Context(6)).ok());
  EXPECT_EQ(h_.memory().live_allocations(), static_cast<int64_t>(g.plan().buffers.size()))
      << "the old buffers were freed";
  EXPECT_EQ(g.Reserve(0).code(), absl::StatusCode::kInvalidArgument);
}

// Every refused replay leaves every buffer byte as it was.
TEST_F(GraphStateTest, RefusedReplaysWriteNothing) {
  GraphState& g = h_.state();
  auto handle = g.Capture(4, ForwardMode::kDecode);
  ASSERT_TRUE(handle.ok());
  ASSERT_TRUE(g.Replay(*handle, Batch(2)).ok());
  const auto before = h_.Contents();
  auto expect_refused = [&](absl::StatusCode code, const ReplayBatch& batch, const char* what) {
    const absl::Status s = g.Replay(*handle, batch).status();
    EXPECT_EQ(s.code(), code) << what << ": " << s;
    EXPECT_TRUE(h_.Contents() == before) << what << ": buffers changed";
  };
  expect_refused(absl::StatusCode::kInvalidArgument, Batch(5), "more rows than the bucket");
  expect_refused(absl::StatusCode::kInvalidArgument, Batch(0), "an empty decode batch");
  std::vector<TokenLength> lens = {TokenLength(513)};
  std::vector<ReqPoolIndex> rows = {f_.rows()[0]};
  expect_refused(absl::StatusCode::kOutOfRange, ReplayBatch{rows, lens}, "beyond max context");
  lens = {TokenLength(0)};
  expect_refused(absl::StatusCode::kInvalidArgument, ReplayBatch{rows, lens}, "no query row");
  lens = {TokenLength(5)};
  rows = {ReqPoolIndex(40)};
  expect_refused(absl::StatusCode::kFailedPrecondition, ReplayBatch{rows, lens}, "row not allocated");
  rows = {ReqPoolIndex(-1)};
  expect_refused(absl::StatusCode::kOutOfRange, ReplayBatch{rows, lens}, "row outside the table");
  rows = {f_.rows()[0], f_.rows()[1]};
  expect_refused(absl::StatusCode::kInvalidArgument, ReplayBatch{rows, lens}, "sizes differ");
  // Forged and foreign handles: a shape Capture refuses, a bucket past the capacity, a handle
  // of another state (whose generation is its own).
  const CaptureHandle good = *handle;
  auto expect_handle_refused = [&](absl::StatusCode code, const CaptureHandle& h, const char* what) {
    const absl::Status s = g.Replay(h, Batch(2)).status();
    EXPECT_EQ(s.code(), code) << what << ": " << s;
    EXPECT_TRUE(h_.Contents() == before) << what << ": buffers changed";
  };
  CaptureHandle forged = good;
  forged.q_len_per_request = TokenLength(-1);
  expect_handle_refused(absl::StatusCode::kInvalidArgument, forged, "negative query rows");
  forged = good;
  forged.bucket = 9;
  expect_handle_refused(absl::StatusCode::kFailedPrecondition, forged, "bucket past the capacity");
  forged = good;
  forged.mode = ForwardMode::kMixed;
  expect_handle_refused(absl::StatusCode::kInvalidArgument, forged, "mixed");
  // A mode that is none of the enumerators, with negative query rows: it passed every
  // per-mode rule, and the replay failed (Internal) after writing kv_indptr.
  forged = good;
  forged.mode = static_cast<ForwardMode>(99);
  forged.q_len_per_request = TokenLength(-1);
  expect_handle_refused(absl::StatusCode::kInvalidArgument, forged, "unknown mode");
  GraphHarness other(MakeTestConfig(16, {.max_batch_size = 2}), f_);
  auto foreign = other.state().Capture(2, ForwardMode::kDecode);
  ASSERT_TRUE(foreign.ok());
  expect_handle_refused(absl::StatusCode::kFailedPrecondition, *foreign, "another state's handle");
  auto big = GraphHarness(MakeTestConfig(16, {.max_batch_size = 8}), f_).state().Capture(8, ForwardMode::kDecode);
  ASSERT_TRUE(big.ok());
  expect_handle_refused(absl::StatusCode::kFailedPrecondition, *big, "a freed state's handle");
  EXPECT_TRUE(h_.memory().VerifyCanaries().ok());
}

// Two requests on one req_to_token row would write one row's slots (and the validator sees
// only their slots collide): refused before anything is written. The marks the check leaves
// are cleared on both paths, so that the rows replay again.
TEST_F(GraphStateTest, ARowListedTwiceIsRefused) {
  GraphState& g = h_.state();
  auto handle = g.Capture(4, ForwardMode::kDecode);
  ASSERT_TRUE(handle.ok());
  ASSERT_TRUE(g.Replay(*handle, Batch(2)).ok());
  const auto before = h_.Contents();
  const std::vector<ReqPoolIndex> rows = {f_.rows()[0], f_.rows()[1], f_.rows()[0]};
  const std::vector<TokenLength> lens = {f_.kv_lens()[0], f_.kv_lens()[1], f_.kv_lens()[0]};
  const absl::Status s = g.Replay(*handle, ReplayBatch{rows, lens}).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("requests 0 and 2 share req row"), absl::string_view::npos) << s;
  EXPECT_TRUE(h_.Contents() == before) << "buffers changed";
  for (int rep = 0; rep < 2; ++rep) {
    auto r = g.Replay(*handle, Batch(3));
    ASSERT_TRUE(r.ok()) << "replay " << rep << ": " << r.status();
    EXPECT_TRUE(ValidateForwardMetadata(r->metadata, Context(3)).ok());
  }
}

TEST_F(GraphStateTest, HugeReservesAreRefused) {
  GraphState& g = h_.state();
  const uint64_t gen = g.generation();
  EXPECT_EQ(g.Reserve(std::numeric_limits<int64_t>::max()).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(g.Reserve(int64_t{1} << 31).code(), absl::StatusCode::kInvalidArgument);
  // 100000 rows of 512 slots fit int32; 5,000,000 do not (OutOfRange naming kv_indices).
  const absl::Status s = g.Reserve(5000000);
  EXPECT_EQ(s.code(), absl::StatusCode::kOutOfRange) << s;
  EXPECT_EQ(g.generation(), gen);
  EXPECT_EQ(g.batch_capacity(), 8);
}

TEST_F(GraphStateTest, CaptureRules) {
  GraphState& g = h_.state();
  EXPECT_EQ(g.Capture(0, ForwardMode::kDecode).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(g.Capture(4, ForwardMode::kDecode, TokenLength(2)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(g.Capture(4, ForwardMode::kExtend).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(g.Capture(4, ForwardMode::kExtend, TokenLength(5)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(g.Capture(4, ForwardMode::kExtend, TokenLength(4)).ok());
  EXPECT_EQ(g.Capture(4, ForwardMode::kMixed).status().code(), absl::StatusCode::kInvalidArgument);
  const absl::Status unknown = g.Capture(4, static_cast<ForwardMode>(99)).status();
  EXPECT_EQ(unknown.code(), absl::StatusCode::kInvalidArgument) << unknown;
  EXPECT_EQ(unknown.message(), "mode 99 is not a forward mode");
  // Speculative modes: draft-extend needs its rows; this config plans no draft tokens, top-k
  // or steps, so target-verify and draft-decode cannot be captured.
  EXPECT_EQ(g.Capture(4, ForwardMode::kDraftExtend).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(g.Capture(4, ForwardMode::kDraftExtend, TokenLength(5)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(g.Capture(4, ForwardMode::kDraftExtend, TokenLength(4)).ok());
  for (ForwardMode m : {ForwardMode::kTargetVerify, ForwardMode::kDraftDecode}) {
    EXPECT_EQ(g.Capture(4, m).status().code(), absl::StatusCode::kFailedPrecondition)
        << ForwardModeName(m);
  }
  EXPECT_EQ(g.Capture(4, ForwardMode::kIdle, TokenLength(1)).status().code(),
            absl::StatusCode::kInvalidArgument);
  auto idle = g.Capture(4, ForwardMode::kIdle);
  ASSERT_TRUE(idle.ok());
  auto r = g.Replay(*idle, ReplayBatch{});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(ValidateForwardMetadata(r->metadata, Context(0)).ok());
  EXPECT_EQ(g.Replay(*idle, Batch(1)).status().code(), absl::StatusCode::kInvalidArgument);
}

// A writer that cannot write a request says so before anything is staged: the buffers stay.
class ExtendOnlyWriter : public MetadataWriter {
 public:
  MemorySpace space() const override { return MemorySpace::kHost; }
  absl::Status CheckSupported(const MetadataWriteRequest& r) const override {
    return r.mode == ForwardMode::kExtend ? absl::OkStatus()
                                          : absl::UnimplementedError("extend only");
  }
  absl::Status WriteBatchArrays(const MetadataWriteRequest& r, const GraphBuffers& b) override {
    return host_.WriteBatchArrays(r, b);
  }
  absl::Status WriteTokenArrays(const MetadataWriteRequest& r, const GraphBuffers& b,
                                SplitKvPlanCounts* c) override {
    return host_.WriteTokenArrays(r, b, c);
  }

 private:
  HostMetadataWriter host_;
};

TEST(GraphStateWriterTest, UnsupportedRequestsAreRefusedBeforeStaging) {
  BatchFixture f(16, 3, 256, 8, 600);
  f.AddSequence(40, 2);
  f.AddSequence(70, 2);
  HostDeviceMemory memory;
  ExtendOnlyWriter writer;
  auto g = GraphState::Create(MakeTestConfig(16), &f.pool(), f.page_size(), &memory, &writer);
  ASSERT_TRUE(g.ok()) << g.status();
  auto extend = (*g)->Capture(4, ForwardMode::kExtend, TokenLength(2));
  ASSERT_TRUE(extend.ok()) << extend.status();
  ASSERT_TRUE((*g)->Replay(*extend, ReplayBatch{f.rows(), f.kv_lens()}).ok());
  std::vector<std::vector<uint8_t>> before;
  for (const BufferSpec& spec : (*g)->plan().buffers) {
    std::vector<uint8_t> bytes(spec.bytes);
    ASSERT_TRUE(memory.CopyToHost(bytes.data(), (*g)->buffer(spec.name), 0, spec.bytes).ok());
    before.push_back(std::move(bytes));
  }
  EXPECT_EQ((*g)->Capture(4, ForwardMode::kDecode).status().code(),
            absl::StatusCode::kUnimplemented);
  size_t k = 0;
  for (const BufferSpec& spec : (*g)->plan().buffers) {
    std::vector<uint8_t> bytes(spec.bytes);
    ASSERT_TRUE(memory.CopyToHost(bytes.data(), (*g)->buffer(spec.name), 0, spec.bytes).ok());
    EXPECT_EQ(bytes, before[k++]) << spec.name << " changed";
  }
}

// A state frees every buffer it allocated, the ones a regrow replaced too, and nothing else.
TEST(GraphStateCreateTest, DestructionFreesEveryBufferOnce) {
  BatchFixture f(16, 3, 256, 8, 600);
  HostDeviceMemory memory;
  HostMetadataWriter writer;
  auto g = GraphState::Create(MakeTestConfig(16), &f.pool(), f.page_size(), &memory, &writer);
  ASSERT_TRUE(g.ok()) << g.status();
  ASSERT_TRUE((*g)->Capture(4, ForwardMode::kDecode).ok());
  ASSERT_TRUE((*g)->Reserve((*g)->batch_capacity() + 4).ok());
  EXPECT_EQ(memory.live_allocations(), static_cast<int64_t>((*g)->plan().buffers.size()));
  g->reset();
  EXPECT_EQ(memory.live_allocations(), 0);
  EXPECT_EQ(memory.foreign_frees(), 0);
}

TEST(GraphStateCreateTest, ConfigMustMatchThePool) {
  BatchFixture f(16, 1, 64, 8, 256);
  HostDeviceMemory memory;
  HostMetadataWriter writer;
  // The pool uses pages of 16; a config of 64 is refused.
  absl::Status s = GraphState::Create(MakeTestConfig(64, {.max_context_len = 256}), &f.pool(),
                                      f.page_size(), &memory, &writer)
                       .status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("page_size"), absl::string_view::npos) << s;
  // req_to_token rows narrower than the config's context.
  s = GraphState::Create(MakeTestConfig(16, {.max_context_len = 512}), &f.pool(), f.page_size(),
                         &memory, &writer)
          .status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("max_context_len"), absl::string_view::npos) << s;
  BackendConfig bad = MakeTestConfig(16, {.max_context_len = 256});
  bad.set_num_kv_heads(3);
  EXPECT_EQ(GraphState::Create(bad, &f.pool(), f.page_size(), &memory, &writer).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(memory.live_allocations(), 0) << "refused creations allocate nothing";
}

// Host memory that says its buffers live on a device, and a host writer that says it writes on
// one: a writer must never be handed buffers of the other space (a host writer would
// dereference device pointers; a device writer would give host pointers to kernels).
class DeviceSpaceMemory : public HostDeviceMemory {
 public:
  MemorySpace space() const override { return MemorySpace::kDevice; }
};
class DeviceSpaceWriter : public HostMetadataWriter {
 public:
  MemorySpace space() const override { return MemorySpace::kDevice; }
};

// Host memory whose allocation number `fail_at` (0-based, counting every call) fails.
class FailingMemory : public HostDeviceMemory {
 public:
  explicit FailingMemory(int64_t fail_at) : fail_at_(fail_at) {}
  absl::StatusOr<DeviceBuffer> Allocate(absl::string_view name, int64_t bytes) override {
    if (calls_++ == fail_at_) return absl::ResourceExhaustedError("out of memory (injected)");
    return HostDeviceMemory::Allocate(name, bytes);
  }
  void FailAt(int64_t call) { fail_at_ = call; }
  int64_t calls() const { return calls_; }

 private:
  int64_t fail_at_;
  int64_t calls_ = 0;
};

// Create and Reserve are all or nothing: whichever allocation fails, the buffers allocated
// before it are freed, and a failed regrow leaves the state as it was.
TEST(GraphStateCreateTest, AFailedAllocationFreesWhatCameBefore) {
  BatchFixture f(16, 3, 256, 8, 600);
  const BackendConfig config = MakeTestConfig(16);
  const int64_t buffers = static_cast<int64_t>(ComputeBufferPlan(config, 8)->buffers.size());
  ASSERT_GT(buffers, 3);
  HostMetadataWriter writer;
  for (int64_t k = 0; k < buffers; ++k) {
    FailingMemory memory(k);
    const absl::Status s =
        GraphState::Create(config, &f.pool(), f.page_size(), &memory, &writer).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << "allocation " << k << ": " << s;
    EXPECT_EQ(memory.live_allocations(), 0) << "allocation " << k;
  }
  for (int64_t k = 0; k < buffers; ++k) {
    FailingMemory memory(-1);
    auto g = GraphState::Create(config, &f.pool(), f.page_size(), &memory, &writer);
    ASSERT_TRUE(g.ok()) << g.status();
    const uint64_t generation = (*g)->generation();
    const DeviceBuffer kv_indices = (*g)->buffer(graph_buffer::kKvIndices);
    memory.FailAt(memory.calls() + k);
    const absl::Status s = (*g)->Reserve(16);
    EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << "allocation " << k << ": " << s;
    EXPECT_EQ(memory.live_allocations(), buffers) << "allocation " << k;
    EXPECT_EQ((*g)->generation(), generation);
    EXPECT_EQ((*g)->batch_capacity(), 8);
    EXPECT_EQ((*g)->buffer(graph_buffer::kKvIndices).ptr, kv_indices.ptr);
  }
}

// Host memory that gives every buffer one byte less than asked.
class ShortMemory : public HostDeviceMemory {
 public:
  absl::StatusOr<DeviceBuffer> Allocate(absl::string_view name, int64_t bytes) override {
    absl::StatusOr<DeviceBuffer> b = HostDeviceMemory::Allocate(name, bytes);
    if (b.ok() && b->bytes > 0) --b->bytes;
    return b;
  }
};

// A buffer shorter than its spec would put the views past its end: refused, nothing kept.
TEST(GraphStateCreateTest, AShortBufferFromTheMemoryIsRefused) {
  BatchFixture f(16, 3, 256, 8, 600);
  ShortMemory memory;
  HostMetadataWriter writer;
  const absl::Status s =
      GraphState::Create(MakeTestConfig(16), &f.pool(), f.page_size(), &memory, &writer).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal) << s;
  EXPECT_NE(s.message().find("asked"), absl::string_view::npos) << s;
  EXPECT_EQ(memory.live_allocations(), 0);
}

// A writer that covers at most 8 rows (requests, or draft-decode branches) a write.
class EightRowWriter : public HostMetadataWriter {
 public:
  int64_t max_write_rows() const override { return 8; }
};

// A batch capacity the writer could never write is refused before anything is allocated,
// whether the config asks for it (Create) or a regrow does (Reserve).
TEST(GraphStateCreateTest, CapacityBeyondTheWritersRowsIsRefused) {
  BatchFixture f(16, 1, 64, 16, 256);
  HostDeviceMemory memory;
  EightRowWriter writer;
  absl::Status s =
      GraphState::Create(MakeTestConfig(16, {.max_batch_size = 9, .max_context_len = 256}),
                         &f.pool(), f.page_size(), &memory, &writer)
          .status();
  EXPECT_EQ(s.code(), absl::StatusCode::kOutOfRange) << s;
  EXPECT_NE(s.message().find("batch capacity of 9 requests beyond the metadata writer's 8 rows"),
            absl::string_view::npos)
      << s;
  EXPECT_EQ(memory.allocations(), 0);
  // Top-k 2: 5 requests are 10 branches, 4 are 8.
  const auto draft = [](int32_t bs) {
    return MakeTestConfig(16,
                          {.max_batch_size = bs, .max_context_len = 128, .topk = 2, .steps = 1});
  };
  s = GraphState::Create(draft(5), &f.pool(), f.page_size(), &memory, &writer).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kOutOfRange) << s;
  EXPECT_NE(s.message().find("5 * topk 2 branches"), absl::string_view::npos) << s;
  EXPECT_EQ(memory.allocations(), 0);
  auto drafting = GraphState::Create(draft(4), &f.pool(), f.page_size(), &memory, &writer);
  ASSERT_TRUE(drafting.ok()) << drafting.status();
  const int64_t held = memory.allocations();
  EXPECT_EQ((*drafting)->Reserve(5).code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ((*drafting)->batch_capacity(), 4);
  EXPECT_EQ(memory.allocations(), held);
  // Without top-k, 8 requests are the most.
  auto g = GraphState::Create(MakeTestConfig(16, {.max_batch_size = 8, .max_context_len = 256}),
                              &f.pool(), f.page_size(), &memory, &writer);
  ASSERT_TRUE(g.ok()) << g.status();
  const uint64_t generation = (*g)->generation();
  const int64_t before = memory.allocations();
  s = (*g)->Reserve(9);
  EXPECT_EQ(s.code(), absl::StatusCode::kOutOfRange) << s;
  EXPECT_EQ((*g)->generation(), generation);
  EXPECT_EQ((*g)->batch_capacity(), 8);
  EXPECT_EQ(memory.allocations(), before);
  EXPECT_TRUE((*g)->Capture(8, ForwardMode::kDecode).ok());
}

TEST(GraphStateCreateTest, WriterAndMemoryMustShareASpace) {
  BatchFixture f(16, 1, 64, 8, 256);
  const BackendConfig config = MakeTestConfig(16, {.max_context_len = 256});
  DeviceSpaceMemory device_memory;
  HostMetadataWriter host_writer;
  absl::Status s =
      GraphState::Create(config, &f.pool(), f.page_size(), &device_memory, &host_writer).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("writer works on host buffers, the memory allocates device"),
            absl::string_view::npos)
      << s;
  EXPECT_EQ(device_memory.allocations(), 0);
  HostDeviceMemory host_memory;
  DeviceSpaceWriter device_writer;
  s = GraphState::Create(config, &f.pool(), f.page_size(), &host_memory, &device_writer).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_EQ(host_memory.allocations(), 0);
  // Each in its own space.
  EXPECT_TRUE(GraphState::Create(config, &f.pool(), f.page_size(), &device_memory, &device_writer)
                  .ok());
  EXPECT_TRUE(
      GraphState::Create(config, &f.pool(), f.page_size(), &host_memory, &host_writer).ok());
}

}  // namespace
}  // namespace attnmeta
