// GPU tests of paged decode attention (paged_decode_launcher.h) against the CPU reference
// attention (attention/metadata/reference_attention.h): batches laid out by the real allocator
// with shuffled pages (page sizes 1, 7, 16, 64, unaligned lengths), K/V read through
// token-level kv_indices and through the page table, with and without split-KV plans, every
// compiled variant; the log-sum-exp against a double-precision computation here; bad inputs
// refused before any launch; corrupted device metadata recorded in the violation word and never
// read out of bounds (the bundle also runs this binary under compute-sanitizer memcheck).
// Outputs (and partial buffers) are poisoned with 0xFF bytes, a NaN in bf16, fp16 and fp32,
// before every run, and checked written in full. Needs a GPU: fails when none is visible.
//
// Error bounds. The inputs are bf16 or fp16 values and the reference reads the same values as
// floats with double accumulation, so what differs is the kernel's fp32 arithmetic (relative
// ~1e-6), the rounding of the softmax weights to the input type before the tensor cores
// multiply them with V, and the rounding of the output to it: half an ulp is 2^-9 relative for
// bf16 and 2^-12 for fp16, and outputs are weighted means of N(0, 1) values (|out| < 4). Per
// element: bf16 |got - want| <= 1e-2 + 1e-2 |want|, fp16 <= 2e-3 + 2e-3 |want|; the fp32
// log-sum-exp <= 1e-3 + 1e-5 |want|.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "attention/kernels/checked_metadata.h"
#include "attention/kernels/metadata_launchers.h"
#include "attention/kernels/paged_decode_attention.h"
#include "attention/kernels/paged_decode_launcher.h"
#include "attention/kernels/testing/attention_inputs.h"
#include "attention/kernels/testing/device_buffer.h"
#include "attention/kernels/testing/gpu_test.h"
#include "attention/kernels/testing/overlap.h"
#include "attention/kernels/testing/spin.h"
#include "attention/kernels/testing/upload.h"
#include "attention/metadata/builders.h"
#include "attention/metadata/reference_attention.h"
#include "attention/metadata/split_kv_planner.h"
#include "attention/metadata/validator.h"
#include "attention/metadata/testing/batch_fixture.h"
#include "gtest/gtest.h"

namespace attnmeta {
namespace {

using testing::BatchFixture;
using testing::Bytes;
using testing::CopyOf;
using testing::DeviceBuffer;
using testing::Dims;
using testing::Download;
using testing::FromBits;
using testing::LaunchesOverlap;
using testing::Poison;
using testing::ToBits;
using testing::Upload;

constexpr float kInf = std::numeric_limits<float>::infinity();

// A decode batch (one query row per sequence, kv lengths given) laid out by the allocator with
// shuffled pages; random N(0, 1) Q, K and V rounded to the element type; the reference output
// and log-sum-exp of every row.
struct Problem {
  DecodeAttentionDims dims;
  std::unique_ptr<BatchFixture> fixture;
  ForwardMetadata metadata;               // decode metadata, token-level and page table
  std::vector<uint16_t> q_bits, k_bits, v_bits;
  std::vector<float> q, k, v;             // the same values as floats
  std::vector<float> want_out;            // [bs][num_q_heads][head_dim]
  std::vector<double> want_lse;           // [bs][num_q_heads]

  int64_t bs() const { return static_cast<int64_t>(metadata.kv_lens.size()); }
  int64_t kv_row() const { return int64_t{dims.num_kv_heads} * dims.head_dim; }
};

// log(sum_t exp(scale * q.k_t)) of query head h over the K rows of `slots`, in double; -inf
// for no slots.
double Lse(const Problem& p, const float* q, int32_t h, const std::vector<int32_t>& slots) {
  const int32_t kv_head = h / (p.dims.num_q_heads / p.dims.num_kv_heads);
  std::vector<double> s;
  for (int32_t slot : slots) {
    const float* k = p.k.data() + slot * p.kv_row() + int64_t{kv_head} * p.dims.head_dim;
    double dot = 0;
    for (int32_t x = 0; x < p.dims.head_dim; ++x) dot += double{q[x]} * k[x];
    s.push_back(dot * p.dims.softmax_scale);
  }
  if (s.empty()) return -std::numeric_limits<double>::infinity();
  const double m = *std::max_element(s.begin(), s.end());
  double sum = 0;
  for (double x : s) sum += std::exp(x - m);
  return m + std::log(sum);
}

Problem MakeProblem(const DecodeAttentionDims& dims, int64_t page_size,
                    const std::vector<int64_t>& lens, uint64_t seed) {
  Problem p;
  p.dims = dims;
  int64_t pages = 8, longest = 1;
  for (int64_t len : lens) {
    pages += len / page_size + 2;
    longest = std::max(longest, len);
  }
  p.fixture = std::make_unique<BatchFixture>(page_size, seed, pages,
                                             static_cast<int32_t>(lens.size()) + 2, longest + 16);
  for (int64_t len : lens) p.fixture->AddSequence(len - 1, 1);
  auto m = BuildForwardMetadata(p.fixture->Batch(ForwardMode::kDecode), p.fixture->pool(),
                                p.fixture->page_size());
  EXPECT_TRUE(m.ok()) << m.status();
  p.metadata = *std::move(m);

  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const int64_t pool_slots = p.fixture->pool_slots().value();
  testing::FillNormal(dims.dtype, pool_slots * p.kv_row(), rng, normal, p.k_bits, p.k);
  testing::FillNormal(dims.dtype, pool_slots * p.kv_row(), rng, normal, p.v_bits, p.v);
  testing::FillNormal(dims.dtype, p.bs() * dims.num_q_heads * dims.head_dim, rng, normal, p.q_bits, p.q);

  // The reference scores with 1 / sqrt(head_dim): another scale is folded into its queries.
  const float fold = dims.softmax_scale * std::sqrt(static_cast<float>(dims.head_dim));
  std::vector<float> ref_q(p.q);
  for (float& x : ref_q) x *= fold;
  const ReferenceAttentionInputs in{AttentionDims{dims.num_q_heads, dims.num_kv_heads, dims.head_dim},
                                    p.metadata.view(), p.fixture->page_size(), ref_q, p.k, p.v};
  p.want_out.assign(p.q.size(), 0.0f);
  const absl::Status s = ReferenceAttentionTokenLevel(in, absl::MakeSpan(p.want_out));
  EXPECT_TRUE(s.ok()) << s;
  for (int64_t i = 0; i < p.bs(); ++i) {
    std::vector<int32_t> slots;
    for (int32_t t = p.metadata.kv_indptr[i].value(); t < p.metadata.kv_indptr[i + 1].value(); ++t) {
      slots.push_back(p.metadata.kv_indices[t].value());
    }
    for (int32_t h = 0; h < dims.num_q_heads; ++h) {
      p.want_lse.push_back(
          Lse(p, p.q.data() + (i * dims.num_q_heads + h) * dims.head_dim, h, slots));
    }
  }
  return p;
}

// The problem's inputs in device memory.
struct DeviceProblem {
  DeviceBuffer<uint8_t> q, k, v;
  DeviceBuffer<TokenOffset> kv_indptr;
  DeviceBuffer<TokenSlot> kv_indices;
  DeviceBuffer<PageId> page_table;
  DeviceBuffer<TokenLength> kv_lens;
  PageCount cols;
  PageSize page_size;

