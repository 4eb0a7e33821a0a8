// GraphState on the GPU: HipDeviceMemory and DeviceMetadataWriter with the metadata kernels
// (the split-KV plan's included) captured in a HIP/CUDA graph per bucket. For page sizes 1, 7,
// 16 and 64, with the staged inputs copied by a copy call or applied inside the writer's
// launch (StagedUploads), random real batches replayed through captured decode, extend and
// target-verify buckets give exactly the buffers the host writer gives (real rows and padded
// rows, the split-KV plan and its counts), the real rows validate, and a regrow invalidates the
// captured graph as on the host; draft-decode replays write every step as the host does.
// Replays queued while the GPU is still busy with earlier ones each write their own batch.
// Needs a GPU: fails when none is visible.

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "attention/graph/buffer_plan.h"
#include "attention/graph/device_memory.h"
#include "attention/graph/graph_state.h"
#include "attention/graph/testing/graph_harness.h"
#include "attention/kernels/device_metadata_writer.h"
#include "attention/kernels/hip_device_memory.h"
#include "attention/kernels/hip_port.h"
#include "attention/kernels/metadata_kernels.h"
#include "attention/kernels/metadata_launchers.h"
#include "attention/kernels/staged_uploads.h"
#include "attention/kernels/testing/device_buffer.h"
#include "attention/kernels/testing/spin.h"
#include "attention/metadata/draft_decode_layout.h"
#include "attention/metadata/split_kv_planner.h"
#include "attention/metadata/testing/batch_fixture.h"
#include "attention/metadata/validator.h"
#include "gtest/gtest.h"

namespace attnmeta {
namespace {

using testing::BatchFixture;
using testing::DeviceBuffer;
using testing::GraphHarness;
using testing::MakeTestConfig;

constexpr int32_t kDraft = 4;
constexpr int kExtendRows = 3;

// The bytes of buffer `name` of a state, read back from wherever it lives.
std::vector<uint8_t> Bytes(GraphState& g, DeviceMemory& memory, absl::string_view name,
                           int64_t count_bytes) {
  std::vector<uint8_t> out(count_bytes);
  const attnmeta::DeviceBuffer b = g.buffer(name);
  EXPECT_TRUE(memory.CopyToHost(out.data(), b, 0, count_bytes).ok()) << name;
  return out;
}

// Every buffer of `g` set to 0xCD, as HostDeviceMemory's new buffers are: a value the next
// replay does not write then reads back as 0xCDCDCDCD, not as what an earlier replay left.
void Poison(GraphState& g, DeviceMemory& memory) {
  for (const BufferSpec& spec : g.plan().buffers) {
    ASSERT_TRUE(memory.Fill(g.buffer(spec.name), 0, spec.bytes, 0xCD).ok()) << spec.name;
  }
}

template <typename T>
std::vector<T> As(const std::vector<uint8_t>& bytes) {
  std::vector<T> out(bytes.size() / sizeof(T));
  std::memcpy(out.data(), bytes.data(), out.size() * sizeof(T));
  return out;
}

// (page size, staged uploads)
class DeviceGraphTest : public ::testing::TestWithParam<std::tuple<int64_t, bool>> {
 protected:
  // A decode write of f's first bs rows (one query row each) with the page table, for a
  // writer called directly over the buffers of `generation`; the split-KV options a test sets
  // when it asks for the plan.
  static MetadataWriteRequest DirectDecodeRequest(const BatchFixture& f, int64_t bs,
                                                  uint64_t generation) {
    MetadataWriteRequest r;
    r.mode = ForwardMode::kDecode;
    r.real_batch_size = bs;
    r.padded_batch_size = bs;
    r.padded_kv_len = GraphState::kPaddedKvLen;
    r.page_size = f.page_size();
    r.req_to_token = &f.pool();
    r.page_table = true;
    r.q_len_per_request = TokenLength(1);
    r.generation = generation;
    return r;
  }
  static SplitKvOptions DirectSplitKvOptions(const BatchFixture& f) {
    SplitKvOptions o;
    o.layout = KvLayout::Paged(f.page_size());
    o.num_units = 7;
    o.kv_granularity = TokenCount(32);
    o.q_tile = TokenCount(4);
    return o;
  }
  void SetUp() override {
    ASSERT_TRUE(testing::RequireGpu().ok()) << testing::RequireGpu();
    ASSERT_EQ(hipStreamCreate(&stream_), hipSuccess);
  }
  void TearDown() override {
    device_.reset();  // it uses the stream
    if (stream_ != nullptr) (void)hipStreamDestroy(stream_);
  }

  // GraphState on the GPU over f's table; members in the order they must be destroyed last.
  struct Device {
    std::unique_ptr<DeviceBuffer<TokenSlot>> table;  // the device copy of f's req_to_token
    std::unique_ptr<StagedUploads> uploads;          // when staged
    std::unique_ptr<HipDeviceMemory> memory;
    std::unique_ptr<DeviceMetadataWriter> writer;
    std::unique_ptr<GraphState> state;
  };
  void MakeDevice(const BatchFixture& f, const BackendConfig& config, bool staged,
                  DeviceMetadataWriter::Options options = {}) {
    device_ = std::make_unique<Device>();
    std::vector<TokenSlot> table(f.pool().table().begin(), f.pool().table().end());
    auto d_table = DeviceBuffer<TokenSlot>::FromHost(table);
    ASSERT_TRUE(d_table.ok()) << d_table.status();
    device_->table = std::make_unique<DeviceBuffer<TokenSlot>>(*std::move(d_table));
    if (staged) {
      auto u = StagedUploads::Create(stream_);
      ASSERT_TRUE(u.ok()) << u.status();
      device_->uploads = *std::move(u);
    }
    device_->memory = std::make_unique<HipDeviceMemory>(stream_, device_->uploads.get());
    options.uploads = device_->uploads.get();
    auto writer = DeviceMetadataWriter::Create(
        DeviceReqToToken{device_->table->const_span(), f.pool().max_context_len()}, f.pool_slots(),
        stream_, options);
    ASSERT_TRUE(writer.ok()) << writer.status();
    device_->writer = *std::move(writer);
    auto state = GraphState::Create(config, &f.pool(), f.page_size(), device_->memory.get(),
                                    device_->writer.get());
    ASSERT_TRUE(state.ok()) << state.status();
    device_->state = *std::move(state);
  }

