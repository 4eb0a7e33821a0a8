// Bandwidth of paged decode attention (paged_decode_launcher.h): bf16, 32 query / 8 KV heads,
// head dim 128, batch sizes 1-256 and contexts 1k-32k, in KV bytes read per second, next to a
// read-only streaming kernel over the same number of bytes (the ceiling of a kernel that only
// reads), the kernel's reads alone (a read-only kernel with its grid and its loads of K and V
// rows, over a contiguous layout: what the layout and the grid leave), a device-to-device copy,
// and the same kernel on a contiguous layout, all measured in the same run.
//
// Per shape: the kernel reading shuffled pools of page size 1, 16 and 64 through token-level
// kv_indices, through the page table at 16 and 64, and a contiguous layout (slots = identity,
// token-level); each with the plan PlanDecodeSplitKv makes for this GPU (a split for bs 1 and 8,
// and wherever the batch alone does not fill the GPU), the partials merged in the attention
// launch (merge counters), plus, at page size 16 where the plan splits, the same plan merged by
// a second launch and the same kernel without a split. Then every compiled variant of the kernel
// shape at a few shapes (the sweep), so that the best can be made the default.
//
// Method (the device tool's measuring method, summarized): every launch's status checked; outputs
// poisoned (0xFF bytes, NaN) and checked written in full after one run of each configuration, two
// sequences against a CPU reference (double) of the same bf16 values, and the violation word clean;
// medians of event-timed replays of a captured graph of back-to-back launches (so that host launch
// cost does not hide the GPU time of small shapes), after warm-up; small shapes rotate over
// disjoint slots of the pool so that every launch reads past the 50 MB L2; random bf16 data, never
// zeros. Bytes counted: the K and V rows the kernel must read (bs * ctx * 8 heads * 128 * 2 bytes,
// twice); indices, queries, outputs and partials are not counted (under 0.2% at ctx >= 1k).
// The read reference (testing/stream_read.h) reads the same number of bytes (at most 2 GiB;
// the rate is flat past that), timed like the kernel; "of read" is the kernel's KV read rate
// over its rate. The copy copies as many bytes, issued on the stream (a copy captured in a
// graph runs on a copy engine, about 2.7 TB/s on the H200 against 4.3 on the stream), and is
// reported as bytes read + written per second, as a copy's bandwidth usually is. "of
// contiguous" is the contiguous layout's time over the kernel's.
//
// Usage: paged_decode_attention_gpu_benchmark [OUT_DIR] [--variant=N|all] [--shape=BS,CTX]
//        [--blocks-per-sm=N] [--max-items-per-sequence=N] [--min-chunk=N] [--no-sweep]
//        [--dims=Q,KV,D] [--overlap=none|wait-first|metadata-first|warm-l2-first]
//        [--pool-gb=G] [--slots=churn] [--slots=sorted]
// --variant: the table with that variant (or each), no sweep; --shape: that shape only;
// --dims: query heads, KV heads and head dim (default 32,8,128). Other dims run without the
// variant sweep (the variants other than 0 are compiled for head dim 128 and groups of a
// multiple of 4 only; the launcher refuses the rest and the run exits), and the reads-alone
// reference only where it models the kernel's grid (head dim 128, one block per KV head);
// --blocks-per-sm: DecodeSplitOptions::blocks_per_multiprocessor of the split plans (default:
// DecodeSplitOptionsForDevice's, the kernel's occupancy on this GPU); --max-items-per-sequence:
// DecodeSplitOptions::max_items_per_sequence, --min-chunk: its min_chunk (defaults:
// DecodeSplitOptionsForDevice's). --overlap: how each attention launch may overlap the one
// before it (PagedDecodeArgs::overlap, DecodeLaunchOverlap; default wait-first, the launcher's
// default), the contiguous layout's included; rows of the other modes are named "... plain",
// "... metadata first" and "... warm l2 first"; the read, reads-alone and copy references are
// timed the same in every mode. --pool-gb: a pool of at least G GB of K and V (default: what
// the shapes' rotation sets need, 34.4 GB for the whole table, under 1 GB for some single
// shapes); the shuffled slots spread over all of it, as in a serving pool, which the address
// translation of page size 1 feels. --slots=churn: also page size 1 through the slots a
// long-running server's allocator hands out (testing::ServingChurnSlots; the pool must hold its
// 64 running requests, so give --pool-gb of a few GB or more), the row "kv_indices ps1 churn".
// --slots=sorted: also page size 1 through uniformly shuffled slots with each sequence's slots
// in ascending order, the row "kv_indices ps1 sorted". Decode attention does not depend on the
// order of a sequence's tokens; sorted, the blocks of a launch walk the pool together, so the
// addresses in flight at any moment span a small part of it (a test of whether the large
// pool's loss at page size 1 is the spread of addresses in flight).
// Writes OUT_DIR/paged_decode_attention.csv and .md besides stdout. Needs a GPU; exits non-zero
// on any error or mismatch.

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <limits>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "attention/kernels/device_violation_word.h"
#include "attention/kernels/half_bits.h"
#include "attention/kernels/metadata_launchers.h"
#include "attention/kernels/paged_decode_attention.h"
#include "attention/kernels/paged_decode_launcher.h"
#include "attention/kernels/testing/bench_check.h"
#include "attention/kernels/testing/device_buffer.h"
#include "attention/kernels/testing/kv_bench.h"
#include "attention/kernels/testing/stream_read.h"
#include "attention/metadata/split_kv_planner.h"
#include "kvcache/testing/serving_churn.h"

