#include "sim/workload.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "attention/metadata/draft_decode_layout.h"
#include "gtest/gtest.h"

namespace attnmeta {
namespace {

TEST(WorkloadTest, DefaultWorkloadParsesAndCoversEveryFeature) {
  absl::StatusOr<Workload> w = ParseWorkload(DefaultWorkloadText());
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ(std::vector<int64_t>(w->page_sizes().begin(), w->page_sizes().end()),
            (std::vector<int64_t>{1, 7, 16, 64}));
  bool topk1 = false, topk4 = false, mixed = false, shared = false, padded_past_pool = false;
  for (const Scenario& s : w->scenarios()) {
    const SpeculativeConfig& spec = s.backend().speculative();
    topk1 |= spec.draft_tokens() > 0 && spec.topk() == 1;
    topk4 |= spec.draft_tokens() > 0 && spec.topk() == 4;
    mixed |= s.mixed_chunk();
    for (const Request& r : s.requests()) shared |= r.prefix_group() > 0;
    for (int32_t b : s.backend().capture_batch_sizes()) {
      padded_past_pool |= b > s.max_running_requests();
    }
  }
  EXPECT_TRUE(topk1 && topk4 && mixed && shared && padded_past_pool);
}

// Parses the default workload with `edit` applied to its first scenario, expecting an error
// whose message starts with `path`.
void ExpectRejected(void (*edit)(Workload&), absl::string_view path) {
  absl::StatusOr<Workload> w = ParseWorkload(DefaultWorkloadText());
  ASSERT_TRUE(w.ok());
  edit(*w);
  const absl::Status s = ValidateWorkload(*w);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << path;
  EXPECT_TRUE(absl::StartsWith(s.message(), path)) << s;
}

TEST(WorkloadTest, EveryBadFieldIsNamed) {
  ExpectRejected([](Workload& w) { w.clear_page_sizes(); }, "page_sizes: no page sizes");
  ExpectRejected([](Workload& w) { w.set_page_sizes(2, 0); }, "page_sizes[2]");
  ExpectRejected([](Workload& w) { w.set_check_steps(-1); }, "check_steps");
  ExpectRejected([](Workload& w) { w.clear_scenarios(); }, "scenarios: no scenarios");
  ExpectRejected([](Workload& w) { w.mutable_scenarios(1)->set_name("bad name"); },
                 "scenarios[1].name");
  ExpectRejected([](Workload& w) { w.mutable_scenarios(1)->set_name("chat"); },
                 "scenarios[1].name: \"chat\" repeats");
  ExpectRejected([](Workload& w) { w.mutable_scenarios(0)->mutable_backend()->set_num_kv_heads(3); },
                 "scenarios[0].backend: at page size 1: num_kv_heads");
  ExpectRejected([](Workload& w) { w.mutable_scenarios(0)->set_kv_pool_tokens(32); },
                 "scenarios[0].kv_pool_tokens: 32 tokens are less than one page of 64");
  ExpectRejected([](Workload& w) { w.mutable_scenarios(0)->set_max_running_requests(0); },
                 "scenarios[0].max_running_requests");
  ExpectRejected([](Workload& w) { w.mutable_scenarios(0)->set_chunked_prefill_tokens(0); },
                 "scenarios[0].chunked_prefill_tokens");
  ExpectRejected([](Workload& w) { w.mutable_scenarios(0)->set_max_steps(0); },
                 "scenarios[0].max_steps");
  ExpectRejected(
      [](Workload& w) { w.mutable_scenarios(1)->mutable_acceptance()->set_probability(1.5); },
      "scenarios[1].acceptance.probability");
  ExpectRejected(
      [](Workload& w) {
        w.mutable_scenarios(1)->mutable_acceptance()->set_probability(std::nan(""));
      },
      "scenarios[1].acceptance.probability");
  ExpectRejected(
      [](Workload& w) {
        w.mutable_scenarios(1)->mutable_backend()->mutable_speculative()->set_draft_tokens(65);
      },
      "scenarios[1].backend");
  ExpectRejected([](Workload& w) { w.mutable_scenarios(0)->mutable_requests(3)->set_prompt_len(0); },
                 "scenarios[0].requests[3].prompt_len");
  ExpectRejected([](Workload& w) { w.mutable_scenarios(0)->mutable_requests(3)->set_output_len(0); },
                 "scenarios[0].requests[3].output_len: must be >= 1");
  ExpectRejected(
      [](Workload& w) { w.mutable_scenarios(0)->mutable_requests(3)->set_output_len(500); },
      "scenarios[0].requests[3].output_len: prompt + output");
  ExpectRejected(
      [](Workload& w) { w.mutable_scenarios(0)->mutable_requests(3)->set_arrival_step(-2); },
      "scenarios[0].requests[3].arrival_step");
  ExpectRejected(
      [](Workload& w) { w.mutable_scenarios(0)->mutable_requests(3)->set_shared_prefix_len(5); },
      "scenarios[0].requests[3].shared_prefix_len: set without a prefix_group");
  ExpectRejected(
      [](Workload& w) { w.mutable_scenarios(0)->mutable_requests(4)->set_shared_prefix_len(90); },
      "scenarios[0].requests[4].shared_prefix_len: 90 differs from 96");
  // A prefix longer than its request's prompt (147 tokens), named at that request.
  ExpectRejected(
      [](Workload& w) { w.mutable_scenarios(0)->mutable_requests(1)->set_shared_prefix_len(148); },
      "scenarios[0].requests[1].shared_prefix_len: 148 is outside [1, prompt_len 147]");
  // EAGLE without a draft tree's shape, and without an acceptance block.
  ExpectRejected(
      [](Workload& w) {
        SpeculativeConfig& spec = *w.mutable_scenarios(1)->mutable_backend()->mutable_speculative();
        spec.set_topk(0);
        spec.set_steps(0);
      },
      "scenarios[1].backend.speculative: EAGLE (draft_tokens > 0) needs topk >= 1");
  ExpectRejected([](Workload& w) { w.mutable_scenarios(1)->clear_acceptance(); },
                 "scenarios[1].acceptance.probability");
  ExpectRejected([](Workload& w) { w.mutable_scenarios(0)->set_kv_pool_tokens(int64_t{1} << 30); },
                 "scenarios[0].kv_pool_tokens: at page size 1 the pool's");
  // Products that overflow int64 when formed unchecked: the pool's slots ((2^63 - 1) / 1 + 1
  // pages of 1 token), and heads x head dim x slots (2^27 x 2^28 x 8 x 64 = 2^64, which wrapped
  // to 0 and passed).
  ExpectRejected(
      [](Workload& w) { w.mutable_scenarios(0)->set_kv_pool_tokens(INT64_MAX); },
      "scenarios[0].kv_pool_tokens: the pool's slots exceed 2^31");
  ExpectRejected(
      [](Workload& w) {
        BackendConfig* b = w.mutable_scenarios(0)->mutable_backend();
        b->set_num_q_heads(1 << 27);
        b->set_num_kv_heads(1 << 27);
        b->set_head_dim(1 << 28);
      },
      "scenarios[0].backend: 134217728 query heads of dimension 268435456");
  // A pool that alone fits, with query heads that make its slots too large.
  ExpectRejected(
      [](Workload& w) {
        BackendConfig* b = w.mutable_scenarios(0)->mutable_backend();
        b->set_num_q_heads(b->num_kv_heads() * 16384);
      },
      "scenarios[0].kv_pool_tokens: at page size 1 the pool's");
  ExpectRejected(
      [](Workload& w) {
        BackendConfig* b = w.mutable_scenarios(0)->mutable_backend();
        b->set_max_batch_size(1 << 20);
        b->set_max_context_len(1 << 20);
      },
      "scenarios[0].backend: at page size 1");
  ExpectRejected(
      [](Workload& w) {
        Scenario* s = w.mutable_scenarios(0);
        s->mutable_backend()->set_max_context_len(4096);
        s->mutable_requests(3)->set_prompt_len(1600);
      },
      "scenarios[0].requests[3]: needs up to");
  // A request that arrives when the run has stopped could never finish.
  ExpectRejected(
      [](Workload& w) {
        Scenario* s = w.mutable_scenarios(0);
        s->mutable_requests(3)->set_arrival_step(s->max_steps());
      },
      "scenarios[0].requests[3].arrival_step");
}

// req_to_token's rows count against the simulator's memory with the graph buffers and the
// pool: 3 rows of 600M slots (7.2 GB) passed before and then failed to allocate.
TEST(WorkloadTest, ReqToTokenRowsCountAgainstTheMemoryLimit) {
  absl::StatusOr<Workload> w = ParseWorkload(DefaultWorkloadText());
  ASSERT_TRUE(w.ok());
  w->clear_page_sizes();
  w->add_page_sizes(64);
  Scenario* s = w->mutable_scenarios(0);
  ASSERT_EQ(s->backend().speculative().draft_tokens(), 0);
  s->mutable_backend()->set_max_batch_size(1);
  s->mutable_backend()->clear_capture_batch_sizes();
  s->mutable_backend()->add_capture_batch_sizes(1);
  s->set_max_running_requests(3);
  // The most a row can hold, and one short of what three rows may take with the rest.
  const int64_t width = (kMaxSimulatedBytes / 4) / 3;
  s->mutable_backend()->set_max_context_len(static_cast<int32_t>(width));
  const absl::Status st = ValidateWorkload(*w);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_TRUE(absl::StrContains(st.message(), "req_to_token rows of")) << st;
  EXPECT_EQ(ReqToTokenWidth(*s, *PageSize::Create(64)).value(), width);
  // One row fits with its graph buffers and pool.
  s->set_max_running_requests(1);
  EXPECT_TRUE(ValidateWorkload(*w).ok()) << ValidateWorkload(*w);
}

// A row holds the longest context with its verify tree, and with EAGLE every draft run of any
// committed length up to max_context_len (DraftRowTokens of each length: the width is their
// maximum, found here by trying every length).
TEST(WorkloadTest, ReqToTokenRowsHoldTheDraftRuns) {
  absl::StatusOr<Workload> w = ParseWorkload(DefaultWorkloadText());
  ASSERT_TRUE(w.ok());
  for (const Scenario& s : w->scenarios()) {
    const SpeculativeConfig& spec = s.backend().speculative();
    const int32_t max_len = s.backend().max_context_len();
    for (int64_t ps : {1, 7, 16, 64}) {
      const PageSize page = *PageSize::Create(ps);
      int64_t want = int64_t{max_len} + spec.draft_tokens();
      if (spec.draft_tokens() > 0) {
        for (int32_t len = 0; len <= max_len; ++len) {
          want = std::max(want, DraftRowTokens(TokenLength(len),
                                               DraftDecodeShape{spec.topk(), spec.steps()}, page)
                                    .value());
        }
      }
      EXPECT_EQ(ReqToTokenWidth(s, page).value(), want) << s.name() << " at page size " << ps;
    }
  }
}

TEST(WorkloadTest, SyntaxErrorsNameTheLine) {
  const absl::StatusOr<Workload> w = ParseWorkload("name: \"x\"\npage_sizes: [1, 16\nseed: 3\n");
  EXPECT_EQ(w.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(w.status().message(), "line 3:")) << w.status();
  const absl::StatusOr<Workload> unknown = ParseWorkload("name: \"x\"\nseeds: 3\n");
  EXPECT_TRUE(absl::StrContains(unknown.status().message(), "line 2:")) << unknown.status();
  EXPECT_TRUE(absl::StrContains(unknown.status().message(), "seeds")) << unknown.status();
}

TEST(WorkloadTest, ScenarioConfigTakesThePageSize) {
  absl::StatusOr<Workload> w = ParseWorkload(DefaultWorkloadText());
  ASSERT_TRUE(w.ok());
  EXPECT_EQ(ScenarioConfig(w->scenarios(0), *PageSize::Create(7)).page_size(), 7);
}

}  // namespace
}  // namespace attnmeta
