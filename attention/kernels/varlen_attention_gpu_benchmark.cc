// Throughput of varlen attention (varlen_attention_launcher.h): bf16, 32 query / 8 KV heads,
// head dim 128 (or --dims), three workloads:
//   extend        bs 8, 2048 new query rows each on a cached prefix of 4096 (kv_len 6144), causal;
//   verify        bs 64, 8 draft tokens each (a binary tree, VerifyTree + WriteTreeMask, in the
//                 FULL, QLEN_ONLY and bit-packed layouts) on a committed prefix of 4096 (kv_len
//                 4104);
//   verify_tree32 the same with 32 draft tokens: 128 query vectors per KV head at 32/8 heads,
//                 past the short-query path (at most 64), so the tiled kernels take it.
// Each on shuffled pools of page size 1, 16 and 64, read through token-level kv_indices and
// through the page table.
//
// Method (the device tool's measuring method, summarized): every launch's status checked; outputs
// poisoned (0xFF bytes, NaN) and checked written in full after one run of each configuration, a few
// rows of the first and last sequence (query heads 0 and 31) against a CPU reference (double) of
// the same bf16 values, and the violation word clean; the median of event-timed launches after
// warm-up (each launch takes milliseconds, so host launch cost does not matter); every launch reads
// more than the 50 MB L2 (extend 201 MB, verify 1.08 GB of K and V); random bf16 data, never
// zeros.
// Figures:
//   TFLOP/s  4 * head_dim * num_q_heads * (visible (query row, key) pairs) / time: two
//            multiply-adds (QK and PV) per visible pair, query head and dim; masked pairs are
//            not counted. Beside it, the H200's dense bf16 tensor-core peak, 989 TFLOP/s (NVIDIA's
//            spec sheet, without sparsity).
//   KV TB/s  the K and V rows the kernel must read at least once (sum of kv_len * KV heads *
//            head dim * 2 bytes, twice) / time. Beside it, in the same run: a read-only streaming
//            kernel (testing/stream_read.h) over as many bytes (the ceiling of a kernel that only
//            reads), and a device-to-device copy issued on the stream (bytes read + written).
//
// Usage: varlen_attention_gpu_benchmark [OUT_DIR] [--dims=Q,KV,D]
//            [--workload=extend|verify|verify_tree32]
//            [--kernel=short_queries|tiled_tensor_cores|tiled_cuda_cores] [--overlap=0|1]
// --dims: query heads, KV heads and head dim of both workloads (default 32,8,128; the figures'
// formulas take them); --workload: that workload only; --kernel: that kernel only;
// --overlap=0: plain launches (default 1: each may overlap the one ahead, the launcher's default).
// Writes OUT_DIR/varlen_attention.csv and .md besides stdout. Needs a GPU; exits non-zero on
// any error or mismatch.

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
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
#include "attention/kernels/testing/bench_check.h"
#include "attention/kernels/testing/device_buffer.h"
#include "attention/kernels/testing/kv_bench.h"
#include "attention/kernels/varlen_attention_launcher.h"
#include "attention/metadata/custom_mask.h"
#include "spec_decode/verify_tree.h"