namespace attnmeta {
namespace {

using testing::DeviceBuffer;
using testing::GpuStatus;
using testing::MedianEventUs;
using testing::Unwrap;

using testing::BenchDims;

// The attention shape (--dims=Q,KV,D). Set by main before any shape runs.
BenchDims dims;
// --overlap: PagedDecodeArgs::overlap of every attention launch.
DecodeLaunchOverlap overlap = DecodeLaunchOverlap::kWaitFirst;
// What a row's name says of a mode other than the default.
std::string OverlapSuffix() {
  switch (overlap) {
    case DecodeLaunchOverlap::kNone:
      return " plain";
    case DecodeLaunchOverlap::kWaitFirst:
      return "";
    case DecodeLaunchOverlap::kMetadataFirst:
      return " metadata first";
    case DecodeLaunchOverlap::kWarmL2First:
      return " warm l2 first";
  }
  return "";
}
constexpr int64_t kRotationBytes = int64_t{256} << 20;  // 5x the L2
constexpr int kMaxSets = 64;
constexpr double kMaxKvBytes = 40e9;
constexpr int64_t kMaxCopyBytes = int64_t{2} << 30;
constexpr int64_t kMaxPageSize = 64;
constexpr double kSampleUs = 1000;  // GPU time one replay aims at

// --slots=churn: also time page size 1 through slots as PagedTokenAllocator hands them out on
// a server that has run a while (kvcache/testing/serving_churn.h), not uniformly shuffled.
bool churn = false;
// --slots=sorted: also time page size 1 through shuffled slots sorted within each sequence.
bool sorted_slots = false;

struct Shape {
  int64_t bs, ctx;
};

constexpr Shape kShapes[] = {
    {1, 1024},   {1, 4096},   {1, 16384},   {1, 32768},   {8, 1024},   {8, 4096},
    {8, 16384},  {8, 32768},  {32, 1024},   {32, 4096},   {32, 16384}, {32, 32768},
    {64, 1024},  {64, 4096},  {64, 16384},  {64, 32768},  {128, 1024}, {128, 4096},
    {128, 16384}, {128, 32768}, {256, 1024}, {256, 4096}, {256, 16384}, {256, 32768}};
// Where every variant is timed.
constexpr Shape kSweepShapes[] = {{1, 16384}, {8, 4096}, {32, 4096}, {64, 4096}, {256, 4096},
                                  {128, 32768}};

double KvBytes(const Shape& s) { return 2.0 * s.bs * s.ctx * dims.RowBytes(); }

// How many disjoint copies of a shape's KV the launches rotate over.
int SetsFor(const Shape& s) {
  return static_cast<int>(
      std::clamp<double>(std::ceil(kRotationBytes / KvBytes(s)), 1, kMaxSets));
}

struct Row {
  std::string op;
  int32_t variant;
  int64_t bs, ctx, ps;
  int64_t items;  // work items of the plan (bs when not split)
  double bytes, us, copy_us, contiguous_us, read_us;
  double pattern_us;  // the attention kernel's reads alone through the row's slots (LaunchHeadRowsRead)
};
std::vector<Row> rows;

// x with `decimals` decimals, or "-" when it was not measured (NaN).
std::string Figure(int decimals, double x) {
  return std::isnan(x) ? "-" : absl::StrFormat("%.*f", decimals, x);
}

void Report(const Row& r) {
  rows.push_back(r);
  const double tbs = r.bytes / (r.us * 1e-6) / 1e12;
  const double copy_tbs = 2 * r.bytes / (r.copy_us * 1e-6) / 1e12;
  const double read_tbs = r.bytes / (r.read_us * 1e-6) / 1e12;
  const double pattern_tbs = r.bytes / (r.pattern_us * 1e-6) / 1e12;
  std::printf(
      "%-20s v%d bs=%4lld ctx=%6lld ps=%2lld items=%5lld %10.2f us %6.3f TB/s | read %6.3f TB/s"
      " | %5.1f%% of read | its reads alone %6s TB/s | %5s%% of them | copy %6.3f TB/s"
      " | %5.1f%% of contiguous\n",
      r.op.c_str(), r.variant, static_cast<long long>(r.bs), static_cast<long long>(r.ctx),
      static_cast<long long>(r.ps), static_cast<long long>(r.items), r.us, tbs, read_tbs,
      100.0 * tbs / read_tbs, Figure(3, pattern_tbs).c_str(),
      Figure(1, 100.0 * tbs / pattern_tbs).c_str(), copy_tbs, 100.0 * r.contiguous_us / r.us);
}

// Median microseconds of one launch: `launches` calls launch(0), launch(1), ... captured into a
// graph on `stream`, the graph replayed after warm-up (so that host launch cost does not hide
// the GPU time of small shapes).
double TimeUs(hipStream_t stream, int launches, const std::function<void(int)>& launch) {
  hipGraph_t graph;
  hipGraphExec_t exec;
  BENCH_CHECK(GpuStatus(hipStreamBeginCapture(stream, hipStreamCaptureModeThreadLocal), "capture"));
  for (int i = 0; i < launches; ++i) launch(i);
  BENCH_CHECK(GpuStatus(hipStreamEndCapture(stream, &graph), "end capture"));
  BENCH_CHECK(GpuStatus(hipGraphInstantiate(&exec, graph, nullptr, nullptr, 0), "instantiate"));
  const double us = MedianEventUs(stream, 1, [&](int) {
    BENCH_CHECK(GpuStatus(hipGraphLaunch(exec, stream), "hipGraphLaunch"));
  });
  BENCH_CHECK(GpuStatus(hipGraphExecDestroy(exec), "hipGraphExecDestroy"));
  BENCH_CHECK(GpuStatus(hipGraphDestroy(graph), "hipGraphDestroy"));
  return us / launches;
}

// Launches per replay: enough GPU time per sample at an expected ~3 TB/s, a multiple of `sets`.
int LaunchesFor(double bytes, int sets) {
  const double per_launch_us = bytes / 3e12 * 1e6;
  const int want = static_cast<int>(std::clamp<double>(std::ceil(kSampleUs / per_launch_us), 1, 256));
  return (want + sets - 1) / sets * sets;
}

// One way of laying out a shape's tokens in the pool, for every rotation set: the slots (set 0
// kept on the host for the reference) and the device metadata of both kinds.
struct Layout {
  std::string name;
  int64_t ps;         // page size (1 for contiguous)
  bool page_table;    // read through the page table, else through kv_indices
  std::vector<int32_t> slots0;          // [bs][ctx]: set 0's slots
  DeviceBuffer<TokenSlot> kv_indices;   // [sets][bs][ctx]
  DeviceBuffer<PageId> table;           // [sets][bs][ctx / ps] (page-table layouts)
};

class Bench {
 public:
  Bench(int64_t max_tokens, int32_t blocks_per_sm, int32_t max_items_per_sequence,
        int32_t min_chunk, std::mt19937_64& rng)
      : rng_(rng),
        blocks_per_sm_(blocks_per_sm),
        max_items_per_sequence_(max_items_per_sequence),
        min_chunk_(min_chunk),
        pool_slots_(max_tokens + kMaxPageSize),
        sms_(Unwrap(DeviceMultiprocessorCount())),
        pool_(pool_slots_ * dims.RowBytes(), rng_),
        references_(pool_, kMaxCopyBytes, sms_ * 4) {
    BENCH_CHECK(GpuStatus(hipStreamCreate(&stream_), "stream"));
    word_.emplace(Unwrap(DeviceViolationWord::Create()));
    std::printf("pool of %lld slots (%.1f GB of K and V), %d multiprocessors\n",
                static_cast<long long>(pool_slots_), 2.0 * pool_slots_ * dims.RowBytes() / 1e9,
                sms_);
  }
  ~Bench() { (void)hipStreamDestroy(stream_); }

