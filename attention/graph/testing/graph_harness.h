// GraphHarness: a GraphState on host memory (canaries, allocation counts) with the host
// metadata writer, over a BatchFixture's req_to_token table, for tests and benchmarks.

#ifndef ATTNMETA_ATTENTION_GRAPH_TESTING_GRAPH_HARNESS_H_
#define ATTNMETA_ATTENTION_GRAPH_TESTING_GRAPH_HARNESS_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "attention/graph/backend_config.h"
#include "attention/graph/graph_state.h"
#include "attention/graph/host_device_memory.h"
#include "attention/graph/host_metadata_writer.h"
#include "attention/metadata/testing/batch_fixture.h"

namespace attnmeta {
namespace testing {

struct TestConfigOptions {
  int32_t max_batch_size = 8;
  int64_t max_context_len = 512;
  bool page_table = true;
  bool split_kv = true;
  int32_t draft_tokens = 0;
  int32_t max_query_rows_per_request = 4;
  int32_t num_kv_heads = 2;
};

// A valid config for `page_size` (4 query heads, head_dim 8, bf16; split-KV over 7 units,
// 32-token granularity, 4-row tiles, paged layout).
BackendConfig MakeTestConfig(int64_t page_size, const TestConfigOptions& options = {});

class GraphHarness {
 public:
  // CHECK-fails when the state cannot be created (a test setup error).
  GraphHarness(const BackendConfig& config, const BatchFixture& fixture);
  ~GraphHarness();

  GraphState& state() { return *state_; }
  HostDeviceMemory& memory() { return memory_; }
  // Every buffer's bytes, in plan order (to compare before and after a refused call).
  std::vector<std::vector<uint8_t>> Contents() const;

 private:
  HostDeviceMemory memory_;
  HostMetadataWriter writer_;
  std::unique_ptr<GraphState> state_;
};

}  // namespace testing
}  // namespace attnmeta

#endif  // ATTNMETA_ATTENTION_GRAPH_TESTING_GRAPH_HARNESS_H_
