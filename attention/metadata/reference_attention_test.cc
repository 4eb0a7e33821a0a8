// The reference attention against an independent naive computation written here (the oracle
// tests compare the metadata paths with DenseAttention, which shares its inner loop with them,
// so a bug in that loop needs this test to be seen), plus hand-computed cases.

#include "attention/metadata/reference_attention.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <optional>
#include <random>
#include <vector>

#include "attention/metadata/builders.h"
#include "attention/metadata/context_gather.h"
#include "attention/metadata/testing/batch_fixture.h"
#include "gtest/gtest.h"

namespace attnmeta {
namespace {

using testing::BatchFixture;

// out[r][h][x] for query rows r of a sequence whose last q_len tokens are the queries:
// softmax over positions 0..(kv_len - q_len + r) of q.k / sqrt(head_dim), times v. Query heads
// are split into num_kv_heads equal consecutive groups, group j reading KV head j.
// `sees`: [q_len][kv_len], empty for causal (row r sees positions up to kv_len - q_len + r).
// A row that sees nothing gets 0.
std::vector<double> Naive(int q_heads, int kv_heads, int dim, int q_len, int kv_len,
                          const std::vector<float>& q, const std::vector<float>& k,
                          const std::vector<float>& v, const std::vector<uint8_t>& sees = {}) {
  std::vector<double> out(static_cast<size_t>(q_len) * q_heads * dim, 0.0);
  const int per_group = q_heads / kv_heads;
  for (int r = 0; r < q_len; ++r) {
    std::vector<int> visible;
    for (int t = 0; t < kv_len; ++t) {
      if (sees.empty() ? t <= kv_len - q_len + r : sees[r * kv_len + t] != 0) visible.push_back(t);
    }
    for (int j = 0; j < kv_heads; ++j) {
      for (int g = 0; g < per_group; ++g) {
        const int h = j * per_group + g;
        std::vector<double> w(visible.size());
        double biggest = -1e300;
        for (size_t i = 0; i < visible.size(); ++i) {
          double dot = 0;
          for (int x = 0; x < dim; ++x) {
            dot +=
                double{q[(r * q_heads + h) * dim + x]} * k[(visible[i] * kv_heads + j) * dim + x];
          }
          w[i] = dot / std::sqrt(double(dim));
          if (w[i] > biggest) biggest = w[i];
        }
        double total = 0;
        for (double& e : w) total += (e = std::exp(e - biggest));
        for (size_t i = 0; i < visible.size(); ++i) {
          for (int x = 0; x < dim; ++x) {
            out[(r * q_heads + h) * dim + x] +=
                w[i] / total * v[(visible[i] * kv_heads + j) * dim + x];
          }
        }
      }
    }
  }
  return out;
}

std::vector<float> Random(size_t n, std::mt19937_64& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> out(n);
  for (float& x : out) x = normal(rng);
  return out;
}

void ExpectNear(const std::vector<float>& got, const std::vector<double>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) ASSERT_NEAR(got[i], want[i], 1e-5) << "element " << i;
}

// Hand-computed: with equal scores the output is the mean of the visible values, and the
// first query row of a fresh prefill sees token 0 only.
TEST(DenseAttentionTest, HandComputedCausalRows) {
  const AttentionDims d{1, 1, 1};
  const std::vector<float> q = {1.0f, 1.0f, 1.0f};
  const std::vector<float> k = {0.0f, 0.0f, 0.0f};
  const std::vector<float> v = {3.0f, 5.0f, 10.0f};
  std::vector<float> out(3, NAN);
  ASSERT_TRUE(DenseAttention(d, q, k, v, absl::MakeSpan(out)).ok());
  EXPECT_FLOAT_EQ(out[0], 3.0f);
  EXPECT_FLOAT_EQ(out[1], 4.0f);
  EXPECT_FLOAT_EQ(out[2], 6.0f);
  // One query row over a prefix of 2: it sees all three tokens; the score scale is
  // 1/sqrt(head_dim): with head_dim 4, q = k = (1,1,1,1) scores 2, against 0 elsewhere.
  const AttentionDims d4{1, 1, 4};
  const std::vector<float> q4 = {1, 1, 1, 1};
  const std::vector<float> k4 = {0, 0, 0, 0, 1, 1, 1, 1, 0, 0, 0, 0};
  const std::vector<float> v4 = {0, 0, 0, 0, 1, 1, 1, 1, 0, 0, 0, 0};
  std::vector<float> o4(4, NAN);
  ASSERT_TRUE(DenseAttention(d4, q4, k4, v4, absl::MakeSpan(o4)).ok());
  const double e2 = std::exp(2.0);
  for (float x : o4) EXPECT_NEAR(x, e2 / (e2 + 2.0), 1e-6);
}

// The log-sum-exp of the scaled scores: row r of the first case sums r + 1 scores of 0, the
// second case's row exp(2) + 2; a row that sees nothing gets -inf.
TEST(DenseAttentionTest, HandComputedLse) {
  const AttentionDims d{1, 1, 1};
  const std::vector<float> q = {1.0f, 1.0f, 1.0f};
  const std::vector<float> k = {0.0f, 0.0f, 0.0f};
  const std::vector<float> v = {3.0f, 5.0f, 10.0f};
  std::vector<float> out(3, NAN), lse(3, NAN);
  ASSERT_TRUE(DenseAttention(d, q, k, v, absl::MakeSpan(out), absl::MakeSpan(lse)).ok());
  EXPECT_NEAR(lse[0], 0.0, 1e-6);
  EXPECT_NEAR(lse[1], std::log(2.0), 1e-6);
  EXPECT_NEAR(lse[2], std::log(3.0), 1e-6);
  const AttentionDims d4{1, 1, 4};
  const std::vector<float> q4 = {1, 1, 1, 1};
  const std::vector<float> k4 = {0, 0, 0, 0, 1, 1, 1, 1, 0, 0, 0, 0};
  std::vector<float> o4(4, NAN), lse4(1, NAN);
  ASSERT_TRUE(DenseAttention(d4, q4, k4, k4, absl::MakeSpan(o4), absl::MakeSpan(lse4)).ok());
  EXPECT_NEAR(lse4[0], std::log(std::exp(2.0) + 2.0), 1e-6);
  // Masked: row 0 sees token 1 only (score 0: lse 0), row 1 nothing.
  const std::vector<uint8_t> sees = {0, 1, 0, 0, 0, 0};
  std::vector<float> om(2, NAN), lsem(2, NAN);
  ASSERT_TRUE(
      DenseMaskedAttention(d, {1.0f, 1.0f}, k, v, sees, absl::MakeSpan(om), absl::MakeSpan(lsem))
          .ok());
  EXPECT_NEAR(lsem[0], 0.0, 1e-6);
  EXPECT_EQ(lsem[1], -std::numeric_limits<float>::infinity());
  // lse must hold one value per query row and head.
  std::vector<float> short_lse(2);
  EXPECT_EQ(DenseAttention(d, q, k, v, absl::MakeSpan(out), absl::MakeSpan(short_lse)).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(DenseAttentionTest, EqualsTheNaiveComputation) {
  std::mt19937_64 rng(99);
  for (auto [qh, kvh] : {std::pair{4, 4}, {4, 2}, {8, 2}, {6, 1}}) {
    for (auto [q_len, kv_len] : {std::pair{1, 1}, {1, 37}, {5, 5}, {7, 19}}) {
      SCOPED_TRACE(::testing::Message() << qh << "/" << kvh << " heads, q " << q_len << " kv "
                                        << kv_len << ", seed 99 (one stream for every case)");
      const int dim = 8;
      const std::vector<float> q = Random(q_len * qh * dim, rng);
      const std::vector<float> k = Random(kv_len * kvh * dim, rng);
      const std::vector<float> v = Random(kv_len * kvh * dim, rng);
      std::vector<float> out(q.size(), NAN);
      ASSERT_TRUE(DenseAttention({qh, kvh, dim}, q, k, v, absl::MakeSpan(out)).ok());
      ExpectNear(out, Naive(qh, kvh, dim, q_len, kv_len, q, k, v));
    }
  }
}

// The masked oracle (target-verify's) against the naive computation with the same mask: tree
// rows with holes, a prefix column cleared, and a row that sees nothing (0).
TEST(DenseAttentionTest, MaskedEqualsTheNaiveComputation) {
  std::mt19937_64 rng(101);
  for (auto [qh, kvh] : {std::pair{4, 4}, {8, 2}}) {
    for (auto [q_len, kv_len] : {std::pair{1, 3}, {4, 4}, {6, 17}}) {
      SCOPED_TRACE(::testing::Message() << qh << "/" << kvh << " heads, q " << q_len << " kv "
                                        << kv_len << ", seed 101 (one stream for every case)");
      const int dim = 8;
      const std::vector<float> q = Random(q_len * qh * dim, rng);
      const std::vector<float> k = Random(kv_len * kvh * dim, rng);
      const std::vector<float> v = Random(kv_len * kvh * dim, rng);
      std::vector<uint8_t> sees(static_cast<size_t>(q_len) * kv_len);
      for (uint8_t& b : sees) b = rng() % 3 != 0;
      std::fill(sees.begin() + (q_len - 1) * kv_len, sees.end(), 0);  // the last row: nothing
      std::vector<float> out(q.size(), NAN);
      ASSERT_TRUE(DenseMaskedAttention({qh, kvh, dim}, q, k, v, sees, absl::MakeSpan(out)).ok());
      ExpectNear(out, Naive(qh, kvh, dim, q_len, kv_len, q, k, v, sees));
    }
  }
}

// Every metadata path of the reference attention against the naive computation over the
// logical sequences (read from the fixture's own req_to_token rows).
TEST(ReferenceAttentionTest, EveryPathEqualsTheNaiveComputation) {
  for (int64_t ps : {1, 16, 7}) {
    SCOPED_TRACE(::testing::Message() << "page_size " << ps << ", seeds 31 (fixture) and 7");
    BatchFixture f(ps, 31);
    f.AddSequence(30, 4);
    f.AddSequence(0, 9);
    f.AddSequence(50, 1);
    auto m = BuildForwardMetadata(f.Batch(ForwardMode::kExtend), f.pool(), f.page_size());
    ASSERT_TRUE(m.ok()) << m.status();
    const int qh = 4, kvh = 2, dim = 8;
    std::mt19937_64 rng(7);
    const std::vector<float> k_pool = Random(f.pool_slots().value() * kvh * dim, rng);
    const std::vector<float> v_pool = Random(k_pool.size(), rng);
    const std::vector<float> q = Random(f.num_query_rows().value() * qh * dim, rng);
    std::vector<double> want;
    // Each sequence's lse from DenseAttention (checked by hand above): the token-level and
    // page-table paths must put it at the sequence's own rows.
    std::vector<float> want_lse;
    int64_t q0 = 0;
    for (int i = 0; i < 3; ++i) {
      std::vector<float> k, v, qi;
      for (TokenSlot s : f.SlotsOf(i)) {
        for (int e = 0; e < kvh * dim; ++e) {
          k.push_back(k_pool[s.value() * kvh * dim + e]);
          v.push_back(v_pool[s.value() * kvh * dim + e]);
        }
      }
      const int q_len = f.q_lens()[i].value();
      qi.assign(q.begin() + q0, q.begin() + q0 + q_len * qh * dim);
      q0 += q_len * qh * dim;
      const std::vector<double> w = Naive(qh, kvh, dim, q_len, f.kv_lens()[i].value(), qi, k, v);
      want.insert(want.end(), w.begin(), w.end());
      std::vector<float> dense_out(qi.size()), dense_lse(q_len * qh);
      ASSERT_TRUE(DenseAttention({qh, kvh, dim}, qi, k, v, absl::MakeSpan(dense_out),
                                 absl::MakeSpan(dense_lse))
                      .ok());
      want_lse.insert(want_lse.end(), dense_lse.begin(), dense_lse.end());
    }
    ReferenceAttentionInputs in{{qh, kvh, dim}, m->view(), f.page_size(), q, k_pool, v_pool};
    std::vector<float> out(q.size(), NAN);
    std::vector<float> lse(want_lse.size(), NAN);
    ASSERT_TRUE(ReferenceAttentionTokenLevel(in, absl::MakeSpan(out), absl::MakeSpan(lse)).ok());
    ExpectNear(out, want);
    ExpectNear(lse, std::vector<double>(want_lse.begin(), want_lse.end()));
    out.assign(q.size(), NAN);
    lse.assign(want_lse.size(), NAN);
    ASSERT_TRUE(ReferenceAttentionPageTable(in, absl::MakeSpan(out), absl::MakeSpan(lse)).ok());
    ExpectNear(out, want);
    ExpectNear(lse, std::vector<double>(want_lse.begin(), want_lse.end()));
    // lse must hold one value per query row and head.
    lse.resize(1);
    EXPECT_EQ(ReferenceAttentionTokenLevel(in, absl::MakeSpan(out), absl::MakeSpan(lse)).code(),
              absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(ReferenceAttentionPageTable(in, absl::MakeSpan(out), absl::MakeSpan(lse)).code(),
              absl::StatusCode::kInvalidArgument);
    auto gather = GatherContextTokens(ContextGatherInputs{ForwardMode::kExtend, m->kv_indptr,
                                                          m->kv_indices, m->kv_lens, f.pool_slots()});
    ASSERT_TRUE(gather.ok());
    out.assign(q.size(), NAN);
    ASSERT_TRUE(ReferenceAttentionGathered(in, *gather, absl::MakeSpan(out)).ok());
    ExpectNear(out, want);
    SplitKvOptions opt;
    opt.num_units = 5;
    opt.kv_granularity = TokenCount(8);
    opt.q_tile = TokenCount(2);
    auto plan = PlanSplitKv(m->qo_indptr, m->kv_indptr, opt);
    ASSERT_TRUE(plan.ok());
    ASSERT_FALSE(plan->reduce.empty()) << "the plan must split some tiles";
    out.assign(q.size(), NAN);
    ASSERT_TRUE(ReferenceAttentionSplitKv(in, *plan, absl::MakeSpan(out)).ok());
    ExpectNear(out, want);
    out.assign(q.size(), NAN);
    ASSERT_TRUE(ReferenceAttentionGatheredSplitKv(in, *gather, *plan, absl::MakeSpan(out)).ok());
    ExpectNear(out, want);
  }
}

// A bad plan is refused before anything is allocated by its counts or written to out: a plan
// whose partial count passes its work items (it would have allocated 2^31 partials), and a
// plan whose first item is sound but whose later reduce item is not (it wrote that item's rows).
// Two sequences (3 query rows over 43 KV tokens, 2 over 22) at page size 16, 2 query heads on
// 1 KV head of dim 4, random Q/K/V: the batch the bad-input tests break.
class SmallExtendBatch : public ::testing::Test {
 protected:
  void SetUp() override {
    f_.AddSequence(40, 3);
    f_.AddSequence(20, 2);
    auto built = BuildForwardMetadata(f_.Batch(ForwardMode::kExtend), f_.pool(), f_.page_size());
    ASSERT_TRUE(built.ok()) << built.status();
    m_ = *std::move(built);
    std::mt19937_64 rng(9);
    k_pool_ = Random(f_.pool_slots().value() * kKvHeads * kHeadDim, rng);
    v_pool_ = Random(k_pool_.size(), rng);
    q_ = Random(f_.num_query_rows().value() * kQHeads * kHeadDim, rng);
  }
  ReferenceAttentionInputs Inputs() const {
    return {{kQHeads, kKvHeads, kHeadDim}, m_->view(), f_.page_size(), q_, k_pool_, v_pool_};
  }

  static constexpr int kQHeads = 2, kKvHeads = 1, kHeadDim = 4;
  BatchFixture f_{16, 5};
  std::optional<ForwardMetadata> m_;
  std::vector<float> k_pool_, v_pool_, q_;
};

TEST_F(SmallExtendBatch, BadSplitPlansWriteNothing) {
  const ReferenceAttentionInputs in = Inputs();
  SplitKvOptions opt;
  opt.num_units = 3;
  opt.kv_granularity = TokenCount(16);
  auto plan = PlanSplitKv(m_->qo_indptr, m_->kv_indptr, opt);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_FALSE(plan->reduce.empty());
  std::vector<float> out(q_.size(), 7.0f);
  ASSERT_TRUE(ReferenceAttentionSplitKv(in, *plan, absl::MakeSpan(out)).ok());

  SplitKvPlan huge = *plan;
  huge.num_partials = std::numeric_limits<int32_t>::max();
  out.assign(q_.size(), 7.0f);
  EXPECT_EQ(ReferenceAttentionSplitKv(in, huge, absl::MakeSpan(out)).code(),
            absl::StatusCode::kInvalidArgument);
  SplitKvPlan late = *plan;
  // A direct item first (sequence 1 whole), then a reduce item naming a slot no item writes.
  late.work.insert(late.work.begin(),
                   SplitKvWorkItem{1, m_->qo_indptr[1], m_->qo_indptr[2], TokenPosition(0),
                                   TokenPosition(m_->kv_lens[1].value()), -1});
  late.reduce.back().partial_end = late.num_partials;
  late.reduce.back().partial_begin = late.num_partials - 1;
  late.work.erase(std::remove_if(late.work.begin(), late.work.end(),
                                 [&](const SplitKvWorkItem& w) {
                                   return w.partial_slot == late.num_partials - 1;
                                 }),
                  late.work.end());
  EXPECT_EQ(ReferenceAttentionSplitKv(in, late, absl::MakeSpan(out)).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(out, std::vector<float>(q_.size(), 7.0f)) << "out written before the error";
}

// Every check of the reference paths: a refused call names what is wrong and writes nothing
// ("a broken array is an error status, never an out-of-bounds read").
TEST_F(SmallExtendBatch, BadInputIsRefusedAndWritesNothing) {
  const ReferenceAttentionInputs good = Inputs();
  auto gather = GatherContextTokens(ContextGatherInputs{
      ForwardMode::kExtend, m_->kv_indptr, m_->kv_indices, m_->kv_lens, f_.pool_slots()});
  ASSERT_TRUE(gather.ok()) << gather.status();
  std::vector<float> out(q_.size(), 7.0f);
  ASSERT_TRUE(ReferenceAttentionTokenLevel(good, absl::MakeSpan(out)).ok());
  ASSERT_TRUE(ReferenceAttentionPageTable(good, absl::MakeSpan(out)).ok());
  ASSERT_TRUE(ReferenceAttentionGathered(good, *gather, absl::MakeSpan(out)).ok());

  enum Path { kTokenLevel, kPageTable, kGathered };
  struct Case {
    const char* words;
    Path path;
    std::function<void(ReferenceAttentionInputs&, ContextGather&)> edit;
    size_t out_size = 0;  // 0: q's size
  };
  // A pool that ends at the batch's highest slot: that slot is outside it.
  int32_t highest = 0;
  for (TokenSlot s : m_->kv_indices) highest = std::max(highest, s.value());
  const size_t fewer_slots = static_cast<size_t>(highest) * kKvHeads * kHeadDim;
  const std::vector<Case> cases = {
      {"attention dims", kTokenLevel, [](auto& in, auto&) { in.dims.num_kv_heads = 3; }},
      {"attention dims", kTokenLevel, [](auto& in, auto&) { in.dims.head_dim = 0; }},
      {"K/V pools of", kTokenLevel, [](auto& in, auto&) { in.v_pool.remove_suffix(kHeadDim); }},
      {"K/V pools of", kPageTable,
       [](auto& in, auto&) {
         in.k_pool.remove_suffix(1);
         in.v_pool.remove_suffix(1);
       }},
      {"q has", kTokenLevel, [](auto&, auto&) {}, q_.size() - 1},
      {"q has", kGathered, [](auto& in, auto&) { in.q.remove_suffix(1); }},
      {"outside the allocatable pages", kTokenLevel,
       [&](auto& in, auto&) {
         in.k_pool = absl::MakeConstSpan(k_pool_).subspan(0, fewer_slots);
         in.v_pool = absl::MakeConstSpan(v_pool_).subspan(0, fewer_slots);
       }},
      {"needs a page table", kPageTable,
       [](auto& in, auto&) { in.metadata.page_table = PageTableSpan<const PageId>(); }},
      {"gather: cu_k must be", kGathered, [](auto&, auto& g) { g.cu_k.pop_back(); }},
      {"gather: cu_k must be", kGathered, [](auto&, auto& g) { g.tok_idx.pop_back(); }},
      {"gather: sequence 0 has 42 tokens, kv_len 43", kGathered,
       [](auto&, auto& g) { g.cu_k[1] = TokenOffset(g.cu_k[1].value() - 1); }},
      {"gather: tok_idx[5] = slot", kGathered,
       [&](auto&, auto& g) {
         g.tok_idx[5] = TokenSlot(static_cast<int32_t>(f_.pool_slots().value()));
       }},
      {"gather: tok_idx[0] = slot -1", kGathered,
       [](auto&, auto& g) { g.tok_idx[0] = TokenSlot(-1); }},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.words);
    ReferenceAttentionInputs in = good;
    ContextGather g = *gather;
    c.edit(in, g);
    std::vector<float> o(c.out_size != 0 ? c.out_size : in.q.size(), 7.0f);
    absl::Status s;
    switch (c.path) {
      case kTokenLevel:
        s = ReferenceAttentionTokenLevel(in, absl::MakeSpan(o));
        break;
      case kPageTable:
        s = ReferenceAttentionPageTable(in, absl::MakeSpan(o));
        break;
      case kGathered:
        s = ReferenceAttentionGathered(in, g, absl::MakeSpan(o));
        break;
    }
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_NE(s.message().find(c.words), absl::string_view::npos) << s;
    EXPECT_EQ(o, std::vector<float>(o.size(), 7.0f)) << "out written before the error";
  }
}

TEST(DenseAttentionTest, BadShapesAreRefusedAndWriteNothing) {
  const AttentionDims d{2, 1, 4};
  const std::vector<float> q(2 * 2 * 4, 1.0f), k(3 * 4, 1.0f), v(3 * 4, 1.0f);
  const std::vector<uint8_t> sees(2 * 3, 1);
  std::vector<float> out(q.size(), 7.0f);
  const std::vector<float> untouched = out;
  auto words = [](const absl::Status& s) { return std::string(s.message()); };
  ASSERT_TRUE(DenseAttention(d, q, k, v, absl::MakeSpan(out)).ok());
  ASSERT_TRUE(DenseMaskedAttention(d, q, k, v, sees, absl::MakeSpan(out)).ok());
  out = untouched;
  EXPECT_EQ(
      words(DenseAttention({2, 3, 4}, q, k, v, absl::MakeSpan(out))).rfind("attention dims", 0),
      0u);
  EXPECT_EQ(words(DenseAttention(d, q, k, absl::MakeConstSpan(v).subspan(4), absl::MakeSpan(out))),
            "dense attention: shapes disagree");
  EXPECT_EQ(words(DenseAttention(d, q, k, v, absl::MakeSpan(out).subspan(1))),
            "dense attention: shapes disagree");
  EXPECT_EQ(words(DenseAttention(d, q, absl::MakeConstSpan(k).subspan(8),
                                 absl::MakeConstSpan(v).subspan(8), absl::MakeSpan(out))),
            "dense attention: q_len > kv_len");
  const absl::Status masked =
      DenseMaskedAttention(d, q, k, v, absl::MakeConstSpan(sees).subspan(1), absl::MakeSpan(out));
  EXPECT_EQ(masked.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(words(masked), "dense masked attention: mask of 5 bytes, want 2 x 3");
  EXPECT_EQ(out, untouched);
}

}  // namespace
}  // namespace attnmeta