  // The split options the plans of `variant` are made with: DecodeSplitOptionsForDevice's, with
  // the blocks per multiprocessor of --blocks-per-sm when it is given.
  DecodeSplitOptions SplitOptions(int32_t variant) const {
    DecodeSplitOptions o = Unwrap(DecodeSplitOptionsForDevice(dims.Attention(), variant));
    if (blocks_per_sm_ > 0) o.blocks_per_multiprocessor = blocks_per_sm_;
    if (max_items_per_sequence_ > 0) o.max_items_per_sequence = max_items_per_sequence_;
    if (min_chunk_ > 0) o.min_chunk = TokenCount(min_chunk_);
    return o;
  }

  // Every configuration of one shape with `variant`, or, when `all_configs` is false, the
  // contiguous and page size 16 token-level ones only (the sweep).
  void RunShape(const Shape& s, int32_t variant, bool all_configs) {
    const int sets = SetsFor(s);
    std::vector<uint16_t> q(s.bs * dims.QRowElements());
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (uint16_t& x : q) x = FloatToBf16(normal(rng_));
    q_host_ = q;
    q_ = Unwrap(DeviceBuffer<uint16_t>::FromHost(q));
    out_ = Unwrap(DeviceBuffer<uint8_t>::Create(s.bs * dims.QRowElements() * 2));
    lse_ = Unwrap(DeviceBuffer<float>::Create(s.bs * dims.q_heads));
    std::vector<TokenOffset> indptr(s.bs + 1);
    for (int64_t i = 0; i <= s.bs; ++i) indptr[i] = TokenOffset(static_cast<int32_t>(i * s.ctx));
    indptr_host_ = indptr;
    kv_indptr_ = Unwrap(DeviceBuffer<TokenOffset>::FromHost(indptr));
    kv_lens_ = Unwrap(DeviceBuffer<TokenLength>::FromHost(
        std::vector<TokenLength>(s.bs, TokenLength(static_cast<int32_t>(s.ctx)))));

    const double bytes = KvBytes(s);
    const int launches = LaunchesFor(bytes, sets);
    const int64_t copy_bytes = std::min<int64_t>(static_cast<int64_t>(bytes), references_.bytes());
    // The copy rotates over the buffer too when it is small.
    const int64_t copy_slices = std::max<int64_t>(1, references_.bytes() / copy_bytes);
    // On the stream, not in a graph: a graph would put the copy on a copy engine.
    const double copy_us = MedianEventUs(stream_, launches, [&](int i) {
      references_.LaunchCopy((i % copy_slices) * copy_bytes, copy_bytes, stream_);
    });
    const double read_us = TimeUs(stream_, launches, [&](int i) {
      references_.LaunchRead((i % copy_slices) * copy_bytes, copy_bytes, stream_);
    });
    // The references' time per byte, applied to the shape's bytes.
    const double copy_us_scaled = copy_us * bytes / copy_bytes;
    const double read_us_scaled = read_us * bytes / copy_bytes;

    Layout contiguous = MakeLayout("contiguous", s, sets, 1, false, /*shuffled=*/false);
    const double contiguous_us = TimeLayout(s, sets, launches, contiguous, variant, Split::kInLaunch);
    const Refs refs{copy_us_scaled, contiguous_us, read_us_scaled,
                    ReadsAloneUs(s, sets, launches, contiguous, variant)};
    Report(RowOf(contiguous.name, variant, s, 1, bytes, contiguous_us, refs));
    struct Config {
      int64_t ps;
      bool page_table;
    };
    std::vector<Config> configs = {{16, false}};
    if (all_configs) configs = {{1, false}, {16, false}, {64, false}, {16, true}, {64, true}};
    for (const Config& c : configs) {
      Layout l = MakeLayout(absl::StrFormat("%s ps%d", c.page_table ? "page_table" : "kv_indices", c.ps),
                            s, sets, c.ps, c.page_table, true);
      const double us = TimeLayout(s, sets, launches, l, variant, Split::kInLaunch);
      Refs layout_refs = refs;
      layout_refs.pattern_us = ReadsAloneUs(s, sets, launches, l, variant);
      Report(RowOf(l.name, variant, s, c.ps, bytes, us, layout_refs));
      if (last_items_ != s.bs && c.ps == 16 && !c.page_table) {
        const int64_t items = last_items_;
        const double launch_us = TimeLayout(s, sets, launches, l, variant, Split::kMergeLaunch);
        Report(RowOf(l.name + " merge launch", variant, s, c.ps, bytes, launch_us, layout_refs, items));
        const double nosplit_us = TimeLayout(s, sets, launches, l, variant, Split::kNone);
        Report(RowOf(l.name + " nosplit", variant, s, c.ps, bytes, nosplit_us, layout_refs, s.bs));
      }
    }
    // Page size 1 through the given slots (sets * bs * ctx of them).
    const auto time_slots = [&](const std::string& name, std::vector<int32_t> slots) {
      Layout l = MakeLayout(name, s, sets, 1, false, /*shuffled=*/false, std::move(slots));
      const double us = TimeLayout(s, sets, launches, l, variant, Split::kInLaunch);
      Refs layout_refs = refs;
      layout_refs.pattern_us = ReadsAloneUs(s, sets, launches, l, variant);
      Report(RowOf(l.name, variant, s, 1, bytes, us, layout_refs));
    };
    if (churn && all_configs) {
      const std::vector<TokenSlot> churned =
          Unwrap(testing::ServingChurnSlots(pool_slots_, sets * s.bs, TokenCount(s.ctx), rng_()));
      const testing::SlotLocality near =
          testing::MeasureSlotLocality(churned, TokenCount(s.ctx), 1024);
      std::printf(
          "churned slots: %.1f%% of consecutive tokens in neighbouring slots, %.0f regions "
          "of 1024 slots per sequence\n",
          100.0 * near.neighbour_fraction, near.regions_per_request);
      std::vector<int32_t> pages(churned.size());
      for (size_t e = 0; e < churned.size(); ++e) pages[e] = churned[e].value();
      time_slots("kv_indices ps1 churn", std::move(pages));
    }
    if (sorted_slots && all_configs) {
      std::vector<int32_t> slots = ShuffledPages(1, sets * s.bs * s.ctx);
      for (auto it = slots.begin(); it != slots.end(); it += s.ctx) std::sort(it, it + s.ctx);
      time_slots("kv_indices ps1 sorted", std::move(slots));
    }
  }

