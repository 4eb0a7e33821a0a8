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

// A realistic config in text format: max_bs 256, ctx 32768, page size 16, 32/8 heads of 128,
// bf16, page table and a paged split-KV consumer (132 units), 4 draft tokens, top-k 1 over
// 3 steps, six capture sizes.
inline constexpr char kRealisticConfigText[] = R"pb(
  max_batch_size: 256
  max_context_len: 32768
  page_size: 16
  num_q_heads: 32
  num_kv_heads: 8
  head_dim: 128
  kv_dtype: KV_DTYPE_BF16
  consumers {
    page_table: true
    split_kv { enabled: true num_units: 132 kv_granularity: 128 q_tile: 64 layout: SPLIT_KV_LAYOUT_PAGED }
  }
  speculative { draft_tokens: 4 topk: 1 steps: 3 }
  capture_batch_sizes: [ 1, 2, 4, 8, 16, 256 ]
)pb";

struct TestConfigOptions {
  int32_t max_batch_size = 8;
  int64_t max_context_len = 512;
  bool page_table = true;
  bool split_kv = true;
  SplitKvLayout split_layout = SPLIT_KV_LAYOUT_PAGED;
  int32_t draft_tokens = 0;
  int32_t topk = 0;
  int32_t steps = 0;
  int32_t max_query_rows_per_request = 4;
  int32_t num_kv_heads = 2;
};

// A valid config for `page_size` (4 query heads, head_dim 8, bf16; split-KV over 7 units,
// 32-token granularity, 4-row tiles, the paged layout unless options say otherwise).
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
