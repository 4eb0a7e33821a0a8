// Host costs of the metadata layer for decode batches (bs in {1, 64, 256, 1024}, every
// sequence at 4096 tokens, page sizes 1/16/64, pages shuffled). Items are int32 indices
// written (kv_indices, or tok_idx for the gather), so 1e9 / items_per_second is ns per index;
// the validator's items are the indices it checks, and the planner's the work items planned.
// Each reports x_memcpy: its time over a memcpy of the bytes it writes (or, for the
// validator, reads), measured in the same run (tools/bench/memcpy_reference.h).
//   ./bazelw run -c opt //attention/metadata:metadata_benchmark

#include <algorithm>
#include <numeric>
#include <random>
#include <vector>

#include "attention/metadata/builders.h"
#include "attention/metadata/context_gather.h"
#include "attention/metadata/split_kv_planner.h"
#include "attention/metadata/validator.h"
#include "benchmark/benchmark.h"
#include "kvcache/req_to_token_pool.h"
#include "tools/bench/memcpy_reference.h"

namespace attnmeta {
namespace {

constexpr int64_t kCtx = 4096;

// bs sequences of kCtx tokens in shuffled pages of `ps`, written straight into the table.
struct DecodeBatch {
  DecodeBatch(int bs, int64_t ps_tokens)
      : ps(*PageSize::Create(ps_tokens)), pool(*ReqToTokenPool::Create(bs, TokenCount(kCtx))) {
    const int64_t pages_per_seq = kCtx / ps_tokens;
    std::vector<int32_t> pages(bs * pages_per_seq);
    std::iota(pages.begin(), pages.end(), 1);  // page 0 is the padding page
    std::shuffle(pages.begin(), pages.end(), std::mt19937_64(bs * 131 + ps_tokens));
    pool_slots = TokensInPages(PageCount(static_cast<int64_t>(pages.size()) + 1), ps);
    std::vector<TokenSlot> row(kCtx);
    for (int r = 0; r < bs; ++r) {
      const ReqPoolIndex idx = *pool.Allocate();
      for (int64_t t = 0; t < kCtx; ++t) {
        row[t] = FirstSlotOf(PageId(pages[r * pages_per_seq + t / ps_tokens]), ps) +
                 TokenCount(t % ps_tokens);
      }
      (void)pool.Write(idx, TokenCount(0), row);
      rows.push_back(idx);
    }
    kv_lens.assign(bs, TokenLength(kCtx));
    q_lens.assign(bs, TokenLength(1));
  }
  ForwardBatch batch() const { return ForwardBatch{ForwardMode::kDecode, rows, kv_lens, q_lens, {}}; }