 private:
  // A shape's references, measured once per shape.
  struct Refs {
    double copy_us, contiguous_us, read_us, pattern_us;
  };
  // The row of one timing; `items` defaults to the last plan's work items.
  Row RowOf(const std::string& op, int32_t variant, const Shape& s, int64_t ps, double bytes,
            double us, const Refs& r, int64_t items = -1) const {
    return Row{
        op + OverlapSuffix(),
        variant, s.bs, s.ctx, ps, items < 0 ? last_items_ : items,
        bytes, us,      r.copy_us, r.contiguous_us, r.read_us, r.pattern_us};
  }

  // `n` distinct pages of `ps` slots drawn uniformly from the whole pool (page 0, the padding
  // page, excepted), so that sets interleave too.
  std::vector<int32_t> ShuffledPages(int64_t ps, int64_t n) {
    std::vector<int32_t> all(pool_slots_ / ps - 1);
    std::iota(all.begin(), all.end(), 1);
    std::shuffle(all.begin(), all.end(), rng_);
    all.resize(n);
    return all;
  }

  // Token t of sequence i of set k: slot k * tokens + i * ctx + t + ps (contiguous, past the
  // padding page), or slot page * ps + t % ps with the pages of all sets shuffled.
  Layout MakeLayout(const std::string& name, const Shape& s, int sets, int64_t ps, bool page_table,
                    bool shuffled, std::vector<int32_t> given_pages = {}) {
    const int64_t tokens = s.bs * s.ctx;
    const int64_t cols = s.ctx / ps;
    std::vector<int32_t> pages(sets * s.bs * cols);
    std::iota(pages.begin(), pages.end(), 1);  // page 0 is the padding page
    if (!given_pages.empty()) {
      if (given_pages.size() != pages.size()) {
        BENCH_CHECK(absl::InternalError("given pages are not the layout's"));
      }
      pages = std::move(given_pages);
    } else if (shuffled) {
      pages = ShuffledPages(ps, static_cast<int64_t>(pages.size()));
    }
    std::vector<TokenSlot> indices(sets * tokens);
    for (int64_t e = 0; e < sets * tokens; ++e) {
      indices[e] = TokenSlot(static_cast<int32_t>(pages[e / ps] * ps + e % ps));
    }
    Layout l{name, ps, page_table, {}, Unwrap(DeviceBuffer<TokenSlot>::FromHost(indices)),
             Unwrap(DeviceBuffer<PageId>::Create(page_table ? pages.size() : 0))};
    if (page_table) {
      std::vector<PageId> table(pages.size());
      for (size_t j = 0; j < pages.size(); ++j) table[j] = PageId(pages[j]);
      BENCH_CHECK(l.table.CopyFrom(table));
    }
    l.slots0.resize(tokens);
    for (int64_t e = 0; e < tokens; ++e) l.slots0[e] = indices[e].value();
    return l;
  }