namespace attnmeta {
namespace {

using testing::DeviceBuffer;
using testing::GpuStatus;
using testing::MedianEventUs;
using testing::Unwrap;

using testing::BenchDims;

// The attention shape (--dims=Q,KV,D). Set once in main, before anything reads it.
BenchDims dims;
// --overlap=0: VarlenAttentionArgs::overlap_preceding_kernel off (plain launches; the op's
// name then ends in " plain").
bool overlap = true;
constexpr int64_t kMaxCopyBytes = int64_t{2} << 30;
constexpr int64_t kMaxPageSize = 64;
constexpr double kPeakTflops = 989;  // H200 dense bf16 tensor cores, NVIDIA spec sheet

struct Workload {
  const char* name;
  int64_t bs, prefix, q_len;
  bool verify;  // q_len draft tokens as a binary tree, else causal extend
};
constexpr Workload kWorkloads[] = {{"extend", 8, 4096, 2048, false},
                                   {"verify", 64, 4096, 8, true},
                                   {"verify_tree32", 64, 4096, 32, true}};

struct Row {
  std::string op, kernel, source, mask;
  int64_t bs, prefix, q_len, ps;
  double flops, bytes, us, read_us, copy_us;
};
std::vector<Row> rows;

void Report(const Row& r) {
  rows.push_back(r);
  const double tflops = r.flops / (r.us * 1e-6) / 1e12;
  const double tbs = r.bytes / (r.us * 1e-6) / 1e12;
  const double read_tbs = r.bytes / (r.read_us * 1e-6) / 1e12;
  const double copy_tbs = 2 * r.bytes / (r.copy_us * 1e-6) / 1e12;
  std::printf("%-7s %-12s %-10s %-10s bs=%3lld prefix=%5lld q=%5lld ps=%2lld %10.1f us | %7.2f "
              "TFLOP/s (%4.1f%% of %g) | KV %6.3f TB/s | read %6.3f TB/s | copy %6.3f TB/s\n",
              r.op.c_str(), r.kernel.c_str(), r.source.c_str(), r.mask.c_str(), static_cast<long long>(r.bs),
              static_cast<long long>(r.prefix), static_cast<long long>(r.q_len),
              static_cast<long long>(r.ps), r.us, tflops, 100 * tflops / kPeakTflops, kPeakTflops,
              tbs, read_tbs, copy_tbs);
}

// A workload's batch on the host: slots of shuffled pages, the metadata of both kinds, the
// tree mask, and what the figures count.
struct Batch {
  int64_t kv_len;
  std::vector<int32_t> slots;             // [bs][kv_len]
  std::vector<TokenOffset> qo_indptr;     // [bs + 1]
  std::vector<TokenOffset> kv_indptr;     // [bs + 1]
  std::vector<TokenSlot> kv_indices;      // [bs * kv_len]
  std::vector<PageId> page_table;         // [bs][cols]
  std::vector<TokenLength> kv_lens;       // [bs]
  int64_t cols;
  VerifyTree tree;                        // verify only
  double pairs = 0;                       // visible (query row, key) pairs
};

class Bench {
 public:
  Bench(int64_t max_tokens, std::optional<VarlenKernel> only_kernel, std::mt19937_64& rng)
      : only_kernel_(only_kernel),
        rng_(rng),
        pool_slots_(max_tokens + 2 * kMaxPageSize),
        sms_(Unwrap(DeviceMultiprocessorCount())),
        pool_(pool_slots_ * dims.RowBytes(), rng_),
        references_(pool_, kMaxCopyBytes, sms_ * 4) {
    BENCH_CHECK(GpuStatus(hipStreamCreate(&stream_), "stream"));
    word_.emplace(Unwrap(DeviceViolationWord::Create()));
    std::printf("pool of %lld slots (%.2f GB of K and V), %d multiprocessors\n",
                static_cast<long long>(pool_slots_), 2.0 * pool_slots_ * dims.RowBytes() / 1e9,
                sms_);
  }
  ~Bench() { (void)hipStreamDestroy(stream_); }

