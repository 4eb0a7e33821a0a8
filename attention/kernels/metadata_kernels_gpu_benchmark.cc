// Bandwidth of the metadata kernels against a device-to-device copy of the same bytes measured
// in the same run, the fused decode-metadata launch against the separate launches it replaces
// and against the kv_indices kernel alone, and the host time of one graph replay step. The
// fused launch, kv_indices and the page table are timed as launched by default (overlapping
// the launch ahead, here the previous one) and as plain launches, as the copy is launched. The
// other rows (indptr, the separate launches, the gather) are default launches, which overlap
// since commit 5b78969: in earlier tables they were plain.
//
// Method (the device tool's measuring method, summarized): every launch's status checked; outputs
// poisoned before timing and checked against host-computed arrays after; medians of
// CUDA-event-timed samples after warm-up; inputs rotate over enough sets that the large shapes
// stream past the 50 MB L2; random shuffled page layouts, never zeros. Bytes counted: what the
// kernel must move to and from memory: an int32 read and an int32 write per token for kv_indices;
// per page for the page table, the int32 written and the 32-byte sector its slot is read from
// (min(page_size, 8) int32 of req_to_token: DRAM is read in sectors, so a strided read of one slot
// per page costs a sector); a length read and the indptr and last-page length written per row; for
// the fused launch, which reads each slot once, the slots read, kv_indices and the page-table
// entries written and its per-row arrays; K and V rows read and written for the gather. The
// copy reference moves the same number of bytes (half read, half written).
//
// Usage: metadata_kernels_gpu_benchmark [--l2-fetch-granularity=BYTES]
//            [--shape=BS,CTX,PS[,STRIDE] [--row-blocks=N[,N...]] | --host-times | OUT_DIR]
// (OUT_DIR gets metadata_kernels.csv and .md besides stdout; --host-times runs only the host-time
// measurements; --row-blocks adds the fused launch with each grid given, rows "fused (1 launch,
// N row blocks)", for same-run A/Bs of FusedMetadataRowBlocks). The granularity, an NVIDIA hint for
// the bytes DRAM fetches per L2 miss, is set for the whole run (the page table's strided reads
// depend on it). Needs a GPU; exits non-zero on any error or mismatch.

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "attention/graph/graph_state.h"
#include "attention/graph/host_device_memory.h"
#include "attention/graph/testing/graph_harness.h"
#include "attention/kernels/device_metadata_writer.h"
#include "attention/kernels/device_violation_word.h"
#include "attention/kernels/hip_device_memory.h"
#include "attention/kernels/metadata_kernel_args.h"
#include "attention/kernels/metadata_kernels.h"
#include "attention/kernels/metadata_kernels_launch.h"
#include "attention/kernels/metadata_launchers.h"
#include "attention/kernels/staged_uploads.h"
#include "attention/kernels/testing/bench_check.h"
#include "attention/kernels/testing/device_buffer.h"
#include "attention/kernels/testing/kv_bench.h"
#include "attention/kernels/token_kv_indices.h"
#include "attention/metadata/draft_decode_layout.h"
#include "attention/metadata/testing/batch_fixture.h"