  DecodeKv KvOf(const Shape& s, const Layout& l, int set) const {
    const int64_t tokens = s.bs * s.ctx;
    if (l.page_table) {
      const int64_t cols = s.ctx / l.ps;
      return DecodePageTableKv{
          DeviceSpan<const PageId>(l.table.data() + set * s.bs * cols, s.bs * cols), PageCount(cols),
          kv_lens_.const_span(), *PageSize::Create(l.ps)};
    }
    return DecodeTokenLevelKv{kv_indptr_.const_span(),
                              DeviceSpan<const TokenSlot>(l.kv_indices.data() + set * tokens, tokens)};
  }

  // How a shape's plan is run: no split; split, merged by a second launch; split, merged in the
  // attention launch (merge counters).
  enum class Split { kNone, kMergeLaunch, kInLaunch };

  // The kernel's reads alone through the layout's token slots (its kv_indices, which a
  // page-table layout has too: the same slots), the last plan's items per sequence as equal
  // chunks, as many blocks resident per multiprocessor as the plan is sized for.
  // LaunchHeadRowsRead reads 256-byte rows with one block per KV head: head dim 128 and blocks
  // of a whole group only (NaN, printed as -, otherwise).
  double ReadsAloneUs(const Shape& s, int sets, int launches, const Layout& l, int32_t variant) {
    if (dims.head_dim != 128 ||
        Unwrap(DecodeBlocksPerWorkItem(dims.Attention(), variant)) != dims.kv_heads) {
      return std::numeric_limits<double>::quiet_NaN();
    }
    const int64_t tokens = s.bs * s.ctx;
    const int32_t chunks = static_cast<int32_t>((last_items_ + s.bs - 1) / s.bs);
    const int32_t resident = SplitOptions(variant).blocks_per_multiprocessor;
    return TimeUs(stream_, launches, [&](int i) {
      const int32_t* slots = reinterpret_cast<const int32_t*>(l.kv_indices.data() + (i % sets) * tokens);
      BENCH_CHECK(GpuStatus(testing::LaunchHeadRowsRead(
                                pool_.k().data(), pool_.v().data(), slots,
                                static_cast<int32_t>(s.bs), s.ctx, chunks, dims.kv_heads, sms_,
                                resident, pattern_sink_.data(), stream_),
                            "LaunchHeadRowsRead"));
    });
  }

  // Checks once, then times, the layout with the plan PlanDecodeSplitKv makes (unless kNone);
  // last_items_ is the plan's work items.
  double TimeLayout(const Shape& s, int sets, int launches, const Layout& l, int32_t variant, Split split) {
    const DecodeKv kv0 = KvOf(s, l, 0);
    SplitKvPlan plan =
        Unwrap(PlanDecodeSplitKv(indptr_host_, DecodeKvLayout(kv0), SplitOptions(variant)));
    const bool use_plan = split != Split::kNone && !plan.reduce.empty();
    last_items_ = use_plan ? static_cast<int64_t>(plan.work.size()) : s.bs;
    DeviceBuffer<SplitKvWorkItem> work = Unwrap(DeviceBuffer<SplitKvWorkItem>::FromHost(plan.work));
    DeviceBuffer<SplitKvReduceItem> reduce = Unwrap(DeviceBuffer<SplitKvReduceItem>::FromHost(plan.reduce));
    DeviceBuffer<float> partial_out =
        Unwrap(DeviceBuffer<float>::Create(int64_t{plan.num_partials} * dims.QRowElements()));
    DeviceBuffer<float> partial_lse =
        Unwrap(DeviceBuffer<float>::Create(int64_t{plan.num_partials} * dims.q_heads));
    DeviceBuffer<uint32_t> counters = Unwrap(DeviceBuffer<uint32_t>::FromHost(
        std::vector<uint32_t>(plan.reduce.size() * dims.q_heads, 0)));
    auto launch = [&](int i) {
      PagedDecodeArgs a;
      a.dims = dims.Attention();
      a.q = DeviceSpan<const uint8_t>(reinterpret_cast<const uint8_t*>(q_.data()), q_.size() * 2);
      a.k_pool = pool_.k().const_span();
      a.v_pool = pool_.v().const_span();
      a.kv = KvOf(s, l, i % sets);
      if (use_plan) {
        a.split = DecodeSplitKv{&plan, work.const_span(), reduce.const_span(), partial_out.span(),
                                partial_lse.span(),
                                split == Split::kInLaunch ? counters.span() : DeviceSpan<uint32_t>()};
      }
      a.out = out_.span();
      a.lse = lse_.span();
      a.variant = variant;
      a.overlap = overlap;
      BENCH_CHECK(PagedDecodeAttention(a, word_->device(), stream_));
    };
    BENCH_CHECK(word_->Reset(stream_));
    BENCH_CHECK(GpuStatus(hipMemsetAsync(out_.data(), 0xff, out_.size(), stream_), "poison"));
    BENCH_CHECK(GpuStatus(hipMemsetAsync(lse_.data(), 0xff, lse_.size() * sizeof(float), stream_), "poison"));
    launch(0);
    BENCH_CHECK(GpuStatus(hipStreamSynchronize(stream_), l.name.c_str()));
    BENCH_CHECK(word_->Check(stream_));
    Check(s, l, variant);
    const double us = TimeUs(stream_, launches, launch);
    BENCH_CHECK(word_->Check(stream_));
    return us;
  }