  void RunWorkload(const Workload& w) {
    std::normal_distribution<float> normal(0.0f, 1.0f);
    q_host_.resize(w.bs * w.q_len * dims.QRowElements());
    for (uint16_t& x : q_host_) x = FloatToBf16(normal(rng_));
    q_ = Unwrap(DeviceBuffer<uint16_t>::FromHost(q_host_));
    out_ = Unwrap(DeviceBuffer<uint8_t>::Create(q_host_.size() * 2));
    lse_ = Unwrap(DeviceBuffer<float>::Create(w.bs * w.q_len * dims.q_heads));

    for (int64_t ps : {1, 16, 64}) {
      const Batch b = MakeBatch(w, ps);
      const double bytes = 2.0 * w.bs * b.kv_len * dims.RowBytes();
      const double flops = 4.0 * dims.head_dim * dims.q_heads * b.pairs;
      const int64_t copy_bytes = std::min<int64_t>(static_cast<int64_t>(bytes), references_.bytes());
      // The references' time per byte, applied to the workload's bytes.
      const double read_us = MedianEventUs(stream_, 1, [&](int) {
        references_.LaunchRead(0, copy_bytes, stream_);
      }) * bytes / copy_bytes;
      const double copy_us = MedianEventUs(stream_, 1, [&](int) {
        references_.LaunchCopy(0, copy_bytes, stream_);
      }) * bytes / copy_bytes;
      const std::vector<MaskLayout> layouts =
          w.verify ? std::vector<MaskLayout>{MaskLayout::kFull, MaskLayout::kQLenOnly, MaskLayout::kBitPacked}
                   : std::vector<MaskLayout>{MaskLayout::kNone};
      // Verify's 8 rows x 4 query heads fit the short-query path (at most 64 query vectors per
      // KV head); a tree of 32 and extend's 2,048 rows only the tiled kernels.
      std::vector<VarlenKernel> kernels = {VarlenKernel::kTiledTensorCores,
                                           VarlenKernel::kTiledCudaCores};
      if (w.q_len * (dims.q_heads / dims.kv_heads) <= 64) {
        kernels.insert(kernels.begin(), VarlenKernel::kShortQueries);
      }
      for (VarlenKernel kernel : kernels) {
        if (only_kernel_.has_value() && *only_kernel_ != kernel) continue;
        for (MaskLayout layout : layouts) {
          for (bool page_table : {false, true}) {
            const double us = TimeConfig(w, b, ps, layout, page_table, kernel);
            Report({std::string(w.name) + (overlap ? "" : " plain"), VarlenKernelName(kernel),
                    page_table ? "page_table" : "kv_indices",
                    layout == MaskLayout::kNone ? "causal" : std::string(MaskLayoutName(layout)),
                    w.bs, w.prefix, w.q_len, ps, flops, bytes, us, read_us, copy_us});
          }
        }
      }
    }
  }

 private:
  // Sequence i's positions on pages shuffled over the whole pool (page 0, the padding page,
  // never used).
  Batch MakeBatch(const Workload& w, int64_t ps) {
    Batch b;
    b.kv_len = w.prefix + w.q_len;
    b.cols = (b.kv_len + ps - 1) / ps;
    std::vector<int32_t> pages(pool_slots_ / ps - 1);
    std::iota(pages.begin(), pages.end(), 1);
    std::shuffle(pages.begin(), pages.end(), rng_);
    b.slots.resize(w.bs * b.kv_len);
    b.page_table.resize(w.bs * b.cols);
    for (int64_t i = 0; i < w.bs; ++i) {
      for (int64_t j = 0; j < b.cols; ++j) b.page_table[i * b.cols + j] = PageId(pages[i * b.cols + j]);
      for (int64_t t = 0; t < b.kv_len; ++t) {
        b.slots[i * b.kv_len + t] = static_cast<int32_t>(pages[i * b.cols + t / ps] * ps + t % ps);
      }
    }
    for (int64_t i = 0; i <= w.bs; ++i) {
      b.qo_indptr.push_back(TokenOffset(static_cast<int32_t>(i * w.q_len)));
      b.kv_indptr.push_back(TokenOffset(static_cast<int32_t>(i * b.kv_len)));
    }
    for (int32_t s : b.slots) b.kv_indices.push_back(TokenSlot(s));
    b.kv_lens.assign(w.bs, TokenLength(static_cast<int32_t>(b.kv_len)));
    if (w.verify) {
      const int32_t n = static_cast<int32_t>(w.q_len);
      std::vector<int32_t> parents;
      for (int64_t i = 0; i < w.bs; ++i) {
        for (int32_t t = 0; t < n; ++t) parents.push_back(t == 0 ? -1 : (t - 1) / 2);
      }
      b.tree = Unwrap(BuildVerifyTreeFromParents(
          parents, std::vector<TokenLength>(w.bs, TokenLength(static_cast<int32_t>(w.prefix))),
          TokenLength(n)));
      for (uint8_t s : b.tree.sees) b.pairs += s;
      b.pairs += static_cast<double>(w.bs) * n * w.prefix;
    } else {
      b.pairs = static_cast<double>(w.bs) *
                (w.q_len * w.prefix + w.q_len * (w.q_len + 1) / 2.0);
    }
    return b;
  }

