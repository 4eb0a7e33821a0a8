// The speculative modes through the graph layer: for page sizes 1, 7, 16 and 64 on shuffled
// pools, draft-extend (fixed and variable rows), target-verify (tree mask) and multi-step
// draft-decode (a request with no committed tokens included) replayed through captured buckets
// give, for their real rows, exactly the eager builders' arrays, validate (slot ownership included)
// and keep every buffer's canaries.

#include <cstdint>
#include <random>
#include <vector>

#include "attention/graph/graph_state.h"
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

constexpr int32_t kDraft = 4;

absl::Status Validate(const ForwardMetadataView& v, const BatchFixture& f, int64_t query_rows) {
  ValidationContext ctx{f.pool_slots(), f.page_size(), TokenCount(query_rows)};
  ctx.check_slot_ownership = true;
  return ValidateForwardMetadata(v, ctx);
}

class SpeculativeGraphTest : public ::testing::TestWithParam<int64_t> {
 protected:
  int64_t ps() const { return GetParam(); }
  uint64_t seed() const { return 500 + GetParam(); }
};

TEST_P(SpeculativeGraphTest, DraftExtendFixedAndVariable) {
  SCOPED_TRACE(::testing::Message() << "seed " << seed() << ", page_size " << ps());
  std::mt19937_64 rng(seed());
  BatchFixture f(ps(), seed());
  for (int i = 0; i < 6; ++i) {
    f.AddSequence(std::uniform_int_distribution<int64_t>(0, 400)(rng), kDraft);
  }
  GraphHarness h(MakeTestConfig(ps(), {.draft_tokens = kDraft}), f);
  auto handle = h.state().Capture(8, ForwardMode::kDraftExtend, TokenLength(kDraft));
  ASSERT_TRUE(handle.ok()) << handle.status();
  const int64_t bs = static_cast<int64_t>(f.rows().size());

  auto fixed = h.state().Replay(*handle, ReplayBatch{f.rows(), f.kv_lens()});
  ASSERT_TRUE(fixed.ok()) << fixed.status();
  auto eager = BuildDraftExtendMetadata({f.rows(), f.kv_lens(), TokenCount(kDraft), {}, TokenCount(0), TokenCount(bs * kDraft)},
                                        f.pool(), f.page_size());
  ASSERT_TRUE(eager.ok()) << eager.status();
  ExpectSameMetadata(fixed->metadata, eager->view());
  EXPECT_TRUE(Validate(fixed->metadata, f, bs * kDraft).ok());

  // Variable form: request i extends by accepted[i] + 1 rows, its KV ending there.
  std::vector<TokenLength> accepted, q_lens, kv_lens;
  int64_t rows = 0;
  for (int64_t i = 0; i < bs; ++i) {
    const int32_t a = static_cast<int32_t>(i % kDraft);
    accepted.push_back(TokenLength(a));
    q_lens.push_back(TokenLength(a + 1));
    kv_lens.push_back(TokenLength(f.kv_lens()[i].value() - (kDraft - 1 - a)));
    rows += a + 1;
  }
  auto variable = h.state().Replay(*handle, ReplayBatch{f.rows(), kv_lens, q_lens});
  ASSERT_TRUE(variable.ok()) << variable.status();
  auto eager_variable = BuildDraftExtendMetadata(
      {f.rows(), kv_lens, TokenCount(0), accepted, TokenCount(kDraft), TokenCount(rows)}, f.pool(), f.page_size());
  ASSERT_TRUE(eager_variable.ok()) << eager_variable.status();
  ExpectSameMetadata(variable->metadata, eager_variable->view());
  EXPECT_TRUE(Validate(variable->metadata, f, rows).ok());
  EXPECT_TRUE(h.memory().VerifyCanaries().ok()) << h.memory().VerifyCanaries();
}