  // Every output written; sequences 0 and bs - 1, the first and the last KV head (every query
  // head of their groups) against a double-precision reference over set 0's slots.
  void Check(const Shape& s, const Layout& l, int32_t variant) {
    const std::vector<uint8_t> out = Unwrap(out_.ToHost());
    const std::vector<float> lse = Unwrap(lse_.ToHost());
    auto out_at = [&](int64_t e) {
      uint16_t b;
      std::memcpy(&b, out.data() + 2 * e, 2);
      return Bf16ToFloat(b);
    };
    auto fail = [&](const std::string& what) {
      std::fprintf(stderr, "MISMATCH %s v%d bs=%lld ctx=%lld: %s\n", l.name.c_str(), variant,
                   static_cast<long long>(s.bs), static_cast<long long>(s.ctx), what.c_str());
      std::exit(1);
    };
    for (int64_t e = 0; e < s.bs * dims.QRowElements(); ++e) {
      if (!std::isfinite(out_at(e))) fail(absl::StrFormat("out element %d not written", e));
    }
    for (int64_t e = 0; e < s.bs * dims.q_heads; ++e) {
      if (!std::isfinite(lse[e])) fail(absl::StrFormat("lse %d not written", e));
    }
    const double scale = 1.0 / std::sqrt(static_cast<double>(dims.head_dim));
    auto k_at = [&](int64_t slot, int64_t h, int64_t x) {
      return pool_.K(slot * dims.RowElements() + h * dims.head_dim + x);
    };
    auto v_at = [&](int64_t slot, int64_t h, int64_t x) {
      return pool_.V(slot * dims.RowElements() + h * dims.head_dim + x);
    };
    std::vector<double> score(s.ctx), acc(dims.head_dim);
    for (int64_t i : {int64_t{0}, s.bs - 1}) {
      const int32_t* slots = l.slots0.data() + i * s.ctx;
      for (int64_t kvh : {0, dims.kv_heads - 1}) {
        for (int64_t qh = kvh * dims.Group(); qh < (kvh + 1) * dims.Group(); ++qh) {
          const uint16_t* q = q_host_.data() + (i * dims.q_heads + qh) * dims.head_dim;
          double m = -std::numeric_limits<double>::infinity();
          for (int64_t t = 0; t < s.ctx; ++t) {
            double dot = 0;
            for (int64_t x = 0; x < dims.head_dim; ++x) {
              dot += double{Bf16ToFloat(q[x])} * k_at(slots[t], kvh, x);
            }
            score[t] = dot * scale;
            m = std::max(m, score[t]);
          }
          std::fill(acc.begin(), acc.end(), 0.0);
          double sum = 0;
          for (int64_t t = 0; t < s.ctx; ++t) {
            const double p = std::exp(score[t] - m);
            sum += p;
            for (int64_t x = 0; x < dims.head_dim; ++x) acc[x] += p * v_at(slots[t], kvh, x);
          }
          for (int64_t x = 0; x < dims.head_dim; ++x) {
            const double want = acc[x] / sum;
            const double got = out_at((i * dims.q_heads + qh) * dims.head_dim + x);
            if (std::fabs(got - want) > 1e-2 + 1e-2 * std::fabs(want)) {
              fail(absl::StrFormat("sequence %d head %d dim %d: %g, want %g", i, qh, x, got, want));
            }
          }
          const double want_lse = m + std::log(sum);
          if (std::fabs(lse[i * dims.q_heads + qh] - want_lse) >
              1e-3 + 1e-5 * std::fabs(want_lse)) {
            fail(absl::StrFormat("lse of sequence %d head %d: %g, want %g", i, qh,
                                 lse[i * dims.q_heads + qh], want_lse));
          }
        }
      }
    }
  }