  // Checks once, then times, one configuration.
  double TimeConfig(const Workload& w, const Batch& b, int64_t ps, MaskLayout layout, bool page_table,
                    VarlenKernel kernel) {
    DeviceBuffer<TokenOffset> qo = Unwrap(DeviceBuffer<TokenOffset>::FromHost(b.qo_indptr));
    DeviceBuffer<TokenOffset> kv_indptr = Unwrap(DeviceBuffer<TokenOffset>::FromHost(b.kv_indptr));
    DeviceBuffer<TokenSlot> kv_indices = Unwrap(DeviceBuffer<TokenSlot>::FromHost(b.kv_indices));
    DeviceBuffer<PageId> table = Unwrap(DeviceBuffer<PageId>::FromHost(b.page_table));
    DeviceBuffer<TokenLength> kv_lens = Unwrap(DeviceBuffer<TokenLength>::FromHost(b.kv_lens));
    std::vector<uint8_t> mask;
    std::vector<int64_t> mask_indptr;
    if (layout != MaskLayout::kNone) {
      mask_indptr.resize(w.bs + 1);
      const int32_t word_bytes = MaskWordBytes(TokenCount(w.q_len));
      mask.resize(w.bs *
                  MaskBlockBytes(layout, TokenCount(w.q_len), TokenCount(b.kv_len), word_bytes));
      BENCH_CHECK(WriteTreeMask(b.tree, layout, absl::MakeSpan(mask), absl::MakeSpan(mask_indptr)));
    }
    DeviceBuffer<uint8_t> d_mask = Unwrap(DeviceBuffer<uint8_t>::FromHost(mask));
    DeviceBuffer<int64_t> d_mask_indptr = Unwrap(DeviceBuffer<int64_t>::FromHost(mask_indptr));

    VarlenAttentionArgs a;
    a.dims = dims.Attention();
    a.q = DeviceSpan<const uint8_t>(reinterpret_cast<const uint8_t*>(q_.data()), q_.size() * 2);
    a.qo_indptr = qo.const_span();
    a.max_q_len = TokenCount(w.q_len);
    a.k_pool = pool_.k().const_span();
    a.v_pool = pool_.v().const_span();
    if (page_table) {
      a.kv = DecodePageTableKv{table.const_span(), PageCount(b.cols), kv_lens.const_span(),
                               *PageSize::Create(ps)};
    } else {
      a.kv = DecodeTokenLevelKv{kv_indptr.const_span(), kv_indices.const_span()};
    }
    a.mask = VarlenMask{layout, d_mask.const_span(), d_mask_indptr.const_span()};
    a.out = out_.span();
    a.lse = lse_.span();
    a.kernel = kernel;
    a.overlap_preceding_kernel = overlap;
    auto launch = [&] { BENCH_CHECK(VarlenAttention(a, word_->device(), stream_)); };

    BENCH_CHECK(word_->Reset(stream_));
    BENCH_CHECK(GpuStatus(hipMemsetAsync(out_.data(), 0xff, out_.size(), stream_), "poison"));
    BENCH_CHECK(GpuStatus(hipMemsetAsync(lse_.data(), 0xff, lse_.size() * sizeof(float), stream_), "poison"));
    launch();
    BENCH_CHECK(GpuStatus(hipStreamSynchronize(stream_), w.name));
    BENCH_CHECK(word_->Check(stream_));
    Check(w, b, layout, mask, mask_indptr, page_table);
    const double us = MedianEventUs(stream_, 1, [&](int) { launch(); });
    BENCH_CHECK(word_->Check(stream_));
    return us;
  }

