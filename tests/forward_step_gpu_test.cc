// One forward step on the GPU, across the layers. The kvcache allocator lays out the
// sequences (BatchFixture, shuffled pages); GraphState on the GPU (HipDeviceMemory,
// DeviceMetadataWriter: the metadata kernels captured in a graph per bucket) replays random real
// batches into a padded bucket; the attention kernels read what the replay left in device
// memory, and every real query row must equal attention computed here in double precision over
// the slots the allocator gave its sequence, with no metadata code in between. Page sizes 1, 7,
// 16 and 64, K/V read through token-level kv_indptr / kv_indices or through the page table.
//  - Decode: PagedDecodeAttention unsplit, and split by the plan the replay wrote on the device
//    (DeviceSplitKvPlan, which covers the padded rows), merged by a second launch and in the
//    attention launch; a launch over the whole bucket (the fixed shape a captured graph runs)
//    gives the real rows the same bytes and the padded rows finite values.
//  - Target-verify: VarlenAttention, with each of its kernels, reads the replay's qo_indptr and
//    its FULL tree mask: draft token r of a request sees the committed prefix and the draft
//    tokens its tree row marks. A launch over the whole bucket (ReplayResult::padded: its
//    qo_indptr ends at the padded query tensor's rows) gives the real rows the same bytes, the
//    padded rows finite values, and records no violation.
//  - Extend and draft-extend: 1 to 4 query rows per request, causal over the cached prefix; over
//    the whole bucket too, in the variable-row form (the rows no request claims written 0 and
//    -inf) and in the fixed form.
// Needs a GPU.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "attention/graph/backend_config.h"
#include "attention/graph/graph_state.h"
#include "attention/graph/testing/graph_harness.h"
#include "attention/kernels/device_metadata_writer.h"
#include "attention/kernels/hip_device_memory.h"
#include "attention/kernels/paged_decode_launcher.h"
#include "attention/kernels/varlen_attention_launcher.h"
#include "attention/kernels/testing/attention_inputs.h"
#include "attention/kernels/testing/device_buffer.h"
#include "attention/kernels/testing/gpu_test.h"
#include "attention/kernels/testing/upload.h"
#include "attention/metadata/testing/batch_fixture.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace attnmeta {
namespace {

using testing::BatchFixture;
using testing::DeviceBuffer;
using testing::Download;
using testing::Poison;
using testing::Upload;

constexpr int32_t kQHeads = 32;
constexpr int32_t kKvHeads = 8;
constexpr int32_t kHeadDim = 128;
constexpr int32_t kBucket = 8;
constexpr int64_t kMaxContext = 1024;
constexpr int kSequences = 16;
constexpr int32_t kDraft = 4;  // target-verify: draft tokens per request

// How the attention reads the KV: token-level indices (the graph's split plan in tokens) or the
// page table (the plan on whole pages).
enum class Source { kTokenLevel, kPageTable };

struct Outputs {
  absl::Status status;
  std::vector<uint8_t> out_bytes;  // [rows][kQHeads][kHeadDim] bf16
  std::vector<float> lse;          // [rows][kQHeads]
  float Out(int64_t e) const {
    uint16_t bits;
    std::memcpy(&bits, out_bytes.data() + 2 * e, 2);
    return testing::FromBits(KvElementType::kBf16, bits);
  }
};

class ForwardStepGpuTest : public testing::GpuTest,
                          public ::testing::WithParamInterface<std::tuple<int64_t, Source>> {
 protected:
  void SetUp() override {
    testing::GpuTest::SetUp();
    if (HasFatalFailure()) return;
    ASSERT_EQ(hipStreamCreate(&stream_), hipSuccess);
  }
  void TearDown() override {
    io_.reset();
    state_.reset();
    writer_.reset();
    memory_.reset();
    if (stream_ != nullptr) (void)hipStreamDestroy(stream_);
  }

  // 32/8 heads of 128, bf16; page table on; split-KV over 16 units in 64-token steps, in the
  // layout the source reads; kDraft draft tokens.
  static BackendConfig Config(int64_t ps, Source source) {
    BackendConfig c = testing::MakeTestConfig(
        ps, {.max_batch_size = kBucket, .max_context_len = kMaxContext, .draft_tokens = kDraft});
    c.set_num_q_heads(kQHeads);
    c.set_num_kv_heads(kKvHeads);
    c.set_head_dim(kHeadDim);
    SplitKvConsumer* split = c.mutable_consumers()->mutable_split_kv();
    split->set_num_units(16);
    split->set_kv_granularity(64);
    split->set_layout(source == Source::kPageTable ? SPLIT_KV_LAYOUT_PAGED
                                                   : SPLIT_KV_LAYOUT_LINEAR_PER_TOKEN);
    EXPECT_TRUE(ValidateBackendConfig(c).ok()) << ValidateBackendConfig(c);
    return c;
  }

  void MakeState(const BatchFixture& f, const BackendConfig& config) {
    std::vector<TokenSlot> table(f.pool().table().begin(), f.pool().table().end());
    table_ = std::make_unique<DeviceBuffer<TokenSlot>>(Upload(table));
    memory_ = std::make_unique<HipDeviceMemory>(stream_, nullptr);
    auto writer = DeviceMetadataWriter::Create(
        DeviceReqToToken{table_->const_span(), f.pool().max_context_len()}, f.pool_slots(), stream_,
        DeviceMetadataWriter::Options{});
    ASSERT_TRUE(writer.ok()) << writer.status();
    writer_ = *std::move(writer);
    auto state = GraphState::Create(config, &f.pool(), f.page_size(), memory_.get(), writer_.get());
    ASSERT_TRUE(state.ok()) << state.status();
    state_ = *std::move(state);
  }

  // The fixture's GraphState and device inputs for sequences of `lens` KV tokens, the last
  // `new_tokens` of each this step's, and `q_rows` query rows of random Q.
  void Prepare(int64_t ps, Source source, uint64_t seed, const std::vector<int64_t>& lens,
               int64_t new_tokens, int64_t q_rows, std::mt19937_64& rng) {
    int64_t pages = 16;
    for (int64_t len : lens) pages += len / ps + 2;
    fixture_ = std::make_unique<BatchFixture>(ps, seed, pages, kSequences + 2, kMaxContext + 8);
    for (int64_t len : lens) fixture_->AddSequence(len - new_tokens, new_tokens);
    config_ = Config(ps, source);
    MakeState(*fixture_, config_);
    if (HasFatalFailure()) return;
    auto word = DeviceViolationWord::Create();
    ASSERT_TRUE(word.ok()) << word.status();
    word_ = std::make_unique<DeviceViolationWord>(*std::move(word));
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<uint16_t> k_bits, v_bits, q_bits;
    const int64_t pool_values = fixture_->pool_slots().value() * kKvHeads * kHeadDim;
    testing::FillNormal(KvElementType::kBf16, pool_values, rng, normal, k_bits, k_host_);
    testing::FillNormal(KvElementType::kBf16, pool_values, rng, normal, v_bits, v_host_);
    testing::FillNormal(KvElementType::kBf16, q_rows * kQHeads * kHeadDim, rng, normal, q_bits,
                        q_host_);
    io_ = std::make_unique<Io>(Io{Upload(testing::Bytes(q_bits)), Upload(testing::Bytes(k_bits)),
                                  Upload(testing::Bytes(v_bits)),
                                  *DeviceBuffer<uint8_t>::Create(q_rows * kQHeads * kHeadDim * 2),
                                  *DeviceBuffer<float>::Create(q_rows * kQHeads)});
  }

  static DecodeAttentionDims Dims() {
    return DecodeAttentionDims{kQHeads, kKvHeads, kHeadDim, KvElementType::kBf16,
                               1.0f / std::sqrt(static_cast<float>(kHeadDim))};
  }

  // The KV source of the replay's real rows.
  DecodeKv RealKv(const ForwardMetadataView& m, Source source) const {
    if (source == Source::kTokenLevel) {
      return DecodeTokenLevelKv{
          DeviceSpan<const TokenOffset>(m.kv_indptr.data(), m.kv_indptr.size()),
          DeviceSpan<const TokenSlot>(m.kv_indices.data(), m.kv_indices.size())};
    }
    return DecodePageTableKv{
        DeviceSpan<const PageId>(m.page_table.entries().data(), m.page_table.entries().size()),
        m.page_table.cols(), DeviceSpan<const TokenLength>(m.kv_lens.data(), m.kv_lens.size()),
        fixture_->page_size()};
  }

  // Varlen attention over the replay's real rows: `q_rows` query rows of Q, the replay's
  // qo_indptr, max_q_len and KV source, no mask; outputs not set.
  VarlenAttentionArgs VarlenArgs(const ForwardMetadataView& m, Source source, int64_t q_rows,
                                 VarlenKernel kernel) const {
    VarlenAttentionArgs a;
    a.dims = Dims();
    a.q = DeviceSpan<const uint8_t>(io_->q.data(), q_rows * kQHeads * kHeadDim * 2);
    a.qo_indptr = DeviceSpan<const TokenOffset>(m.qo_indptr.data(), m.qo_indptr.size());
    a.max_q_len = m.max_q_len;
    a.k_pool = io_->k.const_span();
    a.v_pool = io_->v.const_span();
    a.kv = RealKv(m, source);
    a.kernel = kernel;
    return a;
  }

  // Poisons the outputs of `rows` query rows and points `out` and `lse` at them.
  void PoisonOutputs(int64_t rows, DeviceSpan<uint8_t>& out, DeviceSpan<float>& lse) {
    Poison(io_->out.data(), io_->out.size());
    Poison(io_->lse.data(), io_->lse.size() * sizeof(float));
    out = DeviceSpan<uint8_t>(io_->out.data(), rows * kQHeads * kHeadDim * 2);
    lse = DeviceSpan<float>(io_->lse.data(), rows * kQHeads);
  }

  // After a launch that returned `status`: the outputs of `rows` rows, the violation word
  // checked clean.
  Outputs Finish(absl::Status status, int64_t rows) {
    Outputs o;
    o.status = status;
    EXPECT_EQ(hipStreamSynchronize(stream_), hipSuccess);
    EXPECT_TRUE(word_->Check(stream_).ok()) << word_->Check(stream_);
    std::vector<uint8_t> out = Download(io_->out);
    o.out_bytes.assign(out.begin(), out.begin() + rows * kQHeads * kHeadDim * 2);
    std::vector<float> lse = Download(io_->lse);
    o.lse.assign(lse.begin(), lse.begin() + rows * kQHeads);
    return o;
  }

  // One decode launch over `rows` rows into poisoned outputs.
  Outputs Run(PagedDecodeArgs a, int64_t rows) {
    PoisonOutputs(rows, a.out, a.lse);
    a.q = DeviceSpan<const uint8_t>(io_->q.data(), rows * kQHeads * kHeadDim * 2);
    a.k_pool = io_->k.const_span();
    a.v_pool = io_->v.const_span();
    a.dims = Dims();
    return Finish(PagedDecodeAttention(a, word_->device(), stream_), rows);
  }

  // Query row `row` of a run against attention over `slots` (Attention below).
  void ExpectRow(const Outputs& o, int64_t row, const std::vector<TokenSlot>& slots,
                 const std::string& what);

  hipStream_t stream_ = nullptr;
  std::unique_ptr<DeviceBuffer<TokenSlot>> table_;
  std::unique_ptr<HipDeviceMemory> memory_;
  std::unique_ptr<DeviceMetadataWriter> writer_;
  std::unique_ptr<GraphState> state_;
  std::unique_ptr<DeviceViolationWord> word_;
  // The attention's inputs and outputs in device memory.
  struct Io {
    DeviceBuffer<uint8_t> q, k, v, out;
    DeviceBuffer<float> lse;
  };
  std::unique_ptr<Io> io_;
  std::vector<float> q_host_, k_host_, v_host_;
  std::unique_ptr<BatchFixture> fixture_;
  BackendConfig config_;
};

// Row j's attention over `slots` in double: out [kQHeads][kHeadDim] and lse [kQHeads].
void Attention(const std::vector<float>& q, const std::vector<float>& k,
               const std::vector<float>& v, int64_t row, const std::vector<TokenSlot>& slots,
               std::vector<double>& out, std::vector<double>& lse) {
  const double scale = 1.0 / std::sqrt(static_cast<double>(kHeadDim));
  out.assign(kQHeads * kHeadDim, 0.0);
  lse.assign(kQHeads, 0.0);
  std::vector<double> s(slots.size());
  for (int32_t h = 0; h < kQHeads; ++h) {
    const int64_t kv_off = int64_t{h / (kQHeads / kKvHeads)} * kHeadDim;
    const float* qh = q.data() + (row * kQHeads + h) * kHeadDim;
    double m = -INFINITY;
    for (size_t t = 0; t < slots.size(); ++t) {
      const float* kt = k.data() + slots[t].value() * int64_t{kKvHeads * kHeadDim} + kv_off;
      double dot = 0;
      for (int32_t x = 0; x < kHeadDim; ++x) dot += double{qh[x]} * kt[x];
      s[t] = dot * scale;
      m = std::max(m, s[t]);
    }
    double sum = 0;
    for (size_t t = 0; t < slots.size(); ++t) sum += std::exp(s[t] - m);
    for (size_t t = 0; t < slots.size(); ++t) {
      const double w = std::exp(s[t] - m) / sum;
      const float* vt = v.data() + slots[t].value() * int64_t{kKvHeads * kHeadDim} + kv_off;
      for (int32_t x = 0; x < kHeadDim; ++x) out[h * kHeadDim + x] += w * vt[x];
    }
    lse[h] = m + std::log(sum);
  }
}

void ForwardStepGpuTest::ExpectRow(const Outputs& o, int64_t row,
                                   const std::vector<TokenSlot>& slots, const std::string& what) {
  ASSERT_TRUE(o.status.ok()) << what << ": " << o.status;
  std::vector<double> want_out, want_lse;
  Attention(q_host_, k_host_, v_host_, row, slots, want_out, want_lse);
  for (int64_t e = 0; e < kQHeads * kHeadDim; ++e) {
    const double got = o.Out(row * kQHeads * kHeadDim + e);
    const double want = want_out[e];
    ASSERT_LE(std::fabs(got - want), 1e-2 + 1e-2 * std::fabs(want))
        << what << ": row " << row << " head " << e / kHeadDim << " dim " << e % kHeadDim
        << ": got " << got << " want " << want;
  }
  for (int32_t h = 0; h < kQHeads; ++h) {
    const double got = o.lse[row * kQHeads + h];
    ASSERT_LE(std::fabs(got - want_lse[h]), 1e-3 + 1e-5 * std::fabs(want_lse[h]))
        << what << ": lse row " << row << " head " << h << ": got " << got << " want "
        << want_lse[h];
  }
}

// `bs` distinct sequences of the fixture's kSequences, in random order.
std::vector<int> Pick(int64_t bs, std::mt19937_64& rng) {
  std::vector<int> pick(kSequences);
  std::iota(pick.begin(), pick.end(), 0);
  std::shuffle(pick.begin(), pick.end(), rng);
  pick.resize(bs);
  return pick;
}

TEST_P(ForwardStepGpuTest, DecodeOverReplayedDeviceMetadataMatchesTheMath) {
  const auto [ps, source] = GetParam();
  const uint64_t seed = 1200 + ps + (source == Source::kPageTable ? 1 : 0);
  std::mt19937_64 rng(seed);
  std::vector<int64_t> lens;
  for (int i = 0; i < kSequences; ++i) {
    lens.push_back(std::uniform_int_distribution<int64_t>(1, kMaxContext)(rng));
  }
  Prepare(ps, source, seed, lens, /*new_tokens=*/1, kBucket, rng);
  ASSERT_FALSE(HasFatalFailure());
  const BatchFixture& f = *fixture_;

  auto handle = state_->Capture(kBucket, ForwardMode::kDecode);
  ASSERT_TRUE(handle.ok()) << handle.status();
  const GraphBuffers& buffers = state_->buffers();
  // The partial buffers and merge counters, for the largest plan the buffers can hold.
  const int64_t max_partials = static_cast<int64_t>(buffers.split_kv.work.size());
  DeviceBuffer<float> partial_out = *DeviceBuffer<float>::Create(max_partials * kQHeads * kHeadDim);
  DeviceBuffer<float> partial_lse = *DeviceBuffer<float>::Create(max_partials * kQHeads);
  const std::vector<uint32_t> zeros(buffers.split_kv.reduce.size() * kQHeads, 0);
  DeviceBuffer<uint32_t> counters = Upload(zeros);
  const KvLayout layout = ConfigSplitKvOptions(config_).layout;

  int64_t split_replays = 0;
  for (int iter = 0; iter < 6; ++iter) {
    const int64_t bs = std::uniform_int_distribution<int64_t>(1, kBucket)(rng);
    const std::vector<int> pick = Pick(bs, rng);
    SCOPED_TRACE(::testing::Message()
                 << "page_size " << ps << " seed " << seed << " iter " << iter << " bs " << bs);
    std::vector<ReqPoolIndex> rows;
    std::vector<TokenLength> kv;
    for (int i : pick) {
      rows.push_back(f.rows()[i]);
      kv.push_back(f.kv_lens()[i]);
    }
    auto replay = state_->Replay(*handle, ReplayBatch{rows, kv, {}, {}});
    ASSERT_TRUE(replay.ok()) << replay.status();
    ASSERT_TRUE(writer_->CheckViolations().ok()) << writer_->CheckViolations();

    // The real rows, as an eager launch after the replay reads them.
    PagedDecodeArgs real;
    real.kv = RealKv(replay->metadata, source);
    // The whole bucket, padded rows included, as a captured graph would launch it.
    PagedDecodeArgs bucket;
    if (source == Source::kTokenLevel) {
      bucket.kv = DecodeTokenLevelKv{
          DeviceSpan<const TokenOffset>(buffers.kv_indptr.data(), kBucket + 1),
          DeviceSpan<const TokenSlot>(buffers.kv_indices.data(), buffers.kv_indices.size())};
    } else {
      bucket.kv = DecodePageTableKv{
          DeviceSpan<const PageId>(buffers.page_table.entries().data(),
                                   kBucket * buffers.page_table.cols().value()),
          buffers.page_table.cols(), DeviceSpan<const TokenLength>(buffers.kv_lens.data(), kBucket),
          f.page_size()};
    }

    const SplitKvPlanCounts& counts = replay->split_kv;
    if (counts.reduce_items > 0) ++split_replays;
    auto split = [&](bool in_launch) {
      return DecodeSplitKv{DeviceSplitKvPlan{layout, counts},
                           DeviceSpan<const SplitKvWorkItem>(buffers.split_kv.work.data(),
                                                             buffers.split_kv.work.size()),
                           DeviceSpan<const SplitKvReduceItem>(buffers.split_kv.reduce.data(),
                                                               buffers.split_kv.reduce.size()),
                           partial_out.span(),
                           partial_lse.span(),
                           in_launch ? counters.span() : DeviceSpan<uint32_t>()};
    };

    const Outputs unsplit = Run(real, bs);
    // The plan covers the whole bucket, padded rows too: a split launch runs over the bucket.
    PagedDecodeArgs split_merge_launch = bucket;
    split_merge_launch.split = split(false);
    PagedDecodeArgs split_in_launch = bucket;
    split_in_launch.split = split(true);
    const Outputs runs[] = {unsplit, Run(split_merge_launch, kBucket),
                            Run(split_in_launch, kBucket)};
    EXPECT_EQ(Download(counters), zeros) << "merge counters left nonzero";
    const char* names[] = {"unsplit", "split, merge launch", "split, merged in the launch"};
    for (int64_t j = 0; j < bs; ++j) {
      for (int r = 0; r < 3; ++r) {
        ExpectRow(runs[r], j, f.SlotsOf(pick[j]),
                  absl::StrCat(names[r], ", sequence ", pick[j]));
        ASSERT_FALSE(HasFatalFailure());
      }
    }

    const Outputs whole = Run(bucket, kBucket);
    ASSERT_TRUE(whole.status.ok()) << whole.status;
    const size_t real_bytes = unsplit.out_bytes.size();
    EXPECT_TRUE(
        std::equal(unsplit.out_bytes.begin(), unsplit.out_bytes.end(), whole.out_bytes.begin()))
        << "the bucket launch gave the real rows other bytes";
    for (int64_t e = static_cast<int64_t>(real_bytes / 2); e < kBucket * kQHeads * kHeadDim; ++e) {
      ASSERT_TRUE(std::isfinite(whole.Out(e))) << "padded row element " << e;
    }
  }
  EXPECT_GT(split_replays, 0) << "no replay split a sequence: the split path went untested";
}

TEST_P(ForwardStepGpuTest, VerifyOverReplayedDeviceMetadataMatchesTheMath) {
  const auto [ps, source] = GetParam();
  const uint64_t seed = 1300 + ps + (source == Source::kPageTable ? 1 : 0);
  std::mt19937_64 rng(seed);
  std::vector<int64_t> lens;  // committed prefix + kDraft draft tokens
  for (int i = 0; i < kSequences; ++i) {
    lens.push_back(std::uniform_int_distribution<int64_t>(kDraft + 1, kMaxContext)(rng));
  }
  Prepare(ps, source, seed, lens, /*new_tokens=*/kDraft, int64_t{kBucket} * kDraft, rng);
  ASSERT_FALSE(HasFatalFailure());
  const BatchFixture& f = *fixture_;
  auto handle = state_->Capture(kBucket, ForwardMode::kTargetVerify);
  ASSERT_TRUE(handle.ok()) << handle.status();

  for (int iter = 0; iter < 4; ++iter) {
    const int64_t bs = std::uniform_int_distribution<int64_t>(1, kBucket)(rng);
    const std::vector<int> pick = Pick(bs, rng);
    SCOPED_TRACE(::testing::Message()
                 << "page_size " << ps << " seed " << seed << " iter " << iter << " bs " << bs);
    std::vector<ReqPoolIndex> rows;
    std::vector<TokenLength> kv;
    std::vector<uint8_t> tree;  // [bs][kDraft][kDraft]: a tree row sees its root and itself
    for (int i : pick) {
      rows.push_back(f.rows()[i]);
      kv.push_back(f.kv_lens()[i]);
      for (int r = 0; r < kDraft; ++r) {
        for (int c = 0; c < kDraft; ++c) tree.push_back(c == 0 || c == r || (c < r && rng() % 2));
      }
    }
    auto replay = state_->Replay(*handle, ReplayBatch{rows, kv, {}, tree});
    ASSERT_TRUE(replay.ok()) << replay.status();
    ASSERT_TRUE(writer_->CheckViolations().ok()) << writer_->CheckViolations();
    const ForwardMetadataView& m = replay->metadata;
    const int64_t q_rows = bs * kDraft;

    for (VarlenKernel kernel : {VarlenKernel::kAuto, VarlenKernel::kShortQueries,
                                VarlenKernel::kTiledTensorCores, VarlenKernel::kTiledCudaCores}) {
      VarlenAttentionArgs a = VarlenArgs(m, source, q_rows, kernel);
      a.mask = VarlenMask{
          m.custom_mask.layout,
          DeviceSpan<const uint8_t>(m.custom_mask.mask.data(), m.custom_mask.mask.size()),
          DeviceSpan<const int64_t>(m.custom_mask.mask_indptr.data(),
                                    m.custom_mask.mask_indptr.size())};
      PoisonOutputs(q_rows, a.out, a.lse);
      const Outputs o = Finish(VarlenAttention(a, word_->device(), stream_), q_rows);
      for (int64_t j = 0; j < bs; ++j) {
        const std::vector<TokenSlot> all = f.SlotsOf(pick[j]);
        const int64_t prefix = static_cast<int64_t>(all.size()) - kDraft;
        for (int r = 0; r < kDraft; ++r) {
          std::vector<TokenSlot> seen(all.begin(), all.begin() + prefix);
          for (int c = 0; c < kDraft; ++c) {
            if (tree[(j * kDraft + r) * kDraft + c]) seen.push_back(all[prefix + c]);
          }
          ExpectRow(o, j * kDraft + r, seen,
                    absl::StrCat(VarlenKernelName(kernel), ", sequence ", pick[j], " draft ", r));
          ASSERT_FALSE(HasFatalFailure());
        }
      }

      // The whole bucket, as a kernel captured for it runs: Finish checks that nothing was
      // recorded (before padded rows had query rows, rows past qo_indptr[bucket] were).
      const ForwardMetadataView& w = replay->padded;
      const int64_t bucket_rows = int64_t{kBucket} * kDraft;
      ASSERT_EQ(w.qo_indptr.size(), static_cast<size_t>(kBucket + 1));
      VarlenAttentionArgs b = VarlenArgs(w, source, bucket_rows, kernel);
      b.mask = VarlenMask{
          w.custom_mask.layout,
          DeviceSpan<const uint8_t>(w.custom_mask.mask.data(), w.custom_mask.mask.size()),
          DeviceSpan<const int64_t>(w.custom_mask.mask_indptr.data(),
                                    w.custom_mask.mask_indptr.size())};
      PoisonOutputs(bucket_rows, b.out, b.lse);
      const Outputs whole = Finish(VarlenAttention(b, word_->device(), stream_), bucket_rows);
      ASSERT_TRUE(whole.status.ok()) << VarlenKernelName(kernel) << ": " << whole.status;
      EXPECT_TRUE(std::equal(o.out_bytes.begin(), o.out_bytes.end(), whole.out_bytes.begin()))
          << VarlenKernelName(kernel) << ": the bucket launch gave the real rows other bytes";
      for (int64_t e = q_rows * kQHeads * kHeadDim; e < bucket_rows * kQHeads * kHeadDim; ++e) {
        ASSERT_TRUE(std::isfinite(whole.Out(e)))
            << VarlenKernelName(kernel) << ": padded row element " << e;
      }
    }
  }
}

// Extend and draft-extend: each request's last q_len tokens (1 to 4, drawn per replay) attend
// causally to everything before them. VarlenAttention, with each of its kernels, reads the
// replay's qo_indptr (the query rows of a variable-row batch) and KV source, over the real rows
// and over the whole bucket (the rows no request claims declared with zero_unclaimed_rows);
// then the same requests replayed in the fixed form (4 rows each) over the whole bucket.
TEST_P(ForwardStepGpuTest, ExtendAndDraftExtendOverReplayedDeviceMetadataMatchTheMath) {
  const auto [ps, source] = GetParam();
  const uint64_t seed = 1400 + ps + (source == Source::kPageTable ? 1 : 0);
  std::mt19937_64 rng(seed);
  constexpr int32_t kRows = 4;  // the captured query rows per request
  std::vector<int64_t> lens;
  for (int i = 0; i < kSequences; ++i) {
    lens.push_back(std::uniform_int_distribution<int64_t>(kRows + 1, kMaxContext)(rng));
  }
  Prepare(ps, source, seed, lens, /*new_tokens=*/kRows, int64_t{kBucket} * kRows, rng);
  ASSERT_FALSE(HasFatalFailure());
  const BatchFixture& f = *fixture_;
  // Sequence `seq`'s last q_len query rows, at rows [row0, row0 + q_len) of `o`: each attends
  // causally to the sequence's tokens up to its own.
  const auto expect_rows = [&](const Outputs& o, int seq, int64_t row0, int64_t q_len,
                               const std::string& what) {
    const std::vector<TokenSlot> all = f.SlotsOf(seq);
    for (int64_t r = 0; r < q_len; ++r) {
      const int64_t position = static_cast<int64_t>(all.size()) - q_len + r;
      ExpectRow(o, row0 + r, std::vector<TokenSlot>(all.begin(), all.begin() + position + 1),
                absl::StrCat(what, ", sequence ", seq, " row ", r));
      ASSERT_FALSE(HasFatalFailure());
    }
  };

  for (ForwardMode mode : {ForwardMode::kExtend, ForwardMode::kDraftExtend}) {
    auto handle = state_->Capture(kBucket, mode, TokenLength(kRows));
    ASSERT_TRUE(handle.ok()) << handle.status();
    for (int iter = 0; iter < 3; ++iter) {
      const int64_t bs = std::uniform_int_distribution<int64_t>(1, kBucket)(rng);
      const std::vector<int> pick = Pick(bs, rng);
      SCOPED_TRACE(::testing::Message() << ForwardModeName(mode) << " page_size " << ps << " seed "
                                        << seed << " iter " << iter << " bs " << bs);
      std::vector<ReqPoolIndex> rows;
      std::vector<TokenLength> kv, q_lens;
      std::vector<int64_t> q_begin = {0};  // the host's qo_indptr, for the reference
      for (int i : pick) {
        rows.push_back(f.rows()[i]);
        kv.push_back(f.kv_lens()[i]);
        q_lens.push_back(TokenLength(std::uniform_int_distribution<int32_t>(1, kRows)(rng)));
        q_begin.push_back(q_begin.back() + q_lens.back().value());
      }
      auto replay = state_->Replay(*handle, ReplayBatch{rows, kv, q_lens, {}});
      ASSERT_TRUE(replay.ok()) << replay.status();
      ASSERT_TRUE(writer_->CheckViolations().ok()) << writer_->CheckViolations();
      const ForwardMetadataView& m = replay->metadata;
      const int64_t q_rows = q_begin.back();

      for (VarlenKernel kernel : {VarlenKernel::kAuto, VarlenKernel::kShortQueries,
                                  VarlenKernel::kTiledTensorCores, VarlenKernel::kTiledCudaCores}) {
        VarlenAttentionArgs a = VarlenArgs(m, source, q_rows, kernel);
        PoisonOutputs(q_rows, a.out, a.lse);
        const Outputs o = Finish(VarlenAttention(a, word_->device(), stream_), q_rows);
        for (int64_t j = 0; j < bs; ++j) {
          expect_rows(o, pick[j], q_begin[j], q_lens[j].value(), VarlenKernelName(kernel));
          ASSERT_FALSE(HasFatalFailure());
        }
      }

      // The same replay over the whole bucket, as a captured graph runs it (its max_q_len the
      // captured rows): the padded rows' kRows rows each follow the real rows, and the rows
      // past qo_indptr[bucket], which no request claims, are written 0 and -inf
      // (zero_unclaimed_rows); Finish finds nothing recorded.
      {
        const int64_t bucket_rows = int64_t{kBucket} * kRows;
        const int64_t claimed = q_rows + (kBucket - bs) * kRows;
        const int64_t row_elems = int64_t{kQHeads} * kHeadDim;
        for (VarlenKernel kernel :
             {VarlenKernel::kAuto, VarlenKernel::kShortQueries, VarlenKernel::kTiledTensorCores,
              VarlenKernel::kTiledCudaCores}) {
          const std::string what = absl::StrCat(VarlenKernelName(kernel), ", the variable bucket");
          VarlenAttentionArgs b = VarlenArgs(replay->padded, source, bucket_rows, kernel);
          b.max_q_len = TokenCount(kRows);
          b.zero_unclaimed_rows = true;
          PoisonOutputs(bucket_rows, b.out, b.lse);
          const Outputs whole = Finish(VarlenAttention(b, word_->device(), stream_), bucket_rows);
          for (int64_t j = 0; j < bs; ++j) {
            expect_rows(whole, pick[j], q_begin[j], q_lens[j].value(), what);
            ASSERT_FALSE(HasFatalFailure());
          }
          for (int64_t e = q_rows * row_elems; e < claimed * row_elems; ++e) {
            ASSERT_TRUE(std::isfinite(whole.Out(e))) << what << ": padded row element " << e;
          }
          for (int64_t e = claimed * row_elems; e < bucket_rows * row_elems; ++e) {
            ASSERT_EQ(whole.Out(e), 0.0) << what << ": unclaimed row element " << e;
          }
          for (int64_t e = claimed * kQHeads; e < bucket_rows * kQHeads; ++e) {
            ASSERT_EQ(whole.lse[e], -INFINITY) << what << ": unclaimed row lse " << e;
          }
        }
      }

      // The fixed form (every request kRows rows) over the whole bucket, as a captured graph
      // runs it: the padded rows hold kRows query rows over as many padding slots, the bucket's
      // qo_indptr ends at its query rows, and Finish finds nothing recorded.
      auto fixed = state_->Replay(*handle, ReplayBatch{rows, kv});
      ASSERT_TRUE(fixed.ok()) << fixed.status();
      ASSERT_TRUE(writer_->CheckViolations().ok()) << writer_->CheckViolations();
      const ForwardMetadataView& w = fixed->padded;
      const int64_t bucket_rows = int64_t{kBucket} * kRows;
      ASSERT_EQ(w.qo_indptr.size(), static_cast<size_t>(kBucket + 1));
      for (VarlenKernel kernel : {VarlenKernel::kAuto, VarlenKernel::kShortQueries,
                                  VarlenKernel::kTiledTensorCores, VarlenKernel::kTiledCudaCores}) {
        VarlenAttentionArgs b = VarlenArgs(w, source, bucket_rows, kernel);
        PoisonOutputs(bucket_rows, b.out, b.lse);
        const Outputs whole = Finish(VarlenAttention(b, word_->device(), stream_), bucket_rows);
        for (int64_t j = 0; j < bs; ++j) {
          expect_rows(whole, pick[j], j * kRows, kRows,
                      absl::StrCat(VarlenKernelName(kernel), ", the bucket"));
          ASSERT_FALSE(HasFatalFailure());
        }
        for (int64_t e = bs * kRows * kQHeads * kHeadDim; e < bucket_rows * kQHeads * kHeadDim;
             ++e) {
          ASSERT_TRUE(std::isfinite(whole.Out(e)))
              << VarlenKernelName(kernel) << ": padded row element " << e;
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(PageSizesAndSources, ForwardStepGpuTest,
                         ::testing::Combine(::testing::Values(1, 7, 16, 64),
                                            ::testing::Values(Source::kTokenLevel,
                                                              Source::kPageTable)),
                         [](const ::testing::TestParamInfo<std::tuple<int64_t, Source>>& info) {
                           return "ps" + std::to_string(std::get<0>(info.param)) +
                                  (std::get<1>(info.param) == Source::kTokenLevel ? "_token_level"
                                                                                  : "_page_table");
                         });

}  // namespace
}  // namespace attnmeta