  std::mt19937_64& rng_;
  int32_t blocks_per_sm_;           // 0: DecodeSplitOptionsForDevice's
  int32_t max_items_per_sequence_;  // 0: the planner's default
  int32_t min_chunk_;               // 0: DecodeSplitOptionsForDevice's
  int64_t pool_slots_;
  int32_t sms_;
  testing::RandomKvPool pool_;
  testing::BandwidthReferences references_;
  hipStream_t stream_ = nullptr;
  std::vector<uint16_t> q_host_;
  std::vector<TokenOffset> indptr_host_;
  DeviceBuffer<uint16_t> q_ = Unwrap(DeviceBuffer<uint16_t>::Create(0));
  DeviceBuffer<uint8_t> out_ = Unwrap(DeviceBuffer<uint8_t>::Create(0));
  DeviceBuffer<float> lse_ = Unwrap(DeviceBuffer<float>::Create(0));
  DeviceBuffer<TokenOffset> kv_indptr_ = Unwrap(DeviceBuffer<TokenOffset>::Create(0));
  DeviceBuffer<TokenLength> kv_lens_ = Unwrap(DeviceBuffer<TokenLength>::Create(0));
  std::optional<DeviceViolationWord> word_;
  DeviceBuffer<uint32_t> pattern_sink_ = Unwrap(DeviceBuffer<uint32_t>::Create(1));
  int64_t last_items_ = 0;
};

void Write(const std::string& dir) {
  if (dir.empty()) return;
  std::ofstream csv(dir + "/paged_decode_attention.csv");
  std::ofstream md(dir + "/paged_decode_attention.md");
  csv << "op,variant,bs,ctx,page_size,work_items,kv_bytes,us,tb_per_s,read_tb_per_s,"
         "fraction_of_read,copy_tb_per_s,contiguous_us,fraction_of_contiguous,"
         "reads_alone_tb_per_s,fraction_of_reads_alone\n";
  md << "| op | variant | bs | ctx | page size | items | us | KV TB/s | read TB/s | % of read | "
        "copy TB/s | % of contiguous | its reads alone TB/s | % of them |\n"
     << "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: "
        "| ---: | ---: |\n";
  for (const Row& r : rows) {
    const double tbs = r.bytes / (r.us * 1e-6) / 1e12;
    const double ctbs = 2 * r.bytes / (r.copy_us * 1e-6) / 1e12;
    const double rtbs = r.bytes / (r.read_us * 1e-6) / 1e12;
    const double ptbs = r.bytes / (r.pattern_us * 1e-6) / 1e12;
    // A reference not measured (NaN) is an empty cell.
    auto cell = [](double x) { return std::isnan(x) ? std::string() : absl::StrFormat("%.4f", x); };
    csv << absl::StrFormat("%s,%d,%d,%d,%d,%d,%.0f,%.3f,%.4f,%.4f,%.4f,%.4f,%.3f,%.4f,%s,%s\n",
                           r.op, r.variant, r.bs, r.ctx, r.ps, r.items, r.bytes, r.us, tbs, rtbs,
                           tbs / rtbs, ctbs, r.contiguous_us, r.contiguous_us / r.us, cell(ptbs),
                           cell(tbs / ptbs));
    md << absl::StrFormat(
        "| %s | %d | %d | %d | %d | %d | %.2f | %.3f | %.3f | %.1f | %.3f | %.1f | %s | %s |\n",
        r.op, r.variant, r.bs, r.ctx, r.ps, r.items, r.us, tbs, rtbs, 100 * tbs / rtbs, ctbs,
        100 * r.contiguous_us / r.us, Figure(3, ptbs), Figure(1, 100 * tbs / ptbs));
  }
}

}  // namespace
}  // namespace attnmeta

