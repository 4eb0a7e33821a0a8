// Extend, decode and free for a batch of 256 requests, each timed alone (the call that
// restores the state runs with the timer paused). Items are tokens, so items_per_second
// gives the cost per allocated (or freed) token. x_memcpy: the time over a memcpy of the
// slots written (int32 per token), measured in the same run.
//   ./bazelw run -c opt //kvcache:paged_token_allocator_benchmark

#include <vector>

#include "benchmark/benchmark.h"
#include "kvcache/paged_token_allocator.h"
#include "tools/bench/memcpy_reference.h"

namespace attnmeta {
namespace {

constexpr int kBatch = 256;

PagedTokenAllocator MakeAllocator(int64_t page_size, int64_t tokens_per_req, bool shuffled) {
  const PageSize ps = *PageSize::Create(page_size);
  // Room for two batches, so decode and extend never run out.
  const PageCount pages(2 * kBatch *
                        (PagesForTokensCeil(TokenCount(tokens_per_req), ps).value() + 2));
  return *PagedTokenAllocator::Create(
      pages, ps, shuffled ? FreePagePolicy::Shuffled(1) : FreePagePolicy::InOrder());
}

// args: page_size, tokens per request, shuffled policy.
// 256 requests with `len` tokens already extend by `add` more (len 0: a fresh prefill).
void RunExtend(benchmark::State& state, int64_t len, int64_t add, bool time_free) {
  const int64_t ps = state.range(0);
  PagedTokenAllocator alloc = MakeAllocator(ps, len + add, state.range(1) != 0);
  std::vector<ExtendRequest> reqs(kBatch, {TokenCount(len), TokenCount(len + add), TokenSlot(0)});
  if (len > 0) {
    std::vector<TokenSlot> prefix = *alloc.AllocateExtend(
        std::vector<ExtendRequest>(kBatch, {TokenCount(0), TokenCount(len), TokenSlot(0)}));
    for (int i = 0; i < kBatch; ++i) reqs[i].last_loc = prefix[(i + 1) * len - 1];
  }
  std::vector<TokenSlot> out(kBatch * add);
  for (auto _ : state) {
    if (time_free) state.PauseTiming();
    if (!alloc.AllocateExtend(reqs, absl::MakeSpan(out)).ok()) {
      state.SkipWithError("extend");
      break;
    }
    benchmark::DoNotOptimize(out.data());
    if (time_free) {
      state.ResumeTiming();
    } else {
      state.PauseTiming();
    }
    if (!alloc.Free(out).ok()) {
      state.SkipWithError("free");
      break;
    }
    if (!time_free) state.ResumeTiming();
  }
  state.SetItemsProcessed(state.iterations() * kBatch * add);
  bench::ReportRatioToMemcpy(state, out.size() * sizeof(TokenSlot));
}

void BM_ExtendNew1024(benchmark::State& state) { RunExtend(state, 0, 1024, false); }
void BM_ExtendPrefix1001By100(benchmark::State& state) { RunExtend(state, 1001, 100, false); }
void BM_Free1024(benchmark::State& state) { RunExtend(state, 0, 1024, true); }
BENCHMARK(BM_ExtendNew1024)->ArgsProduct({{1, 16, 64}, {0, 1}});
BENCHMARK(BM_ExtendPrefix1001By100)->ArgsProduct({{1, 16, 64}, {0, 1}});
BENCHMARK(BM_Free1024)->ArgsProduct({{1, 16, 64}, {0, 1}});

// Decode steps of 256 requests that start at 1000 tokens; every 64 steps the decoded tokens
// are freed with the timer paused, so the pause is amortized over 64 steps.
void BM_Decode(benchmark::State& state) {
  const int64_t ps = state.range(0);
  const int64_t len = 1000;
  constexpr int kSteps = 64;
  PagedTokenAllocator alloc = MakeAllocator(ps, len + kSteps, state.range(1) != 0);
  std::vector<TokenSlot> prefix = *alloc.AllocateExtend(
      std::vector<ExtendRequest>(kBatch, {TokenCount(0), TokenCount(len), TokenSlot(0)}));
  std::vector<DecodeRequest> start;
  for (int i = 0; i < kBatch; ++i) start.push_back({TokenCount(len + 1), prefix[(i + 1) * len - 1]});
  std::vector<DecodeRequest> reqs = start;
  std::vector<TokenSlot> decoded(kBatch * kSteps);
  int step = 0;
  for (auto _ : state) {
    absl::Span<TokenSlot> out = absl::MakeSpan(decoded).subspan(step * kBatch, kBatch);
    if (!alloc.AllocateDecode(reqs, out).ok()) {
      state.SkipWithError("decode");
      break;
    }
    for (int i = 0; i < kBatch; ++i) {
      reqs[i].seq_len += TokenCount(1);
      reqs[i].last_loc = out[i];
    }
    if (++step == kSteps) {
      state.PauseTiming();
      if (!alloc.Free(decoded).ok()) {
        state.SkipWithError("free");
        break;
      }
      reqs = start;
      step = 0;
      state.ResumeTiming();
    }
  }
  state.SetItemsProcessed(state.iterations() * kBatch);
  bench::ReportRatioToMemcpy(state, kBatch * sizeof(TokenSlot));
}
BENCHMARK(BM_Decode)->ArgsProduct({{1, 16, 64}, {0, 1}});

}  // namespace
}  // namespace attnmeta