  // Every output written; rows 0, 1 and the last of sequences 0 and bs - 1 (every row for
  // verify), query heads 0 and 31, against a double-precision reference over the slots.
  void Check(const Workload& w, const Batch& b, MaskLayout layout, const std::vector<uint8_t>& mask,
             const std::vector<int64_t>& mask_indptr, bool page_table) {
    const std::vector<uint8_t> out = Unwrap(out_.ToHost());
    const std::vector<float> lse = Unwrap(lse_.ToHost());
    auto out_at = [&](int64_t e) {
      uint16_t bits;
      std::memcpy(&bits, out.data() + 2 * e, 2);
      return Bf16ToFloat(bits);
    };
    auto fail = [&](const std::string& what) {
      std::fprintf(stderr, "MISMATCH %s %s %s: %s\n", w.name, page_table ? "page_table" : "kv_indices",
                   std::string(MaskLayoutName(layout)).c_str(), what.c_str());
      std::exit(1);
    };
    const int64_t total_rows = w.bs * w.q_len;
    for (int64_t e = 0; e < total_rows * dims.QRowElements(); ++e) {
      if (!std::isfinite(out_at(e))) fail(absl::StrFormat("out element %d not written", e));
    }
    for (int64_t e = 0; e < total_rows * dims.q_heads; ++e) {
      if (!std::isfinite(lse[e])) fail(absl::StrFormat("lse %d not written", e));
    }
    const CustomMaskView view{layout, mask, mask_indptr};
    const int32_t word_bytes = MaskWordBytes(TokenCount(w.q_len));
    const double scale = 1.0 / std::sqrt(static_cast<double>(dims.head_dim));
    // Element x of KV head h of a slot, counted from the pool's start.
    auto element = [](int64_t slot, int64_t h, int64_t x) {
      return slot * dims.RowElements() + h * dims.head_dim + x;
    };
    std::vector<int64_t> check_rows = {0, 1, w.q_len - 1};
    if (w.verify) {
      check_rows.resize(w.q_len);
      std::iota(check_rows.begin(), check_rows.end(), 0);
    }
    std::vector<double> score(b.kv_len), acc(dims.head_dim);
    for (int64_t i : {int64_t{0}, w.bs - 1}) {
      const int32_t* slots = b.slots.data() + i * b.kv_len;
      for (int64_t r : check_rows) {
        const int64_t row = i * w.q_len + r;
        for (int64_t qh : {0, dims.q_heads - 1}) {
          const int64_t kvh = qh / (dims.q_heads / dims.kv_heads);
          const uint16_t* q = q_host_.data() + (row * dims.q_heads + qh) * dims.head_dim;
          double m = -std::numeric_limits<double>::infinity();
          for (int64_t t = 0; t < b.kv_len; ++t) {
            score[t] = -std::numeric_limits<double>::infinity();
            if (!MaskSees(view, i, w.q_len, b.kv_len, word_bytes, r, t)) continue;
            double dot = 0;
            for (int64_t x = 0; x < dims.head_dim; ++x) {
              dot += double{Bf16ToFloat(q[x])} * pool_.K(element(slots[t], kvh, x));
            }
            score[t] = dot * scale;
            m = std::max(m, score[t]);
          }
          std::fill(acc.begin(), acc.end(), 0.0);
          double sum = 0;
          for (int64_t t = 0; t < b.kv_len; ++t) {
            if (std::isinf(score[t])) continue;
            const double p = std::exp(score[t] - m);
            sum += p;
            for (int64_t x = 0; x < dims.head_dim; ++x)
              acc[x] += p * pool_.V(element(slots[t], kvh, x));
          }
          for (int64_t x = 0; x < dims.head_dim; ++x) {
            const double want = acc[x] / sum;
            const double got = out_at((row * dims.q_heads + qh) * dims.head_dim + x);
            if (std::fabs(got - want) > 1e-2 + 1e-2 * std::fabs(want)) {
              fail(absl::StrFormat("sequence %d row %d head %d dim %d: %g, want %g", i, r, qh, x, got, want));
            }
          }
          const double want_lse = m + std::log(sum);
          if (std::fabs(lse[row * dims.q_heads + qh] - want_lse) >
              1e-3 + 1e-5 * std::fabs(want_lse)) {
            fail(absl::StrFormat("lse of sequence %d row %d head %d: %g, want %g", i, r, qh,
                                 lse[row * dims.q_heads + qh], want_lse));
          }
        }
      }
    }
  }