int main(int argc, char** argv) {
  using namespace attnmeta;
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // a crash must not lose the lines before it
  std::string out_dir;
  std::vector<int32_t> variants = {0};
  std::optional<Shape> only;
  bool sweep = true;
  int32_t blocks_per_sm = 0;
  int32_t max_items_per_sequence = 0;
  int32_t min_chunk = 0;
  double pool_gb = 0;
  for (int k = 1; k < argc; ++k) {
    const std::string arg = argv[k];
    if (arg.rfind("--variant=", 0) == 0) {
      const std::string v = arg.substr(10);
      sweep = false;
      variants.clear();
      if (v == "all") {
        for (int32_t i = 0; i < kernels::kNumDecodeVariants; ++i) variants.push_back(i);
      } else {
        variants.push_back(std::atoi(v.c_str()));
      }
    } else if (arg.rfind("--shape=", 0) == 0) {
      long long bs = 0, ctx = 0;
      // Whole pages of every page size the table uses.
      if (std::sscanf(arg.c_str() + 8, "%lld,%lld", &bs, &ctx) != 2 || bs < 1 || ctx < kMaxPageSize ||
          ctx % kMaxPageSize != 0) {
        std::fprintf(stderr, "--shape=BS,CTX needs BS >= 1 and CTX a positive multiple of %lld\n",
                     static_cast<long long>(kMaxPageSize));
        return 2;
      }
      only = Shape{bs, ctx};
    } else if (arg.rfind("--blocks-per-sm=", 0) == 0) {
      blocks_per_sm = std::atoi(arg.c_str() + 16);
      if (blocks_per_sm < 1) {
        std::fprintf(stderr, "--blocks-per-sm=N needs N >= 1\n");
        return 2;
      }
    } else if (arg.rfind("--max-items-per-sequence=", 0) == 0) {
      max_items_per_sequence = std::atoi(arg.c_str() + 25);
      if (max_items_per_sequence < 1) {
        std::fprintf(stderr, "--max-items-per-sequence=N needs N >= 1\n");
        return 2;
      }
    } else if (arg.rfind("--min-chunk=", 0) == 0) {
      min_chunk = std::atoi(arg.c_str() + 12);
      if (min_chunk < 1) {
        std::fprintf(stderr, "--min-chunk=N needs N >= 1\n");
        return 2;
      }
    } else if (arg.rfind("--pool-gb=", 0) == 0) {
      pool_gb = std::atof(arg.c_str() + 10);
      if (!(pool_gb > 0 && pool_gb <= 1024)) {
        std::fprintf(stderr, "--pool-gb=G needs 0 < G <= 1024\n");
        return 2;
      }
    } else if (arg == "--slots=churn") {
      churn = true;
    } else if (arg == "--slots=sorted") {
      sorted_slots = true;
    } else if (arg == "--no-sweep") {
      sweep = false;
    } else if (arg.rfind("--overlap=", 0) == 0) {
      const std::string mode = arg.substr(10);
      if (mode == "none") {
        overlap = DecodeLaunchOverlap::kNone;
      } else if (mode == "wait-first") {
        overlap = DecodeLaunchOverlap::kWaitFirst;
      } else if (mode == "metadata-first") {
        overlap = DecodeLaunchOverlap::kMetadataFirst;
      } else if (mode == "warm-l2-first") {
        overlap = DecodeLaunchOverlap::kWarmL2First;
      } else {
        std::fprintf(stderr,
                     "--overlap takes none, wait-first, metadata-first or warm-l2-first, not %s\n",
                     mode.c_str());
        return 2;
      }
    } else if (arg.rfind("--dims=", 0) == 0) {
      if (!testing::ParseBenchDims(arg.substr(7), &dims)) {
        std::fprintf(stderr, "--dims=Q,KV,D takes three integers with Q >= KV >= 1\n");
        return 2;
      }
    } else if (arg.rfind("--", 0) == 0) {
      std::fprintf(stderr, "unknown flag %s\n", arg.c_str());
      return 2;
    } else {
      out_dir = arg;
    }
  }
  for (int32_t v : variants) {
    if (v < 0 || v >= kernels::kNumDecodeVariants) {
      std::fprintf(stderr, "variant %d outside [0, %d)\n", v, kernels::kNumDecodeVariants);
      return 2;
    }
  }
  BENCH_CHECK(testing::RequireGpu());
  std::vector<Shape> shapes;
  for (const Shape& s : kShapes) {
    if (KvBytes(s) <= kMaxKvBytes && (!only.has_value() || (s.bs == only->bs && s.ctx == only->ctx))) {
      shapes.push_back(s);
    }
  }
  if (only.has_value() && shapes.empty()) shapes.push_back(*only);
  int64_t max_tokens = 0;
  for (const Shape& s : shapes) max_tokens = std::max<int64_t>(max_tokens, s.bs * s.ctx * SetsFor(s));
  // Slots of K and V: 2 * RowBytes bytes each.
  max_tokens =
      std::max<int64_t>(max_tokens, static_cast<int64_t>(pool_gb * 1e9 / (2.0 * dims.RowBytes())));
  std::mt19937_64 rng(42);
  Bench bench(max_tokens, blocks_per_sm, max_items_per_sequence, min_chunk, rng);
  {  // A caller that plans every step asks for the options every step.
    std::vector<double> us;
    for (int k = 0; k < 1020; ++k) {
      const auto t0 = std::chrono::steady_clock::now();
      Unwrap(DecodeSplitOptionsForDevice(dims.Attention(), variants[0]));
      const auto t1 = std::chrono::steady_clock::now();
      if (k >= 20) us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
    }
    std::sort(us.begin(), us.end());
    std::printf(
        "DecodeSplitOptionsForDevice (variant %d): host %.3f us median (p90 %.3f) per call\n",
        variants[0], us[us.size() / 2], us[us.size() * 9 / 10]);
  }
  for (int32_t v : variants) {
    const kernels::DecodeVariant& d = kernels::kDecodeVariants[v];
    const DecodeSplitOptions o = bench.SplitOptions(v);
    std::printf(
        "== variant %d: %d warps, steps of %d tokens, %s MMA; %d/%d heads, head dim %d; split "
        "plans: %d blocks per multiprocessor%s, %d per item, at most %d items of a sequence, "
        "chunks of at least %lld tokens\n",
        v, d.warps, kernels::DecodeStepTokens(d, dims.head_dim),
        d.portable_mma ? "portable" : "native", dims.q_heads, dims.kv_heads, dims.head_dim,
        o.blocks_per_multiprocessor, blocks_per_sm > 0 ? " (--blocks-per-sm)" : "",
        o.blocks_per_item, o.max_items_per_sequence, static_cast<long long>(o.min_chunk.value()));
    for (const Shape& s : shapes) bench.RunShape(s, v, /*all_configs=*/true);
  }
  if (sweep && !only.has_value() && dims.IsDefault()) {
    std::printf("== variant sweep\n");
    for (const Shape& s : kSweepShapes) {
      for (int32_t v = 0; v < kernels::kNumDecodeVariants; ++v) {
        if (v != variants[0]) bench.RunShape(s, v, /*all_configs=*/false);
      }
    }
  }
  Write(out_dir);
  return 0;
}
