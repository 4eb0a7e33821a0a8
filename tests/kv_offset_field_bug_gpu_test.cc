// Field bug, DESIGN.md section 3 row 11: int32 offsets into the KV pool overflowed once a KV
// layer passed 2 GiB, and attention read the wrong rows (NaNs in the field). Here every
// attention kernel reads K and V rows that lie past 2^31 bytes (where a byte offset wraps) and
// past 2^31 elements (4 GiB of bf16, where an element offset wraps) in pools of 4 GiB + 4 MiB
// each (2^21 + 2048 slots of 8 KV heads x 128 bf16 dims): decode through token-level kv_indices
// and through the page table, unsplit and split, and varlen attention's three kernels on extend
// rows. Every output row must equal attention computed in double over the same rows. The
// context-prefill gather (GatherKvOnDevice) copies the same rows into linear K and V, which
// must equal them bit for bit. Only the rows the batch uses are written (nothing else of the
// pools is read). The GPU mutants row11_* put 32-bit offset arithmetic back into each kernel's
// address computation. Needs a GPU with 9 GB free.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "attention/kernels/metadata_launchers.h"
#include "attention/kernels/paged_decode_launcher.h"
#include "attention/kernels/testing/attention_inputs.h"
#include "attention/kernels/testing/device_buffer.h"
#include "attention/kernels/testing/gpu_test.h"
#include "attention/kernels/testing/upload.h"
#include "attention/kernels/varlen_attention_launcher.h"
#include "attention/metadata/split_kv_planner.h"
#include "gtest/gtest.h"

namespace attnmeta {
namespace {

using testing::DeviceBuffer;
using testing::Download;
using testing::Poison;
using testing::Upload;

constexpr int32_t kQHeads = 32;
constexpr int32_t kKvHeads = 8;
constexpr int32_t kHeadDim = 128;
constexpr int64_t kRow = int64_t{kKvHeads} * kHeadDim;  // elements of one slot
constexpr int64_t kPageSize = 16;
// A slot is 2 KiB: slots from 2^20 on start past 2^31 bytes, slots from 2^21 on past 2^31
// elements.
constexpr int64_t kFirstSlotPast2GiB = int64_t{1} << 20;
constexpr int64_t kFirstSlotPast4GiB = int64_t{1} << 21;
constexpr int64_t kPoolSlots = kFirstSlotPast4GiB + 2048;
const std::vector<int64_t> kLens = {300, 129, 517};

class KvOffsetFieldBugGpuTest : public testing::ViolationWordGpuTest {
 protected:
  // Pages for the sequences: half past 4 GiB, a quarter between 2 and 4 GiB, a quarter below,
  // shuffled; K, V and Q random N(0, 1) bf16; the rows used copied into pools of kPoolSlots
  // slots.
  void SetUp() override {
    testing::ViolationWordGpuTest::SetUp();
    if (HasFatalFailure()) return;
    std::mt19937_64 rng(1111);
    int64_t num_pages = 0;
    for (int64_t len : kLens) num_pages += (len + kPageSize - 1) / kPageSize;
    // Page ids of [first, last), shuffled.
    auto range = [&](int64_t first, int64_t last) {
      std::vector<int32_t> ids(last - first);
      for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>(first + i);
      std::shuffle(ids.begin(), ids.end(), rng);
      return ids;
    };
    const std::vector<int32_t> low = range(1, kFirstSlotPast2GiB / kPageSize);
    const std::vector<int32_t> mid =
        range(kFirstSlotPast2GiB / kPageSize, kFirstSlotPast4GiB / kPageSize);
    const std::vector<int32_t> high = range(kFirstSlotPast4GiB / kPageSize, kPoolSlots / kPageSize);
    std::vector<int32_t> pages(num_pages);
    for (int64_t i = 0; i < num_pages; ++i) {
      pages[i] = i % 4 == 3 ? low[i] : i % 4 == 1 ? mid[i] : high[i];
    }
    std::shuffle(pages.begin(), pages.end(), rng);

    int64_t page = 0, token = 0;
    kv_indptr_.push_back(TokenOffset(0));
    for (int64_t len : kLens) {
      const int64_t cols = (len + kPageSize - 1) / kPageSize;
      for (int64_t p = 0; p < cols; ++p) page_table_.push_back(PageId(pages[page + p]));
      for (int64_t p = cols; p < kCols; ++p) page_table_.push_back(PageId(0));
      for (int64_t t = 0; t < len; ++t) {
        slots_.push_back(pages[page + t / kPageSize] * kPageSize + t % kPageSize);
        kv_indices_.push_back(TokenSlot(static_cast<int32_t>(slots_.back())));
      }
      page += cols;
      token += len;
      kv_indptr_.push_back(TokenOffset(static_cast<int32_t>(token)));
      kv_lens_.push_back(TokenLength(static_cast<int32_t>(len)));
    }
    past_2gib_ = std::count_if(slots_.begin(), slots_.end(),
                               [](int64_t s) { return s >= kFirstSlotPast2GiB; });
    past_4gib_ = std::count_if(slots_.begin(), slots_.end(),
                               [](int64_t s) { return s >= kFirstSlotPast4GiB; });

    std::normal_distribution<float> normal(0.0f, 1.0f);
    auto k = DeviceBuffer<uint8_t>::Create(kPoolSlots * kRow * 2);
    auto v = DeviceBuffer<uint8_t>::Create(kPoolSlots * kRow * 2);
    ASSERT_TRUE(k.ok() && v.ok()) << k.status() << v.status();
    k_ = std::make_unique<DeviceBuffer<uint8_t>>(*std::move(k));
    v_ = std::make_unique<DeviceBuffer<uint8_t>>(*std::move(v));
    std::vector<uint16_t> bits;
    std::vector<float> values;
    for (int64_t slot : slots_) {
      for (auto [pool, host] : {std::pair{k_.get(), &k_host_}, std::pair{v_.get(), &v_host_}}) {
        testing::FillNormal(KvElementType::kBf16, kRow, rng, normal, bits, values);
        (*host)[slot] = values;
        ASSERT_EQ(hipMemcpy(pool->data() + slot * kRow * 2, bits.data(), kRow * 2,
                            hipMemcpyHostToDevice),
                  hipSuccess);
      }
    }
    const int64_t q_rows = 3 * static_cast<int64_t>(kLens.size());  // 3 rows per sequence at most
    testing::FillNormal(KvElementType::kBf16, q_rows * kQHeads * kHeadDim, rng, normal, bits,
                        q_host_);
    q_ = std::make_unique<DeviceBuffer<uint8_t>>(Upload(testing::Bytes(bits)));
    out_ = std::make_unique<DeviceBuffer<uint8_t>>(
        *DeviceBuffer<uint8_t>::Create(q_rows * kQHeads * kHeadDim * 2));
    lse_ = std::make_unique<DeviceBuffer<float>>(*DeviceBuffer<float>::Create(q_rows * kQHeads));
    d_kv_indptr_ = std::make_unique<DeviceBuffer<TokenOffset>>(Upload(kv_indptr_));
    d_kv_indices_ = std::make_unique<DeviceBuffer<TokenSlot>>(Upload(kv_indices_));
    d_page_table_ = std::make_unique<DeviceBuffer<PageId>>(Upload(page_table_));
    d_kv_lens_ = std::make_unique<DeviceBuffer<TokenLength>>(Upload(kv_lens_));
  }

