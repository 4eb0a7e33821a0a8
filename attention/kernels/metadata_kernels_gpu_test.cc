// GPU tests of the metadata kernels: each device twin produces exactly the host builder's
// arrays (page sizes 1, 7, 16 and 64, pools laid out by the real allocator with shuffled
// pages, outputs poisoned first and their tails checked untouched), and corrupted
// device-resident metadata is clamped and named by the violation word instead of being read
// out of bounds (the bundle also runs this binary under compute-sanitizer memcheck).
// Needs a GPU: fails when none is visible.

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "attention/graph/graph_state.h"
#include "attention/graph/host_metadata_writer.h"
#include "attention/graph/metadata_writer.h"
#include "attention/kernels/device_violation_word.h"
#include "attention/kernels/metadata_kernels.h"
#include "attention/kernels/metadata_kernels_launch.h"
#include "attention/kernels/metadata_launchers.h"
#include "attention/kernels/testing/device_buffer.h"
#include "attention/kernels/testing/gpu_test.h"
#include "attention/kernels/testing/overlap.h"
#include "attention/kernels/testing/spin.h"
#include "attention/kernels/testing/upload.h"
#include "attention/kernels/token_kv_indices.h"
#include "attention/metadata/builders.h"
#include "attention/metadata/context_gather.h"
#include "attention/metadata/custom_mask.h"
#include "attention/metadata/draft_decode_layout.h"
#include "attention/metadata/split_kv_planner.h"
#include "attention/metadata/testing/batch_fixture.h"
#include "gtest/gtest.h"

