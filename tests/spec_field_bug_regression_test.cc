// The field bugs of DESIGN.md section 3 that speculative decoding hit in the reference system
// (rows 7, 8 and 10, and row 4 for the draft-decode buffers), each run through the real speculative
// path at the shape that broke it; the mutation gate puts each bug back into the real code
// (tests/mutants/field_bug_row7_*, draft_extend_rows_unchecked, field_bug_row10_*) and shows these
// tests failing.

#include <vector>

#include "attention/graph/graph_state.h"
#include "attention/graph/host_device_memory.h"
#include "attention/graph/host_metadata_writer.h"
#include "attention/graph/testing/graph_harness.h"
#include "attention/metadata/testing/batch_fixture.h"
#include "attention/metadata/testing/metadata_compare.h"
#include "attention/metadata/validator.h"
#include "gtest/gtest.h"
#include "spec_decode/speculative_metadata.h"
#include "spec_decode/verify_tree.h"

namespace attnmeta {
namespace {

using testing::BatchFixture;
using testing::ExpectSameMetadata;
using testing::GraphHarness;
using testing::MakeTestConfig;

absl::Status Validate(const ForwardMetadataView& v, const BatchFixture& f, int64_t query_rows) {
  ValidationContext ctx{f.pool_slots(), f.page_size(), TokenCount(query_rows)};
  ctx.check_slot_ownership = true;
  return ValidateForwardMetadata(v, ctx);
}

// Captures draft-decode for f's whole batch, replays it, and checks every step against the
// eager path and the validator, and the buffers' canaries.
void ReplayDraftDecodeMatchesEager(GraphHarness& h, const BatchFixture& f,
                                   const std::vector<TokenLength>& seq_lens,
                                   DraftDecodeShape shape) {
  const int64_t bs = static_cast<int64_t>(f.rows().size());
  auto handle = h.state().Capture(bs, ForwardMode::kDraftDecode);
  ASSERT_TRUE(handle.ok()) << handle.status();
  auto r = h.state().Replay(*handle, ReplayBatch{f.rows(), seq_lens});
  ASSERT_TRUE(r.ok()) << r.status();
  auto eager = BuildDraftDecodeMetadata(f.pool(), f.rows(), seq_lens, shape,
                                        TokenCount(bs * shape.topk), f.page_size());
  ASSERT_TRUE(eager.ok()) << eager.status();
  for (int step = 0; step < shape.steps; ++step) {
    ExpectSameMetadata(r->draft_steps[step], (*eager)[step].view());
    EXPECT_TRUE(Validate(r->draft_steps[step], f, bs * shape.topk).ok());
  }
  EXPECT_TRUE(h.memory().VerifyCanaries().ok()) << h.memory().VerifyCanaries();
}

// Row 7: the verify buffer without the draft-token slack overflowed near full context. Every
// request here has max_context_len committed tokens plus its n draft tokens: target-verify
// replays them (kv_len ctx + n) and equals the eager path.
TEST(SpecFieldBugTest, Row7_VerifyAtFullContextFitsTheGraphBuffers) {
  for (int64_t ps : {1, 16, 64}) {
    SCOPED_TRACE(::testing::Message() << "page_size " << ps);
    const int64_t ctx = 192;
    const int32_t n = 4;
    const int bs = 3;
    BatchFixture f(ps, 7, bs * ((ctx + n) / ps + 2) + 8);
    std::vector<TokenLength> seq_lens;
    std::vector<int32_t> parents;
    for (int i = 0; i < bs; ++i) {
      f.AddSequence(ctx, n);
      seq_lens.push_back(TokenLength(ctx));
      for (int32_t t = 0; t < n; ++t) parents.push_back(t == 0 ? -1 : (t - 1) / 2);
    }
    auto tree = BuildVerifyTreeFromParents(parents, seq_lens, TokenLength(n));
    ASSERT_TRUE(tree.ok()) << tree.status();
    GraphHarness h(MakeTestConfig(ps, {.max_batch_size = bs, .max_context_len = ctx,
                                       .draft_tokens = n}),
                   f);
    // The buggy plan: rows of ceil(ctx / ps) * ps slots, without the n draft slots.
    EXPECT_EQ(h.state().plan().kv_row_tokens, TokenCount((ctx + ps - 1) / ps * ps + n));
    auto handle = h.state().Capture(bs, ForwardMode::kTargetVerify);
    ASSERT_TRUE(handle.ok()) << handle.status();
    auto r = h.state().Replay(*handle, ReplayBatch{f.rows(), f.kv_lens(), {}, tree->sees});
    ASSERT_TRUE(r.ok()) << r.status();
    auto eager = BuildTargetVerifyMetadata(f.pool(), f.rows(), *tree, MaskLayout::kFull,
                                           TokenCount(bs * n), f.page_size());
    ASSERT_TRUE(eager.ok()) << eager.status();
    ExpectSameMetadata(r->metadata, eager->view());
    EXPECT_TRUE(Validate(r->metadata, f, bs * n).ok()) << Validate(r->metadata, f, bs * n);
    EXPECT_TRUE(h.memory().VerifyCanaries().ok()) << h.memory().VerifyCanaries();
  }
}

// Row 7 at creation: req_to_token rows one position short of max_context_len + n are refused
// before anything is allocated (a verify at full context would need that position); rows of
// exactly that width are taken.
TEST(SpecFieldBugTest, Row7_RowsWithoutTheDraftSlackAreRefusedAtCreation) {
  constexpr int64_t ps = 16, ctx = 160;
  constexpr int32_t n = 4;
  const BackendConfig config = MakeTestConfig(ps, {.max_batch_size = 2,
                                                   .max_context_len = ctx,
                                                   .draft_tokens = n,
                                                   .max_query_rows_per_request = n});
  HostMetadataWriter writer;
  BatchFixture narrow(ps, 7, 64, 4, ctx + n - 1);
  HostDeviceMemory memory;
  const absl::Status s =
      GraphState::Create(config, &narrow.pool(), narrow.page_size(), &memory, &writer).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("the config needs 164 (max_context_len + draft_tokens)"),
            absl::string_view::npos)
      << s;
  EXPECT_EQ(memory.allocations(), 0);
  BatchFixture exact(ps, 7, 64, 4, ctx + n);
  EXPECT_TRUE(GraphState::Create(config, &exact.pool(), exact.page_size(), &memory, &writer).ok());
}

// Row 4 for draft-decode: a regrow past max_batch_size regrows the per-branch buffers too
// (draft_qo_indptr and every step's indptr, lengths and last-page lengths), so a padded
// draft-decode capture of the new size fits and replays as the eager path builds.
TEST(SpecFieldBugTest, Row4_ReserveRegrowsTheDraftDecodeBuffers) {
  constexpr int64_t ps = 16, ctx = 96;
  const DraftDecodeShape shape{2, 3};
  constexpr int bs = 9;
  BatchFixture f(ps, 12, 2048);
  std::vector<TokenLength> seq_lens;
  for (int i = 0; i < bs; ++i) {
    const TokenLength len(static_cast<int32_t>(ctx - 3 * i));
    f.AddSequence(len.value(), DraftRowTokens(len, shape, f.page_size()).value() - len.value());
    seq_lens.push_back(len);
  }
  GraphHarness h(
      MakeTestConfig(
          ps,
          {.max_batch_size = 4, .max_context_len = ctx, .topk = shape.topk, .steps = shape.steps}),
      f);
  GraphState& g = h.state();
  EXPECT_EQ(g.Capture(bs, ForwardMode::kDraftDecode).status().code(),
            absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(g.Reserve(bs).ok());
  const size_t branches = static_cast<size_t>(bs * shape.topk);
  EXPECT_GE(g.buffers().draft_qo_indptr.size(), branches + 1);
  for (const DraftStepBuffers& d : g.buffers().draft_steps) {
    EXPECT_GE(d.kv_indptr.size(), branches + 1);
    EXPECT_GE(d.kv_lens.size(), branches);
    EXPECT_GE(d.kv_last_page_len.size(), branches);
  }
  ReplayDraftDecodeMatchesEager(h, f, seq_lens, shape);
}

// Row 8: an eager draft-extend took the prefill's qo_indptr, [0, 80], for a 4-row query and
// wrote out of bounds. The builder is told the query tensor's rows and refuses the mismatch.
TEST(SpecFieldBugTest, Row8_DraftExtendWithPrefillQoIndptrIsRefused) {
  BatchFixture f(16, 8);
  f.AddSequence(0, 80);  // the prompt: 80 tokens
  const std::vector<TokenLength> prompt = {TokenLength(80)};
  // The buggy call: rows per request taken from the prefill (80), query tensor of 4 rows.
  auto buggy = BuildDraftExtendMetadata({f.rows(), prompt, TokenCount(80), {}, TokenCount(0), TokenCount(4)}, f.pool(),
                                        f.page_size());
  EXPECT_EQ(buggy.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(buggy.status().message().find("80 query rows"), absl::string_view::npos)
      << buggy.status();
  // The right one: 4 rows per request, qo_indptr [0, 4].
  auto good = BuildDraftExtendMetadata({f.rows(), prompt, TokenCount(4), {}, TokenCount(0), TokenCount(4)}, f.pool(),
                                       f.page_size());
  ASSERT_TRUE(good.ok()) << good.status();
  EXPECT_EQ(good->qo_indptr, (std::vector<TokenOffset>{TokenOffset(0), TokenOffset(4)}));
}

// Row 10: the draft-decode buffer's row width lacked the top-k factor: an out-of-range token
// index. Requests at max_context_len with top-k 4 over 3 steps replay every step into the
// graph buffers and equal the eager path.
TEST(SpecFieldBugTest, Row10_DraftDecodeAtFullContextWithTopK) {
  for (int64_t ps : {1, 16, 64}) {
    SCOPED_TRACE(::testing::Message() << "page_size " << ps);
    const int64_t ctx = 192;
    const DraftDecodeShape shape{4, 3};
    const int bs = 3;
    BatchFixture f(ps, 10, 4096);
    std::vector<TokenLength> seq_lens;
    for (int i = 0; i < bs; ++i) {
      const TokenLength len(ctx);
      f.AddSequence(ctx, DraftRowTokens(len, shape, f.page_size()).value() - ctx);
      seq_lens.push_back(len);
    }
    GraphHarness h(MakeTestConfig(ps, {.max_batch_size = bs, .max_context_len = ctx,
                                       .topk = shape.topk, .steps = shape.steps}),
                   f);
    // steps x B x topk branches of ceil(192 / ps) * ps + steps = 195 tokens (192 is a multiple
    // of every page size here); the buggy plan had B * 195 per step, without top-k.
    EXPECT_EQ(h.state().plan().Find("draft_kv_indices")->capacity, 3 * 3 * 4 * 195);
    ReplayDraftDecodeMatchesEager(h, f, seq_lens, shape);
  }
}

}  // namespace
}  // namespace attnmeta