TEST_P(SpeculativeGraphTest, TargetVerifyWithTreeMask) {
  SCOPED_TRACE(::testing::Message() << "seed " << seed() << ", page_size " << ps());
  std::mt19937_64 rng(seed());
  BatchFixture f(ps(), seed());
  std::vector<TokenLength> seq_lens;
  for (int i = 0; i < 6; ++i) {
    const int64_t prefix = std::uniform_int_distribution<int64_t>(1, 500)(rng);
    f.AddSequence(prefix, kDraft);
    seq_lens.push_back(TokenLength(static_cast<int32_t>(prefix)));
  }
  std::vector<int32_t> parents;
  for (size_t b = 0; b < seq_lens.size(); ++b) {
    parents.push_back(-1);
    for (int32_t t = 1; t < kDraft; ++t) {
      parents.push_back(std::uniform_int_distribution<int32_t>(0, t - 1)(rng));
    }
  }
  auto tree = BuildVerifyTreeFromParents(parents, seq_lens, TokenLength(kDraft));
  ASSERT_TRUE(tree.ok()) << tree.status();
  GraphHarness h(MakeTestConfig(ps(), {.draft_tokens = kDraft}), f);
  auto handle = h.state().Capture(8, ForwardMode::kTargetVerify);
  ASSERT_TRUE(handle.ok()) << handle.status();
  const int64_t bs = static_cast<int64_t>(f.rows().size());
  auto r = h.state().Replay(*handle, ReplayBatch{f.rows(), f.kv_lens(), {}, tree->sees});
  ASSERT_TRUE(r.ok()) << r.status();
  auto eager = BuildTargetVerifyMetadata(f.pool(), f.rows(), *tree, MaskLayout::kFull,
                                         TokenCount(bs * kDraft), f.page_size());
  ASSERT_TRUE(eager.ok()) << eager.status();
  ExpectSameMetadata(r->metadata, eager->view());
  EXPECT_TRUE(Validate(r->metadata, f, bs * kDraft).ok()) << Validate(r->metadata, f, bs * kDraft);
  EXPECT_TRUE(h.memory().VerifyCanaries().ok()) << h.memory().VerifyCanaries();
}

TEST_P(SpeculativeGraphTest, DraftDecodeEveryStep) {
  for (int32_t topk : {1, 3}) {
    SCOPED_TRACE(::testing::Message() << "page_size " << ps() << " topk " << topk);
    const DraftDecodeShape shape{topk, 3};
    SCOPED_TRACE(::testing::Message() << "seed " << seed() + topk);
    std::mt19937_64 rng(seed() + topk);
    BatchFixture f(ps(), seed() + topk);
    std::vector<TokenLength> seq_lens;
    for (int i = 0; i < 5; ++i) {
      // Request 0 has no committed tokens: its branches read their draft tokens only.
      const TokenLength len(
          i == 0 ? 0 : static_cast<int32_t>(std::uniform_int_distribution<int64_t>(1, 500)(rng)));
      f.AddSequence(len.value(), DraftRowTokens(len, shape, f.page_size()).value() - len.value());
      seq_lens.push_back(len);
    }
    GraphHarness h(MakeTestConfig(ps(), {.topk = topk, .steps = 3}), f);
    auto handle = h.state().Capture(8, ForwardMode::kDraftDecode);
    ASSERT_TRUE(handle.ok()) << handle.status();
    auto r = h.state().Replay(*handle, ReplayBatch{f.rows(), seq_lens});
    ASSERT_TRUE(r.ok()) << r.status();
    const int64_t branches = static_cast<int64_t>(f.rows().size()) * topk;
    auto eager = BuildDraftDecodeMetadata(f.pool(), f.rows(), seq_lens, shape,
                                          TokenCount(branches), f.page_size());
    ASSERT_TRUE(eager.ok()) << eager.status();
    ASSERT_EQ(r->draft_steps.size(), 3u);
    // `metadata` is step 0 of the real branches, as draft_steps[0] is.
    ExpectSameMetadata(r->metadata, (*eager)[0].view());
    for (int step = 0; step < 3; ++step) {
      SCOPED_TRACE(::testing::Message() << "step " << step);
      ExpectSameMetadata(r->draft_steps[step], (*eager)[step].view());
      EXPECT_TRUE(Validate(r->draft_steps[step], f, branches).ok())
          << Validate(r->draft_steps[step], f, branches);
    }
    EXPECT_TRUE(h.memory().VerifyCanaries().ok()) << h.memory().VerifyCanaries();
  }
}