  PageSize ps;
  ReqToTokenPool pool;
  TokenCount pool_slots;
  std::vector<ReqPoolIndex> rows;
  std::vector<TokenLength> kv_lens;
  std::vector<TokenLength> q_lens;
};

void Args(benchmark::internal::Benchmark* b) {
  for (int bs : {1, 64, 256, 1024}) {
    for (int ps : {1, 16, 64}) b->Args({bs, ps});
  }
}

void BM_BuildTokenKvIndices(benchmark::State& state) {
  DecodeBatch d(static_cast<int>(state.range(0)), state.range(1));
  std::vector<TokenOffset> indptr(d.rows.size() + 1);
  (void)BuildIndptr(d.kv_lens, absl::MakeSpan(indptr));
  std::vector<TokenSlot> out(indptr.back().value());
  for (auto _ : state) {
    if (!BuildTokenKvIndices(d.pool, d.rows, indptr, {}, absl::MakeSpan(out)).ok()) {
      state.SkipWithError("build");
    }
    benchmark::DoNotOptimize(out.data());
  }
  state.SetItemsProcessed(state.iterations() * static_cast<int64_t>(out.size()));
  bench::ReportRatioToMemcpy(state, out.size() * sizeof(TokenSlot));
}
BENCHMARK(BM_BuildTokenKvIndices)->Apply(Args);

// Every array (indptrs, kv_indices, kv_last_page_len, page table) into reused buffers, as
// the graph path fills its fixed buffers. (BuildForwardMetadata allocates fresh arrays; on
// this VM its cost is dominated by page faults of the new memory.)
void BM_BuildAllArrays(benchmark::State& state) {
  DecodeBatch d(static_cast<int>(state.range(0)), state.range(1));
  const size_t bs = d.rows.size();
  std::vector<TokenOffset> kv_indptr(bs + 1), qo_indptr(bs + 1);
  std::vector<TokenSlot> kv_indices(bs * kCtx);
  std::vector<TokenLength> last_page(bs);
  PageTable table(static_cast<int64_t>(bs), PagesForTokensCeil(TokenCount(kCtx), d.ps));
  for (auto _ : state) {
    bool ok = BuildIndptr(d.kv_lens, absl::MakeSpan(kv_indptr)).ok() &&
              BuildIndptr(d.q_lens, absl::MakeSpan(qo_indptr)).ok() &&
              BuildTokenKvIndices(d.pool, d.rows, kv_indptr, {}, absl::MakeSpan(kv_indices)).ok() &&
              BuildKvLastPageLen(d.kv_lens, d.ps, absl::MakeSpan(last_page)).ok() &&
              BuildPageTable(d.pool, d.rows, d.kv_lens, d.ps, table.span()).ok();
    if (!ok) state.SkipWithError("build");
    benchmark::DoNotOptimize(kv_indices.data());
    benchmark::DoNotOptimize(table.span().entries().data());
  }
  state.SetItemsProcessed(state.iterations() * state.range(0) * kCtx);
  bench::ReportRatioToMemcpy(state, (kv_indices.size() + table.span().entries().size() +
                                     4 * bs + 2) * sizeof(int32_t));
}
BENCHMARK(BM_BuildAllArrays)->Apply(Args);

// args: bs, page size, ownership check (0 or 1).
void BM_Validate(benchmark::State& state) {
  DecodeBatch d(static_cast<int>(state.range(0)), state.range(1));
  const ForwardMetadata m = *BuildForwardMetadata(d.batch(), d.pool, d.ps);
  ValidationContext ctx{d.pool_slots, d.ps, TokenCount(state.range(0))};
  ctx.check_slot_ownership = state.range(2) != 0;
  for (auto _ : state) {
    if (!ValidateForwardMetadata(m.view(), ctx).ok()) state.SkipWithError("validate");
  }
  state.SetItemsProcessed(state.iterations() * state.range(0) * kCtx);
  bench::ReportRatioToMemcpy(
      state, (m.kv_indices.size() + m.page_table.span().entries().size()) * sizeof(int32_t));
}
BENCHMARK(BM_Validate)->Apply([](benchmark::internal::Benchmark* b) {
  for (int bs : {1, 64, 256, 1024}) {
    for (int ps : {1, 16, 64}) {
      for (int own : {0, 1}) b->Args({bs, ps, own});
    }
  }
});

void BM_ContextGather(benchmark::State& state) {
  DecodeBatch d(static_cast<int>(state.range(0)), state.range(1));
  const ForwardMetadata m = *BuildForwardMetadata(d.batch(), d.pool, d.ps);
  std::vector<TokenSlot> tok(m.kv_indices.size());
  std::vector<TokenOffset> cu(m.kv_indptr.size());
  const ContextGatherInputs in{ForwardMode::kExtend, m.kv_indptr, m.kv_indices, m.kv_lens,
                               d.pool_slots};
  for (auto _ : state) {
    if (!GatherContextTokens(in, absl::MakeSpan(tok), absl::MakeSpan(cu), nullptr).ok()) {
      state.SkipWithError("gather");
    }
    benchmark::DoNotOptimize(tok.data());
  }
  state.SetItemsProcessed(state.iterations() * static_cast<int64_t>(tok.size()));
  bench::ReportRatioToMemcpy(state, tok.size() * sizeof(TokenSlot));
}
BENCHMARK(BM_ContextGather)->Apply(Args);

// A 132-unit split of the decode batch in 128-token chunks (linear layout).
void BM_PlanSplitKv(benchmark::State& state) {
  DecodeBatch d(static_cast<int>(state.range(0)), state.range(1));
  std::vector<TokenOffset> qo(d.rows.size() + 1), kv(d.rows.size() + 1);
  (void)BuildIndptr(d.q_lens, absl::MakeSpan(qo));
  (void)BuildIndptr(d.kv_lens, absl::MakeSpan(kv));
  SplitKvOptions opt;
  opt.num_units = 132;
  int64_t items = 0;
  size_t plan_bytes = 0;
  for (auto _ : state) {
    auto plan = PlanSplitKv(qo, kv, opt);
    if (!plan.ok()) {
      state.SkipWithError("plan");
      break;
    }
    items += static_cast<int64_t>(plan->work.size());
    plan_bytes = plan->work.size() * sizeof(SplitKvWorkItem) +
                 plan->reduce.size() * sizeof(SplitKvReduceItem) +
                 plan->unit_indptr.size() * sizeof(int32_t);
    benchmark::DoNotOptimize(plan);
  }
  state.SetItemsProcessed(items);
  bench::ReportRatioToMemcpy(state, plan_bytes);
}
BENCHMARK(BM_PlanSplitKv)->Apply(Args);

}  // namespace
}  // namespace attnmeta