  hipStream_t stream_ = nullptr;
  std::unique_ptr<Device> device_;
};

TEST_P(DeviceGraphTest, ReplaysEqualTheHostWriterAndARegrowRecaptures) {
  const auto [ps, staged] = GetParam();
  const uint64_t seed = 900 + ps + (staged ? 100 : 0);
  std::mt19937_64 rng(seed);
  BatchFixture f(ps, seed, /*num_pages=*/20000 / ps + 64, /*max_reqs=*/40, /*max_context=*/520);
  // 12 decode sequences (one new token), 12 extend (kExtendRows), 12 verify (kDraft drafts).
  std::vector<TokenLength> verify_prefix;
  for (int i = 0; i < 36; ++i) {
    const int64_t cached = std::uniform_int_distribution<int64_t>(0, 500)(rng);
    f.AddSequence(cached, i < 12 ? 1 : (i < 24 ? kExtendRows : kDraft));
  }
  const BackendConfig config = MakeTestConfig(
      ps, {.max_batch_size = 8, .max_context_len = 512, .split_kv = true, .draft_tokens = kDraft});
  GraphHarness host(config, f);
  MakeDevice(f, config, staged);
  ASSERT_FALSE(HasFatalFailure());
  GraphState& d = *device_->state;
  HipDeviceMemory& memory = *device_->memory;
  DeviceMetadataWriter* writer = device_->writer.get();

  struct Bucket {
    ForwardMode mode;
    int first;  // the sequences this mode draws from: [first, first + 12)
  };
  for (int round = 0; round < 2; ++round) {
    if (round == 1) {
      // A regrow moves every buffer: the old captures are refused and new ones are made.
      ASSERT_TRUE(d.Reserve(16).ok());
      ASSERT_TRUE(host.state().Reserve(16).ok());
    }
    for (const Bucket& b : {Bucket{ForwardMode::kDecode, 0}, Bucket{ForwardMode::kExtend, 12},
                            Bucket{ForwardMode::kTargetVerify, 24}}) {
      const int64_t bucket = round == 0 ? 8 : 16;
      std::optional<TokenLength> q;
      if (b.mode == ForwardMode::kExtend) q = TokenLength(kExtendRows);
      const int64_t before = writer->graphs_captured();
      auto dh = d.Capture(bucket, b.mode, q);
      auto hh = host.state().Capture(bucket, b.mode, q);
      ASSERT_TRUE(dh.ok() && hh.ok()) << dh.status() << hh.status();
      EXPECT_EQ(writer->graphs_captured(), before + 1) << "one graph per bucket and mode";
      for (int iter = 0; iter < 4; ++iter) {
        const int64_t bs = std::uniform_int_distribution<int64_t>(1, std::min<int64_t>(bucket, 12))(rng);
        SCOPED_TRACE(::testing::Message() << "page_size " << ps << " staged " << staged
                                          << " seed " << seed << " round "
                                          << round << " mode " << ForwardModeName(b.mode)
                                          << " iter " << iter << " bs " << bs);
        std::vector<int> pick(12);
        std::iota(pick.begin(), pick.end(), b.first);
        std::shuffle(pick.begin(), pick.end(), rng);
        pick.resize(bs);
        std::vector<ReqPoolIndex> rows;
        std::vector<TokenLength> kv;
        std::vector<uint8_t> tree;
        for (int i : pick) {
          rows.push_back(f.rows()[i]);
          kv.push_back(f.kv_lens()[i]);
          for (int r = 0; r < kDraft && b.mode == ForwardMode::kTargetVerify; ++r) {
            for (int c = 0; c < kDraft; ++c) tree.push_back(c == 0 || c == r || (c < r && rng() % 2));
          }
        }
        const ReplayBatch batch{rows, kv, {}, tree};
        Poison(d, memory);
        Poison(host.state(), host.memory());
        ASSERT_FALSE(HasFatalFailure());
        auto dr = d.Replay(*dh, batch);
        auto hr = host.state().Replay(*hh, batch);
        ASSERT_TRUE(dr.ok()) << dr.status();
        ASSERT_TRUE(hr.ok()) << hr.status();
        EXPECT_EQ(writer->graphs_captured(), before + 1) << "replays launch the captured graph";
        ASSERT_TRUE(writer->CheckViolations().ok()) << writer->CheckViolations();
        // Every buffer the replay wrote, padded rows included, byte for byte.
        const int64_t total = static_cast<int64_t>(hr->padded.kv_indices.size());
        ASSERT_EQ(total, hr->padded.kv_indptr.back().value());
        std::vector<std::pair<std::string, int64_t>> written = {
            {"kv_indptr", (bucket + 1) * 4},
            {"qo_indptr", (bucket + 1) * 4},
            {"kv_last_page_len", bucket * 4},
            {"kv_indices", total * 4},
            {"page_table", bucket * host.state().plan().page_table_cols.value() * 4}};
        // The split-KV plan, written on the device, and its counts, computed on the host.
        EXPECT_EQ(dr->split_kv.chunk, hr->split_kv.chunk);
        EXPECT_EQ(dr->split_kv.work_items, hr->split_kv.work_items);
        EXPECT_EQ(dr->split_kv.reduce_items, hr->split_kv.reduce_items);
        EXPECT_EQ(dr->split_kv.num_partials, hr->split_kv.num_partials);
        EXPECT_GT(hr->split_kv.work_items, 0);
        written.push_back({"split_kv_work", hr->split_kv.work_items * int64_t{sizeof(SplitKvWorkItem)}});
        written.push_back({"split_kv_unit_indptr",
                           (config.consumers().split_kv().num_units() + 1) * int64_t{4}});
        written.push_back(
            {"split_kv_reduce", hr->split_kv.reduce_items * int64_t{sizeof(SplitKvReduceItem)}});
        if (b.mode == ForwardMode::kTargetVerify) {
          written.push_back({"mask_indptr", (bucket + 1) * 8});
          written.push_back({"custom_mask", hr->padded.custom_mask.mask_indptr.back()});
        }
        for (const auto& [name, bytes] : written) {
          EXPECT_EQ(Bytes(d, memory, name, bytes), Bytes(host.state(), host.memory(), name, bytes))
              << name;
        }
        // The real rows, read back from the device, validate.
        const std::vector<TokenOffset> kv_indptr =
            As<TokenOffset>(Bytes(d, memory, "kv_indptr", (bs + 1) * 4));
        const std::vector<TokenOffset> qo_indptr =
            As<TokenOffset>(Bytes(d, memory, "qo_indptr", (bs + 1) * 4));
        const std::vector<TokenLength> last =
            As<TokenLength>(Bytes(d, memory, "kv_last_page_len", bs * 4));
        const std::vector<TokenSlot> indices =
            As<TokenSlot>(Bytes(d, memory, "kv_indices", kv_indptr.back().value() * 4));
        ForwardMetadataView v = hr->metadata;  // host view for shape; arrays from the device
        v.kv_indptr = kv_indptr;
        v.qo_indptr = qo_indptr;
        v.kv_last_page_len = last;
        v.kv_indices = indices;
        ValidationContext ctx{f.pool_slots(), f.page_size(), TokenCount(qo_indptr.back().value())};
        ctx.check_slot_ownership = true;
        EXPECT_TRUE(ValidateForwardMetadata(v, ctx).ok()) << ValidateForwardMetadata(v, ctx);
      }
      if (round == 1) {
        // The round-0 handles were captured before the regrow.
        CaptureHandle stale = *dh;
        stale.generation -= 1;
        EXPECT_EQ(d.Replay(stale, ReplayBatch{}).status().code(),
                  absl::StatusCode::kFailedPrecondition);
      }
    }
  }
}

// The writer's Options::overlap_launches reaches every launch it makes. A write captured from
// the stream (the writer launching directly, without its own graphs) holds one programmatic
// edge per launch after the first where launches overlap (the first follows the violation
// word's memset, which nothing overlaps), and none with the option off: a decode write with the
// split-KV plan (the fused launch, then the plan) and a draft-decode write of 3 steps (two
// launches each).
class WriterOverlapTest : public DeviceGraphTest {};

TEST_F(WriterOverlapTest, OverlapLaunchesReachesEveryLaunch) {
  constexpr int64_t kPs = 16;
  const DraftDecodeShape shape{2, 3};
  const int64_t row = MaxDraftRowTokens(TokenLength(512), shape, *PageSize::Create(kPs)).value();
  BatchFixture f(kPs, 71, /*num_pages=*/4000 / kPs + 64, /*max_reqs=*/12, /*max_context=*/row);
  for (int i = 0; i < 8; ++i) f.AddSequence(100 + 30 * i, 1);
  const absl::StatusOr<bool> can = DeviceOverlapsLaunches();
  ASSERT_TRUE(can.ok()) << can.status();
  for (bool overlap : {true, false}) {
    for (bool draft : {false, true}) {
      SCOPED_TRACE(::testing::Message() << (overlap ? "overlapping" : "plain")
                                        << (draft ? ", draft decode" : ", decode with split-KV"));
      const BackendConfig config =
          draft ? MakeTestConfig(kPs, {.max_batch_size = 8, .max_context_len = 512,
                                       .split_kv = false, .topk = shape.topk, .steps = shape.steps})
                : MakeTestConfig(kPs, {.max_batch_size = 8, .max_context_len = 512});
      DeviceMetadataWriter::Options options;
      options.use_graphs = false;
      options.overlap_launches = overlap;
      MakeDevice(f, config, /*staged=*/false, options);
      ASSERT_FALSE(HasFatalFailure());
      GraphState& d = *device_->state;
      const ForwardMode mode = draft ? ForwardMode::kDraftDecode : ForwardMode::kDecode;
      auto h = d.Capture(8, mode);
      ASSERT_TRUE(h.ok()) << h.status();
      ASSERT_TRUE(d.Replay(*h, ReplayBatch{f.rows(), f.kv_lens()}).ok());
      ASSERT_EQ(hipStreamSynchronize(stream_), hipSuccess);
      // The same write again, its launches captured from the stream.
      const std::vector<TokenLength> host_kv(f.kv_lens().begin(), f.kv_lens().end());
      const std::vector<TokenLength> host_q(8, TokenLength(1));
      MetadataWriteRequest r = DirectDecodeRequest(f, 8, d.generation());
      r.mode = mode;
      r.page_table = !draft;
      r.split_kv = !draft;
      r.split_kv_options = DirectSplitKvOptions(f);
      if (draft) r.draft_decode = shape;
      r.host_kv_lens = host_kv;
      r.host_q_lens = host_q;
      ASSERT_EQ(hipStreamBeginCapture(stream_, hipStreamCaptureModeThreadLocal), hipSuccess);
      const absl::Status written = device_->writer->WriteBatchArrays(r, d.buffers());
      hipGraph_t graph = nullptr;
      ASSERT_EQ(hipStreamEndCapture(stream_, &graph), hipSuccess);
      EXPECT_TRUE(written.ok()) << written;
      int64_t programmatic = -1;
      EXPECT_EQ(CountProgrammaticGraphEdges(graph, &programmatic), hipSuccess);
      const int64_t launches = draft ? 2 * shape.steps : 2;
      EXPECT_EQ(programmatic, overlap && *can ? launches - 1 : 0);
      EXPECT_EQ(hipGraphDestroy(graph), hipSuccess);
      device_.reset();
    }
  }
}

// A direct writer refuses split-KV host lengths the planner refuses (a row with more query
// rows than KV tokens) before it queues anything, and then reports no counts until a write
// succeeds; the counts of a write that succeeds are the planner's for its lengths.
class DirectWriterTest : public DeviceGraphTest {};

// The device writer covers the launchers' rows (kMaxMetadataRows) a write: a regrow past them
// is refused by GraphState before it allocates, with the writer's bound named, and a config
// past them by GraphState::Create.
TEST_F(DirectWriterTest, CapacitiesBeyondTheLaunchersRowsAreRefusedUpFront) {
  constexpr int64_t kPs = 16;
  BatchFixture f(kPs, 29, /*num_pages=*/64, /*max_reqs=*/4, /*max_context=*/64);
  MakeDevice(f, MakeTestConfig(kPs, {.max_batch_size = 4, .max_context_len = 64}),
             /*staged=*/false);
  ASSERT_FALSE(HasFatalFailure());
  EXPECT_EQ(device_->writer->max_write_rows(), kernels::kMaxMetadataRows);
  GraphState& d = *device_->state;
  const uint64_t generation = d.generation();
  absl::Status s = d.Reserve(kernels::kMaxMetadataRows + 1);
  EXPECT_EQ(s.code(), absl::StatusCode::kOutOfRange) << s;
  EXPECT_NE(s.message().find("beyond the metadata writer's 8388608 rows per write"),
            absl::string_view::npos)
      << s;
  EXPECT_EQ(d.batch_capacity(), 4);
  EXPECT_EQ(d.generation(), generation);
  HipDeviceMemory memory(stream_, nullptr);
  s = GraphState::Create(
          MakeTestConfig(kPs,
                         {.max_batch_size = static_cast<int32_t>(kernels::kMaxMetadataRows + 1),
                          .max_context_len = 64}),
          &f.pool(), f.page_size(), &memory, device_->writer.get())
          .status();
  EXPECT_EQ(s.code(), absl::StatusCode::kOutOfRange) << s;
  EXPECT_NE(s.message().find("rows per write"), absl::string_view::npos) << s;
  auto h = d.Capture(4, ForwardMode::kDecode);
  ASSERT_TRUE(h.ok()) << h.status();
}

TEST_F(DirectWriterTest, SplitKvLengthsThePlannerRefusesQueueNothing) {
  constexpr int64_t kPs = 16;
  BatchFixture f(kPs, 73, /*num_pages=*/4000 / kPs + 64, /*max_reqs=*/12, /*max_context=*/512);
  for (int i = 0; i < 8; ++i) f.AddSequence(100 + 30 * i, 1);
  const BackendConfig config = MakeTestConfig(kPs, {.max_batch_size = 8, .max_context_len = 512});
  DeviceMetadataWriter::Options options;
  options.use_graphs = false;
  MakeDevice(f, config, /*staged=*/false, options);
  ASSERT_FALSE(HasFatalFailure());
  GraphState& d = *device_->state;
  auto h = d.Capture(8, ForwardMode::kDecode);
  ASSERT_TRUE(h.ok()) << h.status();
  ASSERT_TRUE(d.Replay(*h, ReplayBatch{f.rows(), f.kv_lens()}).ok());
  ASSERT_EQ(hipStreamSynchronize(stream_), hipSuccess);
  const std::vector<TokenLength> host_kv(f.kv_lens().begin(), f.kv_lens().end());
  const std::vector<TokenLength> host_q(8, TokenLength(1));
  MetadataWriteRequest r = DirectDecodeRequest(f, 8, d.generation());
  r.split_kv = true;
  r.split_kv_options = DirectSplitKvOptions(f);
  r.host_kv_lens = host_kv;
  r.host_q_lens = host_q;
  SplitKvPlanCounts counts;
  {
    const DeviceReqToToken table{device_->table->const_span(), f.pool().max_context_len()};
    auto fresh = DeviceMetadataWriter::Create(table, f.pool_slots(), stream_, options);
    ASSERT_TRUE(fresh.ok()) << fresh.status();
    EXPECT_EQ((*fresh)->WriteTokenArrays(r, d.buffers(), &counts).code(),
              absl::StatusCode::kFailedPrecondition)
        << "counts reported by a writer that has written nothing";
  }
  // GraphState's writer wrote the replay above; it is written directly from here on.
  DeviceMetadataWriter& writer = *device_->writer;

  std::vector<TokenLength> longer_q = host_q;
  longer_q[0] = TokenLength(host_kv[0].value() + 1);
  MetadataWriteRequest refused_request = r;
  refused_request.host_q_lens = longer_q;
  ASSERT_EQ(hipStreamBeginCapture(stream_, hipStreamCaptureModeThreadLocal), hipSuccess);
  const absl::Status refused = writer.WriteBatchArrays(refused_request, d.buffers());
  hipGraph_t none = nullptr;
  ASSERT_EQ(hipStreamEndCapture(stream_, &none), hipSuccess);
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument) << refused;
  size_t queued = 1;
  EXPECT_EQ(hipGraphGetNodes(none, nullptr, &queued), hipSuccess);
  EXPECT_EQ(queued, 0u) << "a refused write queued work";
  EXPECT_EQ(hipGraphDestroy(none), hipSuccess);