  DecodeKv TokenLevel() const {
    return DecodeTokenLevelKv{d_kv_indptr_->const_span(), d_kv_indices_->const_span()};
  }
  DecodeKv PageTable() const {
    return DecodePageTableKv{d_page_table_->const_span(), PageCount(kCols), d_kv_lens_->const_span(),
                             *PageSize::Create(kPageSize)};
  }

  // Query row `row` against attention over positions [0, visible) of sequence `seq`, in double.
  void ExpectRow(int64_t row, int64_t seq, int64_t visible, const std::string& what) {
    const std::vector<uint8_t> out = Download(*out_);
    const std::vector<float> lse = Download(*lse_);
    const double scale = 1.0 / std::sqrt(static_cast<double>(kHeadDim));
    for (int32_t h = 0; h < kQHeads; ++h) {
      const int64_t kv_off = int64_t{h / (kQHeads / kKvHeads)} * kHeadDim;
      const float* q = q_host_.data() + (row * kQHeads + h) * kHeadDim;
      std::vector<double> s(visible);
      double m = -INFINITY;
      for (int64_t t = 0; t < visible; ++t) {
        const std::vector<float>& k = k_host_.at(slots_[kv_indptr_[seq].value() + t]);
        double dot = 0;
        for (int32_t x = 0; x < kHeadDim; ++x) dot += double{q[x]} * k[kv_off + x];
        s[t] = dot * scale;
        m = std::max(m, s[t]);
      }
      double sum = 0;
      for (double x : s) sum += std::exp(x - m);
      std::vector<double> want_row(kHeadDim, 0.0);
      for (int64_t t = 0; t < visible; ++t) {
        const double w = std::exp(s[t] - m) / sum;
        const std::vector<float>& v = v_host_.at(slots_[kv_indptr_[seq].value() + t]);
        for (int32_t x = 0; x < kHeadDim; ++x) want_row[x] += w * v[kv_off + x];
      }
      for (int32_t x = 0; x < kHeadDim; ++x) {
        const double want = want_row[x];
        uint16_t b;
        std::memcpy(&b, out.data() + ((row * kQHeads + h) * kHeadDim + x) * 2, 2);
        const double got = testing::FromBits(KvElementType::kBf16, b);
        ASSERT_LE(std::fabs(got - want), 1e-2 + 1e-2 * std::fabs(want))
            << what << ": row " << row << " head " << h << " dim " << x << ": got " << got
            << " want " << want;
      }
      const double want_lse = m + std::log(sum);
      ASSERT_LE(std::fabs(lse[row * kQHeads + h] - want_lse), 1e-3 + 1e-5 * std::fabs(want_lse))
          << what << ": lse row " << row << " head " << h;
    }
  }

