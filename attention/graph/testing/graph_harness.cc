#include "attention/graph/testing/graph_harness.h"

#include <cstring>

#include "glog/logging.h"

namespace attnmeta {
namespace testing {

BackendConfig MakeTestConfig(int64_t page_size, const TestConfigOptions& o) {
  BackendConfig c;
  c.set_max_batch_size(o.max_batch_size);
  c.set_max_context_len(o.max_context_len);
  c.set_page_size(page_size);
  c.set_num_q_heads(4);
  c.set_num_kv_heads(o.num_kv_heads);
  c.set_head_dim(8);
  c.set_kv_dtype(KV_DTYPE_BF16);
  c.mutable_consumers()->set_page_table(o.page_table);
  SplitKvConsumer* split = c.mutable_consumers()->mutable_split_kv();
  split->set_enabled(o.split_kv);
  split->set_num_units(7);
  split->set_kv_granularity(32);
  split->set_q_tile(4);
  split->set_layout(o.split_layout);
  c.mutable_speculative()->set_draft_tokens(o.draft_tokens);
  c.mutable_speculative()->set_topk(o.topk);
  c.mutable_speculative()->set_steps(o.steps);
  c.set_max_query_rows_per_request(o.max_query_rows_per_request);
  const absl::Status valid = ValidateBackendConfig(c);
  CHECK(valid.ok()) << valid;
  return c;
}

GraphHarness::GraphHarness(const BackendConfig& config, const BatchFixture& fixture) {
  auto state = GraphState::Create(config, &fixture.pool(), fixture.page_size(), &memory_, &writer_);
  CHECK(state.ok()) << state.status();
  state_ = *std::move(state);
}

GraphHarness::~GraphHarness() { state_.reset(); }

std::vector<std::vector<uint8_t>> GraphHarness::Contents() const {
  std::vector<std::vector<uint8_t>> out;
  for (const BufferSpec& spec : state_->plan().buffers) {
    const DeviceBuffer b = state_->buffer(spec.name);
    out.emplace_back(static_cast<const uint8_t*>(b.ptr), static_cast<const uint8_t*>(b.ptr) + b.bytes);
  }
  return out;
}

}  // namespace testing
}  // namespace attnmeta
