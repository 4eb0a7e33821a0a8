// Graph replay against the eager path and dense attention: for page sizes 1, 2, 7, 16 and 64
// with shuffled pools, random decode and extend batches replayed through captured buckets
// give, for their real rows, exactly BuildForwardMetadata's arrays, validate (slot ownership
// included), and attention read through the fixed buffers (token-level indices, page table,
// and the split-KV plan written at replay) equals dense attention over the logical sequences.

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "attention/graph/batch_buckets.h"
#include "attention/graph/buffer_plan.h"
#include "attention/graph/graph_state.h"
#include "attention/graph/host_device_memory.h"
#include "attention/graph/testing/graph_harness.h"
#include "attention/metadata/builders.h"
#include "attention/metadata/reference_attention.h"
#include "attention/metadata/testing/attention_problem.h"
#include "attention/metadata/testing/batch_fixture.h"
#include "attention/metadata/validator.h"
#include "gtest/gtest.h"

namespace attnmeta {
namespace {

using testing::BatchFixture;
using testing::GraphHarness;

constexpr AttentionDims kDims{4, 2, 8};
constexpr int kExtendRows = 3;

// The first n entries of s; a failure, and only what s has, when it is shorter (a replayed
// array shorter than the eager one must fail the comparison, not be read past its end).
template <typename T>
std::vector<T> Prefix(absl::Span<const T> s, size_t n) {
  EXPECT_GE(s.size(), n) << "an array shorter than the comparison needs";
  return std::vector<T>(s.begin(), s.begin() + std::min(n, s.size()));
}

void RunPageSize(int64_t ps, uint64_t seed) {
  std::mt19937_64 rng(seed);
  auto uniform = [&](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };
  BatchFixture f(ps, seed, /*num_pages=*/9000 / ps + 64);
  // Sequences 0..11 decode (one new token), 12..23 extend (kExtendRows new tokens); some
  // share a cached prefix with sequence 0 or 12.
  for (int i = 0; i < 24; ++i) {
    const int64_t new_tokens = i < 12 ? 1 : kExtendRows;
    const int64_t cached = uniform(0, 300);
    const int donor = i < 12 ? 0 : 12;
    if (i != donor && uniform(0, 3) == 0) {
      f.AddSequenceSharingPrefix(donor, uniform(0, 300), std::max<int64_t>(cached, 300), new_tokens);
    } else {
      f.AddSequence(cached, new_tokens);
    }
  }
  const testing::AttentionProblem p = testing::MakeAttentionProblem(f, kDims, seed);
  std::vector<int64_t> q_offset(25, 0);  // where sequence i's query rows start in p.q
  const int64_t q_row = int64_t{kDims.num_q_heads} * kDims.head_dim;
  for (int i = 0; i < 24; ++i) q_offset[i + 1] = q_offset[i] + f.q_lens()[i].value() * q_row;

  const BackendConfig config = testing::MakeTestConfig(ps, {.max_batch_size = 8,
                                                            .max_context_len = 512,
                                                            .max_query_rows_per_request = 4});
  GraphHarness h(config, f);
  GraphState& g = h.state();
  const BatchSizeBuckets buckets = BatchSizeBuckets::ForConfig(config);
  std::map<std::pair<int64_t, int>, CaptureHandle> captured;
  for (int iter = 0; iter < 12; ++iter) {
    const bool decode = iter % 2 == 0;
    const int64_t bs = uniform(1, 8);
    SCOPED_TRACE(absl::StrCat("page_size ", ps, " seed ", seed, " iter ", iter,
                              decode ? " decode" : " extend", " bs ", bs));
    std::vector<int> pick(12);
    std::iota(pick.begin(), pick.end(), decode ? 0 : 12);
    std::shuffle(pick.begin(), pick.end(), rng);
    pick.resize(bs);
    std::vector<ReqPoolIndex> rows;
    std::vector<TokenLength> kv_lens, q_lens;
    std::vector<float> q, want;
    for (int i : pick) {
      rows.push_back(f.rows()[i]);
      kv_lens.push_back(f.kv_lens()[i]);
      q_lens.push_back(f.q_lens()[i]);
      q.insert(q.end(), p.q.begin() + q_offset[i], p.q.begin() + q_offset[i + 1]);
      want.insert(want.end(), p.dense.begin() + q_offset[i], p.dense.begin() + q_offset[i + 1]);
    }
    const ForwardMode mode = decode ? ForwardMode::kDecode : ForwardMode::kExtend;
    const int64_t bucket = buckets.Choose(bs)->bucket;
    auto key = std::make_pair(bucket, static_cast<int>(mode));
    if (captured.count(key) == 0) {
      auto handle = g.Capture(bucket, mode, TokenLength(decode ? 1 : kExtendRows));
      ASSERT_TRUE(handle.ok()) << handle.status();
      captured[key] = *handle;
    }
    // Every buffer poisoned first: what the replay reports, it wrote in this replay.
    for (const BufferSpec& spec : g.plan().buffers) {
      ASSERT_TRUE(h.memory().Fill(g.buffer(spec.name), 0, spec.bytes, 0xCD).ok()) << spec.name;
    }
    auto r = g.Replay(captured[key], ReplayBatch{rows, kv_lens});
    ASSERT_TRUE(r.ok()) << r.status();
    const ForwardMetadataView& v = r->metadata;

    auto eager = BuildForwardMetadata(ForwardBatch{mode, rows, kv_lens, q_lens, {}}, f.pool(),
                                      f.page_size());
    ASSERT_TRUE(eager.ok()) << eager.status();
    EXPECT_EQ(Prefix(v.kv_indptr, bs + 1), eager->kv_indptr);
    EXPECT_EQ(Prefix(v.qo_indptr, bs + 1), eager->qo_indptr);
    EXPECT_EQ(Prefix(v.kv_indices, v.kv_indices.size()), eager->kv_indices);
    EXPECT_EQ(Prefix(v.kv_last_page_len, bs), eager->kv_last_page_len);
    EXPECT_EQ(Prefix(v.kv_lens, bs), eager->kv_lens);
    EXPECT_EQ(v.max_q_len, eager->max_q_len);
    EXPECT_EQ(v.max_kv_len, eager->max_kv_len);
    // The config asks for a page table: a replay that dropped it must fail here.
    ASSERT_EQ(v.page_table.rows(), bs);
    for (int64_t i = 0; i < bs; ++i) {
      const absl::Span<const PageId> row = v.page_table.row(i);
      const absl::Span<const PageId> want_row = eager->page_table.span().row(i);
      ASSERT_EQ(Prefix(row, want_row.size()), Prefix(want_row, want_row.size())) << "row " << i;
      for (size_t j = want_row.size(); j < row.size(); ++j) ASSERT_EQ(row[j], kPaddingPage);
    }
    ValidationContext ctx{f.pool_slots(), f.page_size(),
                          TokenCount(static_cast<int64_t>(q.size()) / q_row)};
    ctx.check_slot_ownership = true;
    ASSERT_TRUE(ValidateForwardMetadata(v, ctx).ok()) << ValidateForwardMetadata(v, ctx);

    ReferenceAttentionInputs in{kDims, v, f.page_size(), q, p.k_pool, p.v_pool};
    std::vector<float> out(q.size(), NAN);
    ASSERT_TRUE(ReferenceAttentionTokenLevel(in, absl::MakeSpan(out)).ok());
    EXPECT_LT(testing::RelativeL2Error(out, want), 1e-5) << "token-level";
    out.assign(q.size(), NAN);
    ASSERT_TRUE(ReferenceAttentionPageTable(in, absl::MakeSpan(out)).ok());
    EXPECT_LT(testing::RelativeL2Error(out, want), 1e-5) << "page table";
    // The whole bucket, as a kernel captured for it reads it: its qo_indptr ends at the padded
    // query tensor's rows (DESIGN.md section 2), its real rows are the eager batch's, and it
    // validates. Padded rows' queries are random too; their outputs must be finite.
    const ForwardMetadataView& w = r->padded;
    const int64_t rows_per_request = decode ? 1 : kExtendRows;
    ASSERT_EQ(w.batch_size(), bucket);
    ASSERT_EQ(w.qo_indptr[bucket].value(), bucket * rows_per_request);
    EXPECT_EQ(Prefix(w.kv_indptr, bs + 1), eager->kv_indptr);
    EXPECT_EQ(Prefix(w.qo_indptr, bs + 1), eager->qo_indptr);
    EXPECT_EQ(Prefix(w.kv_indices, eager->kv_indices.size()), eager->kv_indices);
    EXPECT_EQ(Prefix(w.kv_last_page_len, bs), eager->kv_last_page_len);
    EXPECT_EQ(Prefix(w.kv_lens, bs), eager->kv_lens);
    for (int64_t i = 0; i < bs; ++i) {
      const absl::Span<const PageId> want_row = eager->page_table.span().row(i);
      EXPECT_EQ(Prefix(w.page_table.row(i), want_row.size()), Prefix(want_row, want_row.size()))
          << "row " << i;
    }
    std::vector<float> padded_q = q;
    std::normal_distribution<float> normal(0.0f, 1.0f);
    while (static_cast<int64_t>(padded_q.size()) < bucket * rows_per_request * q_row) {
      padded_q.push_back(normal(rng));
    }
    ValidationContext padded_ctx{f.pool_slots(), f.page_size(),
                                 TokenCount(bucket * rows_per_request)};
    padded_ctx.allow_padding_page = true;
    ASSERT_TRUE(ValidateForwardMetadata(w, padded_ctx).ok())
        << ValidateForwardMetadata(w, padded_ctx);
    ReferenceAttentionInputs padded_in{kDims,
                                       w,
                                       f.page_size(),
                                       padded_q,
                                       p.k_pool,
                                       p.v_pool,
                                       /*allow_padding_page=*/true};
    // The split-KV plan the replay wrote into its fixed buffers: the whole bucket's.
    const GraphBuffers& b = g.buffers();
    SplitKvPlan plan;
    plan.layout = KvLayout::Paged(f.page_size());
    plan.chunk = r->split_kv.chunk;
    plan.work = Prefix<SplitKvWorkItem>(b.split_kv.work, r->split_kv.work_items);
    plan.reduce = Prefix<SplitKvReduceItem>(b.split_kv.reduce, r->split_kv.reduce_items);
    plan.unit_indptr = Prefix<int32_t>(b.split_kv.unit_indptr, 8);
    plan.num_partials = r->split_kv.num_partials;
    ASSERT_EQ(plan.unit_indptr.back(), r->split_kv.work_items);
    std::vector<float> padded_out(padded_q.size(), NAN);
    const absl::Status split =
        ReferenceAttentionSplitKv(padded_in, plan, absl::MakeSpan(padded_out));
    ASSERT_TRUE(split.ok()) << split;
    out.assign(padded_out.begin(), padded_out.begin() + q.size());
    EXPECT_LT(testing::RelativeL2Error(out, want), 1e-5) << "split-KV plan from the graph";
    for (size_t e = q.size(); e < padded_out.size(); ++e) {
      ASSERT_TRUE(std::isfinite(padded_out[e])) << "padded query row element " << e - q.size();
    }
    ASSERT_TRUE(h.memory().VerifyCanaries().ok()) << h.memory().VerifyCanaries();
  }
}

class GraphReplayOracleTest : public ::testing::TestWithParam<int64_t> {};

TEST_P(GraphReplayOracleTest, RealRowsEqualTheEagerPathAndDenseAttention) {
  for (uint64_t seed : {11, 12, 13}) RunPageSize(GetParam(), seed * 100 + GetParam());
}

INSTANTIATE_TEST_SUITE_P(PageSizes, GraphReplayOracleTest, ::testing::Values(1, 2, 7, 16, 64),
                         [](const ::testing::TestParamInfo<int64_t>& info) {
                           return absl::StrCat("page_size_", info.param);
                         });

}  // namespace
}  // namespace attnmeta
