#include "attention/graph/buffer_plan.h"

#include <cstdio>
#include <map>
#include <string>

#include "attention/graph/testing/graph_harness.h"
#include "gtest/gtest.h"

namespace attnmeta {
namespace {

BackendConfig Realistic() { return *ParseBackendConfig(testing::kRealisticConfigText); }

// The plan of a realistic config, printed, against sizes computed by hand here.
TEST(BufferPlanTest, RealisticConfigMatchesHandComputedSizes) {
  auto plan = ComputeBufferPlan(Realistic(), 256);
  ASSERT_TRUE(plan.ok()) << plan.status();
  std::printf("%s", PlanTable(*plan).c_str());
  // kv_indices: 256 requests * (32768 tokens rounded up to pages of 16 = 32768, + 4 draft).
  // page_table: ceil((32768 + 4) / 16) = 2049 columns. custom mask: 256 * 4 * (32768 + 4)
  // bytes; the tree rows 256 * 4 * 4. Draft-decode over 256 * top-k 1 branches, 3 steps:
  // draft_kv_indices 3 * 256 * (32768 + 3 steps), indptrs 3 * 257. split-KV: 256 tiles (one
  // 64-row tile per request: max(1, 4) query rows) + 131 unit boundaries; 262 partials.
  const std::map<std::string, std::pair<int64_t, int64_t>> want = {
      {"staged_inputs", {768, 3072}},
      {"kv_indptr", {257, 1028}},
      {"qo_indptr", {257, 1028}},
      {"kv_last_page_len", {256, 1024}},
      {"kv_indices", {8389632, 33558528}},
      {"page_table", {524544, 2098176}},
      {"tree_mask", {4096, 4096}},
      {"mask_indptr", {257, 2056}},
      {"custom_mask", {33558528, 33558528}},
      {"draft_qo_indptr", {257, 1028}},
      {"draft_kv_indptr", {771, 3084}},
      {"draft_kv_lens", {768, 3072}},
      {"draft_kv_last_page_len", {768, 3072}},
      {"draft_kv_indices", {3 * 8389376, 3 * 33557504}},
      {"split_kv_work", {387, 387 * 24}},
      {"split_kv_unit_indptr", {133, 532}},
      {"split_kv_reduce", {131, 131 * 20}},
      {"split_kv_partial_out", {262LL * 64 * 32 * 128, 262LL * 64 * 32 * 128 * 4}},
      {"split_kv_partial_lse", {262 * 64 * 32, 262 * 64 * 32 * 4}},
  };
  ASSERT_EQ(plan->buffers.size(), want.size());
  int64_t total = 0;
  for (const BufferSpec& b : plan->buffers) {
    auto it = want.find(b.name);
    ASSERT_NE(it, want.end()) << b.name;
    EXPECT_EQ(b.capacity, it->second.first) << b.name;
    EXPECT_EQ(b.bytes, it->second.second) << b.name;
    total += it->second.second;
  }
  EXPECT_EQ(plan->total_bytes, total);
  EXPECT_EQ(plan->kv_row_tokens, TokenCount(32772));
  EXPECT_EQ(plan->page_table_cols, PageCount(2049));
  EXPECT_EQ(plan->draft_branch_tokens, TokenCount(32771));
  EXPECT_FALSE(plan->Find("custom_mask")->int32_addressed);
}

TEST(BufferPlanTest, OptionalBuffersFollowTheConfig) {
  BackendConfig c = Realistic();
  c.mutable_consumers()->set_page_table(false);
  c.mutable_consumers()->mutable_split_kv()->set_enabled(false);
  c.mutable_speculative()->Clear();
  auto plan = ComputeBufferPlan(c, 8);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->buffers.size(), 5u);
  EXPECT_EQ(plan->Find("page_table"), nullptr);
  EXPECT_EQ(plan->Find("custom_mask"), nullptr);
  EXPECT_EQ(plan->Find("kv_indices")->capacity, 8 * 32768);
  EXPECT_EQ(plan->page_table_cols, PageCount(0));
  EXPECT_EQ(ComputeBufferPlan(c, 0).status().code(), absl::StatusCode::kInvalidArgument);
  c.set_max_batch_size(0);
  EXPECT_EQ(ComputeBufferPlan(c, 8).status().code(), absl::StatusCode::kInvalidArgument);
}

// The split-KV work items cover the most query rows a replay can have: the realistic
// config's 4 draft tokens (target-verify, draft-extend), not its 1 query row per request.
TEST(BufferPlanTest, SplitKvWorkCoversTheDraftRows) {
  BackendConfig c = Realistic();
  c.mutable_consumers()->mutable_split_kv()->set_q_tile(2);
  auto plan = ComputeBufferPlan(c, 256);
  ASSERT_TRUE(plan.ok()) << plan.status();
  // 256 requests * ceil(4 / 2) tiles + 131 unit boundaries.
  EXPECT_EQ(plan->Find("split_kv_work")->capacity, 256 * 2 + 131);
}

// Page sizes that do not divide the context: token-level rows round up to whole pages.
TEST(BufferPlanTest, RowsRoundUpToWholePages) {
  BackendConfig c = Realistic();
  c.set_max_context_len(1000);
  c.set_page_size(7);
  auto plan = ComputeBufferPlan(c, 3);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->kv_row_tokens, TokenCount(1001 + 4));  // ceil(1000 / 7) = 143 pages = 1001
  EXPECT_EQ(plan->page_table_cols, PageCount(144));      // ceil(1004 / 7)
  EXPECT_EQ(plan->Find("kv_indices")->capacity, 3 * 1005);
}

// Every int32-addressed buffer is checked; the error names the buffer.
TEST(BufferPlanTest, Int32AddressabilityNamesTheBuffer) {
  BackendConfig c = Realistic();
  c.mutable_consumers()->mutable_split_kv()->set_enabled(false);
  c.mutable_speculative()->set_topk(0);
  c.mutable_speculative()->set_steps(0);
  // 65536 rows of 32772 slots: 2.1e9 > INT32_MAX.
  absl::Status s = ComputeBufferPlan(c, 65536).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(std::string(s.message()).rfind("kv_indices:", 0), 0u) << s;
  // 65527 rows * 32772 = 2147450844 <= INT32_MAX: fits.
  EXPECT_TRUE(ComputeBufferPlan(c, 65527).ok());
  // The draft-decode buffer carries the top-k factor and is checked too.
  c.mutable_speculative()->set_topk(8);
  c.mutable_speculative()->set_steps(3);
  s = ComputeBufferPlan(c, 8192).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kOutOfRange) << s;
  EXPECT_EQ(std::string(s.message()).rfind("draft_kv_indices:", 0), 0u) << s;
  // The custom mask's offsets are int64: it may pass 2^31 bytes.
  c.mutable_speculative()->set_topk(0);
  c.mutable_speculative()->set_steps(0);
  c.mutable_speculative()->set_draft_tokens(64);
  c.set_max_context_len(30000);
  auto big = ComputeBufferPlan(c, 2048);
  ASSERT_TRUE(big.ok()) << big.status();
  EXPECT_GT(big->Find("custom_mask")->bytes, int64_t{1} << 31);
}

}  // namespace
}  // namespace attnmeta