namespace attnmeta {
namespace {

using testing::DeviceBuffer;
using testing::GpuStatus;
using testing::Unwrap;

constexpr int kLaunchesPerSample = 8;
constexpr int kSamples = 31;
constexpr int64_t kRotationBytes = int64_t{256} << 20;  // 5x the L2

// Median microseconds of one call of `launch(set)`, the sets rotating within each sample.
double TimeUs(int sets, const std::function<void(int)>& launch) {
  return testing::MedianEventUs(nullptr, kLaunchesPerSample, [&](int i) { launch(i % sets); },
                                kSamples);
}

struct Row {
  std::string op;
  int64_t bs, ctx, ps;
  double bytes, us, copy_us;
};
std::vector<Row> rows;

// --row-blocks=N[,N...] (with --shape): the fused launch also with each of these grids
// (row_blocks, FusedMetadataRowBlocks' choice overridden), in the same run.
std::vector<int32_t> forced_row_blocks;

void Report(const Row& r) {
  rows.push_back(r);
  const double tbs = r.bytes / (r.us * 1e-6) / 1e12;
  const double copy_tbs = r.bytes / (r.copy_us * 1e-6) / 1e12;
  std::printf("%-22s bs=%5lld ctx=%7lld ps=%3lld  %9.2f us %6.3f TB/s | copy %9.2f us %6.3f TB/s | %6.1f%% of copy\n",
              r.op.c_str(), static_cast<long long>(r.bs), static_cast<long long>(r.ctx),
              static_cast<long long>(r.ps), r.us, tbs, r.copy_us, copy_tbs, 100.0 * r.copy_us / r.us);
}

// One shape's inputs: req_to_token rows of shuffled pages, the batch's rows and lengths.
struct Set {
  DeviceBuffer<TokenSlot> table;
  DeviceBuffer<ReqPoolIndex> rows;
  DeviceBuffer<TokenLength> kv_lens, q_lens;
  DeviceBuffer<TokenOffset> kv_indptr, qo_indptr;
  DeviceBuffer<TokenLength> last;
  DeviceBuffer<TokenSlot> indices;
  DeviceBuffer<PageId> pages;
  DeviceBuffer<uint8_t> copy_src, copy_dst;
};

// The fused launch's arguments over a set's buffers (rows of ctx tokens in a req_to_token of
// row stride `stride`, cols page-table columns).
DecodeMetadataDeviceArgs FusedArgs(Set& x, int64_t ctx, int64_t stride, int64_t cols,
                                   TokenCount pool_slots, PageSize page_size) {
  DecodeMetadataDeviceArgs a;
  a.req_to_token = DeviceReqToToken{x.table.const_span(), TokenCount(stride)};
  a.pool_slots = pool_slots;
  a.page_size = page_size;
  a.rows = x.rows.const_span();
  a.kv_lens = x.kv_lens.const_span();
  a.q_lens = x.q_lens.const_span();
  a.kv_indptr = x.kv_indptr.span();
  a.qo_indptr = x.qo_indptr.span();
  a.kv_last_page_len = x.last.span();
  a.kv_indices = x.indices.span();
  a.page_table = x.pages.span();
  a.page_table_cols = PageCount(cols);
  a.max_kv_len = TokenCount(ctx);
  return a;
}

// Rows of ctx tokens in a req_to_token of row stride `stride` (>= ctx; a serving table's is its
// largest context, so with ctx below it the rows start aligned there and only kv_indices
// sees every alignment).
void RunShape(int64_t bs, int64_t ctx, int64_t ps, std::mt19937_64& rng, DeviceViolationWord& word,
              int64_t stride) {
  const PageSize page_size = *PageSize::Create(ps);
  const int64_t tokens = bs * ctx;
  const std::string tag = stride != ctx ? absl::StrFormat(" (row stride %d)", stride) : "";
  const int64_t cols = (ctx + ps - 1) / ps;
  const int64_t pool_pages = bs * cols + 1;
  const int64_t set_bytes = tokens * 8 + bs * cols * 8;
  const int sets = static_cast<int>(std::clamp<int64_t>(kRotationBytes / set_bytes, 1, 8));
  // Host arrays of set 0 (the others are shuffled copies), kept for the output checks.
  std::vector<TokenSlot> table(bs * stride, TokenSlot(0));
  std::vector<ReqPoolIndex> req_rows(bs);
  std::vector<TokenLength> kv(bs, TokenLength(static_cast<int32_t>(ctx))), q(bs, TokenLength(1));
  std::vector<Set> s;
  for (int k = 0; k < sets; ++k) {
    std::vector<int32_t> page_order(pool_pages - 1);
    std::iota(page_order.begin(), page_order.end(), 1);
    std::shuffle(page_order.begin(), page_order.end(), rng);
    for (int64_t i = 0; i < bs; ++i) {
      for (int64_t t = 0; t < ctx; ++t) {
        table[i * stride + t] =
            TokenSlot(static_cast<int32_t>(page_order[i * cols + t / ps] * ps + t % ps));
      }
    }
    for (int64_t i = 0; i < bs; ++i) req_rows[i] = ReqPoolIndex(static_cast<int32_t>(i));
    std::shuffle(req_rows.begin(), req_rows.end(), rng);
    std::vector<TokenOffset> kv_indptr(bs + 1);
    for (int64_t i = 0; i <= bs; ++i) kv_indptr[i] = TokenOffset(static_cast<int32_t>(i * ctx));
    const int64_t copy_bytes = tokens * 4 + bs * cols * 20;
    s.push_back(Set{Unwrap(DeviceBuffer<TokenSlot>::FromHost(table)),
                    Unwrap(DeviceBuffer<ReqPoolIndex>::FromHost(req_rows)),
                    Unwrap(DeviceBuffer<TokenLength>::FromHost(kv)),
                    Unwrap(DeviceBuffer<TokenLength>::FromHost(q)),
                    Unwrap(DeviceBuffer<TokenOffset>::FromHost(kv_indptr)),
                    Unwrap(DeviceBuffer<TokenOffset>::Create(bs + 1)),
                    Unwrap(DeviceBuffer<TokenLength>::Create(bs)),
                    Unwrap(DeviceBuffer<TokenSlot>::Create(tokens)),
                    Unwrap(DeviceBuffer<PageId>::Create(bs * cols)),
                    Unwrap(DeviceBuffer<uint8_t>::Create(copy_bytes)),
                    Unwrap(DeviceBuffer<uint8_t>::Create(copy_bytes))});
    BENCH_CHECK(GpuStatus(hipMemset(s.back().copy_src.data(), 0x5a, copy_bytes), "fill"));
  }
  const TokenCount pool_slots(pool_pages * ps);
  auto poison = [&] {
    for (Set& x : s) {
      BENCH_CHECK(GpuStatus(hipMemset(x.indices.data(), 0xff, tokens * 4), "poison"));
      BENCH_CHECK(GpuStatus(hipMemset(x.pages.data(), 0xff, bs * cols * 4), "poison"));
      BENCH_CHECK(GpuStatus(hipMemset(x.qo_indptr.data(), 0xff, (bs + 1) * 4), "poison"));
    }
  };
  // Checks set `k`'s outputs against its table, which is re-read from the device.
  auto check = [&](bool want_indices, bool want_pages, bool want_indptr, const char* op) {
    BENCH_CHECK(GpuStatus(hipDeviceSynchronize(), op));
    BENCH_CHECK(word.Check(nullptr));
    for (const Set& x : s) {
      const std::vector<TokenSlot> t = Unwrap(x.table.ToHost());
      const std::vector<ReqPoolIndex> r = Unwrap(x.rows.ToHost());
      const std::vector<TokenSlot> got = want_indices ? Unwrap(x.indices.ToHost()) : std::vector<TokenSlot>{};
      const std::vector<PageId> pg = want_pages ? Unwrap(x.pages.ToHost()) : std::vector<PageId>{};
      for (int64_t i = 0; i < bs; ++i) {
        const TokenSlot* row = t.data() + int64_t{r[i].value()} * stride;
        if (want_indices && !std::equal(row, row + ctx, got.begin() + i * ctx)) {
          std::fprintf(stderr, "MISMATCH %s kv_indices bs=%lld ctx=%lld ps=%lld row %lld\n", op,
                       (long long)bs, (long long)ctx, (long long)ps, (long long)i);
          std::exit(1);
        }
        for (int64_t j = 0; want_pages && j < cols; ++j) {
          if (pg[i * cols + j] != PageOf(row[j * ps], page_size)) {
            std::fprintf(stderr, "MISMATCH %s page_table row %lld col %lld\n", op, (long long)i, (long long)j);
            std::exit(1);
          }
        }
      }
      if (want_indptr) {
        const std::vector<TokenOffset> qo = Unwrap(x.qo_indptr.ToHost());
        for (int64_t i = 0; i <= bs; ++i) {
          if (qo[i].value() != i) {
            std::fprintf(stderr, "MISMATCH %s qo_indptr %lld\n", op, (long long)i);
            std::exit(1);
          }
        }
      }
    }
  };
  auto copy_us = [&](int64_t bytes) {
    return TimeUs(sets, [&](int k) {
      BENCH_CHECK(GpuStatus(hipMemcpyAsync(s[k].copy_dst.data(), s[k].copy_src.data(), bytes,
                                           hipMemcpyDeviceToDevice, nullptr),
                            "copy"));
    });
  };
  auto table_of = [&](int k) {
    return DeviceReqToToken{s[k].table.const_span(), TokenCount(stride)};
  };
  // Every launch overlaps the launch ahead by default; `plain` launches without that.
  auto kv_indices_launch = [&](int k, bool plain) {
    TokenKvIndicesDeviceInputs in{s[k].table.const_span(),
                                  TokenCount(stride),
                                  s[k].rows.const_span(),
                                  s[k].kv_indptr.const_span(),
                                  {},
                                  TokenCount(ctx),
                                  pool_slots};
    in.overlap_preceding_kernel = !plain;
    BENCH_CHECK(BuildTokenKvIndicesOnDevice(in, s[k].indices.span(), nullptr, word.device()));
  };
  auto kv_indices = [&](int k) { kv_indices_launch(k, false); };
  auto page_table_launch = [&](int k, bool plain) {
    BENCH_CHECK(BuildPageTableOnDevice(table_of(k), pool_slots, s[k].rows.const_span(),
                                       s[k].kv_lens.const_span(), page_size, s[k].pages.span(),
                                       PageCount(cols), word.device(), nullptr,
                                       /*overlap_preceding_kernel=*/!plain));
  };
  auto page_table = [&](int k) { page_table_launch(k, false); };
  auto indptr = [&](int k) {
    BENCH_CHECK(BuildIndptrOnDevice(s[k].q_lens.const_span(), s[k].qo_indptr.span(),
                                    s[k].last.span(), page_size, word.device(), nullptr));
  };
  auto fused = [&](int k) {
    BENCH_CHECK(BuildDecodeMetadataOnDevice(
        FusedArgs(s[k], ctx, stride, cols, pool_slots, page_size), word.device(), nullptr));
  };
  auto fused_plain = [&](int k) {
    DecodeMetadataDeviceArgs a = FusedArgs(s[k], ctx, stride, cols, pool_slots, page_size);
    a.overlap_preceding_kernel = false;
    BENCH_CHECK(BuildDecodeMetadataOnDevice(a, word.device(), nullptr));
  };
  BENCH_CHECK(word.Reset(nullptr));
  const double token_bytes = 8.0 * tokens;
  const double page_bytes = (4.0 * std::min<int64_t>(ps, 8) + 4.0) * bs * cols;
  const double indptr_bytes = 12.0 * bs;  // lengths read, indptr and last-page lengths written
  // With a power-of-two page size the fused launch takes the page-table entries from the slots
  // it reads for kv_indices: its page-table bytes are the entries written (other page sizes
  // read the page's slot again, as the page-table kernel does); per row it reads the row, both
  // lengths and writes both indptrs and the last-page length.
  const bool shared_loads = (ps & (ps - 1)) == 0;
  const double fused_bytes =
      token_bytes + (shared_loads ? 4.0 * bs * cols : page_bytes) + 24.0 * bs;

  poison();
  const double kv_plain_us = TimeUs(sets, [&](int k) { kv_indices_launch(k, true); });
  check(true, false, false, "kv_indices without overlap");
  poison();
  const double kv_us = TimeUs(sets, kv_indices);
  check(true, false, false, "kv_indices");
  const double kv_copy_us = copy_us(tokens * 4);
  Report({"kv_indices" + tag, bs, ctx, ps, token_bytes, kv_us, kv_copy_us});
  Report({"kv_indices without overlap" + tag, bs, ctx, ps, token_bytes, kv_plain_us, kv_copy_us});

  poison();
  const double pt_plain_us = TimeUs(sets, [&](int k) { page_table_launch(k, true); });
  check(false, true, false, "page_table without overlap");
  poison();
  const double pt_us = TimeUs(sets, page_table);
  check(false, true, false, "page_table");
  const double pt_copy_us = copy_us(static_cast<int64_t>(page_bytes / 2));
  Report({"page_table" + tag, bs, ctx, ps, page_bytes, pt_us, pt_copy_us});
  Report({"page_table without overlap" + tag, bs, ctx, ps, page_bytes, pt_plain_us, pt_copy_us});

  poison();
  const double ip_us = TimeUs(sets, indptr);
  check(false, false, true, "indptr");
  Report({"indptr+last_page_len" + tag, bs, ctx, ps, indptr_bytes, ip_us, copy_us(bs * 6)});

  poison();
  const double sep_us = TimeUs(sets, [&](int k) {
    indptr(k);
    kv_indices(k);
    page_table(k);
  });
  check(true, true, true, "separate");
  const double separate_bytes = token_bytes + page_bytes + indptr_bytes;
  Report({"separate (3 launches)" + tag, bs, ctx, ps, separate_bytes, sep_us,
          copy_us(static_cast<int64_t>(separate_bytes / 2))});

  // The fused launch rewrites kv_indptr from the lengths: the kernels above read it, so it is
  // timed last.
  poison();
  const double plain_us = TimeUs(sets, fused_plain);
  check(true, true, true, "fused without overlap");
  poison();
  const double fused_us = TimeUs(sets, fused);
  check(true, true, true, "fused");
  const double fused_copy_us = copy_us(static_cast<int64_t>(fused_bytes / 2));
  Report({"fused (1 launch)" + tag, bs, ctx, ps, fused_bytes, fused_us, fused_copy_us});
  Report({"fused (1 launch) without overlap" + tag, bs, ctx, ps, fused_bytes, plain_us,
          fused_copy_us});
  std::printf("    fused / kv_indices alone = %.3f (both without overlap %.3f), fused / separate = "
              "%.3f\n",
              fused_us / kv_us, plain_us / kv_plain_us, fused_us / sep_us);
  // Each forced grid through the kernel's own launcher, overlapping the launch ahead where
  // BuildDecodeMetadataOnDevice would (the same checked params, the same outputs checked). A
  // grid is taken as given: blocks past a row's passes return at once, where the launcher never
  // gives more blocks than the longest row's passes.
  const bool overlaps = Unwrap(DeviceOverlapsLaunches());
  for (const int32_t row_blocks : forced_row_blocks) {
    poison();
    const double us = TimeUs(sets, [&](int k) {
      const kernels::FusedMetadataParams p = Unwrap(FusedMetadataParamsFor(
          FusedArgs(s[k], ctx, stride, cols, pool_slots, page_size), word.device()));
      BENCH_CHECK(GpuStatus(kernels::LaunchFusedMetadataKernel(p, row_blocks, overlaps, nullptr),
                            "fused launch with row_blocks"));
    });
    check(true, true, true, "fused with row_blocks");
    Report({absl::StrFormat("fused (1 launch, %d row blocks)", row_blocks) + tag, bs, ctx, ps,
            fused_bytes, us, fused_copy_us});
  }
}

void RunGather(int64_t tokens, int heads, int head_dim, std::mt19937_64& rng, DeviceViolationWord& word) {
  const int64_t row = int64_t{heads} * head_dim * 2;
  const int64_t pool_slots = tokens + 4096;
  std::vector<uint8_t> k(pool_slots * row);
  for (size_t i = 0; i < k.size(); i += 8) k[i] = static_cast<uint8_t>(rng());
  std::vector<TokenSlot> tok(tokens);
  std::vector<int32_t> perm(pool_slots);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  for (int64_t r = 0; r < tokens; ++r) tok[r] = TokenSlot(perm[r]);
  auto dk = Unwrap(DeviceBuffer<uint8_t>::FromHost(k));
  auto dv = Unwrap(DeviceBuffer<uint8_t>::FromHost(k));
  auto dtok = Unwrap(DeviceBuffer<TokenSlot>::FromHost(tok));
  auto dcu = Unwrap(DeviceBuffer<TokenOffset>::FromHost(
      std::vector<TokenOffset>{TokenOffset(0), TokenOffset(static_cast<int32_t>(tokens))}));
  auto ko = Unwrap(DeviceBuffer<uint8_t>::Create(tokens * row));
  auto vo = Unwrap(DeviceBuffer<uint8_t>::Create(tokens * row));
  BENCH_CHECK(GpuStatus(hipMemset(ko.data(), 0xee, tokens * row), "poison"));
  GatherKvDeviceArgs a{dk.const_span(), dv.const_span(), heads, head_dim, KvElementType::kBf16,
                       dtok.const_span(), dcu.const_span(), ko.span(), vo.span()};
  const double us = TimeUs(1, [&](int) { BENCH_CHECK(GatherKvOnDevice(a, word.device(), nullptr)); });
  BENCH_CHECK(GpuStatus(hipDeviceSynchronize(), "gather"));
  BENCH_CHECK(word.Check(nullptr));
  const std::vector<uint8_t> got = Unwrap(ko.ToHost());
  for (int64_t r = 0; r < tokens; r += 97) {
    if (!std::equal(got.begin() + r * row, got.begin() + (r + 1) * row, k.begin() + tok[r].value() * row)) {
      std::fprintf(stderr, "MISMATCH gather row %lld\n", (long long)r);
      std::exit(1);
    }
  }
  // The reference moves the same bytes: K and V rows, read and written.
  auto copy_src = Unwrap(DeviceBuffer<uint8_t>::Create(2 * tokens * row));
  auto copy_dst = Unwrap(DeviceBuffer<uint8_t>::Create(2 * tokens * row));
  BENCH_CHECK(GpuStatus(hipMemset(copy_src.data(), 0x5a, 2 * tokens * row), "fill"));
  const double copy = TimeUs(1, [&](int) {
    BENCH_CHECK(GpuStatus(hipMemcpyAsync(copy_dst.data(), copy_src.data(), 2 * tokens * row,
                                         hipMemcpyDeviceToDevice, nullptr),
                          "copy"));
  });
  Report({absl::StrFormat("gather %dx%d bf16", heads, head_dim), 1, tokens, 1, 4.0 * tokens * row, us,
          copy});
}

// A device writer over `table` (the device copy of f's req_to_token) on `stream`.
std::unique_ptr<DeviceMetadataWriter> MakeWriter(const testing::BatchFixture& f,
                                                 const DeviceBuffer<TokenSlot>& table,
                                                 hipStream_t stream, StagedUploads* uploads,
                                                 bool overlap) {
  DeviceMetadataWriter::Options options;
  options.uploads = uploads;
  options.overlap_launches = overlap;
  return Unwrap(DeviceMetadataWriter::Create(
      DeviceReqToToken{table.const_span(), f.pool().max_context_len()}, f.pool_slots(), stream,
      options));
}

// The host time of one decode replay step: GraphState::Replay staging the batch and launching
// the captured graph, and the GPU time of the step. `staged`: the inputs ride in the graph
// launch (StagedUploads); else a copy call through a pinned slot precedes it. `overlap`: the
// writer's Options::overlap_launches.
void RunReplayStep(bool staged, bool overlap = true) {
  const int bs = 256;
  const int64_t ctx = 4096, ps = 16;
  testing::BatchFixture f(ps, 7, bs * (ctx / ps + 1) + 64, bs + 8, ctx + 16);
  for (int i = 0; i < bs; ++i) f.AddSequence(ctx - 1, 1);
  std::vector<TokenSlot> table(f.pool().table().begin(), f.pool().table().end());
  auto d_table = Unwrap(DeviceBuffer<TokenSlot>::FromHost(table));
  hipStream_t stream;
  BENCH_CHECK(GpuStatus(hipStreamCreate(&stream), "stream"));
  {  // everything that uses the stream goes before it
  std::unique_ptr<StagedUploads> uploads;
  if (staged) uploads = Unwrap(StagedUploads::Create(stream));
  HipDeviceMemory memory(stream, uploads.get());
  auto writer = MakeWriter(f, d_table, stream, uploads.get(), overlap);
  const BackendConfig config = testing::MakeTestConfig(
      ps, {.max_batch_size = bs, .max_context_len = ctx, .split_kv = false});
  auto state = Unwrap(GraphState::Create(config, &f.pool(), f.page_size(), &memory, writer.get()));
  const CaptureHandle h = Unwrap(state->Capture(bs, ForwardMode::kDecode));
  const ReplayBatch batch{f.rows(), f.kv_lens()};
  for (int w = 0; w < 10; ++w) BENCH_CHECK(state->Replay(h, batch).status());
  BENCH_CHECK(GpuStatus(hipStreamSynchronize(stream), "sync"));
  constexpr int kSteps = 200;
  std::vector<double> host_us, copy_us;
  hipEvent_t start, stop;
  BENCH_CHECK(GpuStatus(hipEventCreate(&start), "event"));
  BENCH_CHECK(GpuStatus(hipEventCreate(&stop), "event"));
  std::vector<float> gpu_us;
  // The writer alone: a launch of the same captured graph, the inputs as last staged.
  MetadataWriteRequest last_request;
  last_request.mode = ForwardMode::kDecode;
  last_request.real_batch_size = bs;
  last_request.padded_batch_size = bs;
  last_request.padded_kv_len = GraphState::kPaddedKvLen;
  last_request.page_size = f.page_size();
  last_request.req_to_token = &f.pool();
  last_request.page_table = true;
  last_request.q_len_per_request = TokenLength(1);
  last_request.generation = state->generation();
  for (int step = 0; step < kSteps; ++step) {
    const auto t0 = std::chrono::steady_clock::now();
    // With staged uploads this applies an empty batch: the same launch a replay makes.
    BENCH_CHECK(writer->WriteBatchArrays(last_request, state->buffers()));
    const auto t1 = std::chrono::steady_clock::now();
    BENCH_CHECK(GpuStatus(hipStreamSynchronize(stream), "sync"));
    copy_us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
  }
  for (int w = 0; w < 10; ++w) BENCH_CHECK(state->Replay(h, batch).status());
  for (int step = 0; step < kSteps; ++step) {
    BENCH_CHECK(GpuStatus(hipEventRecord(start, stream), "record"));
    const auto t0 = std::chrono::steady_clock::now();
    BENCH_CHECK(state->Replay(h, batch).status());
    const auto t1 = std::chrono::steady_clock::now();
    BENCH_CHECK(GpuStatus(hipEventRecord(stop, stream), "record"));
    BENCH_CHECK(GpuStatus(hipEventSynchronize(stop), "sync"));
    float ms = 0;
    BENCH_CHECK(GpuStatus(hipEventElapsedTime(&ms, start, stop), "elapsed"));
    host_us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
    gpu_us.push_back(ms * 1e3f);
  }
  BENCH_CHECK(writer->CheckViolations());
  std::sort(copy_us.begin(), copy_us.end());
  const char* how = !staged   ? "inputs by a copy call"
                    : overlap ? "inputs applied in the graph launch"
                              : "inputs applied in the graph launch, launches without overlap";
  std::printf("[%s] the writer alone (its graph launch): host %.2f us median\n", how,
              copy_us[kSteps / 2]);
  std::sort(host_us.begin(), host_us.end());
  std::sort(gpu_us.begin(), gpu_us.end());
  std::printf("[%s] replay step bs=%d ctx=%lld ps=%lld: host %.2f us median (p90 %.2f), GPU "
              "%.2f us median (event to event); graphs captured: %lld\n",
              how, bs, (long long)ctx, (long long)ps, host_us[kSteps / 2],
              host_us[kSteps * 9 / 10], gpu_us[kSteps / 2], (long long)writer->graphs_captured());
  const std::string name = !staged   ? "replay step: copy call"
                           : overlap ? "replay step: staged uploads"
                                     : "replay step: staged uploads without overlap";
  Report({name + " (host us)", bs, ctx, ps, 0, host_us[kSteps / 2], 0});
  Report({name + " (GPU us)", bs, ctx, ps, 0, gpu_us[kSteps / 2], 0});
  BENCH_CHECK(GpuStatus(hipEventDestroy(start), "event"));
  BENCH_CHECK(GpuStatus(hipEventDestroy(stop), "event"));
  }
  BENCH_CHECK(GpuStatus(hipStreamDestroy(stream), "stream"));
}

// The GPU time of one draft-decode replay step (bs 64, top-k 4, 3 steps, committed lengths
// 2000, page size 16, staged uploads): the apply kernel, then two launches per step, each
// overlapping the one ahead or not (the writer's Options::overlap_launches).
void RunDraftReplayStep(bool overlap) {
  const int bs = 64;
  const int64_t ps = 16, committed = 2000;
  const DraftDecodeShape shape{4, 3};
  const TokenLength max_len(4096);
  const PageSize page_size = *PageSize::Create(ps);
  const int64_t row = MaxDraftRowTokens(max_len, shape, page_size).value();
  testing::BatchFixture f(ps, 11, bs * (row / ps + 1) + 64, bs + 8, row);
  const TokenLength len(static_cast<int32_t>(committed));
  for (int i = 0; i < bs; ++i) {
    f.AddSequence(committed, DraftRowTokens(len, shape, page_size).value() - committed);
  }
  std::vector<TokenSlot> table(f.pool().table().begin(), f.pool().table().end());
  auto d_table = Unwrap(DeviceBuffer<TokenSlot>::FromHost(table));
  hipStream_t stream;
  BENCH_CHECK(GpuStatus(hipStreamCreate(&stream), "stream"));
  {  // everything that uses the stream goes before it
  std::unique_ptr<StagedUploads> uploads = Unwrap(StagedUploads::Create(stream));
  HipDeviceMemory memory(stream, uploads.get());
  auto writer = MakeWriter(f, d_table, stream, uploads.get(), overlap);
  const BackendConfig config = testing::MakeTestConfig(
      ps, {.max_batch_size = bs, .max_context_len = max_len.value(), .split_kv = false,
           .topk = shape.topk, .steps = shape.steps});
  auto state = Unwrap(GraphState::Create(config, &f.pool(), f.page_size(), &memory, writer.get()));
  const CaptureHandle h = Unwrap(state->Capture(bs, ForwardMode::kDraftDecode));
  const std::vector<TokenLength> lens(bs, len);
  const ReplayBatch batch{f.rows(), lens};
  for (int w = 0; w < 10; ++w) BENCH_CHECK(state->Replay(h, batch).status());
  constexpr int kSteps = 200;
  std::vector<float> gpu_us;
  hipEvent_t start, stop;
  BENCH_CHECK(GpuStatus(hipEventCreate(&start), "event"));
  BENCH_CHECK(GpuStatus(hipEventCreate(&stop), "event"));
  for (int step = 0; step < kSteps; ++step) {
    BENCH_CHECK(GpuStatus(hipEventRecord(start, stream), "record"));
    BENCH_CHECK(state->Replay(h, batch).status());
    BENCH_CHECK(GpuStatus(hipEventRecord(stop, stream), "record"));
    BENCH_CHECK(GpuStatus(hipEventSynchronize(stop), "sync"));
    float ms = 0;
    BENCH_CHECK(GpuStatus(hipEventElapsedTime(&ms, start, stop), "elapsed"));
    gpu_us.push_back(ms * 1e3f);
  }
  BENCH_CHECK(writer->CheckViolations());
  // The last step's kv_indptr end: what the layout says (draft_decode_layout.h).
  const DraftStepBuffers& last = state->buffers().draft_steps[shape.steps - 1];
  const size_t branches = static_cast<size_t>(bs) * shape.topk;
  TokenOffset end(0);
  BENCH_CHECK(GpuStatus(hipMemcpy(&end, last.kv_indptr.data() + branches, sizeof(end),
                                  hipMemcpyDeviceToHost),
                        "read kv_indptr"));
  if (end.value() != DraftStepTokens(lens, shape, shape.steps - 1).value()) {
    std::fprintf(stderr, "MISMATCH draft replay: kv_indptr[%zu] = %d\n", branches, end.value());
    std::exit(1);
  }
  std::sort(gpu_us.begin(), gpu_us.end());
  const std::string name = overlap ? "draft replay step (GPU us)"
                                   : "draft replay step without overlap (GPU us)";
  std::printf("%s bs=%d topk=%d steps=%d committed=%lld ps=%lld: %.2f us median (p90 %.2f)\n",
              name.c_str(), bs, shape.topk, shape.steps, (long long)committed, (long long)ps,
              gpu_us[kSteps / 2], gpu_us[kSteps * 9 / 10]);
  Report({name, bs, committed, ps, 0, gpu_us[kSteps / 2], 0});
  BENCH_CHECK(GpuStatus(hipEventDestroy(start), "event"));
  BENCH_CHECK(GpuStatus(hipEventDestroy(stop), "event"));
  }
  BENCH_CHECK(GpuStatus(hipStreamDestroy(stream), "stream"));
}

// The host time of one eager BuildDecodeMetadataOnDevice call (no graph: the launcher's checks,
// its grid and the kernel launch), as a step that runs without a captured graph pays it.
void RunEagerLaunchHostTime(DeviceViolationWord& word) {
  const int64_t bs = 256, ctx = 4096, ps = 16;
  const int64_t cols = ctx / ps;
  std::vector<TokenSlot> table(bs * ctx);
  for (int64_t t = 0; t < bs * ctx; ++t) table[t] = TokenSlot(static_cast<int32_t>(t));
  std::vector<ReqPoolIndex> req_rows(bs);
  for (int64_t i = 0; i < bs; ++i) req_rows[i] = ReqPoolIndex(static_cast<int32_t>(i));
  Set x{Unwrap(DeviceBuffer<TokenSlot>::FromHost(table)),
        Unwrap(DeviceBuffer<ReqPoolIndex>::FromHost(req_rows)),
        Unwrap(DeviceBuffer<TokenLength>::FromHost(
            std::vector<TokenLength>(bs, TokenLength(static_cast<int32_t>(ctx))))),
        Unwrap(DeviceBuffer<TokenLength>::FromHost(std::vector<TokenLength>(bs, TokenLength(1)))),
        Unwrap(DeviceBuffer<TokenOffset>::Create(bs + 1)),
        Unwrap(DeviceBuffer<TokenOffset>::Create(bs + 1)),
        Unwrap(DeviceBuffer<TokenLength>::Create(bs)),
        Unwrap(DeviceBuffer<TokenSlot>::Create(bs * ctx)),
        Unwrap(DeviceBuffer<PageId>::Create(bs * cols)),
        Unwrap(DeviceBuffer<uint8_t>::Create(1)),
        Unwrap(DeviceBuffer<uint8_t>::Create(1))};
  const DecodeMetadataDeviceArgs a =
      FusedArgs(x, ctx, ctx, cols, TokenCount(bs * ctx), *PageSize::Create(ps));
  BENCH_CHECK(word.Reset(nullptr));
  std::vector<double> us;
  for (int step = 0; step < 1020; ++step) {
    const auto t0 = std::chrono::steady_clock::now();
    BENCH_CHECK(BuildDecodeMetadataOnDevice(a, word.device(), nullptr));
    const auto t1 = std::chrono::steady_clock::now();
    if (step >= 20) us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
    // Keep the launch queue short: a full queue blocks the launch call.
    if (step % 16 == 15) BENCH_CHECK(GpuStatus(hipStreamSynchronize(nullptr), "sync"));
  }
  BENCH_CHECK(GpuStatus(hipDeviceSynchronize(), "sync"));
  BENCH_CHECK(word.Check(nullptr));
  std::sort(us.begin(), us.end());
  std::printf(
      "eager BuildDecodeMetadataOnDevice bs=%lld ctx=%lld ps=%lld: host %.2f us median "
      "(p90 %.2f) per call\n",
      (long long)bs, (long long)ctx, (long long)ps, us[us.size() / 2], us[us.size() * 9 / 10]);
  Report({"eager fused launcher call (host us)", bs, ctx, ps, 0, us[us.size() / 2], 0});
}

// GraphState's own host work per replay on this machine: the same batch through a writer
// that writes nothing, into host memory.
class NoWriter : public MetadataWriter {
 public:
  MemorySpace space() const override { return MemorySpace::kHost; }
  absl::Status WriteBatchArrays(const MetadataWriteRequest&, const GraphBuffers&) override {
    return absl::OkStatus();
  }
  absl::Status WriteTokenArrays(const MetadataWriteRequest&, const GraphBuffers&,
                                SplitKvPlanCounts*) override {
    return absl::OkStatus();
  }
};

void RunHostBookkeeping() {
  const int bs = 256;
  const int64_t ctx = 4096, ps = 16;
  testing::BatchFixture f(ps, 7, bs * (ctx / ps + 1) + 64, bs + 8, ctx + 16);
  for (int i = 0; i < bs; ++i) f.AddSequence(ctx - 1, 1);
  HostDeviceMemory memory;
  NoWriter writer;
  const BackendConfig config = testing::MakeTestConfig(
      ps, {.max_batch_size = bs, .max_context_len = ctx, .split_kv = false});
  auto state = Unwrap(GraphState::Create(config, &f.pool(), f.page_size(), &memory, &writer));
  const CaptureHandle h = Unwrap(state->Capture(bs, ForwardMode::kDecode));
  const ReplayBatch batch{f.rows(), f.kv_lens()};
  std::vector<double> us;
  for (int step = 0; step < 2000; ++step) {
    const auto t0 = std::chrono::steady_clock::now();
    BENCH_CHECK(state->Replay(h, batch).status());
    us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(us.begin(), us.end());
  std::printf("GraphState::Replay host work alone (no writer, host memory) bs=%d: %.2f us median\n", bs,
              us[us.size() / 2]);
}

void Write(const std::string& dir) {
  if (dir.empty()) return;
  std::ofstream csv(dir + "/metadata_kernels.csv");
  std::ofstream md(dir + "/metadata_kernels.md");
  csv << "op,bs,ctx,page_size,bytes,us,tb_per_s,copy_us,copy_tb_per_s,fraction_of_copy\n";
  md << "| op | bs | ctx | page size | us | TB/s | copy us | copy TB/s | % of copy |\n"
     << "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n";
  for (const Row& r : rows) {
    const double tbs = r.bytes > 0 ? r.bytes / (r.us * 1e-6) / 1e12 : 0;
    const double ctbs = r.bytes > 0 && r.copy_us > 0 ? r.bytes / (r.copy_us * 1e-6) / 1e12 : 0;
    const double frac = r.copy_us > 0 ? r.copy_us / r.us : 0;
    csv << absl::StrFormat("%s,%d,%d,%d,%.0f,%.3f,%.4f,%.3f,%.4f,%.4f\n", r.op, r.bs, r.ctx, r.ps,
                           r.bytes, r.us, tbs, r.copy_us, ctbs, frac);
    md << absl::StrFormat("| %s | %d | %d | %d | %.2f | %.3f | %.2f | %.3f | %.1f |\n", r.op, r.bs,
                          r.ctx, r.ps, r.us, tbs, r.copy_us, ctbs, 100 * frac);
  }
}

}  // namespace
}  // namespace attnmeta

int main(int argc, char** argv) {
  using namespace attnmeta;
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // a crash must not lose the lines before it
  BENCH_CHECK(testing::RequireGpu());
  DeviceViolationWord word = Unwrap(DeviceViolationWord::Create());
  std::mt19937_64 rng(42);
  struct Shape {
    int64_t bs, ctx;
  };
  int arg = 1;
  if (arg < argc && std::string(argv[arg]).rfind("--l2-fetch-granularity=", 0) == 0) {
    const std::string value = argv[arg] + 23;
    if (value != "0" && value != "32" && value != "64" && value != "128") {
      std::fprintf(stderr, "--l2-fetch-granularity takes 0, 32, 64 or 128 (bytes), not %s\n",
                   value.c_str());
      return 2;
    }
    BENCH_CHECK(
        GpuStatus(SetL2FetchGranularity(std::stoul(value)), "set the L2 fetch granularity"));
    ++arg;
  }
  if (size_t granularity = 0; GetL2FetchGranularity(&granularity) == hipSuccess) {
    std::printf("L2 fetch granularity: %zu bytes\n", granularity);
  }
  // --host-times runs only the host-time measurements.
  if (arg < argc && std::string(argv[arg]) == "--host-times") {
    RunHostBookkeeping();
    RunEagerLaunchHostTime(word);
    RunReplayStep(/*staged=*/false);
    RunReplayStep(/*staged=*/true, /*overlap=*/false);
    RunReplayStep(/*staged=*/true);
    RunDraftReplayStep(/*overlap=*/false);
    RunDraftReplayStep(/*overlap=*/true);
    return 0;
  }
  // --shape=BS,CTX,PS[,STRIDE] runs that one shape (for a profiler), STRIDE the row stride of
  // req_to_token (CTX by default); then --row-blocks=N[,N...] adds the fused launch with each
  // of those grids.
  if (arg < argc && std::string(argv[arg]).rfind("--shape=", 0) == 0) {
    long long bs = 0, ctx = 0, ps = 0, stride = 0;
    const int n = std::sscanf(argv[arg] + 8, "%lld,%lld,%lld,%lld", &bs, &ctx, &ps, &stride);
    if (n < 3 || (n == 4 && stride < ctx)) return 2;
    if (arg + 1 < argc && std::string(argv[arg + 1]).rfind("--row-blocks=", 0) == 0) {
      for (const absl::string_view v : absl::StrSplit(argv[arg + 1] + 13, ',')) {
        int32_t row_blocks = 0;
        // The grid's y dimension: at most 65535 blocks.
        if (!absl::SimpleAtoi(v, &row_blocks) || row_blocks < 1 || row_blocks > 65535) {
          std::fprintf(stderr, "--row-blocks takes numbers from 1 to 65535, not %s\n",
                       argv[arg + 1] + 13);
          return 2;
        }
        forced_row_blocks.push_back(row_blocks);
      }
    }
    RunShape(bs, ctx, ps, rng, word, n == 4 ? stride : ctx);
    return 0;
  }
  for (int64_t ps : {1, 16, 64}) {
    for (Shape s : {Shape{1, 16384}, Shape{1024, 1024}, Shape{8, 4096}, Shape{64, 4096}, Shape{256, 4096},
                    Shape{1024, 4096}, Shape{8, 131072}, Shape{64, 131072}, Shape{1024, 32768}}) {
      RunShape(s.bs, s.ctx, ps, rng, word, s.ctx);
    }
  }
  // Odd context lengths: rows start at every alignment in kv_indices, and in the table too
  // when its row stride is the length (a serving table's stride is its largest context).
  for (Shape s : {Shape{1024, 4095}, Shape{1024, 32767}}) {
    RunShape(s.bs, s.ctx, 16, rng, word, s.ctx);
    RunShape(s.bs, s.ctx, 16, rng, word, s.ctx + 1);
  }
  RunGather(65536, 8, 128, rng, word);
  RunGather(65536, 1, 256, rng, word);
  RunHostBookkeeping();
  RunEagerLaunchHostTime(word);
  RunReplayStep(/*staged=*/false);
  RunReplayStep(/*staged=*/true, /*overlap=*/false);
  RunReplayStep(/*staged=*/true);
  RunDraftReplayStep(/*overlap=*/false);
  RunDraftReplayStep(/*overlap=*/true);
  Write(arg < argc ? argv[arg] : "");
  return 0;
}
