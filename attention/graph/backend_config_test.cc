#include "attention/graph/backend_config.h"

#include <functional>
#include <limits>
#include <string>

#include "attention/graph/testing/graph_harness.h"
#include "gtest/gtest.h"

namespace attnmeta {
namespace {

constexpr const char* kText = testing::kRealisticConfigText;

TEST(BackendConfigTest, ParsesAndValidatesTextFormat) {
  auto c = ParseBackendConfig(kText);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->max_batch_size(), 256);
  EXPECT_EQ(ConfigPageSize(*c).tokens(), 16);
  EXPECT_EQ(MaxQueryRowsPerRequest(*c), TokenCount(1));
  const SplitKvOptions o = ConfigSplitKvOptions(*c);
  EXPECT_TRUE(o.layout.paged());
  EXPECT_EQ(o.layout.block().tokens(), 16);
  EXPECT_EQ(o.num_units, 132);
  EXPECT_EQ(o.kv_granularity, TokenCount(128));
  EXPECT_EQ(o.q_tile, TokenCount(64));
  // The linear layout (a consumer that reads K/V per token): planned in tokens, whatever the
  // page size (DESIGN.md section 3, row 5).
  BackendConfig linear = *c;
  linear.mutable_consumers()->mutable_split_kv()->set_layout(SPLIT_KV_LAYOUT_LINEAR_PER_TOKEN);
  const SplitKvOptions lo = ConfigSplitKvOptions(linear);
  EXPECT_FALSE(lo.layout.paged());
  EXPECT_EQ(lo.layout.block().tokens(), 1);
  EXPECT_EQ(SplitKvChunk(lo), TokenCount(128));
  EXPECT_EQ(SplitKvChunk(o), TokenCount(128));
  EXPECT_EQ(ParseBackendConfig("max_batch_size: banana").status().code(),
            absl::StatusCode::kInvalidArgument);
}

// Each bad field is named first in the message.
TEST(BackendConfigTest, NamesTheBadField) {
  const BackendConfig good = *ParseBackendConfig(kText);
  auto expect = [&](const std::string& field, const std::function<void(BackendConfig&)>& bad) {
    BackendConfig c = good;
    bad(c);
    const absl::Status s = ValidateBackendConfig(c);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << field;
    EXPECT_EQ(std::string(s.message()).rfind(field + ":", 0), 0u) << s.message();
  };
  expect("max_batch_size", [](BackendConfig& c) { c.set_max_batch_size(0); });
  expect("max_batch_size", [](BackendConfig& c) { c.set_max_batch_size(-4); });
  expect("max_context_len", [](BackendConfig& c) { c.set_max_context_len(0); });
  // Huge: refused before any arithmetic on it could overflow.
  expect("max_context_len", [](BackendConfig& c) {
    c.set_max_context_len(std::numeric_limits<int64_t>::max());
  });
  expect("max_context_len", [](BackendConfig& c) { c.set_max_context_len(int64_t{1} << 31); });
  // INT32_MAX is a valid length, but rounded up to pages of 16 it is 2^31 slots: the context's
  // fault, not the (zero) draft tokens'.
  expect("max_context_len", [](BackendConfig& c) {
    c.set_max_context_len(std::numeric_limits<int32_t>::max());
    c.mutable_speculative()->set_draft_tokens(0);
  });
  expect("page_size", [](BackendConfig& c) { c.set_page_size(0); });
  expect("page_size", [](BackendConfig& c) { c.set_page_size(int64_t{1} << 21); });
  expect("num_q_heads", [](BackendConfig& c) { c.set_num_q_heads(0); });
  expect("num_kv_heads", [](BackendConfig& c) { c.set_num_kv_heads(5); });
  expect("head_dim", [](BackendConfig& c) { c.set_head_dim(-1); });
  expect("head_dim", [](BackendConfig& c) { c.set_head_dim(0); });
  expect("kv_dtype", [](BackendConfig& c) { c.set_kv_dtype(KV_DTYPE_UNSPECIFIED); });
  expect("consumers.split_kv.num_units",
         [](BackendConfig& c) { c.mutable_consumers()->mutable_split_kv()->set_num_units(0); });
  expect("consumers.split_kv.kv_granularity", [](BackendConfig& c) {
    c.mutable_consumers()->mutable_split_kv()->set_kv_granularity(0);
  });
  expect("consumers.split_kv.q_tile",
         [](BackendConfig& c) { c.mutable_consumers()->mutable_split_kv()->set_q_tile(-1); });
  expect("consumers.split_kv.q_tile",
         [](BackendConfig& c) { c.mutable_consumers()->mutable_split_kv()->set_q_tile(0); });
  // One past each split-KV bound (the bounds themselves are accepted below).
  expect("consumers.split_kv.num_units", [](BackendConfig& c) {
    c.mutable_consumers()->mutable_split_kv()->set_num_units((1 << 20) + 1);
  });
  expect("consumers.split_kv.kv_granularity", [](BackendConfig& c) {
    c.mutable_consumers()->mutable_split_kv()->set_kv_granularity((1 << 30) + 1);
  });
  expect("consumers.split_kv.q_tile", [](BackendConfig& c) {
    c.mutable_consumers()->mutable_split_kv()->set_q_tile((1 << 30) + 1);
  });
  expect("consumers.split_kv.layout", [](BackendConfig& c) {
    c.mutable_consumers()->mutable_split_kv()->set_layout(SPLIT_KV_LAYOUT_UNSPECIFIED);
  });
  // Open enums keep values outside the declared set; the layout must not be guessed from one.
  expect("consumers.split_kv.layout", [](BackendConfig& c) {
    c.mutable_consumers()->mutable_split_kv()->set_layout(static_cast<SplitKvLayout>(7));
  });
  expect("kv_dtype", [](BackendConfig& c) { c.set_kv_dtype(static_cast<KvDtype>(99)); });
  expect("speculative.draft_tokens",
         [](BackendConfig& c) { c.mutable_speculative()->set_draft_tokens(-1); });
  expect("speculative.topk", [](BackendConfig& c) { c.mutable_speculative()->set_steps(0); });
  expect("speculative.topk", [](BackendConfig& c) {
    c.mutable_speculative()->set_topk(-1);
    c.mutable_speculative()->set_steps(0);
  });
  expect("speculative.steps", [](BackendConfig& c) {
    c.mutable_speculative()->set_topk(0);
    c.mutable_speculative()->set_steps(-1);
  });
  // A draft setting that overflows int32 slots per request.
  expect("speculative.draft_tokens", [](BackendConfig& c) {
    c.mutable_speculative()->set_draft_tokens(2147483647 - 32768 + 1);
  });
  expect("capture_batch_sizes[5]", [](BackendConfig& c) { c.set_capture_batch_sizes(5, 257); });
  expect("capture_batch_sizes[0]", [](BackendConfig& c) { c.set_capture_batch_sizes(0, 0); });
  expect("capture_batch_sizes[2]", [](BackendConfig& c) { c.set_capture_batch_sizes(2, 2); });
  expect("max_query_rows_per_request",
         [](BackendConfig& c) { c.set_max_query_rows_per_request(-1); });
  expect("max_query_rows_per_request",
         [](BackendConfig& c) { c.set_max_query_rows_per_request(32768 + 4 + 1); });
  // At the limits: accepted.
  BackendConfig edge = good;
  edge.set_max_query_rows_per_request(32768 + 4);
  edge.mutable_speculative()->set_draft_tokens(4);
  EXPECT_TRUE(ValidateBackendConfig(edge).ok()) << ValidateBackendConfig(edge);
  edge.mutable_speculative()->set_draft_tokens(2147483647 - 32768);
  edge.set_max_query_rows_per_request(1);
  EXPECT_TRUE(ValidateBackendConfig(edge).ok()) << ValidateBackendConfig(edge);
  // The longest context pages of 16 can hold, and INT32_MAX itself with pages of 1.
  BackendConfig longest = good;
  longest.mutable_speculative()->set_draft_tokens(0);
  longest.set_max_query_rows_per_request(1);
  longest.set_max_context_len(2147483647 - 15);
  EXPECT_TRUE(ValidateBackendConfig(longest).ok()) << ValidateBackendConfig(longest);
  longest.set_page_size(1);
  longest.set_max_context_len(2147483647);
  EXPECT_TRUE(ValidateBackendConfig(longest).ok()) << ValidateBackendConfig(longest);
  // The split-KV options at their bounds.
  BackendConfig widest = good;
  widest.mutable_consumers()->mutable_split_kv()->set_num_units(1 << 20);
  widest.mutable_consumers()->mutable_split_kv()->set_kv_granularity(1 << 30);
  widest.mutable_consumers()->mutable_split_kv()->set_q_tile(1 << 30);
  EXPECT_TRUE(ValidateBackendConfig(widest).ok()) << ValidateBackendConfig(widest);
}

}  // namespace
}  // namespace attnmeta