  void PoisonOutputs() {
    Poison(out_->data(), out_->size());
    Poison(lse_->data(), lse_->size() * sizeof(float));
  }

  static constexpr int64_t kCols = (517 + kPageSize - 1) / kPageSize;
  std::vector<TokenOffset> kv_indptr_;
  std::vector<TokenSlot> kv_indices_;
  std::vector<PageId> page_table_;  // [bs][kCols]
  std::vector<TokenLength> kv_lens_;
  std::vector<int64_t> slots_;      // token by token, all sequences
  int64_t past_2gib_ = 0, past_4gib_ = 0;
  std::map<int64_t, std::vector<float>> k_host_, v_host_;  // the rows written, by slot
  std::vector<float> q_host_;
  std::unique_ptr<DeviceBuffer<uint8_t>> k_, v_, q_, out_;
  std::unique_ptr<DeviceBuffer<float>> lse_;
  std::unique_ptr<DeviceBuffer<TokenOffset>> d_kv_indptr_;
  std::unique_ptr<DeviceBuffer<TokenSlot>> d_kv_indices_;
  std::unique_ptr<DeviceBuffer<PageId>> d_page_table_;
  std::unique_ptr<DeviceBuffer<TokenLength>> d_kv_lens_;
};

TEST_F(KvOffsetFieldBugGpuTest, DecodeReadsRowsPast2GiB) {
  ASSERT_GT(past_2gib_, static_cast<int64_t>(slots_.size()) / 2) << "most rows lie past 2 GiB";
  ASSERT_GT(past_4gib_, static_cast<int64_t>(slots_.size()) / 4) << "many rows lie past 4 GiB";
  const int64_t bs = static_cast<int64_t>(kLens.size());
  const std::vector<TokenOffset> qo = {TokenOffset(0), TokenOffset(1), TokenOffset(2),
                                       TokenOffset(3)};
  for (bool page_table : {false, true}) {
    // A plan of 64-token chunks for the layout this source reads.
    auto plan = PlanSplitKv(qo, kv_indptr_,
                            SplitKvOptions{DecodeKvLayout(page_table ? PageTable() : TokenLevel()),
                                           8, TokenCount(64)});
    ASSERT_TRUE(plan.ok()) << plan.status();
    ASSERT_GT(plan->num_partials, 0);
    DeviceBuffer<SplitKvWorkItem> work = Upload(plan->work);
    DeviceBuffer<SplitKvReduceItem> reduce = Upload(plan->reduce);
    DeviceBuffer<float> partial_out =
        *DeviceBuffer<float>::Create(int64_t{plan->num_partials} * kQHeads * kHeadDim);
    DeviceBuffer<float> partial_lse = *DeviceBuffer<float>::Create(plan->num_partials * kQHeads);
    for (bool split : {false, true}) {
      const std::string what = absl::StrCat(page_table ? "page table" : "token-level",
                                            split ? ", split" : "");
      PagedDecodeArgs a;
      a.dims = testing::Dims(kQHeads, kKvHeads, kHeadDim, KvElementType::kBf16);
      a.q = DeviceSpan<const uint8_t>(q_->data(), bs * kQHeads * kHeadDim * 2);
      a.k_pool = k_->const_span();
      a.v_pool = v_->const_span();
      a.kv = page_table ? PageTable() : TokenLevel();
      if (split) {
        a.split = DecodeSplitKv{&*plan, work.const_span(), reduce.const_span(), partial_out.span(),
                                partial_lse.span()};
      }
      PoisonOutputs();
      a.out = DeviceSpan<uint8_t>(out_->data(), bs * kQHeads * kHeadDim * 2);
      a.lse = DeviceSpan<float>(lse_->data(), bs * kQHeads);
      ASSERT_TRUE(PagedDecodeAttention(a, word_->device(), nullptr).ok()) << what;
      ASSERT_EQ(hipDeviceSynchronize(), hipSuccess) << what;
      ASSERT_TRUE(word_->Check(nullptr).ok()) << what << ": " << word_->Check(nullptr);
      for (int64_t i = 0; i < bs; ++i) {
        ExpectRow(i, i, kLens[i], what);
        ASSERT_FALSE(HasFatalFailure());
      }
    }
  }
}

TEST_F(KvOffsetFieldBugGpuTest, VarlenKernelsReadRowsPast2GiB) {
  // Extend: the last 3 positions of each sequence are query rows, causal.
  constexpr int64_t kRows = 3;
  const int64_t bs = static_cast<int64_t>(kLens.size());
  std::vector<TokenOffset> qo;
  for (int64_t i = 0; i <= bs; ++i) qo.push_back(TokenOffset(static_cast<int32_t>(i * kRows)));
  DeviceBuffer<TokenOffset> d_qo = Upload(qo);
  for (bool page_table : {false, true}) {
    for (VarlenKernel kernel : {VarlenKernel::kShortQueries, VarlenKernel::kTiledTensorCores,
                                VarlenKernel::kTiledCudaCores}) {
      const std::string what =
          absl::StrCat(page_table ? "page table, " : "token-level, ", VarlenKernelName(kernel));
      VarlenAttentionArgs a;
      a.dims = testing::Dims(kQHeads, kKvHeads, kHeadDim, KvElementType::kBf16);
      a.q = DeviceSpan<const uint8_t>(q_->data(), bs * kRows * kQHeads * kHeadDim * 2);
      a.qo_indptr = d_qo.const_span();
      a.max_q_len = TokenCount(kRows);
      a.k_pool = k_->const_span();
      a.v_pool = v_->const_span();
      a.kv = page_table ? PageTable() : TokenLevel();
      a.kernel = kernel;
      PoisonOutputs();
      a.out = DeviceSpan<uint8_t>(out_->data(), bs * kRows * kQHeads * kHeadDim * 2);
      a.lse = DeviceSpan<float>(lse_->data(), bs * kRows * kQHeads);
      ASSERT_TRUE(VarlenAttention(a, word_->device(), nullptr).ok()) << what;
      ASSERT_EQ(hipDeviceSynchronize(), hipSuccess) << what;
      ASSERT_TRUE(word_->Check(nullptr).ok()) << what << ": " << word_->Check(nullptr);
      for (int64_t i = 0; i < bs; ++i) {
        for (int64_t r = 0; r < kRows; ++r) {
          ExpectRow(i * kRows + r, i, kLens[i] - kRows + r + 1, what);
          ASSERT_FALSE(HasFatalFailure());
        }
      }
    }
  }
}

TEST_F(KvOffsetFieldBugGpuTest, GatherCopiesRowsPast2GiB) {
  const int64_t rows = static_cast<int64_t>(slots_.size());
  DeviceBuffer<uint8_t> k_out = *DeviceBuffer<uint8_t>::Create(rows * kRow * 2);
  DeviceBuffer<uint8_t> v_out = *DeviceBuffer<uint8_t>::Create(rows * kRow * 2);
  Poison(k_out.data(), k_out.size());
  Poison(v_out.data(), v_out.size());
  GatherKvDeviceArgs a;
  a.k_pool = k_->const_span();
  a.v_pool = v_->const_span();
  a.num_kv_heads = kKvHeads;
  a.head_dim = kHeadDim;
  a.dtype = KvElementType::kBf16;
  a.tok_idx = d_kv_indices_->const_span();
  a.cu_k = d_kv_indptr_->const_span();
  a.k_out = k_out.span();
  a.v_out = v_out.span();
  ASSERT_TRUE(GatherKvOnDevice(a, word_->device(), nullptr).ok());
  ASSERT_EQ(hipDeviceSynchronize(), hipSuccess);
  ASSERT_TRUE(word_->Check(nullptr).ok()) << word_->Check(nullptr);
  const std::vector<uint8_t> k = Download(k_out), v = Download(v_out);
  for (int64_t r = 0; r < rows; ++r) {
    for (auto [out, host] : {std::pair{&k, &k_host_}, std::pair{&v, &v_host_}}) {
      const std::vector<float>& want = host->at(slots_[r]);
      for (int64_t x = 0; x < kRow; ++x) {
        uint16_t b;
        std::memcpy(&b, out->data() + (r * kRow + x) * 2, 2);
        ASSERT_EQ(testing::FromBits(KvElementType::kBf16, b), want[x])
            << (out == &k ? "K" : "V") << " row " << r << " (slot " << slots_[r] << ") element "
            << x;
      }
    }
  }
}

}  // namespace
}  // namespace attnmeta