  DecodeKv TokenLevel() const {
    return DecodeTokenLevelKv{kv_indptr.const_span(), kv_indices.const_span()};
  }
  DecodeKv PageLevel() const {
    return DecodePageTableKv{page_table.const_span(), cols, kv_lens.const_span(), page_size};
  }
};

DeviceProblem ToDevice(const Problem& p) {
  const absl::Span<const PageId> table = p.metadata.page_table.span().entries();
  return DeviceProblem{
      Upload(Bytes(p.q_bits)),       Upload(Bytes(p.k_bits)),
      Upload(Bytes(p.v_bits)),       Upload(p.metadata.kv_indptr),
      Upload(p.metadata.kv_indices), Upload(std::vector<PageId>(table.begin(), table.end())),
      Upload(p.metadata.kv_lens),    p.metadata.page_table.cols(),
      p.fixture->page_size()};
}

struct Result {
  absl::Status status;
  std::vector<float> out;  // [bs][num_q_heads][head_dim]
  std::vector<float> lse;  // [bs][num_q_heads]
  std::vector<uint8_t> out_bytes;
  bool faulted = false;  // the launch failed on the device: nothing downloaded, status says why
};

// What the launcher of a plan held only on the device knows of `plan`.
DeviceSplitKvPlan DevicePlanOf(const SplitKvPlan& plan) {
  return DeviceSplitKvPlan{
      plan.layout, SplitKvPlanCounts{plan.chunk, static_cast<int64_t>(plan.work.size()),
                                     static_cast<int64_t>(plan.reduce.size()), plan.num_partials}};
}

// A kernel ahead of the decode: the decode is launched on `stream` with `overlap`, right after
// a kernel that lets it start at once, spins for about half a millisecond and then makes
// `copies` (LaunchSpinThenCopy); with `captured`, the two launches are captured in a graph,
// replayed once.
struct KernelAhead {
  hipStream_t stream;
  testing::SpinCopies copies;
  DecodeLaunchOverlap overlap;
  bool captured = false;  // both launches captured in a graph, which is then replayed once
  // With a device plan: its work and reduce items too are written by the kernel ahead (cleared
  // before), as a graph replay's metadata writer does (at most two other copies then).
  bool writes_plan = false;
};

// One call of the launcher on the problem's inputs through `kv` (split by `plan` when not
// null, given as a plan held only on the device when `device_plan`, merged in the attention
// launch when `merge_counters` is not empty, after `ahead` when not null), into outputs
// and partial buffers poisoned first.
Result RunDecodeOnce(const DecodeAttentionDims& dims, const DeviceProblem& d, int64_t bs,
                     const DecodeKv& kv, const SplitKvPlan* plan, int32_t variant,
                     kernels::DeviceViolation* violation, DeviceSpan<uint32_t> merge_counters,
                     bool device_plan = false, const KernelAhead* ahead = nullptr) {
  const int64_t rows = bs * dims.num_q_heads;
  DeviceBuffer<uint8_t> out = *DeviceBuffer<uint8_t>::Create(rows * dims.head_dim * 2);
  DeviceBuffer<float> lse = *DeviceBuffer<float>::Create(rows);
  const int64_t partials = plan != nullptr ? plan->num_partials : 0;
  DeviceBuffer<float> partial_out =
      *DeviceBuffer<float>::Create(partials * dims.num_q_heads * dims.head_dim);
  DeviceBuffer<float> partial_lse = *DeviceBuffer<float>::Create(partials * dims.num_q_heads);
  Poison(out.data(), out.size());
  Poison(lse.data(), lse.size() * sizeof(float));
  Poison(partial_out.data(), partial_out.size() * sizeof(float));
  Poison(partial_lse.data(), partial_lse.size() * sizeof(float));
  std::vector<SplitKvWorkItem> work;
  std::vector<SplitKvReduceItem> reduce;
  if (plan != nullptr) {
    work = plan->work;
    reduce = plan->reduce;
  }
  if (device_plan) {
    // A device plan's buffers hold more than its counts (the graph's, at capacity): entries
    // past the counts are garbage the kernels must not read.
    for (int k = 0; k < 3; ++k) {
      work.push_back(SplitKvWorkItem{-7, TokenOffset(5), TokenOffset(3), TokenPosition(-9),
                                     TokenPosition(1 << 30), 1 << 30});
      reduce.push_back(SplitKvReduceItem{1 << 30, TokenOffset(0), TokenOffset(1), -4, 1 << 30});
    }
  }
  DeviceBuffer<SplitKvWorkItem> d_work = Upload(work);
  DeviceBuffer<SplitKvReduceItem> d_reduce = Upload(reduce);
  DeviceBuffer<SplitKvWorkItem> ahead_work = Upload(work);
  DeviceBuffer<SplitKvReduceItem> ahead_reduce = Upload(reduce);
  testing::SpinCopies ahead_copies;
  if (ahead != nullptr) {
    ahead_copies = ahead->copies;
    if (ahead->writes_plan && device_plan && ahead_copies.count + 2 > testing::kMaxSpinCopies) {
      ADD_FAILURE() << "no room for the plan's two copies beside " << ahead_copies.count;
    } else if (ahead->writes_plan && device_plan) {
      EXPECT_EQ(hipMemset(d_work.data(), 0xff, d_work.size() * sizeof(SplitKvWorkItem)), hipSuccess);
      EXPECT_EQ(hipMemset(d_reduce.data(), 0xff, d_reduce.size() * sizeof(SplitKvReduceItem)),
                hipSuccess);
      ahead_copies.copy[ahead_copies.count++] = testing::SpinCopy{
          d_work.data(), ahead_work.data(),
          static_cast<int64_t>(d_work.size() * sizeof(SplitKvWorkItem))};
      ahead_copies.copy[ahead_copies.count++] = testing::SpinCopy{
          d_reduce.data(), ahead_reduce.data(),
          static_cast<int64_t>(d_reduce.size() * sizeof(SplitKvReduceItem))};
    }
  }
  PagedDecodeArgs a;
  a.dims = dims;
  a.q = d.q.const_span();
  a.k_pool = d.k.const_span();
  a.v_pool = d.v.const_span();
  a.kv = kv;
  if (plan != nullptr) {
    a.split = DecodeSplitKv{plan, d_work.const_span(), d_reduce.const_span(), partial_out.span(),
                            partial_lse.span(), merge_counters};
    if (device_plan) a.split->plan = DevicePlanOf(*plan);
  }
  a.out = out.span();
  a.lse = lse.span();
  a.variant = variant;
  hipStream_t stream = nullptr;
  const bool captured = ahead != nullptr && ahead->captured;
  if (ahead != nullptr) {
    stream = ahead->stream;
    a.overlap = ahead->overlap;
    if (captured) {
      EXPECT_EQ(hipStreamBeginCapture(stream, hipStreamCaptureModeThreadLocal), hipSuccess);
    }
    EXPECT_EQ(testing::LaunchSpinThenCopy(testing::kAheadSpinCycles, ahead_copies, stream), hipSuccess);
  }
  Result r;
  r.status = PagedDecodeAttention(a, violation, stream);
  if (captured) {
    hipGraph_t graph = nullptr;
    EXPECT_EQ(hipStreamEndCapture(stream, &graph), hipSuccess);
    testing::LaunchGraphOnce(graph, stream);
  }
  // A launch that faulted (an illegal address loses the context) ends here with its error, for
  // the caller's ASSERT on r.status: a download would abort the whole binary.
  const hipError_t synced = hipDeviceSynchronize();
  EXPECT_EQ(synced, hipSuccess) << hipGetErrorString(synced);
  if (synced != hipSuccess) {
    if (r.status.ok()) r.status = absl::InternalError(hipGetErrorString(synced));
    r.faulted = true;
    return r;
  }
  r.out_bytes = Download(out);
  r.lse = Download(lse);
  r.out.resize(rows * dims.head_dim);
  for (size_t i = 0; i < r.out.size(); ++i) {
    uint16_t bits;
    std::memcpy(&bits, r.out_bytes.data() + 2 * i, 2);
    r.out[i] = FromBits(dims.dtype, bits);
  }
  return r;
}

// RunDecodeOnce with the merge launch. A split with reduce items also runs twice with the merge
// in the attention launch (the same counters, zeroed once): its results must be the merge
// launch's (to fp32 rounding) and the counters zero after each run.
Result RunDecode(const DecodeAttentionDims& dims, const DeviceProblem& d, int64_t bs, const DecodeKv& kv,
                 const SplitKvPlan* plan, int32_t variant = 0,
                 kernels::DeviceViolation* violation = nullptr) {
  Result r = RunDecodeOnce(dims, d, bs, kv, plan, variant, violation, {});
  if (plan == nullptr || plan->reduce.empty() || violation != nullptr || r.faulted) return r;
  if (!r.status.ok()) {  // refused before any launch: so is the other way
    DeviceBuffer<uint32_t> counters = Upload(std::vector<uint32_t>(plan->reduce.size() * dims.num_q_heads, 0));
    EXPECT_EQ(RunDecodeOnce(dims, d, bs, kv, plan, variant, nullptr, counters.span()).status, r.status);
    return r;
  }
  const std::vector<uint32_t> zeros(plan->reduce.size() * dims.num_q_heads, 0);
  DeviceBuffer<uint32_t> counters = Upload(zeros);
  for (int run = 0; run < 2; ++run) {
    SCOPED_TRACE(::testing::Message() << "merged in the attention launch, run " << run);
    const Result fused = RunDecodeOnce(dims, d, bs, kv, plan, variant, nullptr, counters.span());
    EXPECT_EQ(fused.status, r.status);
    if (fused.faulted) return r;
    EXPECT_EQ(Download(counters), zeros) << "counters left nonzero";
    for (size_t i = 0; i < r.out.size(); ++i) {
      const double want = r.out[i];
      if (!(std::fabs(fused.out[i] - want) <= 1e-3 + 8e-3 * std::fabs(want))) {
        ADD_FAILURE() << "out element " << i << ": " << fused.out[i] << " against " << want;
        break;
      }
    }
    for (size_t i = 0; i < r.lse.size(); ++i) {
      if (!(std::fabs(fused.lse[i] - r.lse[i]) <= 1e-5 * (1 + std::fabs(r.lse[i])))) {
        ADD_FAILURE() << "lse " << i << ": " << fused.lse[i] << " against " << r.lse[i];
        break;
      }
    }
  }
  return r;
}

Result RunDecode(const Problem& p, const DeviceProblem& d, const DecodeKv& kv,
           const SplitKvPlan* plan = nullptr, int32_t variant = 0) {
  return RunDecode(p.dims, d, p.bs(), kv, plan, variant);
}

bool Near(double got, double want, double abs, double rel) {
  return std::fabs(got - want) <= abs + rel * std::fabs(want);
}

// Row `got_row` of a run against row `want_row` of the problem's reference: every element
// written (no NaN left of the poison) and within the dtype's bounds; lse too.
void ExpectRow(const Problem& p, const Result& r, int64_t got_row, int64_t want_row) {
  const bool bf16 = p.dims.dtype == KvElementType::kBf16;
  const double abs = bf16 ? 1e-2 : 2e-3, rel = bf16 ? 1e-2 : 2e-3;
  const int64_t heads = p.dims.num_q_heads, dim = p.dims.head_dim;
  for (int64_t h = 0; h < heads; ++h) {
    for (int64_t x = 0; x < dim; ++x) {
      const float got = r.out[(got_row * heads + h) * dim + x];
      const float want = p.want_out[(want_row * heads + h) * dim + x];
      ASSERT_TRUE(Near(got, want, abs, rel))
          << "row " << got_row << " head " << h << " dim " << x << ": got " << got << " want " << want;
    }
    const float got = r.lse[got_row * heads + h];
    const double want = p.want_lse[want_row * heads + h];
    ASSERT_TRUE(Near(got, want, 1e-3, 1e-5))
        << "lse row " << got_row << " head " << h << ": got " << got << " want " << want;
  }
}

void ExpectMatches(const Problem& p, const Result& r) {
  ASSERT_TRUE(r.status.ok()) << r.status;
  for (int64_t i = 0; i < p.bs(); ++i) {
    ExpectRow(p, r, i, i);
    if (::testing::Test::HasFatalFailure()) return;
  }
}

// Nothing was written: every byte still holds the poison.
void ExpectUntouched(const Result& r) {
  for (size_t i = 0; i < r.out_bytes.size(); ++i) ASSERT_EQ(r.out_bytes[i], 0xff) << "out byte " << i;
  for (size_t i = 0; i < r.lse.size(); ++i) ASSERT_TRUE(std::isnan(r.lse[i])) << "lse " << i;
}

class DecodeGpuTest : public testing::GpuTest {};

class PageSizeDecodeGpuTest : public DecodeGpuTest, public ::testing::WithParamInterface<int64_t> {};

// Unaligned lengths around the page size, through both kinds of metadata, without a split and
// with the plan PlanDecodeSplitKv makes for a GPU four times wider than the batch's blocks (so
// that the batch is split).
TEST_P(PageSizeDecodeGpuTest, TokenLevelAndPageTableMatchTheReference) {
  const int64_t ps = GetParam();
  const Problem p = MakeProblem(Dims(32, 8, 128, KvElementType::kBf16), ps,
                                {1, 2, ps, ps + 1, 3 * ps - 1, 129, 517, 1000}, 100 + ps);
  const DeviceProblem d = ToDevice(p);
  SCOPED_TRACE(::testing::Message() << "page_size " << ps);
  {
    SCOPED_TRACE("token-level");
    ExpectMatches(p, RunDecode(p, d, d.TokenLevel()));
  }
  {
    SCOPED_TRACE("page table");
    ExpectMatches(p, RunDecode(p, d, d.PageLevel()));
  }
  const DecodeSplitOptions wide_gpu{/*multiprocessor_count=*/32, /*blocks_per_item=*/8,
                                    /*blocks_per_multiprocessor=*/8};
  for (const DecodeKv& kv : {d.TokenLevel(), d.PageLevel()}) {
    auto plan = PlanDecodeSplitKv(p.metadata.kv_indptr, DecodeKvLayout(kv), wide_gpu);
    ASSERT_TRUE(plan.ok()) << plan.status();
    ASSERT_FALSE(plan->reduce.empty()) << "the plan splits the long sequences";
    SCOPED_TRACE(kv.index() == 0 ? "token-level, split" : "page table, split");
    ExpectMatches(p, RunDecode(p, d, kv, &*plan));
  }
}

INSTANTIATE_TEST_SUITE_P(PageSizes, PageSizeDecodeGpuTest, ::testing::Values(1, 7, 16, 64));

// GQA groups of 1 (MHA) to 16 (query heads per block 1, 2, 4, 8, and a group of 16 run as two
// chunks of 8, a group of 3 as three of 1), head dims 64, 128, 256 (each of 1, 2, 4 and 8
// query heads per block at 256, where Q comes from shared memory), bf16 and fp16; unsplit, and
// split with a plan whose longest sequence has more than 32 partials (the merge's warp takes
// up to 32 partials, 16 at head dim 256, in one round of loads, and more in two).
TEST_F(DecodeGpuTest, HeadsHeadDimsAndDtypesMatchTheReference) {
  struct Shape {
    int32_t q_heads, kv_heads, head_dim;
    KvElementType dtype;
  };
  const Shape shapes[] = {
      {32, 8, 128, KvElementType::kBf16}, {64, 8, 128, KvElementType::kFp16},
      {8, 1, 64, KvElementType::kBf16},   {8, 8, 128, KvElementType::kFp16},
      {32, 8, 256, KvElementType::kFp16}, {16, 16, 64, KvElementType::kBf16},
      {12, 4, 256, KvElementType::kBf16}, {16, 1, 128, KvElementType::kFp16},
      {4, 2, 64, KvElementType::kFp16},   {32, 8, 64, KvElementType::kFp16},
      {8, 1, 256, KvElementType::kBf16},  {8, 2, 128, KvElementType::kBf16},
      {16, 8, 256, KvElementType::kFp16},
  };
  uint64_t seed = 7;
  for (const Shape& s : shapes) {
    SCOPED_TRACE(::testing::Message() << s.q_heads << "/" << s.kv_heads << " heads, head_dim "
                                      << s.head_dim << (s.dtype == KvElementType::kBf16 ? " bf16" : " fp16"));
    const Problem p = MakeProblem(Dims(s.q_heads, s.kv_heads, s.head_dim, s.dtype), 16,
                                  {37, 300, 1, 64, 1200}, ++seed);
    const DeviceProblem d = ToDevice(p);
    ExpectMatches(p, RunDecode(p, d, d.TokenLevel()));
    ExpectMatches(p, RunDecode(p, d, d.PageLevel()));
    // At most 64 items: chunks of 32 tokens, 38 partials for the 1200-token sequence, more than
    // the merge's one round takes. max_items_per_sequence is pinned so that a smaller default
    // (it was 32 for a while) cannot take the two-round path away.
    const DecodeSplitOptions many_partials{/*multiprocessor_count=*/8, /*blocks_per_item=*/1,
                                           /*blocks_per_multiprocessor=*/8, TokenCount(16),
                                           /*max_items_per_sequence=*/64};
    for (const DecodeKv& kv : {d.TokenLevel(), d.PageLevel()}) {
      SCOPED_TRACE(kv.index() == 0 ? "token-level, split" : "page table, split");
      auto plan = PlanDecodeSplitKv(p.metadata.kv_indptr, DecodeKvLayout(kv), many_partials);
      ASSERT_TRUE(plan.ok()) << plan.status();
      int32_t most = 0;
      for (const SplitKvReduceItem& r : plan->reduce) most = std::max(most, r.partial_end - r.partial_begin);
      EXPECT_GT(most, 32);
      ExpectMatches(p, RunDecode(p, d, kv, &*plan));
    }
    if (HasFatalFailure()) return;
  }
}

TEST_F(DecodeGpuTest, SoftmaxScaleIsAnArgument) {
  for (float scale : {0.02f, 0.3f, 1.0f}) {
    SCOPED_TRACE(::testing::Message() << "scale " << scale);
    DecodeAttentionDims dims = Dims(32, 8, 128, KvElementType::kFp16);
    dims.softmax_scale = scale;
    const Problem p = MakeProblem(dims, 16, {90, 33}, 11);
    const DeviceProblem d = ToDevice(p);
    ExpectMatches(p, RunDecode(p, d, d.TokenLevel()));
  }
}

// Every compiled variant of the kernel shape computes the same, with and without a split.
TEST_F(DecodeGpuTest, EveryVariantMatchesTheReference) {
  for (KvElementType t : {KvElementType::kBf16, KvElementType::kFp16}) {
    const Problem p = MakeProblem(Dims(32, 8, 128, t), 16, {1, 17, 250, 1031}, 21);
    const DeviceProblem d = ToDevice(p);
    auto plan = PlanSplitKv(std::vector<TokenOffset>{TokenOffset(0), TokenOffset(1), TokenOffset(2),
                                                     TokenOffset(3), TokenOffset(4)},
                            p.metadata.kv_indptr,
                            SplitKvOptions{KvLayout::LinearPerToken(), 5, TokenCount(96)});
    ASSERT_TRUE(plan.ok()) << plan.status();
    for (int32_t v = 0; v < kernels::kNumDecodeVariants; ++v) {
      SCOPED_TRACE(::testing::Message() << "variant " << v);
      ExpectMatches(p, RunDecode(p, d, d.TokenLevel(), nullptr, v));
      ExpectMatches(p, RunDecode(p, d, d.PageLevel(), nullptr, v));
      ExpectMatches(p, RunDecode(p, d, d.TokenLevel(), &*plan, v));
      if (HasFatalFailure()) return;
    }
  }
}

// Sequences with no KV (padded rows) write zeros and lse -inf, as the reference does for a row
// that sees nothing; the rows around them are unaffected. Built by hand: a decode batch (and a
// split plan) cannot hold an empty sequence.
TEST_F(DecodeGpuTest, EmptySequencesWriteZerosAndMinusInfinity) {
  for (int64_t ps : {1, 16}) {
    SCOPED_TRACE(::testing::Message() << "page_size " << ps);
    const Problem p = MakeProblem(Dims(32, 8, 128, KvElementType::kBf16), ps, {40, 70}, 31);
    const DeviceProblem d = ToDevice(p);
    // Batch [seq 0, empty, seq 1, empty].
    const int32_t a = p.metadata.kv_lens[0].value(), b = p.metadata.kv_lens[1].value();
    const std::vector<TokenOffset> indptr = {TokenOffset(0), TokenOffset(a), TokenOffset(a),
                                             TokenOffset(a + b), TokenOffset(a + b)};
    const std::vector<TokenLength> lens = {TokenLength(a), TokenLength(0), TokenLength(b),
                                           TokenLength(0)};
    const int64_t cols = p.metadata.page_table.cols().value();
    std::vector<PageId> table(4 * cols, kPaddingPage);
    std::copy_n(p.metadata.page_table.span().row(0).begin(), cols, table.begin());
    std::copy_n(p.metadata.page_table.span().row(1).begin(), cols, table.begin() + 2 * cols);
    const int64_t q_row = int64_t{p.dims.num_q_heads} * p.dims.head_dim;
    std::vector<uint16_t> q(4 * q_row, ToBits(p.dims.dtype, 0.5f));
    std::copy_n(p.q_bits.begin(), q_row, q.begin());
    std::copy_n(p.q_bits.begin() + q_row, q_row, q.begin() + 2 * q_row);
    const DeviceProblem e{Upload(Bytes(q)), Upload(Bytes(p.k_bits)), Upload(Bytes(p.v_bits)),
                          Upload(indptr), Upload(p.metadata.kv_indices), Upload(table),
                          Upload(lens), PageCount(cols), p.fixture->page_size()};
    for (const DecodeKv& kv : {e.TokenLevel(), e.PageLevel()}) {
      const Result r = RunDecode(p.dims, e, 4, kv, nullptr);
      ASSERT_TRUE(r.status.ok()) << r.status;
      ExpectRow(p, r, 0, 0);
      ExpectRow(p, r, 2, 1);
      for (int64_t row : {1, 3}) {
        for (int64_t x = row * q_row; x < (row + 1) * q_row; ++x) ASSERT_EQ(r.out[x], 0.0f) << x;
        for (int64_t h = 0; h < p.dims.num_q_heads; ++h) {
          ASSERT_EQ(r.lse[row * p.dims.num_q_heads + h], -kInf) << "row " << row << " head " << h;
        }
      }
    }
  }
}

// bs 1 with a 16k context: the plan for an H200-sized GPU splits the sequence into items that
// fill it, through token-level indices (LinearPerToken plan) and the page table (Paged plan);
// the same kernel without a split, and a plan sized for this GPU, give the same result.
TEST_F(DecodeGpuTest, SplitKvLongSequenceMatchesTheReference) {
  const Problem p = MakeProblem(Dims(32, 8, 128, KvElementType::kBf16), 16, {16384}, 41);
  const DeviceProblem d = ToDevice(p);
  auto sms = DeviceMultiprocessorCount();
  ASSERT_TRUE(sms.ok()) << sms.status();
  for (int32_t mp : {132, *sms}) {
    for (const DecodeKv& kv : {d.TokenLevel(), d.PageLevel()}) {
      SCOPED_TRACE(::testing::Message() << mp << " multiprocessors, "
                                        << (kv.index() == 0 ? "token-level" : "page table"));
      auto plan = PlanDecodeSplitKv(p.metadata.kv_indptr, DecodeKvLayout(kv),
                                    DecodeSplitOptions{mp, 8});
      ASSERT_TRUE(plan.ok()) << plan.status();
      // One wave: more than half of the blocks the options aim for, and no more.
      const int64_t blocks = static_cast<int64_t>(plan->work.size()) * 8;
      const int64_t target = int64_t{mp} * DecodeSplitOptions{}.blocks_per_multiprocessor;
      EXPECT_GT(2 * blocks, target);
      EXPECT_LE(blocks, target);
      ASSERT_EQ(plan->reduce.size(), 1u);
      ExpectMatches(p, RunDecode(p, d, kv, &*plan));
    }
  }
  ExpectMatches(p, RunDecode(p, d, d.TokenLevel()));
}

// The split options for this GPU: its multiprocessors, the kernel's occupancy, and the launch's
// blocks per item for groups a block takes whole (32/8, and 16/16 at head dim 256), as two
// chunks of 8 query heads (128/8: 16 blocks per item, not 8) and as three of 1 (12/4). A bs 1 x
// 16k plan made with them fills more than half of one wave of the launch and no more, and gives
// the reference's result. The occupancy is the variant's own kernel's. Dims and variants the
// launch refuses are refused here too.
TEST_F(DecodeGpuTest, SplitOptionsForThisDeviceFillOneWave) {
  auto sms = DeviceMultiprocessorCount();
  ASSERT_TRUE(sms.ok()) << sms.status();
  struct Case {
    int32_t q_heads, kv_heads, head_dim, blocks_per_item;
  };
  for (const Case& c :
       {Case{32, 8, 128, 8}, Case{128, 8, 128, 16}, Case{12, 4, 64, 12}, Case{16, 16, 256, 16}}) {
    SCOPED_TRACE(::testing::Message()
                 << c.q_heads << "/" << c.kv_heads << " heads, head dim " << c.head_dim);
    const DecodeAttentionDims dims = Dims(c.q_heads, c.kv_heads, c.head_dim, KvElementType::kBf16);
    absl::StatusOr<int32_t> per_item = DecodeBlocksPerWorkItem(dims, /*variant=*/0);
    ASSERT_TRUE(per_item.ok()) << per_item.status();
    EXPECT_EQ(*per_item, c.blocks_per_item);
    absl::StatusOr<DecodeSplitOptions> o = DecodeSplitOptionsForDevice(dims, /*variant=*/0);
    ASSERT_TRUE(o.ok()) << o.status();
    EXPECT_EQ(o->multiprocessor_count, *sms);
    EXPECT_EQ(o->blocks_per_item, c.blocks_per_item);
    EXPECT_GE(o->blocks_per_multiprocessor, 1);
    const Problem p = MakeProblem(dims, 16, {16384}, 43);
    auto plan = PlanDecodeSplitKv(p.metadata.kv_indptr, KvLayout::LinearPerToken(), *o);
    ASSERT_TRUE(plan.ok()) << plan.status();
    const int64_t blocks = static_cast<int64_t>(plan->work.size()) * c.blocks_per_item;
    const int64_t wave = int64_t{*sms} * o->blocks_per_multiprocessor;
    EXPECT_LE(blocks, wave);
    EXPECT_GT(2 * blocks, wave);
    const DeviceProblem d = ToDevice(p);
    ExpectMatches(p, RunDecode(p, d, d.TokenLevel(), &*plan));
  }
  // Variants 0, 1 and 2 hold the same registers per thread (250 on sm_90) in blocks of 4, 2 and
  // 8 warps, so a multiprocessor fits more blocks of 2 warps than of 4, and fewer of 8.
  const DecodeAttentionDims gqa = Dims(32, 8, 128, KvElementType::kBf16);
  absl::StatusOr<DecodeSplitOptions> four_warps = DecodeSplitOptionsForDevice(gqa, 0);
  absl::StatusOr<DecodeSplitOptions> two_warps = DecodeSplitOptionsForDevice(gqa, 1);
  absl::StatusOr<DecodeSplitOptions> eight_warps = DecodeSplitOptionsForDevice(gqa, 2);
  ASSERT_TRUE(four_warps.ok() && two_warps.ok() && eight_warps.ok());
  EXPECT_GT(two_warps->blocks_per_multiprocessor, four_warps->blocks_per_multiprocessor);
  EXPECT_GT(four_warps->blocks_per_multiprocessor, eight_warps->blocks_per_multiprocessor);
  EXPECT_GE(eight_warps->blocks_per_multiprocessor, 1);
  EXPECT_EQ(two_warps->blocks_per_item, 8) << "variants other than 0 run 4 query heads per block";
  const DecodeAttentionDims bad = Dims(30, 8, 128, KvElementType::kBf16);
  EXPECT_EQ(DecodeBlocksPerWorkItem(bad, 0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(DecodeSplitOptionsForDevice(bad, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
  const DecodeAttentionDims head_dim_64 = Dims(32, 8, 64, KvElementType::kBf16);
  EXPECT_EQ(DecodeSplitOptionsForDevice(head_dim_64, /*variant=*/2).status().code(),
            absl::StatusCode::kInvalidArgument)
      << "variants other than 0 are compiled for head dim 128 only";
}

// A plan with more than 32 reduce items (48 sequences, each split): merging in the attention
// launch, a block finds its reduce item past the first 32 the search takes at a time.
TEST_F(DecodeGpuTest, SplitKvWithManyReduceItemsMatchesTheReference) {
  std::vector<int64_t> lens;
  for (int i = 0; i < 48; ++i) lens.push_back(100 + 7 * i);
  const Problem p = MakeProblem(Dims(32, 8, 128, KvElementType::kBf16), 16, lens, 47);
  const DeviceProblem d = ToDevice(p);
  std::vector<TokenOffset> qo;
  for (int32_t i = 0; i <= 48; ++i) qo.push_back(TokenOffset(i));
  auto plan = PlanSplitKv(qo, p.metadata.kv_indptr,
                          SplitKvOptions{KvLayout::LinearPerToken(), 200, TokenCount(32)});
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_GT(plan->reduce.size(), 40u);
  ExpectMatches(p, RunDecode(p, d, d.TokenLevel(), &*plan));
}

// Plans that mix direct items (short sequences) and split ones, at page size 64: a linear-KV
// plan (splits inside pages, which token-level indices serve) and a paged plan (whole pages).
TEST_F(DecodeGpuTest, SplitKvMixedPlansAtPageSize64) {
  const Problem p = MakeProblem(Dims(32, 8, 128, KvElementType::kFp16), 64,
                                {1000, 3, 700, 64, 2000, 129}, 51);
  const DeviceProblem d = ToDevice(p);
  std::vector<TokenOffset> qo(7);
  for (int i = 0; i <= 6; ++i) qo[i] = TokenOffset(i);
  struct Case {
    KvLayout layout;
    DecodeKv kv;
  };
  for (const Case& c : {Case{KvLayout::LinearPerToken(), d.TokenLevel()},
                        Case{KvLayout::Paged(d.page_size), d.PageLevel()}}) {
    SCOPED_TRACE(c.layout.paged() ? "paged plan, page table" : "linear plan, token-level");
    auto plan = PlanSplitKv(qo, p.metadata.kv_indptr,
                            SplitKvOptions{c.layout, 9, TokenCount(100), TokenCount(1)});
    ASSERT_TRUE(plan.ok()) << plan.status();
    const bool direct = std::any_of(plan->work.begin(), plan->work.end(),
                                    [](const SplitKvWorkItem& w) { return w.partial_slot < 0; });
    ASSERT_TRUE(direct && !plan->reduce.empty()) << "the plan mixes direct and split items";
    if (!c.layout.paged()) {
      const bool mid_page = std::any_of(plan->work.begin(), plan->work.end(), [](const SplitKvWorkItem& w) {
        return w.kv_begin.value() % 64 != 0;
      });
      EXPECT_TRUE(mid_page) << "a linear plan splits inside pages";
    }
    ExpectMatches(p, RunDecode(p, d, c.kv, &*plan));
  }
}

// A plan made for another layout than the one the call reads is refused before any launch.
TEST_F(DecodeGpuTest, PlanForAnotherLayoutIsRefused) {
  const Problem p = MakeProblem(Dims(32, 8, 128, KvElementType::kBf16), 64, {500, 900}, 61);
  const DeviceProblem d = ToDevice(p);
  std::vector<TokenOffset> qo = {TokenOffset(0), TokenOffset(1), TokenOffset(2)};
  auto plan_for = [&](KvLayout layout) {
    auto plan = PlanSplitKv(qo, p.metadata.kv_indptr, SplitKvOptions{layout, 8, TokenCount(128)});
    EXPECT_TRUE(plan.ok()) << plan.status();
    return *std::move(plan);
  };
  const SplitKvPlan paged64 = plan_for(KvLayout::Paged(*PageSize::Create(64)));
  const SplitKvPlan paged16 = plan_for(KvLayout::Paged(*PageSize::Create(16)));
  const SplitKvPlan linear = plan_for(KvLayout::LinearPerToken());
  struct Case {
    const char* what;
    DecodeKv kv;
    const SplitKvPlan* plan;
  } cases[] = {{"paged plan, token-level read", d.TokenLevel(), &paged64},
               {"linear plan, page-table read", d.PageLevel(), &linear},
               {"page size 16 plan, page size 64 table", d.PageLevel(), &paged16}};
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    const Result r = RunDecode(p, d, c.kv, c.plan);
    EXPECT_EQ(r.status.code(), absl::StatusCode::kInvalidArgument) << r.status;
    EXPECT_NE(r.status.message().find("layout"), absl::string_view::npos) << r.status;
    ExpectUntouched(r);
  }
  ExpectMatches(p, RunDecode(p, d, d.TokenLevel(), &linear));
  ExpectMatches(p, RunDecode(p, d, d.PageLevel(), &paged64));
}

// What the host can see is refused before any launch, with nothing written: a case of each
// kind of check (every check is in paged_decode_args_test.cc, on the CPU).
TEST_F(DecodeGpuTest, BadInputsAreRefusedBeforeLaunch) {
  const Problem p = MakeProblem(Dims(32, 8, 128, KvElementType::kBf16), 16, {200, 50, 333}, 71);
  const DeviceProblem d = ToDevice(p);
  const int64_t bs = p.bs();
  const int64_t q_bytes = bs * 32 * 128 * 2;
  // Room for a misaligned view of the same size.
  DeviceBuffer<uint8_t> spare = *DeviceBuffer<uint8_t>::Create(q_bytes + 64);
  auto plan = PlanDecodeSplitKv(p.metadata.kv_indptr, KvLayout::LinearPerToken(),
                                DecodeSplitOptions{8, 8, /*blocks_per_multiprocessor=*/8});
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_GT(plan->num_partials, 0);
  DeviceBuffer<SplitKvWorkItem> work = Upload(plan->work);
  DeviceBuffer<SplitKvReduceItem> reduce = Upload(plan->reduce);
  const int64_t partial_floats = int64_t{plan->num_partials} * 32 * 128;
  DeviceBuffer<float> partial_out = *DeviceBuffer<float>::Create(partial_floats);
  DeviceBuffer<float> partial_lse = *DeviceBuffer<float>::Create(plan->num_partials * 32);
  DeviceBuffer<uint8_t> out = *DeviceBuffer<uint8_t>::Create(q_bytes);
  DeviceBuffer<float> lse = *DeviceBuffer<float>::Create(bs * 32);
  Poison(out.data(), out.size());
  Poison(lse.data(), lse.size() * sizeof(float));

  PagedDecodeArgs good;
  good.dims = p.dims;
  good.q = d.q.const_span();
  good.k_pool = d.k.const_span();
  good.v_pool = d.v.const_span();
  good.kv = d.TokenLevel();
  good.split = DecodeSplitKv{&*plan, work.const_span(), reduce.const_span(), partial_out.span(),
                             partial_lse.span()};
  good.out = out.span();
  good.lse = lse.span();

  // Checked mode: the host copy of the metadata, and a copy that fails validation although
  // every slot is inside the pool (no kernel guard would see it): sequence 0's new token in a
  // slot of sequence 2, without the page table, which would disagree first.
  ValidationContext ctx{p.fixture->pool_slots(), p.fixture->page_size(), TokenCount(bs)};
  ctx.check_slot_ownership = true;
  const CheckedMetadata checked{p.metadata.view(), ctx};
  ForwardMetadata twice = p.metadata;
  twice.kv_indices[twice.kv_indptr[1].value() - 1] = twice.kv_indices[twice.kv_indptr[2].value()];
  twice.page_table = PageTable();
  const CheckedMetadata checked_twice{twice.view(), ctx};

  using Edit = std::function<void(PagedDecodeArgs&)>;
  struct Case {
    const char* what;
    Edit edit;
    absl::StatusCode code;
  };
  const absl::StatusCode kInvalid = absl::StatusCode::kInvalidArgument;
  const Case cases[] = {
      {"checked: a slot handed out twice",
       [&](PagedDecodeArgs& a) { a.checked = &checked_twice; }, kInvalid},
      {"heads that do not divide", [](PagedDecodeArgs& a) { a.dims.num_kv_heads = 5; }, kInvalid},
      {"q misaligned",
       [&](PagedDecodeArgs& a) { a.q = DeviceSpan<const uint8_t>(spare.data() + 2, q_bytes); },
       kInvalid},
      {"null kv_indices",
       [&](PagedDecodeArgs& a) {
         a.kv = DecodeTokenLevelKv{d.kv_indptr.const_span(),
                                   DeviceSpan<const TokenSlot>(nullptr, d.kv_indices.size())};
       },
       kInvalid},
      {"page table beyond int32 tokens",
       [&](PagedDecodeArgs& a) {
         a.kv = DecodePageTableKv{d.page_table.const_span(), PageCount(int64_t{1} << 27),
                                  d.kv_lens.const_span(), d.page_size};
         a.split.reset();
       },
       absl::StatusCode::kOutOfRange},
      {"partial_out too small",
       [&](PagedDecodeArgs& a) {
         a.split->partial_out = DeviceSpan<float>(partial_out.data(), partial_floats - 1);
       },
       absl::StatusCode::kResourceExhausted},
      {"device plan with more items than its buffers",
       [&](PagedDecodeArgs& a) {
         DeviceSplitKvPlan dp = DevicePlanOf(*plan);
         ++dp.counts.work_items;
         a.split->plan = dp;
       },
       kInvalid},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    PagedDecodeArgs a = good;
    c.edit(a);
    const absl::Status s = PagedDecodeAttention(a, nullptr, nullptr);
    EXPECT_EQ(s.code(), c.code) << s;
  }
  ASSERT_EQ(hipDeviceSynchronize(), hipSuccess);
  const std::vector<uint8_t> got = Download(out);
  for (size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i], 0xff) << "out written at byte " << i;
  // The unedited arguments run, also checked, through both sources.
  ASSERT_TRUE(PagedDecodeAttention(good, nullptr, nullptr).ok());
  PagedDecodeArgs checked_args = good;
  checked_args.checked = &checked;
  EXPECT_TRUE(PagedDecodeAttention(checked_args, nullptr, nullptr).ok());
  checked_args.kv = d.PageLevel();
  checked_args.split.reset();
  EXPECT_TRUE(PagedDecodeAttention(checked_args, nullptr, nullptr).ok());
  ASSERT_EQ(hipDeviceSynchronize(), hipSuccess);
}

// Corrupted device-resident metadata: the kernels stay in bounds (memcheck in the bundle),
// skip what they cannot read, and the violation word names the first problem.
class GuardDecodeGpuTest : public testing::ViolationWordGpuTest {};

void ExpectAllFinite(const Result& r) {
  for (size_t i = 0; i < r.out.size(); ++i) ASSERT_TRUE(std::isfinite(r.out[i])) << "out " << i;
  for (size_t i = 0; i < r.lse.size(); ++i) ASSERT_FALSE(std::isnan(r.lse[i])) << "lse " << i;
}

TEST_F(GuardDecodeGpuTest, SlotsOutsideThePoolAreSkippedAndRecorded) {
  const Problem p = MakeProblem(Dims(32, 8, 128, KvElementType::kBf16), 16, {100, 60, 80}, 81);
  const DeviceProblem d = ToDevice(p);
  const int64_t pool_slots = p.fixture->pool_slots().value();
  // Token 37 of sequence 0 points outside the pool: the kernel attends to the other 99 tokens.
  for (int32_t bad : {1 << 30, -7, static_cast<int32_t>(pool_slots)}) {
    SCOPED_TRACE(::testing::Message() << "slot " << bad);
    std::vector<TokenSlot> indices(p.metadata.kv_indices);
    indices[37] = TokenSlot(bad);
    const DeviceProblem e{Upload(Bytes(p.q_bits)), Upload(Bytes(p.k_bits)), Upload(Bytes(p.v_bits)),
                          Upload(p.metadata.kv_indptr), Upload(indices), Upload(std::vector<PageId>{}),
                          Upload(p.metadata.kv_lens), PageCount(0), d.page_size};
    const Result r = RunDecode(p.dims, e, p.bs(), e.TokenLevel(), nullptr, 0, word_->device());
    ASSERT_TRUE(r.status.ok()) << r.status;
    ExpectViolation("outside the pool");
    ExpectAllFinite(r);
    ExpectRow(p, r, 1, 1);
    ExpectRow(p, r, 2, 2);
    // Sequence 0 without token 37, by the dense reference.
    std::vector<float> k, v;
    const int64_t row = p.kv_row();
    for (int32_t t = 0; t < 100; ++t) {
      if (t == 37) continue;
      const int64_t s = p.metadata.kv_indices[t].value();
      k.insert(k.end(), p.k.begin() + s * row, p.k.begin() + (s + 1) * row);
      v.insert(v.end(), p.v.begin() + s * row, p.v.begin() + (s + 1) * row);
    }
    const int64_t q_row = int64_t{p.dims.num_q_heads} * p.dims.head_dim;
    std::vector<float> want(q_row);
    ASSERT_TRUE(DenseAttention(AttentionDims{32, 8, 128}, absl::MakeConstSpan(p.q).subspan(0, q_row),
                               k, v, absl::MakeSpan(want))
                    .ok());
    for (int64_t x = 0; x < q_row; ++x) {
      ASSERT_TRUE(Near(r.out[x], want[x], 1e-2, 1e-2)) << x << ": " << r.out[x] << " vs " << want[x];
    }
  }
  // A page outside the pool, through the page table.
  std::vector<PageId> table(p.metadata.page_table.span().entries().begin(),
                            p.metadata.page_table.span().entries().end());
  table[d.cols.value() + 2] = PageId(1 << 29);
  const DeviceProblem e{Upload(Bytes(p.q_bits)), Upload(Bytes(p.k_bits)), Upload(Bytes(p.v_bits)),
                        Upload(p.metadata.kv_indptr), Upload(p.metadata.kv_indices), Upload(table),
                        Upload(p.metadata.kv_lens), d.cols, d.page_size};
  const Result r = RunDecode(p.dims, e, p.bs(), e.PageLevel(), nullptr, 0, word_->device());
  ASSERT_TRUE(r.status.ok()) << r.status;
  ExpectViolation("outside the pool");
  ExpectAllFinite(r);
  ExpectRow(p, r, 0, 0);
  ExpectRow(p, r, 2, 2);
}

TEST_F(GuardDecodeGpuTest, LengthsAndIndptrPastTheirBuffersAreClampedAndRecorded) {
  const Problem p = MakeProblem(Dims(32, 8, 128, KvElementType::kFp16), 16, {100, 60, 80}, 91);
  const DeviceProblem d = ToDevice(p);
  const int32_t total = p.metadata.kv_indptr.back().value();
  struct IndptrCase {
    std::vector<TokenOffset> indptr;
    const char* words;
  } indptr_cases[] = {
      {{TokenOffset(0), TokenOffset(100), TokenOffset(160), TokenOffset(total + 5000)},
       "the buffer holds"},
      {{TokenOffset(0), TokenOffset(100), TokenOffset(50), TokenOffset(total)}, "below the entry"},
      {{TokenOffset(-40), TokenOffset(100), TokenOffset(160), TokenOffset(total)}, "is negative"},
  };
  for (const IndptrCase& c : indptr_cases) {
    SCOPED_TRACE(c.words);
    DeviceBuffer<TokenOffset> indptr = Upload(c.indptr);
    const Result r = RunDecode(p.dims, d, p.bs(),
                         DecodeTokenLevelKv{indptr.const_span(), d.kv_indices.const_span()}, nullptr,
                         0, word_->device());
    ASSERT_TRUE(r.status.ok()) << r.status;
    ExpectViolation(c.words);
    ExpectAllFinite(r);
  }
  struct LensCase {
    std::vector<TokenLength> lens;
    const char* words;
  } lens_cases[] = {
      {{TokenLength(100), TokenLength(100000), TokenLength(80)}, "columns"},
      {{TokenLength(100), TokenLength(60), TokenLength(-3)}, "is negative"},
  };
  for (const LensCase& c : lens_cases) {
    SCOPED_TRACE(c.words);
    DeviceBuffer<TokenLength> lens = Upload(c.lens);
    const Result r = RunDecode(p.dims, d, p.bs(),
                         DecodePageTableKv{d.page_table.const_span(), d.cols, lens.const_span(),
                                           d.page_size},
                         nullptr, 0, word_->device());
    ASSERT_TRUE(r.status.ok()) << r.status;
    ExpectViolation(c.words);
    ExpectAllFinite(r);
  }
}

// The device copy of a plan disagrees with the host plan the launcher checked: items naming a
// sequence outside the batch, partial slots past the buffers or KV past the sequence are
// recorded, and nothing is read or written out of bounds.
// A page table of zero columns (its pointer null) is still read as a page table: lengths past
// it are clamped and recorded, never taken for token-level indices.
TEST_F(GuardDecodeGpuTest, EmptyPageTableIsClampedNotReadAsTokenIndices) {
  const Problem p = MakeProblem(Dims(32, 8, 128, KvElementType::kBf16), 16, {100, 60, 80}, 95);
  const DeviceProblem d = ToDevice(p);
  const Result r = RunDecode(p.dims, d, p.bs(),
                             DecodePageTableKv{DeviceSpan<const PageId>(nullptr, 0), PageCount(0),
                                               d.kv_lens.const_span(), d.page_size},
                             nullptr, 0, word_->device());
  ASSERT_TRUE(r.status.ok()) << r.status;
  ASSERT_EQ(hipDeviceSynchronize(), hipSuccess);
  ExpectViolation("columns");
  for (float x : r.out) ASSERT_EQ(x, 0.0f);
  for (float x : r.lse) ASSERT_EQ(x, -kInf);
}

TEST_F(GuardDecodeGpuTest, CorruptedDevicePlanIsRecorded) {
  const Problem p = MakeProblem(Dims(32, 8, 128, KvElementType::kBf16), 16, {700, 900}, 101);
  const DeviceProblem d = ToDevice(p);
  auto plan = PlanDecodeSplitKv(p.metadata.kv_indptr, KvLayout::LinearPerToken(),
                                DecodeSplitOptions{8, 8, /*blocks_per_multiprocessor=*/8});
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_FALSE(plan->reduce.empty());
  const int64_t partial_floats = int64_t{plan->num_partials} * 32 * 128;
  DeviceBuffer<float> partial_out = *DeviceBuffer<float>::Create(partial_floats);
  DeviceBuffer<float> partial_lse = *DeviceBuffer<float>::Create(plan->num_partials * 32);
  DeviceBuffer<uint8_t> out = *DeviceBuffer<uint8_t>::Create(p.bs() * 32 * 128 * 2);
  DeviceBuffer<float> lse = *DeviceBuffer<float>::Create(p.bs() * 32);
  struct Case {
    const char* what;
    std::function<void(std::vector<SplitKvWorkItem>&, std::vector<SplitKvReduceItem>&)> edit;
    const char* words;
  } cases[] = {
      {"work item of sequence 99", [](auto& w, auto&) { w[0].sequence = 99; },
       "split-KV work item 0: sequence 99 outside the batch"},
      {"partial slot past the buffers", [](auto& w, auto&) { w.back().partial_slot = 1000; },
       ": partial slot 1000, the partial buffers hold"},
      {"KV past the sequence", [](auto& w, auto&) { w[0].kv_end = TokenPosition(50000); },
       "split-KV work item 0: kv_end 50000 is past its sequence's KV length"},
      {"reduce item of sequence -2", [](auto&, auto& r) { r[0].sequence = -2; },
       "split-KV reduce item 0: sequence -2 outside the batch"},
      {"reduce item past the partials", [](auto&, auto& r) { r[0].partial_end = 5000; },
       "split-KV reduce item 0: partial_end 5000 is past the"},
      {"reduce item before the partials", [](auto&, auto& r) { r[0].partial_begin = -1; },
       "split-KV reduce item 0: partial_begin -1 is negative"},
  };
  DeviceBuffer<uint32_t> counters = Upload(std::vector<uint32_t>(plan->reduce.size() * 32, 0));
  for (const Case& c : cases) {
    for (bool fused : {false, true}) {
      SCOPED_TRACE(::testing::Message() << c.what << (fused ? ", merged in the attention launch" : ""));
      std::vector<SplitKvWorkItem> work(plan->work);
      std::vector<SplitKvReduceItem> reduce(plan->reduce);
      c.edit(work, reduce);
      DeviceBuffer<SplitKvWorkItem> d_work = Upload(work);
      DeviceBuffer<SplitKvReduceItem> d_reduce = Upload(reduce);
      // A launch that records a violation may leave the counters nonzero (the launcher's
      // contract): each case starts from zero.
      ASSERT_EQ(hipMemset(counters.data(), 0, counters.size() * sizeof(uint32_t)), hipSuccess);
      PagedDecodeArgs a;
      a.dims = p.dims;
      a.q = d.q.const_span();
      a.k_pool = d.k.const_span();
      a.v_pool = d.v.const_span();
      a.kv = d.TokenLevel();
      a.split = DecodeSplitKv{&*plan, d_work.const_span(), d_reduce.const_span(), partial_out.span(),
                              partial_lse.span(), fused ? counters.span() : DeviceSpan<uint32_t>()};
      a.out = out.span();
      a.lse = lse.span();
      ASSERT_TRUE(PagedDecodeAttention(a, word_->device(), nullptr).ok());
      ExpectViolation(c.words);
    }
  }
}

// A work item that writes its sequence's output (no partial slot) must attend to all of the
// sequence: a copy of a plan made one decode step earlier (kv_end one short) or one starting
// past token 0 is recorded, where before the output was silently that of part of the sequence.
// The plan's items as made pass unrecorded.
TEST_F(GuardDecodeGpuTest, DirectItemShortOfItsSequenceIsRecorded) {
  const Problem p = MakeProblem(Dims(32, 8, 128, KvElementType::kBf16), 16, {700, 900}, 102);
  const DeviceProblem d = ToDevice(p);
  // One multiprocessor: the batch alone fills it, so each sequence has one direct item.
  auto plan = PlanDecodeSplitKv(p.metadata.kv_indptr, KvLayout::LinearPerToken(),
                                DecodeSplitOptions{1, 8, 2});
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->work.size(), 2u);
  ASSERT_TRUE(plan->reduce.empty());
  for (int i = 0; i < 2; ++i) {
    ASSERT_EQ(plan->work[i].sequence, i);
    ASSERT_LT(plan->work[i].partial_slot, 0);
    ASSERT_EQ(plan->work[i].kv_begin.value(), 0);
    ASSERT_EQ(plan->work[i].kv_end.value(), i == 0 ? 700 : 900);
  }
  DeviceBuffer<uint8_t> out = *DeviceBuffer<uint8_t>::Create(p.bs() * 32 * 128 * 2);
  DeviceBuffer<float> lse = *DeviceBuffer<float>::Create(p.bs() * 32);
  struct Case {
    const char* what;
    std::function<void(std::vector<SplitKvWorkItem>&)> edit;
    const char* words;  // empty: nothing recorded
  } cases[] = {
      {"the plan as made", [](auto&) {}, ""},
      {"one token short (a stale plan)", [](auto& w) { w[1].kv_end = TokenPosition(899); },
       "split-KV work item 1: writes its sequence's output from 899 of its 900 KV tokens"},
      {"starting past token 0", [](auto& w) { w[0].kv_begin = TokenPosition(16); },
       "split-KV work item 0: writes its sequence's output from 684 of its 700 KV tokens"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    std::vector<SplitKvWorkItem> work(plan->work);
    c.edit(work);
    DeviceBuffer<SplitKvWorkItem> d_work = Upload(work);
    DeviceBuffer<SplitKvReduceItem> d_reduce = Upload(plan->reduce);
    PagedDecodeArgs a;
    a.dims = p.dims;
    a.q = d.q.const_span();
    a.k_pool = d.k.const_span();
    a.v_pool = d.v.const_span();
    a.kv = d.TokenLevel();
    a.split = DecodeSplitKv{&*plan, d_work.const_span(), d_reduce.const_span(), {}, {}, {}};
    a.out = out.span();
    a.lse = lse.span();
    ASSERT_TRUE(PagedDecodeAttention(a, word_->device(), nullptr).ok());
    if (*c.words == '\0') {
      const absl::Status s = word_->Check(nullptr);
      EXPECT_TRUE(s.ok()) << s;
    } else {
      ExpectViolation(c.words);
    }
  }
}

// Launches that may overlap the kernel ahead of them (PagedDecodeArgs::overlap). The kernel
// ahead lets the decode start at once and writes only after half a millisecond.
class OverlapDecodeGpuTest : public testing::ViolationWordGpuTest {
 protected:
  void SetUp() override {
    testing::ViolationWordGpuTest::SetUp();
    if (HasFatalFailure()) return;
    ASSERT_EQ(hipStreamCreate(&stream_), hipSuccess);
  }
  void TearDown() override {
    if (stream_ != nullptr) {
      EXPECT_EQ(hipStreamDestroy(stream_), hipSuccess);
    }
  }
  KernelAhead Ahead(std::initializer_list<testing::SpinCopy> copies, DecodeLaunchOverlap overlap,
                    bool captured = false) const {
    return KernelAhead{stream_, testing::CopiesOf(copies), overlap, captured};
  }
  void ExpectAnOverlappingProbeStartsFirst() { testing::ExpectAnOverlappingProbeStartsFirst(stream_); }
  static const char* NameOf(DecodeLaunchOverlap overlap) {
    switch (overlap) {
      case DecodeLaunchOverlap::kNone:
        return "plain launch";
      case DecodeLaunchOverlap::kWaitFirst:
        return "waits first";
      case DecodeLaunchOverlap::kMetadataFirst:
        return "metadata first";
      case DecodeLaunchOverlap::kWarmL2First:
        return "warms L2 first";
    }
    return "?";
  }
  hipStream_t stream_ = nullptr;
};

// The premise of the tests below, on its own.
TEST_F(OverlapDecodeGpuTest, AnOverlappingLaunchStartsBeforeTheKernelAheadEnds) {
  if (!LaunchesOverlap()) {
    GTEST_SKIP() << testing::kNoOverlapHere;
  }
  ExpectAnOverlappingProbeStartsFirst();
}

// Q, K and V hold NaNs until the kernel ahead overwrites them at its end (as a kernel that
// writes Q and the new tokens' K and V would): an overlapping launch, any mode, reads them
// only after waiting for it, and its results are the reference's, without a split, with the
// partials merged in the launch and by a merge launch, through kv_indices and the page table,
// at head dims 128 and 256 (Q in shared memory), launched on the stream and replayed from a
// graph.
TEST_F(OverlapDecodeGpuTest, OverlappingLaunchReadsWhatTheKernelAheadWritesAfterIt) {
  if (LaunchesOverlap()) ExpectAnOverlappingProbeStartsFirst();
  for (const DecodeLaunchOverlap overlap :
       {DecodeLaunchOverlap::kWaitFirst, DecodeLaunchOverlap::kMetadataFirst,
        DecodeLaunchOverlap::kWarmL2First}) {
    SCOPED_TRACE(NameOf(overlap));
    for (const DecodeAttentionDims& dims :
         {Dims(32, 8, 128, KvElementType::kBf16), Dims(16, 4, 256, KvElementType::kFp16)}) {
      SCOPED_TRACE(::testing::Message() << "head dim " << dims.head_dim);
      const Problem p = MakeProblem(dims, 16, {1000, 37, 300, 64}, 111);
      const DeviceProblem d = ToDevice(p);
      const std::vector<PageId> table(p.metadata.page_table.span().entries().begin(),
                                      p.metadata.page_table.span().entries().end());
      const DeviceProblem e{Upload(std::vector<uint8_t>(d.q.size(), 0xff)),
                            Upload(std::vector<uint8_t>(d.k.size(), 0xff)),
                            Upload(std::vector<uint8_t>(d.v.size(), 0xff)),
                            Upload(p.metadata.kv_indptr),
                            Upload(p.metadata.kv_indices),
                            Upload(table),
                            Upload(p.metadata.kv_lens),
                            d.cols,
                            d.page_size};
      auto blocks_per_item = DecodeBlocksPerWorkItem(dims, 0);
      ASSERT_TRUE(blocks_per_item.ok()) << blocks_per_item.status();
      for (const DecodeKv& kv : {e.TokenLevel(), e.PageLevel()}) {
        auto plan = PlanDecodeSplitKv(p.metadata.kv_indptr, DecodeKvLayout(kv),
                                      DecodeSplitOptions{132, *blocks_per_item});
        ASSERT_TRUE(plan.ok()) << plan.status();
        ASSERT_FALSE(plan->reduce.empty());
        DeviceBuffer<uint32_t> counters =
            Upload(std::vector<uint32_t>(plan->reduce.size() * p.dims.num_q_heads, 0));
        struct Case {
          const char* name;
          const SplitKvPlan* plan;
          DeviceSpan<uint32_t> counters;
        } cases[] = {{"no split", nullptr, {}},
                     {"merged in the launch", &*plan, counters.span()},
                     {"merge launch", &*plan, {}}};
        for (const Case& c : cases) {
          // Each kernel loaded (and the real inputs checked) by a launch with nothing ahead.
          ExpectMatches(p, RunDecodeOnce(p.dims, d, p.bs(), kv, c.plan, 0, nullptr, c.counters));
          for (bool captured : {false, true}) {
            SCOPED_TRACE(::testing::Message()
                         << (kv.index() == 0 ? "token-level, " : "page table, ") << c.name
                         << (captured ? ", captured" : ""));
            for (const DeviceBuffer<uint8_t>* b : {&e.q, &e.k, &e.v}) {
              ASSERT_EQ(hipMemset(b->data(), 0xff, b->size()), hipSuccess);
            }
            const KernelAhead ahead =
                Ahead({CopyOf(e.q, d.q), CopyOf(e.k, d.k), CopyOf(e.v, d.v)}, overlap, captured);
            const Result r = RunDecodeOnce(p.dims, e, p.bs(), kv, c.plan, 0, word_->device(),
                                           c.counters, /*device_plan=*/false, &ahead);
            ExpectMatches(p, r);
            EXPECT_TRUE(word_->Check(nullptr).ok());
          }
        }
      }
    }
  }
}

// Violations found before the wait are recorded after it: the kernel ahead clears the
// violation word at its end (as the staged uploads' apply kernel does at the head of a replay),
// and the violation is still there after the launch, in any overlapping mode. Corrupted lengths
// (the block goes on) and a device plan's work item naming a sequence outside the batch (the block
// stops).
TEST_F(OverlapDecodeGpuTest, ViolationsFoundBeforeTheWaitAreRecordedAfterIt) {
  if (LaunchesOverlap()) ExpectAnOverlappingProbeStartsFirst();
  const Problem p = MakeProblem(Dims(32, 8, 128, KvElementType::kBf16), 16, {100, 60, 800}, 113);
  const DeviceProblem d = ToDevice(p);
  DeviceBuffer<uint8_t> zeros = Upload(std::vector<uint8_t>(sizeof(kernels::DeviceViolation), 0));
  for (const DecodeLaunchOverlap overlap :
       {DecodeLaunchOverlap::kWaitFirst, DecodeLaunchOverlap::kMetadataFirst,
        DecodeLaunchOverlap::kWarmL2First}) {
    SCOPED_TRACE(NameOf(overlap));
    const KernelAhead ahead = Ahead({testing::SpinCopy{word_->device(), zeros.data(),
                                                       static_cast<int64_t>(zeros.size())}},
                                    overlap);
    {
      SCOPED_TRACE("indptr decreasing");
      const int32_t total = p.metadata.kv_indptr.back().value();
      DeviceBuffer<TokenOffset> indptr = Upload(std::vector<TokenOffset>{
          TokenOffset(0), TokenOffset(100), TokenOffset(50), TokenOffset(total)});
      const DecodeKv kv = DecodeTokenLevelKv{indptr.const_span(), d.kv_indices.const_span()};
      RunDecodeOnce(p.dims, d, p.bs(), kv, nullptr, 0, nullptr, {});  // loads the kernel
      const Result r = RunDecodeOnce(p.dims, d, p.bs(), kv, nullptr, 0, word_->device(), {},
                                     /*device_plan=*/false, &ahead);
      ASSERT_TRUE(r.status.ok()) << r.status;
      ExpectViolation("below the entry");
      ExpectAllFinite(r);
      ExpectRow(p, r, 0, 0);
    }
    {
      SCOPED_TRACE("work item outside the batch");
      auto plan = PlanDecodeSplitKv(p.metadata.kv_indptr, KvLayout::LinearPerToken(),
                                    DecodeSplitOptions{132, 8});
      ASSERT_TRUE(plan.ok()) << plan.status();
      ASSERT_FALSE(plan->reduce.empty());
      SplitKvPlan bad = *plan;
      bad.work[0].sequence = 99;
      RunDecodeOnce(p.dims, d, p.bs(), d.TokenLevel(), &*plan, 0, nullptr, {});  // loads it
      const Result r = RunDecodeOnce(p.dims, d, p.bs(), d.TokenLevel(), &bad, 0, word_->device(),
                                     {}, /*device_plan=*/true, &ahead);
      ASSERT_TRUE(r.status.ok()) << r.status;
      ExpectViolation("split-KV work item 0: sequence 99 outside the batch");
    }
  }
}

// The default mode and kWarmL2First are safe after a kernel that writes the metadata (as the
// fused decode metadata or a graph replay's writer does): the kernel ahead writes the lengths
// and the index entries at its end (before: kv_indptr entries far past kv_indices or zero,
// zero lengths for the page table, slots outside the pool), and, for a plan held on the device, the
// plan's work and reduce items (cleared to -1 before); a launch that waits first, one that
// warms L2 from those stale values first (every address clamped: an unclamped one reads far
// outside the buffers), or a plain launch, reads what it wrote, without a split and with the
// partials merged in the launch, through kv_indices and the page table, on the stream and in a
// graph. Where launches cannot overlap (LaunchesOverlap) every launch here is a plain one.
TEST_F(OverlapDecodeGpuTest, WaitingFirstReadsTheMetadataTheKernelAheadWrites) {
  if (LaunchesOverlap()) ExpectAnOverlappingProbeStartsFirst();
  const Problem p = MakeProblem(Dims(32, 8, 128, KvElementType::kBf16), 16, {700, 60, 333}, 117);
  const DeviceProblem d = ToDevice(p);
  DeviceBuffer<TokenOffset> indptr = Upload(p.metadata.kv_indptr);
  DeviceBuffer<TokenSlot> indices = Upload(p.metadata.kv_indices);
  DeviceBuffer<PageId> table = Upload(Download(d.page_table));
  DeviceBuffer<TokenLength> lens = Upload(p.metadata.kv_lens);
  auto blocks_per_item = DecodeBlocksPerWorkItem(p.dims, 0);
  ASSERT_TRUE(blocks_per_item.ok()) << blocks_per_item.status();
  for (const DecodeKv& kv :
       {DecodeKv(DecodeTokenLevelKv{indptr.const_span(), indices.const_span()}),
        DecodeKv(DecodePageTableKv{table.const_span(), d.cols, lens.const_span(), d.page_size})}) {
    auto plan = PlanDecodeSplitKv(p.metadata.kv_indptr, DecodeKvLayout(kv),
                                  DecodeSplitOptions{132, *blocks_per_item});
    ASSERT_TRUE(plan.ok()) << plan.status();
    ASSERT_FALSE(plan->reduce.empty());
    DeviceBuffer<uint32_t> counters =
        Upload(std::vector<uint32_t>(plan->reduce.size() * p.dims.num_q_heads, 0));
    struct Case {
      const char* name;
      const SplitKvPlan* plan;
      bool device_plan;  // the plan held on the device and written by the kernel ahead
    } cases[] = {{"no split", nullptr, false},
                 {"split", &*plan, false},
                 {"split, the plan written ahead", &*plan, true}};
    for (const Case& k : cases) {
      const DeviceSpan<uint32_t> c = k.plan != nullptr ? counters.span() : DeviceSpan<uint32_t>();
      ExpectMatches(p, RunDecodeOnce(p.dims, d, p.bs(), kv, k.plan, 0, nullptr, c,
                                     k.device_plan));  // loads it
      for (const DecodeLaunchOverlap overlap :
           {DecodeLaunchOverlap::kWaitFirst, DecodeLaunchOverlap::kWarmL2First,
            DecodeLaunchOverlap::kNone}) {
        for (bool captured : {false, true}) {
          SCOPED_TRACE(::testing::Message()
                       << (kv.index() == 0 ? "token-level, " : "page table, ")
                       << k.name << ", " << NameOf(overlap)
                       << (captured ? ", captured" : ""));
          // Cleared here, rewritten by the kernel ahead: this source's two arrays. The stale
          // kv_indptr lies far past kv_indices on the stream (a warm-up must clamp it) and is
          // zero in the graph (a warm-up then reaches the stale slots outside the pool).
          if (kv.index() == 0) {
            ASSERT_EQ(
                hipMemset(indptr.data(), captured ? 0 : 0x7f, indptr.size() * sizeof(TokenOffset)),
                hipSuccess);
            ASSERT_EQ(hipMemset(indices.data(), 0x7f, indices.size() * sizeof(TokenSlot)),
                      hipSuccess);
          } else {
            ASSERT_EQ(hipMemset(lens.data(), 0, lens.size() * sizeof(TokenLength)), hipSuccess);
            ASSERT_EQ(hipMemset(table.data(), 0x7f, table.size() * sizeof(PageId)), hipSuccess);
          }
          KernelAhead ahead =
              kv.index() == 0
                  ? Ahead({CopyOf(indptr, d.kv_indptr), CopyOf(indices, d.kv_indices)}, overlap,
                          captured)
                  : Ahead({CopyOf(lens, d.kv_lens), CopyOf(table, d.page_table)}, overlap,
                          captured);
          ahead.writes_plan = k.device_plan;
          const Result r = RunDecodeOnce(p.dims, d, p.bs(), kv, k.plan, 0, word_->device(), c,
                                         k.device_plan, &ahead);
          ASSERT_TRUE(r.status.ok()) << r.status;
          EXPECT_TRUE(word_->Check(nullptr).ok()) << word_->Check(nullptr);
          ExpectMatches(p, r);
        }
      }
    }
  }
}

// Which launches ask to overlap the node ahead: captured in a graph after a kernel, the
// attention launch of each overlapping mode hangs on a programmatic edge, and so does a split
// plan's merge launch after it; a plain launch on none. Deterministic, unlike the tests above,
// and so run under the sanitizer too. (No launch asks where launches cannot overlap.)
TEST_F(OverlapDecodeGpuTest, CapturedLaunchesAskToOverlapInTheOverlappingModesOnly) {
  absl::StatusOr<bool> can = DeviceOverlapsLaunches();
  ASSERT_TRUE(can.ok()) << can.status();
  const Problem p = MakeProblem(Dims(32, 8, 128, KvElementType::kBf16), 16, {900, 60, 333}, 119);
  const DeviceProblem d = ToDevice(p);
  auto plan = PlanDecodeSplitKv(p.metadata.kv_indptr, KvLayout::LinearPerToken(),
                                DecodeSplitOptions{132, 8});
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_FALSE(plan->reduce.empty());
  DeviceBuffer<SplitKvWorkItem> work = Upload(plan->work);
  DeviceBuffer<SplitKvReduceItem> reduce = Upload(plan->reduce);
  DeviceBuffer<float> partial_out =
      *DeviceBuffer<float>::Create(plan->num_partials * p.dims.num_q_heads * p.dims.head_dim);
  DeviceBuffer<float> partial_lse =
      *DeviceBuffer<float>::Create(plan->num_partials * p.dims.num_q_heads);
  DeviceBuffer<uint8_t> out =
      *DeviceBuffer<uint8_t>::Create(p.bs() * p.dims.num_q_heads * p.dims.head_dim * 2);
  DeviceBuffer<float> lse = *DeviceBuffer<float>::Create(p.bs() * p.dims.num_q_heads);
  for (const DecodeLaunchOverlap overlap :
       {DecodeLaunchOverlap::kNone, DecodeLaunchOverlap::kWaitFirst,
        DecodeLaunchOverlap::kMetadataFirst, DecodeLaunchOverlap::kWarmL2First}) {
    for (bool merge_launch : {false, true}) {
      SCOPED_TRACE(::testing::Message() << NameOf(overlap)
                                        << (merge_launch ? ", merge launch" : ", no split"));
      PagedDecodeArgs a;
      a.dims = p.dims;
      a.q = d.q.const_span();
      a.k_pool = d.k.const_span();
      a.v_pool = d.v.const_span();
      a.kv = d.TokenLevel();
      if (merge_launch) {
        a.split = DecodeSplitKv{&*plan, work.const_span(), reduce.const_span(),
                                partial_out.span(), partial_lse.span(), {}};
      }
      a.out = out.span();
      a.lse = lse.span();
      a.overlap = overlap;
      ASSERT_EQ(hipStreamBeginCapture(stream_, hipStreamCaptureModeThreadLocal), hipSuccess);
      const hipError_t ahead = testing::LaunchSpinThenCopy(0, testing::SpinCopies{}, stream_);
      const absl::Status launched = PagedDecodeAttention(a, word_->device(), stream_);
      hipGraph_t graph = nullptr;
      ASSERT_EQ(hipStreamEndCapture(stream_, &graph), hipSuccess);
      ASSERT_EQ(ahead, hipSuccess);
      ASSERT_TRUE(launched.ok()) << launched;
      int64_t programmatic = -1;
      EXPECT_EQ(CountProgrammaticGraphEdges(graph, &programmatic), hipSuccess);
      const int64_t want =
          overlap == DecodeLaunchOverlap::kNone || !*can ? 0 : (merge_launch ? 2 : 1);
      EXPECT_EQ(programmatic, want);
      EXPECT_EQ(hipGraphDestroy(graph), hipSuccess);
    }
  }
  EXPECT_EQ(hipStreamSynchronize(stream_), hipSuccess);
  EXPECT_TRUE(word_->Check(nullptr).ok());
}

// What kMetadataFirst's REQUIRES is for: the metadata is read before the wait. Here
// the kernel ahead writes the lengths (all zero before): the launch sees every sequence empty
// (output 0, lse -inf), which also shows that the launcher asked for the overlap, on the stream
// and in a graph.
TEST_F(OverlapDecodeGpuTest, OverlappingLaunchReadsTheLengthsBeforeTheWait) {
  if (!LaunchesOverlap()) {
    GTEST_SKIP() << testing::kNoOverlapHere;
  }
  const Problem p = MakeProblem(Dims(32, 8, 128, KvElementType::kBf16), 16, {100, 60, 80}, 115);
  const DeviceProblem d = ToDevice(p);
  DeviceBuffer<TokenOffset> indptr = Upload(std::vector<TokenOffset>(d.kv_indptr.size(), TokenOffset(0)));
  DeviceBuffer<TokenLength> lens = Upload(std::vector<TokenLength>(d.kv_lens.size(), TokenLength(0)));
  for (const DecodeKv& kv :
       {DecodeKv(DecodeTokenLevelKv{indptr.const_span(), d.kv_indices.const_span()}),
        DecodeKv(DecodePageTableKv{d.page_table.const_span(), d.cols, lens.const_span(), d.page_size})}) {
    RunDecodeOnce(p.dims, d, p.bs(), kv, nullptr, 0, nullptr, {});  // loads the kernel
    for (bool captured : {false, true}) {
      SCOPED_TRACE(::testing::Message() << (kv.index() == 0 ? "token-level" : "page table")
                                        << (captured ? ", captured" : ""));
      ASSERT_EQ(hipMemset(indptr.data(), 0, indptr.size() * sizeof(TokenOffset)), hipSuccess);
      ASSERT_EQ(hipMemset(lens.data(), 0, lens.size() * sizeof(TokenLength)), hipSuccess);
      const KernelAhead ahead = Ahead({CopyOf(indptr, d.kv_indptr), CopyOf(lens, d.kv_lens)},
                                      DecodeLaunchOverlap::kMetadataFirst, captured);
      const Result r = RunDecodeOnce(p.dims, d, p.bs(), kv, nullptr, 0, word_->device(), {},
                                     /*device_plan=*/false, &ahead);
      ASSERT_TRUE(r.status.ok()) << r.status;
      EXPECT_TRUE(word_->Check(nullptr).ok());
      for (float x : r.out) ASSERT_EQ(x, 0.0f);
      for (float x : r.lse) ASSERT_EQ(x, -kInf);
      // The kernel ahead did write them: a launch after it reads the real lengths.
      ExpectMatches(p, RunDecodeOnce(p.dims, d, p.bs(), kv, nullptr, 0, nullptr, {}));
    }
  }
}

// A plan held only on the device (as a graph replay leaves it: items in buffers larger than
// its counts, the host knowing only the counts) runs as its host copy does, bit for bit, merged
// by a second launch and in the attention launch. A device plan whose last sequence has no
// item (as a padded row of a graph bucket has none) leaves that row unwritten, the others right.
TEST_F(GuardDecodeGpuTest, DevicePlanRunsAsItsHostCopy) {
  // The last sequence is shorter than any split: one direct item, no partial slot.
  const Problem p =
      MakeProblem(Dims(32, 8, 128, KvElementType::kBf16), 16, {900, 1500, 260, 17}, 83);
  const DeviceProblem d = ToDevice(p);
  auto plan = PlanDecodeSplitKv(p.metadata.kv_indptr, KvLayout::LinearPerToken(),
                                DecodeSplitOptions{16, 8, /*blocks_per_multiprocessor=*/8});
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_GT(plan->num_partials, 0);
  const std::vector<uint32_t> zeros(plan->reduce.size() * 32, 0);
  DeviceBuffer<uint32_t> counters = Upload(zeros);
  for (bool in_launch : {false, true}) {
    SCOPED_TRACE(in_launch ? "merged in the attention launch" : "merge launch");
    const DeviceSpan<uint32_t> c = in_launch ? counters.span() : DeviceSpan<uint32_t>();
    const Result host = RunDecodeOnce(p.dims, d, p.bs(), d.TokenLevel(), &*plan, 0, nullptr, c);
    const Result device = RunDecodeOnce(p.dims, d, p.bs(), d.TokenLevel(), &*plan, 0,
                                        word_->device(), c, /*device_plan=*/true);
    EXPECT_TRUE(word_->Check(nullptr).ok())
        << "an item past the counts was read: " << word_->Check(nullptr);
    ExpectMatches(p, device);
    EXPECT_EQ(device.out_bytes, host.out_bytes);
    EXPECT_EQ(device.lse, host.lse);
    EXPECT_EQ(Download(counters), zeros) << "counters left nonzero";
  }

  SplitKvPlan missing = *plan;
  const int32_t last = static_cast<int32_t>(p.bs()) - 1;
  ASSERT_EQ(std::count_if(
                plan->work.begin(), plan->work.end(),
                [&](const SplitKvWorkItem& w) { return w.sequence == last && w.partial_slot < 0; }),
            1);
  missing.work.erase(std::remove_if(missing.work.begin(), missing.work.end(),
                                    [&](const SplitKvWorkItem& w) { return w.sequence == last; }),
                     missing.work.end());
  missing.reduce.erase(
      std::remove_if(missing.reduce.begin(), missing.reduce.end(),
                     [&](const SplitKvReduceItem& r) { return r.sequence == last; }),
      missing.reduce.end());
  const Result r =
      RunDecodeOnce(p.dims, d, p.bs(), d.TokenLevel(), &missing, 0, word_->device(), {},
                    /*device_plan=*/true);
  ASSERT_TRUE(r.status.ok()) << r.status;
  EXPECT_TRUE(word_->Check(nullptr).ok()) << word_->Check(nullptr);
  for (int64_t i = 0; i < last; ++i) ExpectRow(p, r, i, i);
  const int64_t row_bytes = int64_t{32} * 128 * 2;
  for (int64_t b = last * row_bytes; b < (last + 1) * row_bytes; ++b) {
    ASSERT_EQ(r.out_bytes[b], 0xff) << "the row without an item written at byte " << b;
  }
  for (int64_t h = 0; h < 32; ++h)
    ASSERT_TRUE(std::isnan(r.lse[last * 32 + h])) << "lse head " << h;
}

}  // namespace
}  // namespace attnmeta