  ASSERT_TRUE(writer.WriteBatchArrays(r, d.buffers()).ok());
  ASSERT_EQ(writer.WriteBatchArrays(refused_request, d.buffers()).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(writer.WriteTokenArrays(r, d.buffers(), &counts).code(),
            absl::StatusCode::kFailedPrecondition)
      << "counts of an earlier write reported after a refused one";
  ASSERT_TRUE(writer.WriteBatchArrays(r, d.buffers()).ok());
  ASSERT_TRUE(writer.WriteTokenArrays(r, d.buffers(), &counts).ok());
  const absl::StatusOr<SplitKvPlanCounts> want =
      CountSplitKvPlan(host_q, host_kv, r.split_kv_options);
  ASSERT_TRUE(want.ok()) << want.status();
  EXPECT_GT(want->work_items, 0);
  EXPECT_EQ(counts.work_items, want->work_items);
  EXPECT_EQ(counts.reduce_items, want->reduce_items);
  EXPECT_EQ(counts.num_partials, want->num_partials);
  EXPECT_EQ(counts.chunk, want->chunk);
  ASSERT_EQ(hipStreamSynchronize(stream_), hipSuccess);
  EXPECT_TRUE(writer.CheckViolations().ok());
}

// GraphState captures one extend bucket at several query lengths; they share the writer's
// graph (its key is generation, bucket and mode; without a mask the query length is not part
// of what the graph fixes), and each replays as the host writer writes it.
TEST_F(DirectWriterTest, ExtendCapturesAtSeveralQueryLengthsShareOneGraph) {
  constexpr int64_t kPs = 16;
  BatchFixture f(kPs, 81, /*num_pages=*/6000 / kPs + 64, /*max_reqs=*/12, /*max_context=*/520);
  for (int i = 0; i < 8; ++i) f.AddSequence(60 + 40 * i, kExtendRows);
  const BackendConfig config = MakeTestConfig(
      kPs, {.max_batch_size = 8, .max_context_len = 512, .split_kv = true, .draft_tokens = kDraft});
  GraphHarness host(config, f);
  MakeDevice(f, config, /*staged=*/false);
  ASSERT_FALSE(HasFatalFailure());
  GraphState& d = *device_->state;
  // A different batch for each query length (bs 8, 5 and 7, rows rotated), every buffer
  // poisoned before each replay.
  int rotate = 0;
  for (int32_t q : {1, kExtendRows, 2}) {
    SCOPED_TRACE(::testing::Message() << "q_len_per_request " << q);
    auto dh = d.Capture(8, ForwardMode::kExtend, TokenLength(q));
    auto hh = host.state().Capture(8, ForwardMode::kExtend, TokenLength(q));
    ASSERT_TRUE(dh.ok()) << dh.status();
    ASSERT_TRUE(hh.ok()) << hh.status();
    EXPECT_EQ(device_->writer->graphs_captured(), 1);
    const int64_t bs = q == 1 ? 8 : (q == kExtendRows ? 5 : 7);
    std::vector<ReqPoolIndex> rows;
    std::vector<TokenLength> kv;
    for (int64_t i = 0; i < bs; ++i) {
      rows.push_back(f.rows()[(i + rotate) % 8]);
      kv.push_back(f.kv_lens()[(i + rotate) % 8]);
    }
    rotate += 3;
    const std::vector<TokenLength> q_lens(bs, TokenLength(q));
    const ReplayBatch batch{rows, kv, q_lens};
    Poison(d, *device_->memory);
    Poison(host.state(), host.memory());
    ASSERT_FALSE(HasFatalFailure());
    auto dr = d.Replay(*dh, batch);
    auto hr = host.state().Replay(*hh, batch);
    ASSERT_TRUE(dr.ok()) << dr.status();
    ASSERT_TRUE(hr.ok()) << hr.status();
    ASSERT_TRUE(device_->writer->CheckViolations().ok()) << device_->writer->CheckViolations();
    EXPECT_EQ(dr->split_kv.work_items, hr->split_kv.work_items);
    EXPECT_EQ(dr->split_kv.reduce_items, hr->split_kv.reduce_items);
    EXPECT_EQ(dr->split_kv.num_partials, hr->split_kv.num_partials);
    const int64_t total = hr->padded.kv_indptr.back().value();
    for (const auto& [name, bytes] : std::vector<std::pair<std::string, int64_t>>{
             {"kv_indptr", 9 * 4},
             {"qo_indptr", 9 * 4},
             {"kv_last_page_len", 8 * 4},
             {"kv_indices", total * 4},
             {"page_table", 8 * host.state().plan().page_table_cols.value() * 4},
             {"split_kv_work", hr->split_kv.work_items * int64_t{sizeof(SplitKvWorkItem)}},
             {"split_kv_unit_indptr", (config.consumers().split_kv().num_units() + 1) * int64_t{4}},
             {"split_kv_reduce", hr->split_kv.reduce_items * int64_t{sizeof(SplitKvReduceItem)}}}) {
      EXPECT_EQ(Bytes(d, *device_->memory, name, bytes),
                Bytes(host.state(), host.memory(), name, bytes))
          << name;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(PageSizes, DeviceGraphTest,
                         ::testing::Combine(::testing::Values(1, 7, 16, 64), ::testing::Bool()));

// The host queues replay after replay while the GPU is still busy with earlier steps (a spin
// kernel per step), as an engine running ahead does: with the inputs staged in StagedUploads,
// each replay must still see its own batch. Each step's outputs are copied aside on the stream
// and compared with the host writer's after the last step.
TEST_P(DeviceGraphTest, ReplaysQueuedAheadOfTheGpuEachWriteTheirOwnBatch) {
  const auto [ps, staged] = GetParam();
  const uint64_t seed = 1700 + ps;
  std::mt19937_64 rng(seed);
  BatchFixture f(ps, seed, /*num_pages=*/12000 / ps + 64, /*max_reqs=*/24, /*max_context=*/400);
  for (int i = 0; i < 20; ++i) f.AddSequence(std::uniform_int_distribution<int64_t>(0, 380)(rng), 1);
  const BackendConfig config =
      MakeTestConfig(ps, {.max_batch_size = 8, .max_context_len = 400, .split_kv = false});
  GraphHarness host(config, f);
  MakeDevice(f, config, staged);
  ASSERT_FALSE(HasFatalFailure());
  GraphState& d = *device_->state;
  DeviceMetadataWriter* writer = device_->writer.get();
  DeviceBuffer<TokenSlot>& d_table = *device_->table;
  constexpr int64_t kBucket = 8;
  auto dh = d.Capture(kBucket, ForwardMode::kDecode);
  auto hh = host.state().Capture(kBucket, ForwardMode::kDecode);
  ASSERT_TRUE(dh.ok() && hh.ok()) << dh.status() << hh.status();

  constexpr int kSteps = 12;
  const std::vector<std::string> names = {"kv_indptr", "kv_last_page_len", "kv_indices",
                                          "page_table"};
  std::vector<std::vector<std::vector<uint8_t>>> want(kSteps);
  std::vector<std::unique_ptr<DeviceBuffer<uint8_t>>> aside;  // [step * names + k]
  for (int step = 0; step < kSteps; ++step) {
    const int64_t bs = std::uniform_int_distribution<int64_t>(1, kBucket)(rng);
    std::vector<int> pick(20);
    std::iota(pick.begin(), pick.end(), 0);
    std::shuffle(pick.begin(), pick.end(), rng);
    std::vector<ReqPoolIndex> rows;
    std::vector<TokenLength> kv;
    for (int k = 0; k < bs; ++k) {
      rows.push_back(f.rows()[pick[k]]);
      kv.push_back(f.kv_lens()[pick[k]]);
    }
    const ReplayBatch batch{rows, kv};
    ASSERT_EQ(testing::LaunchSpin(200000, stream_), hipSuccess);
    ASSERT_TRUE(d.Replay(*dh, batch).ok()) << "step " << step;
    auto hr = host.state().Replay(*hh, batch);
    ASSERT_TRUE(hr.ok()) << hr.status();
    const int64_t total = hr->metadata.kv_indptr.back().value() + (kBucket - bs);
    const int64_t bytes[] = {(kBucket + 1) * 4, kBucket * 4, total * 4,
                             kBucket * host.state().plan().page_table_cols.value() * 4};
    for (size_t k = 0; k < names.size(); ++k) {
      want[step].push_back(Bytes(host.state(), host.memory(), names[k], bytes[k]));
      auto copy = DeviceBuffer<uint8_t>::Create(bytes[k]);
      ASSERT_TRUE(copy.ok());
      aside.push_back(std::make_unique<DeviceBuffer<uint8_t>>(*std::move(copy)));
      ASSERT_EQ(hipMemcpyAsync(aside.back()->data(), d.buffer(names[k]).ptr, bytes[k],
                               hipMemcpyDeviceToDevice, stream_),
                hipSuccess);
    }
  }
  ASSERT_TRUE(writer->CheckViolations().ok()) << writer->CheckViolations();
  for (int step = 0; step < kSteps; ++step) {
    for (size_t k = 0; k < names.size(); ++k) {
      auto got = aside[step * names.size() + k]->ToHost();
      ASSERT_TRUE(got.ok());
      EXPECT_EQ(*got, want[step][k]) << "page size " << ps << " staged " << staged << " seed "
                                     << seed << " step " << step << " " << names[k];
    }
  }
  // A slot corrupted in the device table: the replay that reads it reports it, and the next
  // replay, on the repaired table, is clean (every launch clears the violation word).
  const int64_t at = int64_t{f.rows()[0].value()} * f.pool().max_context_len().value();
  TokenSlot good;
  ASSERT_EQ(hipMemcpy(&good, d_table.data() + at, sizeof(TokenSlot), hipMemcpyDeviceToHost),
            hipSuccess);
  const TokenSlot bad(static_cast<int32_t>(f.pool_slots().value() + 5));
  ASSERT_EQ(hipMemcpy(d_table.data() + at, &bad, sizeof(TokenSlot), hipMemcpyHostToDevice),
            hipSuccess);
  const std::vector<ReqPoolIndex> one_row = {f.rows()[0]};
  const std::vector<TokenLength> one_len = {f.kv_lens()[0]};
  const ReplayBatch one{one_row, one_len};
  ASSERT_TRUE(d.Replay(*dh, one).ok());
  const absl::Status corrupted = writer->CheckViolations();
  EXPECT_EQ(corrupted.code(), absl::StatusCode::kOutOfRange) << corrupted;
  ASSERT_EQ(hipMemcpy(d_table.data() + at, &good, sizeof(TokenSlot), hipMemcpyHostToDevice),
            hipSuccess);
  ASSERT_TRUE(d.Replay(*dh, one).ok());
  EXPECT_TRUE(writer->CheckViolations().ok()) << writer->CheckViolations();
}

// A writer that Create returns can write: a table it cannot use is refused there. And a
// direct write that fails (a request past the buffers GraphState sized) changes nothing: the
// violation the previous write recorded is still reported after it.
TEST_P(DeviceGraphTest, BadTablesAndRequestsAreRefusedAndChangeNothing) {
  const auto [ps, staged] = GetParam();
  BatchFixture f(ps, 77, /*num_pages=*/4000 / ps + 64, /*max_reqs=*/12, /*max_context=*/264);
  for (int i = 0; i < 4; ++i) f.AddSequence(100 + 37 * i, 1);
  const BackendConfig config =
      MakeTestConfig(ps, {.max_batch_size = 4, .max_context_len = 256, .split_kv = false});
  MakeDevice(f, config, /*staged=*/false);
  ASSERT_FALSE(HasFatalFailure());
  DeviceBuffer<TokenSlot>& table = *device_->table;
  const DeviceReqToToken whole{table.const_span(), f.pool().max_context_len()};
  // Not whole rows, and a pool of no slots (which would leave every slot unchecked).
  const DeviceReqToToken ragged{DeviceSpan<const TokenSlot>(table.data(), table.size() - 1),
                                f.pool().max_context_len()};
  DeviceMetadataWriter::Options direct;
  direct.use_graphs = false;
  EXPECT_EQ(DeviceMetadataWriter::Create(ragged, f.pool_slots(), stream_, direct).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(DeviceMetadataWriter::Create(whole, TokenCount(0), stream_, direct).status().code(),
            absl::StatusCode::kInvalidArgument);
  if (staged) return;  // the rest does not depend on the staging

  // The graph's buffers hold a replayed batch; a direct writer writes from them.
  GraphState& d = *device_->state;
  const auto h = d.Capture(4, ForwardMode::kDecode);
  ASSERT_TRUE(h.ok()) << h.status();
  ASSERT_TRUE(d.Replay(*h, ReplayBatch{f.rows(), f.kv_lens()}).ok());
  ASSERT_EQ(hipStreamSynchronize(stream_), hipSuccess);
  auto writer = DeviceMetadataWriter::Create(whole, f.pool_slots(), stream_, direct);
  ASSERT_TRUE(writer.ok()) << writer.status();
  const MetadataWriteRequest r = DirectDecodeRequest(f, 4, d.generation());
  // A slot outside the pool in the first row: the write records it.
  const int64_t at = int64_t{f.rows()[0].value()} * f.pool().max_context_len().value();
  const TokenSlot bad(static_cast<int32_t>(f.pool_slots().value() + 5));
  ASSERT_EQ(hipMemcpy(table.data() + at, &bad, sizeof(TokenSlot), hipMemcpyHostToDevice),
            hipSuccess);
  ASSERT_TRUE((*writer)->WriteBatchArrays(r, d.buffers()).ok());
  EXPECT_EQ((*writer)->CheckViolations().code(), absl::StatusCode::kOutOfRange);
  // A padded batch past the buffers, and more draft steps than their buffers: refused, and
  // the word still holds the violation (a write clears it only once it will launch).
  MetadataWriteRequest past = r;
  past.padded_batch_size = static_cast<int64_t>(d.buffers().req_rows.size()) + 1;
  EXPECT_EQ((*writer)->WriteBatchArrays(past, d.buffers()).code(),
            absl::StatusCode::kInvalidArgument);
  MetadataWriteRequest draft = r;
  draft.mode = ForwardMode::kDraftDecode;
  draft.draft_decode = {1, static_cast<int32_t>(d.buffers().draft_steps.size()) + 1};
  EXPECT_EQ((*writer)->WriteBatchArrays(draft, d.buffers()).code(),
            absl::StatusCode::kInvalidArgument);
  draft.draft_decode = {1, 0};
  EXPECT_EQ((*writer)->WriteBatchArrays(draft, d.buffers()).code(),
            absl::StatusCode::kInvalidArgument);
  // Draft-decode with a split-KV plan, which its launch never writes: refused, not counted.
  MetadataWriteRequest draft_split = r;
  draft_split.mode = ForwardMode::kDraftDecode;
  draft_split.draft_decode = {1, 1};
  draft_split.split_kv = true;
  const absl::Status split = (*writer)->WriteBatchArrays(draft_split, d.buffers());
  EXPECT_EQ(split.code(), absl::StatusCode::kInvalidArgument) << split;
  EXPECT_NE(split.message().find("draft-decode has no split-KV plan"), absl::string_view::npos)
      << split;
  // A request for the page table with no page-table buffer (the host writer refuses it too;
  // the fused launch would take the empty buffer for no page table and write none).
  GraphBuffers no_table = d.buffers();
  no_table.page_table = PageTableSpan<PageId>();
  EXPECT_EQ((*writer)->WriteBatchArrays(r, no_table).code(), absl::StatusCode::kInvalidArgument);
  const absl::Status after = (*writer)->CheckViolations();
  EXPECT_EQ(after.code(), absl::StatusCode::kOutOfRange) << after;

  // A graph writer refusing a write of a new generation keeps the graphs it has: the same
  // request as before launches its graph again, with no new capture.
  auto graphs = DeviceMetadataWriter::Create(whole, f.pool_slots(), stream_, {});
  ASSERT_TRUE(graphs.ok()) << graphs.status();
  ASSERT_TRUE((*graphs)->WriteBatchArrays(r, d.buffers()).ok());
  ASSERT_EQ((*graphs)->graphs_captured(), 1);
  MetadataWriteRequest moved = past;
  moved.generation = r.generation + 1;
  EXPECT_EQ((*graphs)->WriteBatchArrays(moved, d.buffers()).code(),
            absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE((*graphs)->WriteBatchArrays(r, d.buffers()).ok());
  EXPECT_EQ((*graphs)->graphs_captured(), 1) << "a refused write dropped the captured graph";
  // A write of the captured key that differs in what the graph fixes is refused and queues
  // nothing: without the page table, or with kv_indices elsewhere.
  MetadataWriteRequest no_page_table = r;
  no_page_table.page_table = false;
  GraphBuffers shorter = d.buffers();
  shorter.kv_indices = shorter.kv_indices.subspan(0, shorter.kv_indices.size() - 1);
  const std::pair<const MetadataWriteRequest*, const GraphBuffers*> differing[] = {
      {&no_page_table, &d.buffers()}, {&r, &shorter}};
  for (const auto& [request, buffers] : differing) {
    ASSERT_EQ(hipStreamBeginCapture(stream_, hipStreamCaptureModeThreadLocal), hipSuccess);
    const absl::Status refused = (*graphs)->WriteBatchArrays(*request, *buffers);
    hipGraph_t none = nullptr;
    ASSERT_EQ(hipStreamEndCapture(stream_, &none), hipSuccess);
    EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition) << refused;
    const absl::string_view what =
        request == &r ? "the buffer kv_indices differs" : "the page_table differs";
    EXPECT_NE(refused.message().find(what), absl::string_view::npos) << refused;
    size_t queued = 1;
    EXPECT_EQ(hipGraphGetNodes(none, nullptr, &queued), hipSuccess);
    EXPECT_EQ(queued, 0u) << "a refused write queued work";
    EXPECT_EQ(hipGraphDestroy(none), hipSuccess);
  }
  ASSERT_TRUE((*graphs)->WriteBatchArrays(r, d.buffers()).ok());
  EXPECT_EQ((*graphs)->graphs_captured(), 1);
  ASSERT_EQ(hipStreamSynchronize(stream_), hipSuccess);
}

template <typename T>
std::vector<T> FromDevice(absl::Span<T> device, size_t n) {
  std::vector<T> out(n);
  EXPECT_EQ(hipMemcpy(out.data(), device.data(), n * sizeof(T), hipMemcpyDeviceToHost), hipSuccess);
  return out;
}

template <typename T>
std::vector<T> Prefix(absl::Span<T> host, size_t n) {
  return std::vector<T>(host.begin(), host.begin() + n);
}

// Draft-decode replays (top-k branches over several steps) write every step's arrays, the
// padded branches' included, exactly as the host writer does.
TEST_P(DeviceGraphTest, DraftDecodeReplaysEqualTheHostWriter) {
  const auto [ps, staged] = GetParam();
  const uint64_t seed = 2300 + ps;
  std::mt19937_64 rng(seed);
  const DraftDecodeShape shape{ps < 16 ? 2 : 4, 3};
  constexpr int32_t kMaxContext = 600;
  // Rows as wide as draft-decode reads at kMaxContext (GraphState checks it).
  const int64_t row =
      MaxDraftRowTokens(TokenLength(kMaxContext), shape, *PageSize::Create(ps)).value();
  BatchFixture f(ps, seed, /*num_pages=*/30000 / ps + 64, /*max_reqs=*/16, /*max_context=*/row);
  std::vector<TokenLength> committed;
  for (int i = 0; i < 12; ++i) {
    // Request 0 has no committed tokens (its branches read their draft tokens only).
    const TokenLength len(i == 0 ? 0 : std::uniform_int_distribution<int32_t>(0, 300)(rng));
    f.AddSequence(len.value(), DraftRowTokens(len, shape, f.page_size()).value() - len.value());
    committed.push_back(len);
  }
  const BackendConfig config = MakeTestConfig(
      ps, {.max_batch_size = 8, .max_context_len = kMaxContext, .split_kv = false, .topk = shape.topk,
           .steps = shape.steps});
  GraphHarness host(config, f);
  MakeDevice(f, config, staged);
  ASSERT_FALSE(HasFatalFailure());
  GraphState& d = *device_->state;
  constexpr int64_t kBucket = 8;
  auto dh = d.Capture(kBucket, ForwardMode::kDraftDecode);
  auto hh = host.state().Capture(kBucket, ForwardMode::kDraftDecode);
  ASSERT_TRUE(dh.ok() && hh.ok()) << dh.status() << hh.status();
  const size_t branches = kBucket * shape.topk;
  for (int iter = 0; iter < 6; ++iter) {
    const int64_t bs = std::uniform_int_distribution<int64_t>(1, kBucket)(rng);
    std::vector<int> pick(12);
    std::iota(pick.begin(), pick.end(), 0);
    std::shuffle(pick.begin(), pick.end(), rng);
    if (iter == 0) std::iter_swap(pick.begin(), std::find(pick.begin(), pick.end(), 0));
    std::vector<ReqPoolIndex> rows;
    std::vector<TokenLength> lens;
    for (int k = 0; k < bs; ++k) {
      rows.push_back(f.rows()[pick[k]]);
      lens.push_back(committed[pick[k]]);
    }
    const ReplayBatch batch{rows, lens};
    Poison(d, *device_->memory);
    Poison(host.state(), host.memory());
    ASSERT_FALSE(HasFatalFailure());
    ASSERT_TRUE(d.Replay(*dh, batch).ok());
    ASSERT_TRUE(host.state().Replay(*hh, batch).ok());
    ASSERT_TRUE(device_->writer->CheckViolations().ok()) << device_->writer->CheckViolations();
    const GraphBuffers& db = d.buffers();
    const GraphBuffers& hb = host.state().buffers();
    const std::string at = "page size " + std::to_string(ps) + " staged " +
                           std::to_string(staged) + " seed " + std::to_string(seed) + " iter " +
                           std::to_string(iter) + " bs " + std::to_string(bs);
    EXPECT_EQ(FromDevice(db.draft_qo_indptr, branches + 1), Prefix(hb.draft_qo_indptr, branches + 1))
        << at;
    for (int step = 0; step < shape.steps; ++step) {
      const DraftStepBuffers& dd = db.draft_steps[step];
      const DraftStepBuffers& hd = hb.draft_steps[step];
      const size_t tokens = static_cast<size_t>(hd.kv_indptr[branches].value());
      EXPECT_EQ(FromDevice(dd.kv_indptr, branches + 1), Prefix(hd.kv_indptr, branches + 1))
          << at << " step " << step;
      EXPECT_EQ(FromDevice(dd.kv_lens, branches), Prefix(hd.kv_lens, branches)) << at;
      EXPECT_EQ(FromDevice(dd.kv_last_page_len, branches), Prefix(hd.kv_last_page_len, branches))
          << at;
      EXPECT_EQ(FromDevice(dd.kv_indices, tokens), Prefix(hd.kv_indices, tokens)) << at;
    }
  }
}

}  // namespace
}  // namespace attnmeta