INSTANTIATE_TEST_SUITE_P(PageSizes, SpeculativeGraphTest, ::testing::Values(1, 7, 16, 64));

// Padded branches of a draft-decode replay (the padded requests' topk each) read one token of
// the padding page and have one query row, at every step, so that the bucket's qo_indptr ends
// at its branches (the rows of the query tensor a captured kernel is given); target-verify's
// padded rows have draft_tokens query rows over as many padding slots, their mask blocks all
// ones. The padded views validate against the bucket's query rows.
TEST(SpeculativeGraphPaddingTest, PaddedBranchesAndRowsGetSafeValues) {
  const DraftDecodeShape shape{2, 3};
  BatchFixture f(16, 12);
  std::vector<TokenLength> seq_lens;
  for (int i = 0; i < 2; ++i) {
    const TokenLength len(40 + 9 * i);
    f.AddSequence(len.value(), DraftRowTokens(len, shape, f.page_size()).value() - len.value());
    seq_lens.push_back(len);
  }
  GraphHarness h(MakeTestConfig(16, {.draft_tokens = kDraft, .topk = 2, .steps = 3}), f);
  GraphState& g = h.state();
  auto decode = g.Capture(8, ForwardMode::kDraftDecode);
  ASSERT_TRUE(decode.ok()) << decode.status();
  auto drafted = g.Replay(*decode, ReplayBatch{f.rows(), seq_lens});
  ASSERT_TRUE(drafted.ok()) << drafted.status();
  const GraphBuffers& b = g.buffers();
  const int64_t real = 2 * shape.topk, padded = 8 * shape.topk;
  for (int64_t z = real; z < padded; ++z) {
    EXPECT_EQ(b.draft_qo_indptr[z + 1].value(), z + 1) << "branch " << z;
  }
  ASSERT_EQ(drafted->padded_draft_steps.size(), static_cast<size_t>(shape.steps));
  for (int step = 0; step < shape.steps; ++step) {
    const DraftStepBuffers& d = b.draft_steps[step];
    for (int64_t z = real; z < padded; ++z) {
      EXPECT_EQ(d.kv_lens[z], GraphState::kPaddedKvLen) << "step " << step << " branch " << z;
      EXPECT_EQ(d.kv_last_page_len[z], TokenLength(1));
      EXPECT_EQ(d.kv_indptr[z + 1] - d.kv_indptr[z], TokenCount(1));
      EXPECT_EQ(PageOf(d.kv_indices[d.kv_indptr[z].value()], f.page_size()), kPaddingPage);
    }
    const ForwardMetadataView& all = drafted->padded_draft_steps[step];
    EXPECT_EQ(all.batch_size(), padded) << "step " << step;
    ValidationContext ctx{f.pool_slots(), f.page_size(), TokenCount(padded)};
    ctx.allow_padding_page = true;
    ctx.check_slot_ownership = true;
    EXPECT_TRUE(ValidateForwardMetadata(all, ctx).ok())
        << "step " << step << ": " << ValidateForwardMetadata(all, ctx);
  }
  EXPECT_EQ(drafted->padded.kv_indptr.data(), drafted->padded_draft_steps[0].kv_indptr.data());

  std::vector<uint8_t> tree(2 * kDraft * kDraft, 0);
  for (int i = 0; i < 2 * kDraft; ++i) {
    tree[i * kDraft] = 1;               // the root
    tree[i * kDraft + i % kDraft] = 1;  // itself
  }
  std::vector<TokenLength> kv = {TokenLength(30), TokenLength(44)};
  auto verify = g.Capture(8, ForwardMode::kTargetVerify);
  ASSERT_TRUE(verify.ok()) << verify.status();
  auto r = g.Replay(*verify, ReplayBatch{f.rows(), kv, {}, tree});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(b.mask_indptr[2], kDraft * (30 + 44));
  for (int i = 2; i < 8; ++i) {
    EXPECT_EQ(b.q_lens[i].value(), kDraft) << i;
    EXPECT_EQ(b.kv_lens[i].value(), kDraft) << i;
    EXPECT_EQ(b.qo_indptr[i + 1].value(), (i + 1) * kDraft) << i;
    EXPECT_EQ(b.mask_indptr[i + 1] - b.mask_indptr[i], kDraft * kDraft) << i;
    for (int64_t e = b.mask_indptr[i]; e < b.mask_indptr[i + 1]; ++e) {
      ASSERT_EQ(b.custom_mask[e], 1) << "row " << i << " byte " << e - b.mask_indptr[i];
    }
    for (int64_t k = b.kv_indptr[i].value(); k < b.kv_indptr[i + 1].value(); ++k) {
      EXPECT_EQ(PageOf(b.kv_indices[k], f.page_size()), kPaddingPage) << i;
    }
  }
  EXPECT_EQ(r->padded.custom_mask.mask.size(), static_cast<size_t>(b.mask_indptr[8]));
  ValidationContext ctx{f.pool_slots(), f.page_size(), TokenCount(8 * kDraft)};
  ctx.allow_padding_page = true;
  ctx.check_slot_ownership = true;
  EXPECT_TRUE(ValidateForwardMetadata(r->padded, ctx).ok())
      << ValidateForwardMetadata(r->padded, ctx);
  // The real rows' view stops at them.
  EXPECT_EQ(r->metadata.batch_size(), 2);
  EXPECT_EQ(r->metadata.custom_mask.mask.size(), static_cast<size_t>(kDraft * (30 + 44)));
}