  std::optional<VarlenKernel> only_kernel_;  // none: every kernel
  std::mt19937_64& rng_;
  int64_t pool_slots_;
  int32_t sms_;
  testing::RandomKvPool pool_;
  testing::BandwidthReferences references_;
  hipStream_t stream_ = nullptr;
  std::vector<uint16_t> q_host_;
  DeviceBuffer<uint16_t> q_ = Unwrap(DeviceBuffer<uint16_t>::Create(0));
  DeviceBuffer<uint8_t> out_ = Unwrap(DeviceBuffer<uint8_t>::Create(0));
  DeviceBuffer<float> lse_ = Unwrap(DeviceBuffer<float>::Create(0));
  std::optional<DeviceViolationWord> word_;
};

void Write(const std::string& dir) {
  if (dir.empty()) return;
  std::ofstream csv(dir + "/varlen_attention.csv");
  std::ofstream md(dir + "/varlen_attention.md");
  csv << "op,kernel,source,mask,bs,prefix,q_len,page_size,visible_pairs,flops,kv_bytes,us,tflops,"
         "fraction_of_bf16_peak,kv_tb_per_s,read_tb_per_s,fraction_of_read,copy_tb_per_s\n";
  md << "| op | kernel | source | mask | bs | prefix | q_len | page size | us | TFLOP/s | % of 989 "
        "| KV TB/s | read TB/s | % of read | copy TB/s |\n"
     << "| --- | --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: "
        "| ---: |\n";
  for (const Row& r : rows) {
    const double tflops = r.flops / (r.us * 1e-6) / 1e12;
    const double tbs = r.bytes / (r.us * 1e-6) / 1e12;
    const double rtbs = r.bytes / (r.read_us * 1e-6) / 1e12;
    const double ctbs = 2 * r.bytes / (r.copy_us * 1e-6) / 1e12;
    csv << absl::StrFormat(
        "%s,%s,%s,%s,%d,%d,%d,%d,%.0f,%.0f,%.0f,%.3f,%.3f,%.5f,%.4f,%.4f,%.4f,%.4f\n", r.op,
        r.kernel, r.source, r.mask, r.bs, r.prefix, r.q_len, r.ps,
        r.flops / (4.0 * dims.head_dim * dims.q_heads), r.flops, r.bytes, r.us, tflops,
        tflops / kPeakTflops, tbs, rtbs, tbs / rtbs, ctbs);
    md << absl::StrFormat("| %s | %s | %s | %s | %d | %d | %d | %d | %.1f | %.2f | %.1f | %.3f | %.3f | %.1f | %.3f |\n",
                          r.op, r.kernel, r.source, r.mask, r.bs, r.prefix, r.q_len, r.ps, r.us, tflops,
                          100 * tflops / kPeakTflops, tbs, rtbs, 100 * tbs / rtbs, ctbs);
  }
}

}  // namespace
}  // namespace attnmeta

int main(int argc, char** argv) {
  using namespace attnmeta;
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // a crash must not lose the lines before it
  std::string out_dir;
  std::string only;  // --workload=NAME
  std::optional<VarlenKernel> only_kernel;  // --kernel=NAME
  for (int k = 1; k < argc; ++k) {
    const std::string arg = argv[k];
    if (arg.rfind("--dims=", 0) == 0) {
      if (!testing::ParseBenchDims(arg.substr(7), &dims)) {
        std::fprintf(stderr, "--dims=Q,KV,D takes three integers with Q >= KV >= 1\n");
        return 2;
      }
    } else if (arg.rfind("--workload=", 0) == 0) {
      only = arg.substr(11);
    } else if (arg.rfind("--kernel=", 0) == 0) {
      for (VarlenKernel kernel : {VarlenKernel::kShortQueries, VarlenKernel::kTiledTensorCores,
                                  VarlenKernel::kTiledCudaCores}) {
        if (arg.substr(9) == VarlenKernelName(kernel)) only_kernel = kernel;
      }
      if (!only_kernel.has_value()) {
        std::fprintf(stderr, "unknown kernel %s\n", arg.substr(9).c_str());
        return 2;
      }
    } else if (arg == "--overlap=0" || arg == "--overlap=1") {
      overlap = arg.back() == '1';
    } else if (arg.rfind("--", 0) == 0) {
      std::fprintf(stderr, "unknown flag %s\n", arg.c_str());
      return 2;
    } else {
      out_dir = arg;
    }
  }
  BENCH_CHECK(testing::RequireGpu());
  int64_t max_tokens = 0;
  for (const Workload& w : kWorkloads) {
    // Whole pages of the largest page size per sequence.
    const int64_t per_seq = (w.prefix + w.q_len + kMaxPageSize - 1) / kMaxPageSize * kMaxPageSize;
    max_tokens = std::max(max_tokens, w.bs * per_seq);
  }
  std::mt19937_64 rng(42);
  Bench bench(max_tokens, only_kernel, rng);
  for (const Workload& w : kWorkloads) {
    if (only.empty() || only == w.name) bench.RunWorkload(w);
  }
  Write(out_dir);
  return 0;
}
