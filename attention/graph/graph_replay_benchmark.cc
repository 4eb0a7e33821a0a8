// Host cost of one decode replay into the graph buffers: bs 256 (and 64), ctx 4096, page
// size 16 (and 1, 64), pages shuffled, page table on.
//   BM_ReplayBookkeeping: everything but the per-token arrays (checks, input staging,
//     indptrs, last-page lengths): what the host does per step when a kernel builds
//     kv_indices and the page table on the GPU. Target: <= 5 us at bs 256.
//   BM_ReplayFull: the whole host replay, kv_indices and page table included; ns per token
//     and x_memcpy (its time over a memcpy of the kv_indices and page-table bytes, same run).
// Both report heap_allocs (operator new calls per replay; must be 0).
//   ./bazelw run -c opt //attention/graph:graph_replay_benchmark


#include "attention/graph/testing/graph_harness.h"
#include "attention/metadata/testing/batch_fixture.h"
#include "benchmark/benchmark.h"
#include "tools/bench/heap_counter.h"
#include "tools/bench/memcpy_reference.h"


namespace attnmeta {
namespace {

constexpr int64_t kCtx = 4096;

// Writes the per-batch arrays only: the per-token ones are a kernel's work on a GPU.
class BatchArraysOnly : public MetadataWriter {
 public:
  MemorySpace space() const override { return MemorySpace::kHost; }
  absl::Status WriteBatchArrays(const MetadataWriteRequest& r, const GraphBuffers& b) override {
    return host_.WriteBatchArrays(r, b);
  }
  absl::Status WriteTokenArrays(const MetadataWriteRequest&, const GraphBuffers&,
                                SplitKvPlanCounts*) override {
    return absl::OkStatus();
  }

 private:
  HostMetadataWriter host_;
};

struct Setup {
  Setup(int bs, int64_t ps)
      : fixture(ps, 7, /*num_pages=*/bs * (kCtx / ps + 1) + 8, /*max_reqs=*/bs, kCtx),
        config(testing::MakeTestConfig(ps, {.max_batch_size = bs, .max_context_len = kCtx,
                                            .split_kv = false})) {
    for (int i = 0; i < bs; ++i) fixture.AddSequence(kCtx - 1, 1);
  }
  testing::BatchFixture fixture;
  BackendConfig config;
};

void Run(benchmark::State& state, MetadataWriter& writer) {
  const int bs = static_cast<int>(state.range(0));
  Setup s(bs, state.range(1));
  HostDeviceMemory memory;
  auto g = GraphState::Create(s.config, &s.fixture.pool(), s.fixture.page_size(), &memory, &writer);
  if (!g.ok()) {
    state.SkipWithError("create");
    return;
  }
  auto handle = (*g)->Capture(bs, ForwardMode::kDecode);
  if (!handle.ok()) {
    state.SkipWithError("capture");
    return;
  }
  const ReplayBatch batch{s.fixture.rows(), s.fixture.kv_lens()};
  const int64_t heap_before = bench::HeapAllocations();
  for (auto _ : state) {
    absl::StatusOr<ReplayResult> r = (*g)->Replay(*handle, batch);
    if (!r.ok()) {
      state.SkipWithError("replay");
      break;
    }
    benchmark::DoNotOptimize(r->metadata.kv_indices.data());
  }
  state.counters["heap_allocs"] = benchmark::Counter(
      static_cast<double>(bench::HeapAllocations() - heap_before), benchmark::Counter::kAvgIterations);
  state.SetItemsProcessed(state.iterations() * bs * kCtx);
  const int64_t table_bytes = s.config.consumers().page_table()
                                  ? (*g)->plan().Find("page_table")->bytes
                                  : 0;
  bench::ReportRatioToMemcpy(state, bs * kCtx * sizeof(TokenSlot) + table_bytes);
}

void BM_ReplayBookkeeping(benchmark::State& state) {
  BatchArraysOnly writer;
  Run(state, writer);
}
BENCHMARK(BM_ReplayBookkeeping)->ArgsProduct({{64, 256}, {1, 16, 64}});

void BM_ReplayFull(benchmark::State& state) {
  HostMetadataWriter writer;
  Run(state, writer);
}
BENCHMARK(BM_ReplayFull)->ArgsProduct({{64, 256}, {1, 16, 64}});

}  // namespace
}  // namespace attnmeta