// Refused replays name the problem and write nothing.
TEST(SpeculativeGraphBadInputTest, RefusedReplaysWriteNothing) {
  BatchFixture f(16, 9);
  std::vector<TokenLength> seq_lens;
  for (int i = 0; i < 3; ++i) {
    f.AddSequence(100 + i, 60);
    seq_lens.push_back(TokenLength(100 + i));
  }
  GraphHarness h(MakeTestConfig(16, {.draft_tokens = kDraft, .topk = 2, .steps = 3}), f);
  GraphState& g = h.state();
  auto verify = g.Capture(4, ForwardMode::kTargetVerify);
  auto extend = g.Capture(4, ForwardMode::kDraftExtend, TokenLength(kDraft));
  auto decode = g.Capture(4, ForwardMode::kDraftDecode);
  auto plain = g.Capture(4, ForwardMode::kDecode);
  ASSERT_TRUE(verify.ok() && extend.ok() && decode.ok() && plain.ok());
  const std::vector<std::vector<uint8_t>> before = h.Contents();
  std::vector<uint8_t> tree(3 * kDraft * kDraft, 1);
  std::vector<uint8_t> short_tree(tree.begin(), tree.end() - 1);
  std::vector<uint8_t> bad_byte = tree;
  bad_byte[5] = 2;
  // Request 1's row 2 does not see the root (column 0), then does not see itself: a verify row
  // that drops the root, and a row that sees nothing past the prefix.
  std::vector<uint8_t> rootless = tree;
  rootless[kDraft * kDraft + 2 * kDraft] = 0;
  std::vector<uint8_t> selfless = tree;
  selfless[kDraft * kDraft + 2 * kDraft + 2] = 0;
  std::vector<TokenLength> too_many = {TokenLength(1), TokenLength(5), TokenLength(1)};
  std::vector<TokenLength> none = {TokenLength(1), TokenLength(0), TokenLength(1)};
  std::vector<TokenLength> two = {TokenLength(1), TokenLength(1)};
  std::vector<TokenLength> ones = {TokenLength(1), TokenLength(1), TokenLength(1)};
  std::vector<TokenLength> past_context = {TokenLength(100), TokenLength(513), TokenLength(102)};
  std::vector<TokenLength> negative = {TokenLength(100), TokenLength(-1), TokenLength(102)};
  struct Case {
    const char* what;
    const CaptureHandle& handle;
    ReplayBatch batch;
    absl::StatusCode code;
    const char* message;  // the refusal's message starts with it
  } cases[] = {
      {"verify without a tree",
       *verify,
       {f.rows(), f.kv_lens()},
       absl::StatusCode::kInvalidArgument,
       "target_verify replay needs the tree mask"},
      {"a short tree",
       *verify,
       {f.rows(), f.kv_lens(), {}, short_tree},
       absl::StatusCode::kInvalidArgument,
       "tree_mask: 47 bytes, want bs * n * n = 48"},
      {"a tree byte of 2",
       *verify,
       {f.rows(), f.kv_lens(), {}, bad_byte},
       absl::StatusCode::kInvalidArgument,
       "tree_mask: custom mask: tree row byte 5 (sequence 0, row 1) = 2, want 0 or 1"},
      {"a row not seeing the root",
       *verify,
       {f.rows(), f.kv_lens(), {}, rootless},
       absl::StatusCode::kInvalidArgument,
       "tree_mask: custom mask: row 2 of sequence 1 does not see the root (tree row byte 24;"},
      {"a row not seeing itself",
       *verify,
       {f.rows(), f.kv_lens(), {}, selfless},
       absl::StatusCode::kInvalidArgument,
       "tree_mask: custom mask: row 2 of sequence 1 does not see itself (tree row byte 26)"},
      {"a tree to draft-extend",
       *extend,
       {f.rows(), f.kv_lens(), {}, tree},
       absl::StatusCode::kInvalidArgument,
       "replay batch: a tree mask given to draft_extend"},
      {"more rows than captured",
       *extend,
       {f.rows(), f.kv_lens(), too_many},
       absl::StatusCode::kInvalidArgument,
       "q_lens[1] = 5 outside [1, 4]"},
      {"a request of no query rows",
       *extend,
       {f.rows(), f.kv_lens(), none},
       absl::StatusCode::kInvalidArgument,
       "q_lens[1] = 0 outside [1, 4]"},
      {"fewer q_lens than rows",
       *extend,
       {f.rows(), f.kv_lens(), two},
       absl::StatusCode::kInvalidArgument,
       "replay batch: 3 rows but 2 q_lens"},
      {"q_lens to decode",
       *plain,
       {f.rows(), f.kv_lens(), ones},
       absl::StatusCode::kInvalidArgument,
       "replay batch: per-request q_lens are for extend and draft_extend, not decode"},
      {"a committed length past max_context_len",
       *decode,
       {f.rows(), past_context},
       absl::StatusCode::kOutOfRange,
       "kv_lens[1] = 513 beyond max_context_len = 512"},
      {"a negative committed length",
       *decode,
       {f.rows(), negative},
       absl::StatusCode::kInvalidArgument,
       "kv_lens[1] = -1 is negative"},
  };
  for (const Case& c : cases) {
    ASSERT_NE(c.message[0], '\0') << c.what;
    const absl::Status s = g.Replay(c.handle, c.batch).status();
    EXPECT_EQ(s.code(), c.code) << c.what << ": " << s;
    EXPECT_EQ(std::string(s.message()).rfind(c.message, 0), 0u) << c.what << ": " << s;
    EXPECT_EQ(h.Contents(), before) << c.what;
  }
}

// A config whose draft-decode runs do not fit req_to_token's rows is refused at creation. With
// 16-token pages, top-k 4 and 3 steps, the furthest run is not at max_context_len = 512 but
// at 511: 496 + 3 branches * 2 pages * 16 + 15 + 3 = 610 positions.
TEST(SpeculativeGraphBadInputTest, DraftRunsMustFitTheRows) {
  HostDeviceMemory memory;
  HostMetadataWriter writer;
  const BackendConfig config = MakeTestConfig(16, {.topk = 4, .steps = 3});
  BatchFixture fits(16, 9, 256, 8, 610);
  EXPECT_TRUE(GraphState::Create(config, &fits.pool(), fits.page_size(), &memory, &writer).ok());
  BatchFixture short_rows(16, 9, 256, 8, 609);
  absl::Status s =
      GraphState::Create(config, &short_rows.pool(), short_rows.page_size(), &memory, &writer)
          .status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("610"), absl::string_view::npos) << s;
}

}  // namespace
}  // namespace attnmeta