namespace attnmeta {
namespace {

using testing::BatchFixture;
using testing::DeviceBuffer;
using testing::BytesOf;
using testing::Download;
using testing::Upload;

class GpuTest : public testing::ViolationWordGpuTest {
 public:
  kernels::DeviceViolation* violation() { return word_->device(); }
  // The recorded violation, then clears the word for the next launch.
  absl::Status Violations() {
    const absl::Status s = word_->Check(nullptr);
    EXPECT_TRUE(word_->Reset(nullptr).ok());
    return s;
  }
};

class PageSizeGpuTest : public GpuTest, public ::testing::WithParamInterface<int64_t> {};

// A batch of `n` sequences with random cached lengths and `new_tokens` each.
BatchFixture MakeBatch(int64_t ps, int n, int64_t max_cached, int64_t new_tokens, uint64_t seed) {
  BatchFixture f(ps, seed, /*num_pages=*/n * (max_cached + new_tokens) / ps + n + 8,
                 /*max_reqs=*/n + 4, /*max_context=*/max_cached + new_tokens + 16);
  std::mt19937_64 rng(seed);
  for (int i = 0; i < n; ++i) {
    f.AddSequence(std::uniform_int_distribution<int64_t>(0, max_cached)(rng), new_tokens);
  }
  return f;
}

DeviceReqToToken DeviceTable(const BatchFixture& f, DeviceBuffer<TokenSlot>& table) {
  std::vector<TokenSlot> host(f.pool().table().begin(), f.pool().table().end());
  table = Upload(host);
  return DeviceReqToToken{table.const_span(), f.pool().max_context_len()};
}

TEST_P(PageSizeGpuTest, IndptrAndLastPageLenEqualTheHostBuilders) {
  const PageSize ps = *PageSize::Create(GetParam());
  std::mt19937_64 rng(GetParam());
  for (int n : {0, 1, 1000, 3000}) {
    SCOPED_TRACE(::testing::Message() << "n " << n << " page_size " << GetParam());
    std::vector<TokenLength> lens(n);
    for (TokenLength& l : lens) l = TokenLength(std::uniform_int_distribution<int32_t>(0, 9000)(rng));
    std::vector<TokenOffset> want_indptr(n + 1);
    std::vector<TokenLength> want_last(n);
    ASSERT_TRUE(BuildIndptr(lens, absl::MakeSpan(want_indptr)).ok());
    ASSERT_TRUE(BuildKvLastPageLen(lens, ps, absl::MakeSpan(want_last)).ok());
    DeviceBuffer<TokenLength> d_lens = Upload(lens);
    DeviceBuffer<TokenOffset> d_indptr = Upload(std::vector<TokenOffset>(n + 1, TokenOffset(-5)));
    DeviceBuffer<TokenLength> d_last = Upload(std::vector<TokenLength>(n, TokenLength(-5)));
    ASSERT_TRUE(BuildIndptrOnDevice(d_lens.const_span(), d_indptr.span(), d_last.span(), ps,
                                    violation(), nullptr)
                    .ok());
    EXPECT_EQ(Download(d_indptr), want_indptr);
    EXPECT_EQ(Download(d_last), want_last);
    EXPECT_TRUE(Violations().ok()) << Violations();
  }
}

TEST_P(PageSizeGpuTest, PageTableEqualsTheHostBuilderAndKeepsRowsPastTheBatch) {
  const BatchFixture f = MakeBatch(GetParam(), 20, 700, 1, 10 + GetParam());
  const int64_t bs = 20;
  const int64_t cols = (720 + GetParam() - 1) / GetParam() + 3;
  PageTable want(bs, PageCount(cols));
  ASSERT_TRUE(BuildPageTable(f.pool(), f.rows(), f.kv_lens(), f.page_size(), want.span()).ok());
  DeviceBuffer<TokenSlot> table = Upload(std::vector<TokenSlot>{});
  const DeviceReqToToken src = DeviceTable(f, table);
  DeviceBuffer<ReqPoolIndex> rows = Upload(f.rows());
  DeviceBuffer<TokenLength> lens = Upload(f.kv_lens());
  // Two extra rows past the batch: the kernel must leave them.
  DeviceBuffer<PageId> out = Upload(std::vector<PageId>((bs + 2) * cols, PageId(77)));
  ASSERT_TRUE(BuildPageTableOnDevice(src, f.pool_slots(), rows.const_span(), lens.const_span(),
                                     f.page_size(), out.span(), PageCount(cols), violation(), nullptr)
                  .ok());
  const std::vector<PageId> got = Download(out);
  const absl::Span<const PageId> w = want.span().entries();
  EXPECT_EQ(std::vector<PageId>(got.begin(), got.begin() + bs * cols),
            std::vector<PageId>(w.begin(), w.end()));
  EXPECT_EQ(std::vector<PageId>(got.begin() + bs * cols, got.end()),
            std::vector<PageId>(2 * cols, PageId(77)));
  EXPECT_TRUE(Violations().ok()) << Violations();
}

// A kernel ahead of the fused launch on `stream`: it spins for about half a millisecond and
// then writes the launch's inputs (rows, lengths and req_to_token, zero until then), as the
// kernels of a step write them; the launch follows with overlap_preceding_kernel = `overlap`.
// `captured`: both are captured in a graph (whose programmatic edges are counted), replayed
// once. `memset_between`: a memset right before the launch, so that the node ahead of it is
// not a kernel (no programmatic edge then, and the launch waits for everything ahead).
struct FusedAhead {
  hipStream_t stream = nullptr;
  bool overlap = true;
  bool captured = false;
  bool memset_between = false;
};

// The fused launch against the host writer over the same padded batch (real rows, then
// padded rows staged as GraphState stages them: kPaddedRow, q query rows, PaddedRowKvLen).
// The fused launch over `real` random sequences (cached lengths up to max_cached, q new tokens
// each) padded to `padded` rows equals the host writer, every output poisoned first.
// row_blocks 0: through BuildDecodeMetadataOnDevice (its grid), after `ahead` when not null;
// else the kernel launched directly with that many blocks per row.
void ExpectFusedEqualsTheHostWriter(GpuTest& test, int64_t ps, int real, int64_t padded,
                                    int64_t max_cached, int64_t q, uint64_t seed,
                                    int32_t row_blocks = 0, const FusedAhead* ahead = nullptr) {
  SCOPED_TRACE(::testing::Message() << "q " << q << " page_size " << ps << " rows " << real
                                    << " seed " << seed << " row_blocks " << row_blocks);
  {
    const BatchFixture f = MakeBatch(ps, real, max_cached, q, seed);
    std::vector<ReqPoolIndex> rows(f.rows());
    std::vector<TokenLength> kv(f.kv_lens());
    std::vector<TokenLength> qs(real, TokenLength(static_cast<int32_t>(q)));
    const TokenLength padded_kv = GraphState::PaddedRowKvLen(qs.front());
    rows.resize(padded, ReqPoolIndex(kernels::kPaddedRow));
    kv.resize(padded, padded_kv);
    qs.resize(padded, TokenLength(static_cast<int32_t>(q)));
    const int64_t row_tokens = max_cached + 100;
    const int64_t cols = (row_tokens + ps - 1) / ps + 2;
    const int64_t capacity = padded * row_tokens;
    // The host writer's result.
    std::vector<TokenOffset> h_kv_indptr(padded + 1), h_qo_indptr(padded + 1);
    std::vector<TokenLength> h_last(padded);
    std::vector<TokenSlot> h_indices(capacity, TokenSlot(-9));
    std::vector<PageId> h_table(padded * cols, PageId(-9));
    GraphBuffers hb;
    hb.req_rows = absl::MakeSpan(rows);
    hb.kv_lens = absl::MakeSpan(kv);
    hb.q_lens = absl::MakeSpan(qs);
    hb.kv_indptr = absl::MakeSpan(h_kv_indptr);
    hb.qo_indptr = absl::MakeSpan(h_qo_indptr);
    hb.kv_last_page_len = absl::MakeSpan(h_last);
    hb.kv_indices = absl::MakeSpan(h_indices);
    hb.page_table =
        *PageTableSpan<PageId>::Create(absl::MakeSpan(h_table), padded, PageCount(cols));
    MetadataWriteRequest req;
    req.mode = q == 1 ? ForwardMode::kDecode : ForwardMode::kExtend;
    req.real_batch_size = real;
    req.padded_batch_size = padded;
    req.padded_kv_len = padded_kv;
    req.page_size = f.page_size();
    req.req_to_token = &f.pool();
    req.page_table = true;
    req.q_len_per_request = TokenLength(static_cast<int32_t>(q));
    HostMetadataWriter host;
    ASSERT_TRUE(host.WriteBatchArrays(req, hb).ok());
    ASSERT_TRUE(host.WriteTokenArrays(req, hb, nullptr).ok());

    DeviceBuffer<TokenSlot> table = Upload(std::vector<TokenSlot>{});
    DecodeMetadataDeviceArgs a;
    a.req_to_token = DeviceTable(f, table);
    a.pool_slots = f.pool_slots();
    a.page_size = f.page_size();
    DeviceBuffer<ReqPoolIndex> d_rows = Upload(rows);
    DeviceBuffer<TokenLength> d_kv = Upload(kv), d_q = Upload(qs);
    // With a kernel ahead: the inputs the launch reads are zero until that kernel copies these
    // over them.
    DeviceBuffer<TokenSlot> real_table = Upload(std::vector<TokenSlot>{});
    DeviceBuffer<ReqPoolIndex> real_rows = Upload(std::vector<ReqPoolIndex>{});
    DeviceBuffer<TokenLength> real_kv = Upload(std::vector<TokenLength>{});
    DeviceBuffer<TokenLength> real_q = Upload(std::vector<TokenLength>{});
    if (ahead != nullptr) {
      real_table = Upload(Download(table));
      real_rows = Upload(rows);
      real_kv = Upload(kv);
      real_q = Upload(qs);
      for (const auto& [ptr, bytes] :
           {std::pair<void*, size_t>{table.data(), table.size() * sizeof(TokenSlot)},
            {d_rows.data(), d_rows.size() * sizeof(ReqPoolIndex)},
            {d_kv.data(), d_kv.size() * sizeof(TokenLength)},
            {d_q.data(), d_q.size() * sizeof(TokenLength)}}) {
        ASSERT_EQ(hipMemset(ptr, 0, bytes), hipSuccess);
      }
    }
    DeviceBuffer<TokenOffset> d_kv_indptr = Upload(std::vector<TokenOffset>(padded + 1, TokenOffset(-9)));
    DeviceBuffer<TokenOffset> d_qo_indptr = Upload(std::vector<TokenOffset>(padded + 1, TokenOffset(-9)));
    DeviceBuffer<TokenLength> d_last = Upload(std::vector<TokenLength>(padded, TokenLength(-9)));
    DeviceBuffer<TokenSlot> d_indices = Upload(std::vector<TokenSlot>(capacity, TokenSlot(-9)));
    DeviceBuffer<PageId> d_table = Upload(std::vector<PageId>(padded * cols, PageId(-9)));
    a.rows = d_rows.const_span();
    a.kv_lens = d_kv.const_span();
    a.q_lens = d_q.const_span();
    a.kv_indptr = d_kv_indptr.span();
    a.qo_indptr = d_qo_indptr.span();
    a.kv_last_page_len = d_last.span();
    a.kv_indices = d_indices.span();
    a.page_table = d_table.span();
    a.page_table_cols = PageCount(cols);
    a.max_kv_len = f.pool().max_context_len();
    if (ahead != nullptr) {
      a.overlap_preceding_kernel = ahead->overlap;
      const testing::SpinCopies copies =
          testing::CopiesOf({testing::CopyOf(table, real_table), testing::CopyOf(d_rows, real_rows),
                             testing::CopyOf(d_kv, real_kv), testing::CopyOf(d_q, real_q)});
      if (ahead->captured) {
        ASSERT_EQ(hipStreamBeginCapture(ahead->stream, hipStreamCaptureModeThreadLocal), hipSuccess);
      }
      hipError_t spun = testing::LaunchSpinThenCopy(testing::kAheadSpinCycles, copies, ahead->stream);
      if (spun == hipSuccess && ahead->memset_between) {
        spun = hipMemsetAsync(real_q.data(), 0, sizeof(TokenLength), ahead->stream);
      }
      const absl::Status launched = BuildDecodeMetadataOnDevice(a, test.violation(), ahead->stream);
      if (ahead->captured) {
        hipGraph_t graph = nullptr;
        ASSERT_EQ(hipStreamEndCapture(ahead->stream, &graph), hipSuccess);
        // The launch asked for the overlap where the device runs one: a programmatic edge.
        int64_t programmatic = -1;
        EXPECT_EQ(CountProgrammaticGraphEdges(graph, &programmatic), hipSuccess);
        const absl::StatusOr<bool> can = DeviceOverlapsLaunches();
        ASSERT_TRUE(can.ok()) << can.status();
        EXPECT_EQ(programmatic, ahead->overlap && *can && !ahead->memset_between ? 1 : 0);
        testing::LaunchGraphOnce(graph, ahead->stream);
      }
      ASSERT_EQ(spun, hipSuccess);
      ASSERT_TRUE(launched.ok()) << launched;
      ASSERT_EQ(hipStreamSynchronize(ahead->stream), hipSuccess);
    } else if (row_blocks == 0) {
      ASSERT_TRUE(BuildDecodeMetadataOnDevice(a, test.violation(), nullptr).ok());
    } else {
      kernels::FusedMetadataParams p;
      const int64_t stride = f.pool().max_context_len().value();
      p.src.req_to_token = reinterpret_cast<const int32_t*>(table.data());
      p.src.stride = stride;
      p.src.max_reqs = static_cast<int32_t>(static_cast<int64_t>(table.size()) / stride);
      p.src.pool_slots = f.pool_slots().value();
      p.src.page_size = static_cast<int32_t>(ps);
      p.src.page_size_log2 = f.page_size().log2();
      p.rows = reinterpret_cast<const int32_t*>(d_rows.data());
      p.kv_lens = reinterpret_cast<const int32_t*>(d_kv.data());
      p.q_lens = reinterpret_cast<const int32_t*>(d_q.data());
      p.kv_indptr = reinterpret_cast<int32_t*>(d_kv_indptr.data());
      p.qo_indptr = reinterpret_cast<int32_t*>(d_qo_indptr.data());
      p.kv_last_page_len = reinterpret_cast<int32_t*>(d_last.data());
      p.kv_indices = reinterpret_cast<int32_t*>(d_indices.data());
      p.kv_indices_capacity = capacity;
      p.page_table = reinterpret_cast<int32_t*>(d_table.data());
      p.page_table_cols = static_cast<int32_t>(cols);
      p.padded_batch = static_cast<int32_t>(padded);
      p.violation = test.violation();
      ASSERT_EQ(kernels::LaunchFusedMetadataKernel(p, row_blocks, /*overlap_preceding=*/false, nullptr), hipSuccess);
    }
    EXPECT_EQ(Download(d_kv_indptr), h_kv_indptr);
    EXPECT_EQ(Download(d_qo_indptr), h_qo_indptr);
    EXPECT_EQ(Download(d_last), h_last);
    EXPECT_EQ(Download(d_indices), h_indices) << "the tail past kv_indptr[B] stays poisoned too";
    EXPECT_EQ(Download(d_table), h_table);
    EXPECT_TRUE(test.Violations().ok()) << test.Violations();
  }
}

TEST_P(PageSizeGpuTest, FusedDecodeMetadataEqualsTheHostWriter) {
  for (int64_t q : {1, 3}) {
    ExpectFusedEqualsTheHostWriter(*this, GetParam(), 12, 16, 900, q, 20 + GetParam() + q);
  }
}

// 700 rows: more than the 256 whose lengths a block loads ahead of its own row's, so that the
// sum of the rows before a row takes the rest in a second loop; with one and more query
// tokens per row (qo_indptr) and more than one block per row (the blocks past a row's first
// sum the KV lengths only).
TEST_P(PageSizeGpuTest, FusedDecodeMetadataPlacesTheRowsOfALargeBatch) {
  for (int64_t q : {1, 2}) {
    for (int32_t row_blocks : {0, 3}) {
      ExpectFusedEqualsTheHostWriter(*this, GetParam(), 700, 704, 2000, q, 130 + GetParam() + q,
                                     row_blocks);
    }
  }
}

// 200 rows of up to 20,000 tokens: more passes per row than the launch gives a row blocks,
// so blocks loop over passes; rows start at every alignment.
TEST_P(PageSizeGpuTest, FusedDecodeMetadataLoopsOverPassesOfLongRows) {
  ExpectFusedEqualsTheHostWriter(*this, GetParam(), 200, 205, 20000, 1, 70 + GetParam());
}

// The kernel's contract holds for any grid, not only the one its launcher picks (which depends
// on the GPU's occupancy): every pass and page-table column written once, with 1 to more than
// the rows' passes blocks per row.
TEST_P(PageSizeGpuTest, FusedKernelCoversEveryPassForAnyRowBlocks) {
  for (int32_t row_blocks : {1, 2, 3, 5, 11, 40}) {
    ExpectFusedEqualsTheHostWriter(*this, GetParam(), 30, 33, 9000, 1, 90 + GetParam(), row_blocks);
  }
}

// The fused launch after a kernel that writes its inputs at its end (rows, lengths,
// req_to_token), as a step's kernels and a replay's staged uploads do: launched to overlap
// that kernel (the default) it waits for it before reading them, on the stream and in a
// graph, and its arrays are the host writer's. Where launches overlap (LaunchesOverlap) the
// launch starts while that kernel spins, so a read before the wait would see zeros; a plain
// launch is checked too.
TEST_P(PageSizeGpuTest, FusedLaunchWaitsForTheKernelAheadThatWritesItsInputs) {
  hipStream_t stream = nullptr;
  ASSERT_EQ(hipStreamCreate(&stream), hipSuccess);
  if (testing::LaunchesOverlap()) testing::ExpectAnOverlappingProbeStartsFirst(stream);
  // Loads the kernel and asks the launcher's device figures once: a first launch waits for
  // the kernels running, which would keep the first case below from overlapping.
  ExpectFusedEqualsTheHostWriter(*this, GetParam(), 40, 45, 3000, 1, 110 + GetParam());
  for (bool overlap : {true, false}) {
    for (bool captured : {false, true}) {
      for (bool memset_between : {false, true}) {
        SCOPED_TRACE(::testing::Message() << (overlap ? "overlapping" : "plain")
                                          << (captured ? ", captured" : ", on the stream")
                                          << (memset_between ? ", a memset between" : ""));
        const FusedAhead ahead{stream, overlap, captured, memset_between};
        ExpectFusedEqualsTheHostWriter(*this, GetParam(), 40, 45, 3000, 1, 110 + GetParam(),
                                       /*row_blocks=*/0, &ahead);
      }
    }
  }
  EXPECT_EQ(hipStreamDestroy(stream), hipSuccess);
}

INSTANTIATE_TEST_SUITE_P(PageSizes, PageSizeGpuTest, ::testing::Values(1, 7, 16, 64));

TEST_F(GpuTest, TreeMaskEqualsTheHostBuilder) {
  // Three requests, the last with no query rows, trees of 3 and 4 rows; no rows given, so none
  // is padded (TreeMaskOfPaddedRequestsEqualsTheHostWriter has padded ones).
  const std::vector<TokenLength> q = {TokenLength(3), TokenLength(4), TokenLength(0)};
  const std::vector<TokenLength> kv = {TokenLength(10), TokenLength(7), TokenLength(1)};
  std::vector<uint8_t> tree;
  std::mt19937_64 rng(3);
  for (TokenLength l : q) {
    for (int r = 0; r < l.value(); ++r) {
      for (int c = 0; c < l.value(); ++c) tree.push_back(c == r || (c < r && rng() % 2) ? 1 : 0);
    }
  }
  std::vector<int64_t> want_indptr(4);
  ASSERT_TRUE(BuildMaskIndptr(MaskLayout::kFull, q, kv, absl::MakeSpan(want_indptr)).ok());
  std::vector<uint8_t> want(want_indptr.back() + 5, 7);
  ASSERT_TRUE(BuildCustomMask(MaskLayout::kFull, tree, q, kv, want_indptr, absl::MakeSpan(want)).ok());
  DeviceBuffer<TokenLength> d_q = Upload(q), d_kv = Upload(kv);
  DeviceBuffer<uint8_t> d_tree = Upload(tree);
  DeviceBuffer<int64_t> d_indptr = Upload(std::vector<int64_t>(4, -1));
  DeviceBuffer<uint8_t> d_mask = Upload(std::vector<uint8_t>(want.size(), 7));
  TreeMaskDeviceArgs a{d_q.const_span(), d_kv.const_span(), d_tree.const_span(), d_indptr.span(),
                       d_mask.span(), 40};
  ASSERT_TRUE(BuildTreeMaskOnDevice(a, violation(), nullptr).ok());
  EXPECT_EQ(Download(d_indptr), want_indptr);
  EXPECT_EQ(Download(d_mask), want);
  EXPECT_TRUE(Violations().ok()) << Violations();
}

// Padded requests (rows given, kPaddedRow) of a captured target-verify graph, after the real
// ones: no tree rows of their own (the tree buffer's bytes past the real trees are not read)
// and all-ones blocks, as the host writer writes them.
TEST_F(GpuTest, TreeMaskOfPaddedRequestsEqualsTheHostWriter) {
  constexpr int32_t kN = 3;  // draft tokens per request
  const BatchFixture f = MakeBatch(16, 2, 20, kN, 4);
  const ReqPoolIndex pad(kernels::kPaddedRow);
  const TokenLength padded_kv = GraphState::PaddedRowKvLen(TokenLength(kN));
  std::vector<ReqPoolIndex> rows = {f.rows()[0], f.rows()[1], pad, pad};
  std::vector<TokenLength> q(4, TokenLength(kN));
  std::vector<TokenLength> kv = {f.kv_lens()[0], f.kv_lens()[1], padded_kv, padded_kv};
  std::vector<uint8_t> tree;
  std::mt19937_64 rng(4);
  for (int i = 0; i < 2; ++i) {
    for (int r = 0; r < kN; ++r) {
      for (int c = 0; c < kN; ++c) tree.push_back(c == 0 || c == r || rng() % 2 ? 1 : 0);
    }
  }
  std::vector<uint8_t> tree_buffer(tree);
  tree_buffer.resize(4 * kN * kN, 5);  // past the real trees: bytes a padded row must not read
  // What the host writer leaves.
  const int64_t mask_bytes = int64_t{kN} * (kv[0].value() + kv[1].value() + 2 * padded_kv.value());
  std::vector<int64_t> want_indptr(5);
  std::vector<uint8_t> want(mask_bytes + 5, 7);
  std::vector<TokenOffset> kv_indptr(5), qo_indptr(5);
  std::vector<TokenLength> last(4);
  std::vector<TokenSlot> indices(f.pool().max_context_len().value() * 4);
  GraphBuffers hb;
  hb.req_rows = absl::MakeSpan(rows);
  hb.kv_lens = absl::MakeSpan(kv);
  hb.q_lens = absl::MakeSpan(q);
  hb.kv_indptr = absl::MakeSpan(kv_indptr);
  hb.qo_indptr = absl::MakeSpan(qo_indptr);
  hb.kv_last_page_len = absl::MakeSpan(last);
  hb.kv_indices = absl::MakeSpan(indices);
  hb.mask_indptr = absl::MakeSpan(want_indptr);
  hb.tree_mask = absl::MakeSpan(tree_buffer);
  hb.custom_mask = absl::MakeSpan(want);
  MetadataWriteRequest req;
  req.mode = ForwardMode::kTargetVerify;
  req.real_batch_size = 2;
  req.padded_batch_size = 4;
  req.padded_kv_len = padded_kv;
  req.page_size = f.page_size();
  req.req_to_token = &f.pool();
  req.mask_layout = MaskLayout::kFull;
  req.q_len_per_request = TokenLength(kN);
  HostMetadataWriter host;
  ASSERT_TRUE(host.WriteBatchArrays(req, hb).ok());
  ASSERT_TRUE(host.WriteTokenArrays(req, hb, nullptr).ok());
  ASSERT_EQ(want_indptr[4], mask_bytes);
  for (int64_t e = want_indptr[2]; e < want_indptr[4]; ++e) ASSERT_EQ(want[e], 1) << e;

  DeviceBuffer<ReqPoolIndex> d_rows = Upload(rows);
  DeviceBuffer<TokenLength> d_q = Upload(q), d_kv = Upload(kv);
  DeviceBuffer<uint8_t> d_tree = Upload(tree_buffer);
  DeviceBuffer<int64_t> d_indptr = Upload(std::vector<int64_t>(5, -1));
  DeviceBuffer<uint8_t> d_mask = Upload(std::vector<uint8_t>(want.size(), 7));
  TreeMaskDeviceArgs a{d_q.const_span(),    d_kv.const_span(),
                       d_tree.const_span(), d_indptr.span(),
                       d_mask.span(),       int64_t{kN} * f.pool().max_context_len().value()};
  a.rows = d_rows.const_span();
  ASSERT_TRUE(BuildTreeMaskOnDevice(a, violation(), nullptr).ok());
  EXPECT_EQ(Download(d_indptr), want_indptr);
  EXPECT_EQ(Download(d_mask), want);
  EXPECT_TRUE(Violations().ok()) << Violations();
  // Rows of another size than the batch: refused before any launch.
  a.rows = DeviceSpan<const ReqPoolIndex>(d_rows.data(), 3);
  EXPECT_EQ(BuildTreeMaskOnDevice(a, violation(), nullptr).code(),
            absl::StatusCode::kInvalidArgument);
}

// An empty batch launches no kernel, yet its indptrs are [0], as the host builders write them:
// the fused decode launch's kv_indptr and qo_indptr, the tree mask's mask_indptr, a draft
// step's kv_indptr and qo_indptr (each poisoned before).
TEST_F(GpuTest, EmptyBatchesWriteTheirIndptrsFirstEntry) {
  const BatchFixture f = MakeBatch(16, 1, 40, 1, 5);
  DeviceBuffer<TokenSlot> table = Upload(std::vector<TokenSlot>{});
  const DeviceReqToToken src = DeviceTable(f, table);
  DeviceBuffer<ReqPoolIndex> no_rows = Upload(std::vector<ReqPoolIndex>{});
  DeviceBuffer<TokenLength> no_lens = Upload(std::vector<TokenLength>{});
  DeviceBuffer<TokenLength> no_out_lens = Upload(std::vector<TokenLength>{});
  DeviceBuffer<TokenOffset> kv_indptr = Upload(std::vector<TokenOffset>{TokenOffset(-9)});
  DeviceBuffer<TokenOffset> qo_indptr = Upload(std::vector<TokenOffset>{TokenOffset(-9)});
  DeviceBuffer<TokenSlot> indices = Upload(std::vector<TokenSlot>(8, TokenSlot(-9)));
  DecodeMetadataDeviceArgs a;
  a.req_to_token = src;
  a.pool_slots = f.pool_slots();
  a.page_size = f.page_size();
  a.rows = no_rows.const_span();
  a.kv_lens = no_lens.const_span();
  a.q_lens = no_lens.const_span();
  a.kv_indptr = kv_indptr.span();
  a.qo_indptr = qo_indptr.span();
  a.kv_last_page_len = no_out_lens.span();
  a.kv_indices = indices.span();
  a.max_kv_len = f.pool().max_context_len();
  ASSERT_TRUE(BuildDecodeMetadataOnDevice(a, violation(), nullptr).ok());
  EXPECT_EQ(Download(kv_indptr), std::vector<TokenOffset>{TokenOffset(0)});
  EXPECT_EQ(Download(qo_indptr), std::vector<TokenOffset>{TokenOffset(0)});

  DeviceBuffer<uint8_t> no_tree = Upload(std::vector<uint8_t>{});
  DeviceBuffer<int64_t> mask_indptr = Upload(std::vector<int64_t>{-9});
  DeviceBuffer<uint8_t> mask = Upload(std::vector<uint8_t>(4, 7));
  const TreeMaskDeviceArgs m{no_lens.const_span(), no_lens.const_span(), no_tree.const_span(),
                             mask_indptr.span(), mask.span(), 1};
  ASSERT_TRUE(BuildTreeMaskOnDevice(m, violation(), nullptr).ok());
  EXPECT_EQ(Download(mask_indptr), std::vector<int64_t>{0});
  EXPECT_EQ(Download(mask), std::vector<uint8_t>(4, 7));

  DeviceBuffer<TokenOffset> step_kv_indptr = Upload(std::vector<TokenOffset>{TokenOffset(-9)});
  DeviceBuffer<TokenOffset> step_qo_indptr = Upload(std::vector<TokenOffset>{TokenOffset(-9)});
  const DraftStepDeviceArgs d{src,
                              f.pool_slots(),
                              f.page_size(),
                              no_rows.const_span(),
                              no_lens.const_span(),
                              DraftDecodeShape{2, 2},
                              1,
                              no_out_lens.span(),
                              step_kv_indptr.span(),
                              step_qo_indptr.span(),
                              no_out_lens.span(),
                              indices.span()};
  ASSERT_TRUE(BuildDraftStepOnDevice(d, violation(), nullptr).ok());
  EXPECT_EQ(Download(step_kv_indptr), std::vector<TokenOffset>{TokenOffset(0)});
  EXPECT_EQ(Download(step_qo_indptr), std::vector<TokenOffset>{TokenOffset(0)});
  EXPECT_EQ(Download(indices), std::vector<TokenSlot>(8, TokenSlot(-9)));
  EXPECT_TRUE(Violations().ok()) << Violations();
}

// The gather copies pool rows tok_idx[r] into row r, in 16-byte words or 2-byte words.
TEST_F(GpuTest, GatherKvCopiesThePoolRowsOfTokIdx) {
  const BatchFixture f = MakeBatch(16, 6, 300, 5, 31);
  auto m = BuildForwardMetadata(f.Batch(ForwardMode::kExtend), f.pool(), f.page_size());
  ASSERT_TRUE(m.ok()) << m.status();
  auto g = GatherContextTokens(
      ContextGatherInputs{ForwardMode::kExtend, m->kv_indptr, m->kv_indices, m->kv_lens, f.pool_slots()});
  ASSERT_TRUE(g.ok()) << g.status();
  std::mt19937_64 rng(5);
  struct Dims {
    int32_t heads, head_dim;
  };
  for (Dims d : {Dims{8, 128}, Dims{1, 256}, Dims{3, 40}, Dims{3, 41}, Dims{2, 64}}) {
    for (KvElementType dtype : {KvElementType::kBf16, KvElementType::kFp16}) {
      SCOPED_TRACE(::testing::Message() << d.heads << " heads of " << d.head_dim);
      const int64_t row = int64_t{d.heads} * d.head_dim * 2;
      std::vector<uint8_t> k(f.pool_slots().value() * row), v(k.size());
      for (uint8_t& x : k) x = static_cast<uint8_t>(rng());
      for (uint8_t& x : v) x = static_cast<uint8_t>(rng());
      DeviceBuffer<uint8_t> dk = Upload(k), dv = Upload(v);
      DeviceBuffer<TokenSlot> tok = Upload(g->tok_idx);
      DeviceBuffer<TokenOffset> cu = Upload(g->cu_k);
      const size_t rows = g->tok_idx.size() + 3;
      DeviceBuffer<uint8_t> ko = Upload(std::vector<uint8_t>(rows * row, 0xEE));
      DeviceBuffer<uint8_t> vo = Upload(std::vector<uint8_t>(rows * row, 0xEE));
      GatherKvDeviceArgs a{dk.const_span(), dv.const_span(), d.heads, d.head_dim, dtype,
                           tok.const_span(), cu.const_span(), ko.span(), vo.span()};
      ASSERT_TRUE(GatherKvOnDevice(a, violation(), nullptr).ok());
      const std::vector<uint8_t> got_k = Download(ko), got_v = Download(vo);
      for (size_t r = 0; r < rows; ++r) {
        const bool real = r < g->tok_idx.size();
        const int64_t s = real ? g->tok_idx[r].value() : 0;
        for (int64_t b = 0; b < row; ++b) {
          const uint8_t want_k = real ? k[s * row + b] : 0xEE;
          const uint8_t want_v = real ? v[s * row + b] : 0xEE;
          ASSERT_EQ(got_k[r * row + b], want_k) << "row " << r << " byte " << b;
          ASSERT_EQ(got_v[r * row + b], want_v) << "row " << r << " byte " << b;
        }
      }
      EXPECT_TRUE(Violations().ok()) << Violations();
    }
  }
}

// Corrupted device-resident metadata: the kernels stay in bounds, write safe values, and the
// violation word names the first problem.
// The words of a vector of plain structs, for exact comparisons.
template <typename T>
std::vector<int32_t> Words(const std::vector<T>& v) {
  static_assert(sizeof(T) % 4 == 0);
  std::vector<int32_t> out(v.size() * sizeof(T) / 4);
  std::memcpy(out.data(), v.data(), out.size() * 4);
  return out;
}

constexpr SplitKvWorkItem kPoisonItem{-7, TokenOffset(-7), TokenOffset(-7), TokenPosition(-7),
                                      TokenPosition(-7), -7};
constexpr SplitKvReduceItem kPoisonReduce{-7, TokenOffset(-7), TokenOffset(-7), -7, -7};

// The split-KV plan on the device is the host planner's, bit for bit, over random batches (up to
// 2,500 sequences: several rounds of the one-block kernel), query tiles, layouts and unit
// counts; entries past the plan keep their poison.
TEST_F(GpuTest, SplitKvPlanEqualsTheHostPlanner) {
  const uint64_t seed = 4242;
  std::mt19937_64 rng(seed);
  for (int iter = 0; iter < 60; ++iter) {
    const int bs = iter < 6 ? iter
                            : std::uniform_int_distribution<int>(1, iter % 6 == 0 ? 2500 : 40)(rng);
    std::vector<TokenOffset> qo = {TokenOffset(0)}, kv = {TokenOffset(0)};
    for (int i = 0; i < bs; ++i) {
      const int32_t k = std::uniform_int_distribution<int32_t>(0, 5000)(rng);
      const int32_t q = std::uniform_int_distribution<int32_t>(0, std::min(k, 150))(rng);
      qo.push_back(TokenOffset(qo.back().value() + q));
      kv.push_back(TokenOffset(kv.back().value() + k));
    }
    SplitKvOptions opt;
    const int64_t ps = std::vector<int64_t>{1, 7, 16, 64}[iter % 4];
    opt.layout = iter % 2 ? KvLayout::Paged(*PageSize::Create(ps)) : KvLayout::LinearPerToken();
    opt.num_units = std::uniform_int_distribution<int32_t>(1, iter % 5 == 0 ? 1500 : 300)(rng);
    opt.kv_granularity = TokenCount(std::uniform_int_distribution<int64_t>(1, 700)(rng));
    opt.q_tile = TokenCount(std::uniform_int_distribution<int64_t>(1, 128)(rng));
    const SplitKvCapacity cap = SplitKvCapacityFor(*NumQueryTiles(qo, opt.q_tile), opt.num_units);
    std::vector<SplitKvWorkItem> work(cap.work_items + 3, kPoisonItem);
    std::vector<int32_t> unit_indptr(opt.num_units + 3, -7);
    std::vector<SplitKvReduceItem> reduce(cap.reduce_items + 3, kPoisonReduce);
    DeviceBuffer<SplitKvWorkItem> d_work = Upload(work);
    DeviceBuffer<int32_t> d_units = Upload(unit_indptr);
    DeviceBuffer<SplitKvReduceItem> d_reduce = Upload(reduce);
    auto counts = PlanSplitKvInto(
        qo, kv, opt,
        SplitKvPlanSpans{absl::MakeSpan(work), absl::MakeSpan(unit_indptr), absl::MakeSpan(reduce)});
    ASSERT_TRUE(counts.ok()) << counts.status();
    DeviceBuffer<TokenOffset> d_qo = Upload(qo), d_kv = Upload(kv);
    SplitKvPlanDeviceArgs a{d_qo.const_span(), d_kv.const_span(), opt, d_work.span(),
                            d_units.span(), d_reduce.span()};
    ASSERT_TRUE(BuildSplitKvPlanOnDevice(a, violation(), nullptr).ok());
    ASSERT_TRUE(Violations().ok()) << Violations();
    const std::string at = "seed " + std::to_string(seed) + " iter " + std::to_string(iter) +
                           " bs " + std::to_string(bs) + " units " + std::to_string(opt.num_units);
    ASSERT_EQ(Words(Download(d_work)), Words(work)) << at;
    ASSERT_EQ(Download(d_units), unit_indptr) << at;
    ASSERT_EQ(Words(Download(d_reduce)), Words(reduce)) << at;
  }
}

// The launches of a graph replay after the fused one (the tree mask, the draft steps, the
// split-KV plan) wait for the kernel ahead, which writes what they read (lengths, rows,
// req_to_token, indptrs), when they overlap it (the default), on the stream and in a graph.
// Where launches overlap (LaunchesOverlap) they start while that kernel spins: a read before
// the wait would see zeros.
TEST_F(GpuTest, ReplayLaunchesWaitForTheKernelAheadThatWritesTheirInputs) {
  {
    hipStream_t stream = nullptr;
    ASSERT_EQ(hipStreamCreate(&stream), hipSuccess);
    if (testing::LaunchesOverlap()) testing::ExpectAnOverlappingProbeStartsFirst(stream);
    EXPECT_EQ(hipStreamDestroy(stream), hipSuccess);
  }
  {
    SCOPED_TRACE("tree mask");
    const std::vector<TokenLength> q = {TokenLength(3), TokenLength(4), TokenLength(2)};
    const std::vector<TokenLength> kv = {TokenLength(10), TokenLength(7), TokenLength(9)};
    std::vector<uint8_t> tree;
    for (TokenLength l : q) {
      for (int r = 0; r < l.value(); ++r) {
        for (int c = 0; c < l.value(); ++c) tree.push_back(c <= r ? 1 : 0);
      }
    }
    DeviceBuffer<TokenLength> d_q = Upload(q), d_kv = Upload(kv);
    DeviceBuffer<uint8_t> d_tree = Upload(tree);
    DeviceBuffer<int64_t> d_indptr = Upload(std::vector<int64_t>(4));
    DeviceBuffer<uint8_t> d_mask = Upload(std::vector<uint8_t>(80));
    testing::ExpectTheLaunchWaitsForItsInputs(
        {BytesOf(d_q), BytesOf(d_kv), BytesOf(d_tree)}, {BytesOf(d_indptr), BytesOf(d_mask)},
        1, [&](bool overlap, hipStream_t stream) {
          TreeMaskDeviceArgs a{d_q.const_span(), d_kv.const_span(), d_tree.const_span(),
                               d_indptr.span(),  d_mask.span(),     40};
          a.overlap_preceding_kernel = overlap;
          return BuildTreeMaskOnDevice(a, violation(), stream);
        },
        [&] { return Violations(); });
  }
  {
    SCOPED_TRACE("draft step");
    const BatchFixture f = MakeBatch(16, 3, 100, 40, 48);
    DeviceBuffer<TokenSlot> d_table = Upload(std::vector<TokenSlot>{});
    const DeviceReqToToken src = DeviceTable(f, d_table);
    const DraftDecodeShape shape{2, 3};
    DeviceBuffer<ReqPoolIndex> rows = Upload(f.rows());
    // Committed lengths whose draft positions stay well inside the rows.
    DeviceBuffer<TokenLength> lens =
        Upload(std::vector<TokenLength>{TokenLength(20), TokenLength(35), TokenLength(50)});
    const int64_t branches = 3 * shape.topk;
    DeviceBuffer<TokenLength> kv_lens = Upload(std::vector<TokenLength>(branches));
    DeviceBuffer<TokenOffset> kv_indptr = Upload(std::vector<TokenOffset>(branches + 1));
    DeviceBuffer<TokenOffset> qo_indptr = Upload(std::vector<TokenOffset>(branches + 1));
    DeviceBuffer<TokenLength> last = Upload(std::vector<TokenLength>(branches));
    DeviceBuffer<TokenSlot> indices =
        Upload(std::vector<TokenSlot>(branches * f.pool().max_context_len().value()));
    testing::ExpectTheLaunchWaitsForItsInputs(
        {BytesOf(d_table), BytesOf(rows), BytesOf(lens)},
        {BytesOf(kv_lens), BytesOf(kv_indptr), BytesOf(qo_indptr), BytesOf(last), BytesOf(indices)},
        2, [&](bool overlap, hipStream_t stream) {
          DraftStepDeviceArgs a{src, f.pool_slots(), f.page_size(), rows.const_span(),
                                lens.const_span(), shape, 2, kv_lens.span(), kv_indptr.span(),
                                qo_indptr.span(), last.span(), indices.span()};
          a.overlap_preceding_kernel = overlap;
          return BuildDraftStepOnDevice(a, violation(), stream);
        },
        [&] { return Violations(); });
  }
  {
    SCOPED_TRACE("split-KV plan");
    std::vector<TokenOffset> qo = {TokenOffset(0)}, kv = {TokenOffset(0)};
    for (int32_t i = 0; i < 30; ++i) {
      qo.push_back(TokenOffset(qo.back().value() + 1 + i % 3));
      kv.push_back(TokenOffset(kv.back().value() + 200 + 97 * i));
    }
    SplitKvOptions opt;
    opt.layout = KvLayout::LinearPerToken();
    opt.num_units = 16;
    opt.kv_granularity = TokenCount(64);
    opt.q_tile = TokenCount(2);
    const SplitKvCapacity cap = SplitKvCapacityFor(*NumQueryTiles(qo, opt.q_tile), opt.num_units);
    DeviceBuffer<TokenOffset> d_qo = Upload(qo), d_kv = Upload(kv);
    DeviceBuffer<SplitKvWorkItem> d_work = Upload(std::vector<SplitKvWorkItem>(cap.work_items, kPoisonItem));
    DeviceBuffer<int32_t> d_units = Upload(std::vector<int32_t>(opt.num_units + 1));
    DeviceBuffer<SplitKvReduceItem> d_reduce =
        Upload(std::vector<SplitKvReduceItem>(cap.reduce_items, kPoisonReduce));
    testing::ExpectTheLaunchWaitsForItsInputs(
        {BytesOf(d_qo), BytesOf(d_kv)}, {BytesOf(d_work), BytesOf(d_units), BytesOf(d_reduce)},
        1, [&](bool overlap, hipStream_t stream) {
          SplitKvPlanDeviceArgs a{d_qo.const_span(), d_kv.const_span(), opt,
                                  d_work.span(),      d_units.span(),    d_reduce.span()};
          a.overlap_preceding_kernel = overlap;
          return BuildSplitKvPlanOnDevice(a, violation(), stream);
        },
        [&] { return Violations(); });
  }
}

// The device twins launched on their own (kv_indices, the page table, indptr and last-page
// lengths, the K/V gather) wait for the kernel ahead, which writes what they read, when they
// overlap it (the default), on the stream and in a graph.
TEST_F(GpuTest, TwinLaunchesWaitForTheKernelAheadThatWritesTheirInputs) {
  {
    hipStream_t stream = nullptr;
    ASSERT_EQ(hipStreamCreate(&stream), hipSuccess);
    if (testing::LaunchesOverlap()) testing::ExpectAnOverlappingProbeStartsFirst(stream);
    EXPECT_EQ(hipStreamDestroy(stream), hipSuccess);
  }
  const BatchFixture f = MakeBatch(16, 5, 300, 7, 52);
  auto m = BuildForwardMetadata(f.Batch(ForwardMode::kExtend), f.pool(), f.page_size());
  ASSERT_TRUE(m.ok()) << m.status();
  DeviceBuffer<TokenSlot> d_table = Upload(std::vector<TokenSlot>{});
  const DeviceReqToToken src = DeviceTable(f, d_table);
  DeviceBuffer<ReqPoolIndex> rows = Upload(f.rows());
  DeviceBuffer<TokenLength> lens = Upload(f.kv_lens());
  {
    SCOPED_TRACE("kv_indices");
    DeviceBuffer<TokenOffset> indptr = Upload(m->kv_indptr);
    DeviceBuffer<TokenSlot> out = Upload(std::vector<TokenSlot>(m->kv_indices.size()));
    testing::ExpectTheLaunchWaitsForItsInputs(
        {BytesOf(d_table), BytesOf(rows), BytesOf(indptr)}, {BytesOf(out)}, 1,
        [&](bool overlap, hipStream_t stream) {
          TokenKvIndicesDeviceInputs in{src.table,       src.max_context_len, rows.const_span(),
                                        indptr.const_span(), {}, f.pool().max_context_len(),
                                        f.pool_slots()};
          in.overlap_preceding_kernel = overlap;
          return BuildTokenKvIndicesOnDevice(in, out.span(), stream, violation());
        },
        [&] { return Violations(); });
  }
  {
    SCOPED_TRACE("page table");
    const int64_t cols = f.pool().max_context_len().value() / 16 + 1;
    DeviceBuffer<PageId> out = Upload(std::vector<PageId>(f.rows().size() * cols));
    testing::ExpectTheLaunchWaitsForItsInputs(
        {BytesOf(d_table), BytesOf(rows), BytesOf(lens)}, {BytesOf(out)}, 1,
        [&](bool overlap, hipStream_t stream) {
          return BuildPageTableOnDevice(src, f.pool_slots(), rows.const_span(), lens.const_span(),
                                        f.page_size(), out.span(), PageCount(cols), violation(), stream,
                                        /*overlap_preceding_kernel=*/overlap);
        },
        [&] { return Violations(); });
  }
  {
    SCOPED_TRACE("indptr and last-page lengths");
    DeviceBuffer<TokenOffset> indptr = Upload(std::vector<TokenOffset>(f.rows().size() + 1));
    DeviceBuffer<TokenLength> last = Upload(std::vector<TokenLength>(f.rows().size()));
    testing::ExpectTheLaunchWaitsForItsInputs(
        {BytesOf(lens)}, {BytesOf(indptr), BytesOf(last)}, 1,
        [&](bool overlap, hipStream_t stream) {
          return BuildIndptrOnDevice(lens.const_span(), indptr.span(), last.span(), f.page_size(),
                                     violation(), stream, /*overlap_preceding_kernel=*/overlap);
        },
        [&] { return Violations(); });
  }
  {
    SCOPED_TRACE("K/V gather");
    auto g = GatherContextTokens(ContextGatherInputs{ForwardMode::kExtend, m->kv_indptr,
                                                     m->kv_indices, m->kv_lens, f.pool_slots()});
    ASSERT_TRUE(g.ok()) << g.status();
    constexpr int32_t kHeads = 2, kHeadDim = 64;
    const int64_t row = int64_t{kHeads} * kHeadDim * 2;
    std::vector<uint8_t> pool(f.pool_slots().value() * row);
    std::mt19937_64 rng(53);
    for (uint8_t& b : pool) b = static_cast<uint8_t>(rng());
    DeviceBuffer<uint8_t> k = Upload(pool), v = Upload(pool);
    DeviceBuffer<TokenSlot> tok = Upload(g->tok_idx);
    DeviceBuffer<TokenOffset> cu = Upload(g->cu_k);
    DeviceBuffer<uint8_t> k_out = Upload(std::vector<uint8_t>(g->tok_idx.size() * row));
    DeviceBuffer<uint8_t> v_out = Upload(std::vector<uint8_t>(g->tok_idx.size() * row));
    testing::ExpectTheLaunchWaitsForItsInputs(
        {BytesOf(k), BytesOf(v), BytesOf(tok), BytesOf(cu)}, {BytesOf(k_out), BytesOf(v_out)},
        1, [&](bool overlap, hipStream_t stream) {
          GatherKvDeviceArgs a{k.const_span(),   v.const_span(),  kHeads,          kHeadDim,
                               KvElementType::kBf16, tok.const_span(), cu.const_span(),
                               k_out.span(),     v_out.span()};
          a.overlap_preceding_kernel = overlap;
          return GatherKvOnDevice(a, violation(), stream);
        },
        [&] { return Violations(); });
  }
}

class GuardGpuTest : public GpuTest {};

// The draft-step kernels name a row outside the table, a negative committed length, draft
// positions past the row and a slot outside the pool; the branch (or token) is written on the
// padding page and nothing is read or written out of bounds.
TEST_F(GuardGpuTest, DraftStepNamesBadRowsLengthsPositionsAndSlots) {
  const BatchFixture f = MakeBatch(16, 2, 100, 40, 47);
  DeviceBuffer<TokenSlot> d_table = Upload(std::vector<TokenSlot>{});
  const DeviceReqToToken src = DeviceTable(f, d_table);
  const DraftDecodeShape shape{2, 2};
  struct Case {
    ReqPoolIndex row;
    int32_t len;
    std::string words;
  };
  const int32_t past = static_cast<int32_t>(f.pool().max_context_len().value());
  for (const Case& c : {Case{ReqPoolIndex(1000), 10, "outside [0, "},
                        Case{f.rows()[0], -3, "is negative"},
                        Case{f.rows()[0], past, "is past the row"}}) {
    SCOPED_TRACE(c.words);
    DeviceBuffer<ReqPoolIndex> rows = Upload(std::vector<ReqPoolIndex>{f.rows()[1], c.row});
    DeviceBuffer<TokenLength> lens =
        Upload(std::vector<TokenLength>{TokenLength(20), TokenLength(c.len)});
    DeviceBuffer<TokenLength> kv_lens = Upload(std::vector<TokenLength>(4));
    DeviceBuffer<TokenOffset> kv_indptr = Upload(std::vector<TokenOffset>(5));
    DeviceBuffer<TokenOffset> qo_indptr = Upload(std::vector<TokenOffset>(5));
    DeviceBuffer<TokenLength> last = Upload(std::vector<TokenLength>(4));
    DeviceBuffer<TokenSlot> indices = Upload(std::vector<TokenSlot>(4 * (past + 4), TokenSlot(-9)));
    DraftStepDeviceArgs a{src, f.pool_slots(),
                          f.page_size(), rows.const_span(), lens.const_span(), shape, 1,
                          kv_lens.span(), kv_indptr.span(), qo_indptr.span(), last.span(),
                          indices.span()};
    ASSERT_TRUE(BuildDraftStepOnDevice(a, violation(), nullptr).ok());
    ExpectViolation(c.words);
    // Every branch holds one query row, the bad request's (written as padding) too.
    EXPECT_EQ(Download(qo_indptr).back(), TokenOffset(4));
  }
  // A slot outside the pool, read as a draft slot.
  std::vector<TokenSlot> table(f.pool().table().begin(), f.pool().table().end());
  const int64_t at = int64_t{f.rows()[0].value()} * f.pool().max_context_len().value() + 20;
  table[at] = TokenSlot(static_cast<int32_t>(f.pool_slots().value() + 3));
  DeviceBuffer<TokenSlot> bad_table = Upload(table);
  DeviceBuffer<ReqPoolIndex> rows = Upload(std::vector<ReqPoolIndex>{f.rows()[0]});
  DeviceBuffer<TokenLength> lens = Upload(std::vector<TokenLength>{TokenLength(20)});
  DeviceBuffer<TokenLength> kv_lens = Upload(std::vector<TokenLength>(2));
  DeviceBuffer<TokenOffset> kv_indptr = Upload(std::vector<TokenOffset>(3));
  DeviceBuffer<TokenOffset> qo_indptr = Upload(std::vector<TokenOffset>(3));
  DeviceBuffer<TokenLength> last = Upload(std::vector<TokenLength>(2));
  DeviceBuffer<TokenSlot> indices = Upload(std::vector<TokenSlot>(64, TokenSlot(-9)));
  DraftStepDeviceArgs a{DeviceReqToToken{bad_table.const_span(), f.pool().max_context_len()},
                        f.pool_slots(), f.page_size(), rows.const_span(), lens.const_span(),
                        shape, 0, kv_lens.span(), kv_indptr.span(), qo_indptr.span(), last.span(),
                        indices.span()};
  ASSERT_TRUE(BuildDraftStepOnDevice(a, violation(), nullptr).ok());
  ExpectViolation("outside the pool");
  // What the launcher sees.
  DraftStepDeviceArgs b = a;
  b.step = 2;
  EXPECT_EQ(BuildDraftStepOnDevice(b, violation(), nullptr).code(),
            absl::StatusCode::kInvalidArgument);
  b = a;
  b.kv_lens = DeviceSpan<TokenLength>(kv_lens.data(), 1);
  EXPECT_EQ(BuildDraftStepOnDevice(b, violation(), nullptr).code(),
            absl::StatusCode::kInvalidArgument);
  b = a;
  b.shape.topk = 0;
  EXPECT_EQ(BuildDraftStepOnDevice(b, violation(), nullptr).code(),
            absl::StatusCode::kInvalidArgument);
}

// The plan's kernel names a decreasing indptr and items past a span it was given, and writes
// nothing outside the spans; the launcher refuses what it can see.
TEST_F(GuardGpuTest, SplitKvPlanNamesBadIndptrsAndShortSpans) {
  const std::vector<TokenOffset> qo = {TokenOffset(0), TokenOffset(1), TokenOffset(2)};
  const std::vector<TokenOffset> kv = {TokenOffset(0), TokenOffset(900), TokenOffset(1800)};
  SplitKvOptions opt;
  opt.num_units = 8;
  opt.kv_granularity = TokenCount(100);
  // 18 chunks over 8 units: 9 items, one more than the span of 8 (two guard entries follow it).
  DeviceBuffer<SplitKvWorkItem> work = Upload(std::vector<SplitKvWorkItem>(10, kPoisonItem));
  DeviceBuffer<int32_t> units = Upload(std::vector<int32_t>(9, -7));
  DeviceBuffer<SplitKvReduceItem> reduce = Upload(std::vector<SplitKvReduceItem>(4, kPoisonReduce));
  DeviceBuffer<TokenOffset> d_qo = Upload(qo), d_kv = Upload(kv);
  SplitKvPlanDeviceArgs a{d_qo.const_span(), d_kv.const_span(), opt,
                          DeviceSpan<SplitKvWorkItem>(work.data(), 8), units.span(), reduce.span()};
  ASSERT_TRUE(BuildSplitKvPlanOnDevice(a, violation(), nullptr).ok());
  ExpectViolation("the buffer holds 8");
  const std::vector<SplitKvWorkItem> got = Download(work);
  EXPECT_EQ(Words(std::vector<SplitKvWorkItem>(got.begin() + 8, got.end())),
            Words(std::vector<SplitKvWorkItem>(2, kPoisonItem)));
  DeviceBuffer<TokenOffset> bad_kv =
      Upload(std::vector<TokenOffset>{TokenOffset(0), TokenOffset(900), TokenOffset(800)});
  a.kv_indptr = bad_kv.const_span();
  a.work = work.span();
  ASSERT_TRUE(BuildSplitKvPlanOnDevice(a, violation(), nullptr).ok());
  ExpectViolation("kv_indptr entry 2: 800 is below the entry before it (900)");
  // Each indptr's violations under its own name.
  for (const auto& [bad_qo, bad_kv_entries, words] :
       {std::tuple<std::vector<TokenOffset>, std::vector<TokenOffset>, std::string>{
            {TokenOffset(0), TokenOffset(2), TokenOffset(1)},
            kv,
            "qo_indptr entry 2: 1 is below the entry before it (2)"},
        {{TokenOffset(-1), TokenOffset(1), TokenOffset(2)},
         kv,
         "qo_indptr entry 0: -1 is negative"},
        {qo,
         {TokenOffset(-5), TokenOffset(900), TokenOffset(1800)},
         "kv_indptr entry 0: -5 is negative"}}) {
    SCOPED_TRACE(words);
    DeviceBuffer<TokenOffset> q_entries = Upload(bad_qo), k_entries = Upload(bad_kv_entries);
    SplitKvPlanDeviceArgs c = a;
    c.qo_indptr = q_entries.const_span();
    c.kv_indptr = k_entries.const_span();
    ASSERT_TRUE(BuildSplitKvPlanOnDevice(c, violation(), nullptr).ok());
    ExpectViolation(words);
  }
  // More query tiles than work items (2^20 tiles of one row, 8 items): no plan these buffers
  // hold. Named once, and written as a plan of no items: unit_indptr all 0, the items untouched.
  // (Such tiles, 2^31 of them over INT32_MAX-long sequences, were walked by one thread, and
  // their chunks' sum wrapped the unit map.)
  {
    const std::vector<TokenOffset> long_seq = {TokenOffset(0), TokenOffset(1 << 20)};
    DeviceBuffer<TokenOffset> q_entries = Upload(long_seq), k_entries = Upload(long_seq);
    DeviceBuffer<SplitKvWorkItem> items = Upload(std::vector<SplitKvWorkItem>(8, kPoisonItem));
    DeviceBuffer<int32_t> unit_entries = Upload(std::vector<int32_t>(9, -7));
    SplitKvPlanDeviceArgs c = a;
    c.qo_indptr = q_entries.const_span();
    c.kv_indptr = k_entries.const_span();
    c.options.q_tile = TokenCount(1);
    c.work = items.span();
    c.unit_indptr = unit_entries.span();
    ASSERT_TRUE(BuildSplitKvPlanOnDevice(c, violation(), nullptr).ok());
    ExpectViolation("output entry 1: needs 1048576 entries, the buffer holds 8");
    EXPECT_EQ(Download(unit_entries), std::vector<int32_t>(9, 0));
    EXPECT_EQ(Words(Download(items)), Words(std::vector<SplitKvWorkItem>(8, kPoisonItem)));
  }
  // What the launcher sees: options, sizes, nulls.
  SplitKvPlanDeviceArgs b = a;
  b.options.num_units = 0;
  EXPECT_EQ(BuildSplitKvPlanOnDevice(b, violation(), nullptr).code(),
            absl::StatusCode::kInvalidArgument);
  b = a;
  b.unit_indptr = DeviceSpan<int32_t>(units.data(), 8);
  EXPECT_EQ(BuildSplitKvPlanOnDevice(b, violation(), nullptr).code(),
            absl::StatusCode::kInvalidArgument);
  b = a;
  b.qo_indptr = DeviceSpan<const TokenOffset>(d_qo.data(), 2);
  EXPECT_EQ(BuildSplitKvPlanOnDevice(b, violation(), nullptr).code(),
            absl::StatusCode::kInvalidArgument);
  b = a;
  b.work = DeviceSpan<SplitKvWorkItem>(nullptr, 8);
  EXPECT_EQ(BuildSplitKvPlanOnDevice(b, violation(), nullptr).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(GuardGpuTest, FusedLaunchClampsAndNamesBadRowsLengthsSlotsAndCapacity) {
  const BatchFixture f = MakeBatch(16, 4, 200, 1, 41);
  struct Case {
    const char* what;
    int corrupt_row;           // entry whose row is replaced, or -1
    int32_t row;
    int corrupt_len;           // entry whose length is replaced, or -1
    int32_t len;
    int bad_slot_at;           // token of row 1 whose req_to_token entry is outside the pool, or -1
    int64_t capacity;          // kv_indices capacity
    const char* words;
  } cases[] = {
      {"row outside the table", 2, 999, -1, 0, -1, 4096, "row 999 outside"},
      {"negative row", 1, -7, -1, 0, -1, 4096, "row -7 outside"},
      {"length past the row", -1, 0, 3, 100000, -1, 4096, "past the row"},
      {"negative length", -1, 0, 0, -3, -1, 4096, "is negative"},
      // Tokens 4 to 7: every position in a group of 4 slots, whatever the row's alignment.
      {"slot outside the pool at token 4", -1, 0, -1, 0, 4, 4096, "outside the pool"},
      {"slot outside the pool at token 5", -1, 0, -1, 0, 5, 4096, "outside the pool"},
      {"slot outside the pool at token 6", -1, 0, -1, 0, 6, 4096, "outside the pool"},
      {"slot outside the pool at token 7", -1, 0, -1, 0, 7, 4096, "outside the pool"},
      {"kv_indices too small", -1, 0, -1, 0, -1, 100, "the buffer holds 100"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    std::vector<ReqPoolIndex> rows(f.rows());
    std::vector<TokenLength> kv(f.kv_lens());
    std::vector<TokenLength> q(4, TokenLength(1));
    if (c.corrupt_row >= 0) rows[c.corrupt_row] = ReqPoolIndex(c.row);
    if (c.corrupt_len >= 0) kv[c.corrupt_len] = TokenLength(c.len);
    std::vector<TokenSlot> table(f.pool().table().begin(), f.pool().table().end());
    if (c.bad_slot_at >= 0) {
      table[f.rows()[1].value() * f.pool().max_context_len().value() + c.bad_slot_at] =
          TokenSlot(1 << 30);
    }
    DeviceBuffer<TokenSlot> d_table = Upload(table);
    DeviceBuffer<ReqPoolIndex> d_rows = Upload(rows);
    DeviceBuffer<TokenLength> d_kv = Upload(kv), d_q = Upload(q);
    DeviceBuffer<TokenOffset> d_kv_indptr = Upload(std::vector<TokenOffset>(5));
    DeviceBuffer<TokenOffset> d_qo_indptr = Upload(std::vector<TokenOffset>(5));
    DeviceBuffer<TokenLength> d_last = Upload(std::vector<TokenLength>(4));
    // The capacity given to the kernel, then a poisoned tail it must not touch.
    DeviceBuffer<TokenSlot> d_indices = Upload(std::vector<TokenSlot>(c.capacity + 64, TokenSlot(-9)));
    const int64_t cols = 20;
    DeviceBuffer<PageId> d_pt = Upload(std::vector<PageId>(4 * cols, PageId(-9)));
    DecodeMetadataDeviceArgs a;
    a.req_to_token = DeviceReqToToken{d_table.const_span(), f.pool().max_context_len()};
    a.pool_slots = f.pool_slots();
    a.page_size = f.page_size();
    a.rows = d_rows.const_span();
    a.kv_lens = d_kv.const_span();
    a.q_lens = d_q.const_span();
    a.kv_indptr = d_kv_indptr.span();
    a.qo_indptr = d_qo_indptr.span();
    a.kv_last_page_len = d_last.span();
    a.kv_indices = DeviceSpan<TokenSlot>(d_indices.data(), c.capacity);
    a.page_table = d_pt.span();
    a.page_table_cols = PageCount(cols);
    a.max_kv_len = f.pool().max_context_len();
    ASSERT_TRUE(BuildDecodeMetadataOnDevice(a, violation(), nullptr).ok());
    ExpectViolation(c.words);
    // The offsets are those of the lengths clamped to [0, max_context_len], whatever the
    // capacity.
    const std::vector<TokenOffset> indptr = Download(d_kv_indptr);
    int64_t run = 0;
    ASSERT_EQ(indptr[0], TokenOffset(0));
    for (int r = 0; r < 4; ++r) {
      run += std::clamp<int64_t>(kv[r].value(), 0, f.pool().max_context_len().value());
      EXPECT_EQ(indptr[r + 1], TokenOffset(static_cast<int32_t>(run))) << "row " << r;
    }
    const std::vector<TokenSlot> got = Download(d_indices);
    for (int64_t k = c.capacity; k < c.capacity + 64; ++k) {
      ASSERT_EQ(got[k], TokenSlot(-9)) << "written past the capacity at " << k;
    }
    for (int64_t k = 0; k < c.capacity; ++k) {
      ASSERT_TRUE(got[k] == TokenSlot(-9) ||
                  (got[k].value() >= 0 && got[k].value() < f.pool_slots().value()))
          << "entry " << k << " = " << got[k].value();
    }
  }
}

// With a power-of-two page size the fused launch takes page-table entries from the token loads;
// a table too narrow for a row is still named.
TEST_F(GuardGpuTest, FusedLaunchNamesATooNarrowPageTable) {
  const BatchFixture f = MakeBatch(16, 4, 200, 1, 41);
  DeviceBuffer<TokenSlot> d_table = Upload(std::vector<TokenSlot>{});
  DecodeMetadataDeviceArgs a;
  a.req_to_token = DeviceTable(f, d_table);
  a.pool_slots = f.pool_slots();
  a.page_size = f.page_size();
  DeviceBuffer<ReqPoolIndex> rows = Upload(f.rows());
  DeviceBuffer<TokenLength> kv = Upload(f.kv_lens());
  DeviceBuffer<TokenLength> q = Upload(std::vector<TokenLength>(4, TokenLength(1)));
  DeviceBuffer<TokenOffset> kv_indptr = Upload(std::vector<TokenOffset>(5));
  DeviceBuffer<TokenOffset> qo_indptr = Upload(std::vector<TokenOffset>(5));
  DeviceBuffer<TokenLength> last = Upload(std::vector<TokenLength>(4));
  DeviceBuffer<TokenSlot> indices = Upload(std::vector<TokenSlot>(4096));
  DeviceBuffer<PageId> pt = Upload(std::vector<PageId>(4 * 2 + 8, PageId(-9)));
  a.rows = rows.const_span();
  a.kv_lens = kv.const_span();
  a.q_lens = q.const_span();
  a.kv_indptr = kv_indptr.span();
  a.qo_indptr = qo_indptr.span();
  a.kv_last_page_len = last.span();
  a.kv_indices = indices.span();
  a.page_table = DeviceSpan<PageId>(pt.data(), 4 * 2);  // 2 columns; rows need up to 13
  a.page_table_cols = PageCount(2);
  a.max_kv_len = f.pool().max_context_len();
  ASSERT_TRUE(BuildDecodeMetadataOnDevice(a, violation(), nullptr).ok());
  ExpectViolation("the table has 2 columns");
  const std::vector<PageId> got = Download(pt);
  for (int k = 8; k < 16; ++k) EXPECT_EQ(got[k], PageId(-9)) << "written past the table at " << k;
}

// Corrupted lengths near INT32_MAX make each request's mask block 2^62 bytes: the tree-mask
// kernel's sums of the blocks before a request wrapped past 2^63 at the third request, passed
// the capacity check and wrote and read 2^63 bytes past the buffers. Now the requests past the
// buffer are recorded, nothing past the mask is written (the guard bytes keep their poison;
// memcheck sees no access outside), and a request within it still gets its block.
TEST_F(GuardGpuTest, TreeMaskSumsOfHugeBlocksDoNotWrap) {
  constexpr int32_t kMax = std::numeric_limits<int32_t>::max();
  const std::vector<TokenLength> q = {TokenLength(2), TokenLength(kMax), TokenLength(kMax),
                                      TokenLength(kMax)};
  const std::vector<TokenLength> kv = {TokenLength(3), TokenLength(kMax), TokenLength(kMax),
                                       TokenLength(kMax)};
  DeviceBuffer<TokenLength> d_q = Upload(q), d_kv = Upload(kv);
  DeviceBuffer<uint8_t> d_tree = Upload(std::vector<uint8_t>{1, 0, 1, 1, 9, 9, 9, 9});
  DeviceBuffer<int64_t> d_indptr = Upload(std::vector<int64_t>(5, -1));
  constexpr int64_t kMask = 64, kGuard = 64;
  DeviceBuffer<uint8_t> d_mask = Upload(std::vector<uint8_t>(kMask + kGuard, 7));
  TreeMaskDeviceArgs a{d_q.const_span(),
                       d_kv.const_span(),
                       DeviceSpan<const uint8_t>(d_tree.data(), 4),
                       d_indptr.span(),
                       DeviceSpan<uint8_t>(d_mask.data(), kMask),
                       256};
  ASSERT_TRUE(BuildTreeMaskOnDevice(a, violation(), nullptr).ok());
  // Requests 1 to 3 each record it (the first to arrive wins): the words all share.
  ExpectViolation("entries, the buffer holds 64");
  const std::vector<uint8_t> got = Download(d_mask);
  ASSERT_EQ(got.size(), static_cast<size_t>(kMask + kGuard));
  // Request 0: one prefix column, then its 2 x 2 tree.
  EXPECT_EQ(std::vector<uint8_t>(got.begin(), got.begin() + 6),
            (std::vector<uint8_t>{1, 1, 0, 1, 1, 1}));
  for (int64_t k = kMask; k < kMask + kGuard; ++k) ASSERT_EQ(got[k], 7) << k;
  const std::vector<int64_t> indptr = Download(d_indptr);
  ASSERT_EQ(indptr.size(), 5u);
  EXPECT_EQ(indptr[0], 0);
  EXPECT_EQ(indptr[1], 6);
}

TEST_F(GuardGpuTest, OtherKernelsNameTheirViolations) {
  const BatchFixture f = MakeBatch(16, 3, 100, 1, 43);
  DeviceBuffer<TokenSlot> d_table = Upload(std::vector<TokenSlot>{});
  const DeviceReqToToken src = DeviceTable(f, d_table);
  // Indptr: a negative length.
  {
    DeviceBuffer<TokenLength> lens = Upload(std::vector<TokenLength>{TokenLength(4), TokenLength(-2)});
    DeviceBuffer<TokenOffset> indptr = Upload(std::vector<TokenOffset>(3));
    ASSERT_TRUE(BuildIndptrOnDevice(lens.const_span(), indptr.span(), {}, f.page_size(),
                                    violation(), nullptr)
                    .ok());
    ExpectViolation("is negative");
  }
  // Token kv_indices: a decreasing indptr, and one past the output.
  for (const auto& [indptr, words] :
       {std::pair<std::vector<TokenOffset>, std::string>{
            {TokenOffset(0), TokenOffset(10), TokenOffset(4), TokenOffset(20)}, "below the entry"},
        {{TokenOffset(0), TokenOffset(10), TokenOffset(20), TokenOffset(120)}, "the buffer holds 64"}}) {
    DeviceBuffer<ReqPoolIndex> rows = Upload(f.rows());
    DeviceBuffer<TokenOffset> d_indptr = Upload(indptr);
    DeviceBuffer<TokenSlot> out = Upload(std::vector<TokenSlot>(64 + 16, TokenSlot(-9)));
    TokenKvIndicesDeviceInputs in{src.table, src.max_context_len, rows.const_span(),
                                  d_indptr.const_span(), {}, f.pool().max_context_len(),
                                  f.pool_slots()};
    ASSERT_TRUE(BuildTokenKvIndicesOnDevice(in, DeviceSpan<TokenSlot>(out.data(), 64), nullptr,
                                            violation())
                    .ok());
    ExpectViolation(words);
    const std::vector<TokenSlot> got = Download(out);
    for (int k = 64; k < 80; ++k) ASSERT_EQ(got[k], TokenSlot(-9)) << k;
  }
  // Token kv_indices: the padded row (-1) is a row outside the table here; an empty start span
  // with a pointer means all zeros (it is not read).
  {
    DeviceBuffer<ReqPoolIndex> rows = Upload(std::vector<ReqPoolIndex>{f.rows()[0], ReqPoolIndex(-1)});
    DeviceBuffer<TokenOffset> d_indptr =
        Upload(std::vector<TokenOffset>{TokenOffset(0), TokenOffset(10), TokenOffset(15)});
    DeviceBuffer<TokenSlot> out = Upload(std::vector<TokenSlot>(15, TokenSlot(-9)));
    TokenKvIndicesDeviceInputs in{src.table, src.max_context_len, rows.const_span(),
                                  d_indptr.const_span(), {}, f.pool().max_context_len(),
                                  f.pool_slots()};
    ASSERT_TRUE(BuildTokenKvIndicesOnDevice(in, out.span(), nullptr, violation()).ok());
    ExpectViolation("row -1 outside");
    DeviceBuffer<TokenPosition> one_start = Upload(std::vector<TokenPosition>{TokenPosition(3)});
    DeviceBuffer<ReqPoolIndex> row0 = Upload(std::vector<ReqPoolIndex>{f.rows()[0]});
    DeviceBuffer<TokenOffset> ten = Upload(std::vector<TokenOffset>{TokenOffset(0), TokenOffset(10)});
    in = TokenKvIndicesDeviceInputs{src.table, src.max_context_len, row0.const_span(),
                                    ten.const_span(), DeviceSpan<const TokenPosition>(one_start.data(), 0),
                                    f.pool().max_context_len(), f.pool_slots()};
    ASSERT_TRUE(BuildTokenKvIndicesOnDevice(in, out.span(), nullptr, violation()).ok());
    EXPECT_TRUE(Violations().ok());
    const std::vector<TokenSlot> got = Download(out);
    auto row = f.pool().Read(f.rows()[0], TokenCount(0), TokenCount(10));
    ASSERT_TRUE(row.ok()) << row.status();
    EXPECT_EQ(std::vector<TokenSlot>(got.begin(), got.begin() + 10),
              std::vector<TokenSlot>(row->begin(), row->end()));
  }
  // Token kv_indices: a start outside the row (negative, or past its end) is named, and that
  // sequence's entries are the padding page's slot (0: token-level slots are pages of one);
  // the other sequence is copied.
  const int32_t row_len = static_cast<int32_t>(f.pool().max_context_len().value());
  for (const int32_t bad : {-5, row_len + 1}) {
    SCOPED_TRACE(bad);
    DeviceBuffer<ReqPoolIndex> rows = Upload(std::vector<ReqPoolIndex>{f.rows()[0], f.rows()[1]});
    DeviceBuffer<TokenOffset> d_indptr =
        Upload(std::vector<TokenOffset>{TokenOffset(0), TokenOffset(10), TokenOffset(15)});
    DeviceBuffer<TokenPosition> starts =
        Upload(std::vector<TokenPosition>{TokenPosition(0), TokenPosition(bad)});
    DeviceBuffer<TokenSlot> out = Upload(std::vector<TokenSlot>(15, TokenSlot(-9)));
    const TokenKvIndicesDeviceInputs in{
        src.table,           src.max_context_len,        rows.const_span(), d_indptr.const_span(),
        starts.const_span(), f.pool().max_context_len(), f.pool_slots()};
    ASSERT_TRUE(BuildTokenKvIndicesOnDevice(in, out.span(), nullptr, violation()).ok());
    ExpectViolation(
        absl::StrCat("kv_start_idx entry 1: ", bad, " outside the row of ", row_len, " positions"));
    const std::vector<TokenSlot> got = Download(out);
    ASSERT_EQ(got.size(), 15u);
    auto row = f.pool().Read(f.rows()[0], TokenCount(0), TokenCount(10));
    ASSERT_TRUE(row.ok()) << row.status();
    EXPECT_EQ(std::vector<TokenSlot>(got.begin(), got.begin() + 10),
              std::vector<TokenSlot>(row->begin(), row->end()));
    EXPECT_EQ(std::vector<TokenSlot>(got.begin() + 10, got.end()),
              std::vector<TokenSlot>(5, TokenSlot(0)));
  }
  // Page table: a table with no columns, or too few, for rows that need pages.
  {
    DeviceBuffer<ReqPoolIndex> rows = Upload(f.rows());
    DeviceBuffer<TokenLength> lens = Upload(f.kv_lens());
    DeviceBuffer<PageId> none = Upload(std::vector<PageId>{});
    ASSERT_TRUE(BuildPageTableOnDevice(src, f.pool_slots(), rows.const_span(), lens.const_span(),
                                       f.page_size(), none.span(), PageCount(0), violation(), nullptr)
                    .ok());
    ExpectViolation("the table has 0 columns");
  }
  // Gather: a slot outside the pool, and a total past the outputs.
  {
    const int64_t row = 2 * 64 * 2;
    DeviceBuffer<uint8_t> pool = Upload(std::vector<uint8_t>(f.pool_slots().value() * row, 1));
    DeviceBuffer<TokenSlot> tok = Upload(std::vector<TokenSlot>{TokenSlot(17), TokenSlot(1 << 29)});
    DeviceBuffer<TokenOffset> cu = Upload(std::vector<TokenOffset>{TokenOffset(0), TokenOffset(2)});
    DeviceBuffer<uint8_t> out = Upload(std::vector<uint8_t>(2 * row, 9));
    GatherKvDeviceArgs a{pool.const_span(), pool.const_span(), 2, 64, KvElementType::kBf16,
                         tok.const_span(), cu.const_span(), out.span(), out.span()};
    ASSERT_TRUE(GatherKvOnDevice(a, violation(), nullptr).ok());
    ExpectViolation("outside the pool");
    DeviceBuffer<TokenOffset> long_cu = Upload(std::vector<TokenOffset>{TokenOffset(0), TokenOffset(900)});
    a.cu_k = long_cu.const_span();
    ASSERT_TRUE(GatherKvOnDevice(a, violation(), nullptr).ok());
    ExpectViolation("needs 900");
  }
}

// What the host can see is refused before any launch.
TEST_F(GpuTest, LaunchersRefuseBadShapesNullsAndMisalignedPointers) {
  DeviceBuffer<TokenLength> lens = Upload(std::vector<TokenLength>(4, TokenLength(1)));
  DeviceBuffer<TokenOffset> indptr = Upload(std::vector<TokenOffset>(5));
  const PageSize ps = *PageSize::Create(16);
  EXPECT_EQ(BuildIndptrOnDevice(lens.const_span(), DeviceSpan<TokenOffset>(indptr.data(), 4), {},
                                ps, nullptr, nullptr)
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(BuildIndptrOnDevice(DeviceSpan<const TokenLength>(nullptr, 4), indptr.span(), {}, ps,
                                nullptr, nullptr)
                .code(),
            absl::StatusCode::kInvalidArgument);
  DeviceBuffer<uint8_t> pool = Upload(std::vector<uint8_t>(64 * 256 + 2, 1));
  DeviceBuffer<TokenSlot> tok = Upload(std::vector<TokenSlot>{TokenSlot(1)});
  DeviceBuffer<TokenOffset> cu = Upload(std::vector<TokenOffset>{TokenOffset(0), TokenOffset(1)});
  DeviceBuffer<uint8_t> out = Upload(std::vector<uint8_t>(256 + 2, 0));
  // One byte off the 2-byte element.
  GatherKvDeviceArgs misaligned{DeviceSpan<const uint8_t>(pool.data() + 1, 64 * 256),
                                DeviceSpan<const uint8_t>(pool.data() + 1, 64 * 256),
                                1, 128, KvElementType::kBf16, tok.const_span(), cu.const_span(),
                                DeviceSpan<uint8_t>(out.data(), 256), DeviceSpan<uint8_t>(out.data(), 256)};
  EXPECT_EQ(GatherKvOnDevice(misaligned, nullptr, nullptr).code(), absl::StatusCode::kInvalidArgument);
  GatherKvDeviceArgs wide = misaligned;
  wide.k_pool = wide.v_pool = DeviceSpan<const uint8_t>(pool.data(), 64 * 256);
  wide.head_dim = 257;
  EXPECT_EQ(GatherKvOnDevice(wide, nullptr, nullptr).code(), absl::StatusCode::kInvalidArgument);
  // More sequences than the kernel's int32 batch: refused before the kernel reads cu_k (the
  // span is never dereferenced; its size is what a 2^31 + 1 entry cu_k would have).
  GatherKvDeviceArgs many = wide;
  many.head_dim = 128;
  many.cu_k = DeviceSpan<const TokenOffset>(cu.data(), (size_t{1} << 31) + 1);
  EXPECT_EQ(GatherKvOnDevice(many, nullptr, nullptr).code(), absl::StatusCode::kOutOfRange);
  DecodeMetadataDeviceArgs decode;  // empty table
  EXPECT_EQ(BuildDecodeMetadataOnDevice(decode, nullptr, nullptr).code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace attnmeta
