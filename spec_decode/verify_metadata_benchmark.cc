// Target-verify metadata on one core: the verify tree from the reference encoding (parents,
// positions, retrieve index, next-token and next-sibling links), the bit-packed mask and the
// indptrs (qo, kv, mask) of bs 64 requests with 8 draft tokens and top-k 4; and the FULL mask
// per byte against a memset of the same bytes in the same run.
//
//   ./bazelw run -c opt //spec_decode:verify_metadata_benchmark

#include <cstdint>
#include <random>
#include <vector>

#include "attention/metadata/builders.h"
#include "attention/metadata/custom_mask.h"
#include "benchmark/benchmark.h"
#include "spec_decode/verify_tree.h"
#include "tools/bench/memcpy_reference.h"

namespace attnmeta {
namespace {

constexpr int32_t kTopK = 4;
constexpr int32_t kDepth = 4;
constexpr int32_t kDraft = 8;

// One request's reference encoding, EAGLE-shaped: level 0 holds candidates 0..3 (children of
// the root), level l >= 1 the top-k children of each of the top-k nodes expanded at level
// l - 1 (parent_list slot 1 + (l - 1) * topk + j names the j-th). The 7 selected tokens form a
// tree of depth 4: 0 -> {0, 1}, 0 -> {4, 5}, 1 -> {8}, 4 -> {20}, 20 -> {36}.
const std::vector<int64_t> kParentList = {-1, 0, 1, 2, 3, 4, 5, 6, 7, 20, 21, 22, 23};
const std::vector<int64_t> kSelected = {0, 1, 4, 5, 8, 20, 36};

struct Batch {
  std::vector<int64_t> parent_list, selected;
  std::vector<TokenLength> seq_lens, q_lens, kv_lens;
};

Batch MakeBatch(int bs, int64_t max_seq) {
  Batch b;
  std::mt19937_64 rng(64);
  for (int i = 0; i < bs; ++i) {
    b.parent_list.insert(b.parent_list.end(), kParentList.begin(), kParentList.end());
    b.selected.insert(b.selected.end(), kSelected.begin(), kSelected.end());
    const int32_t len = static_cast<int32_t>(std::uniform_int_distribution<int64_t>(1, max_seq)(rng));
    b.seq_lens.push_back(TokenLength(len));
    b.q_lens.push_back(TokenLength(kDraft));
    b.kv_lens.push_back(TokenLength(len + kDraft));
  }
  return b;
}

void BM_VerifyTreeBitPackedAndIndptrs(benchmark::State& state) {
  const int bs = static_cast<int>(state.range(0));
  const Batch b = MakeBatch(bs, 4096);
  std::vector<uint8_t> mask(bs * kDraft * 4);
  std::vector<int64_t> mask_indptr(bs + 1);
  std::vector<TokenOffset> qo_indptr(bs + 1), kv_indptr(bs + 1);
  for (auto _ : state) {
    absl::StatusOr<VerifyTree> tree =
        BuildVerifyTree(b.parent_list, b.selected, b.seq_lens, kTopK, kDepth, TokenLength(kDraft));
    if (!tree.ok() ||
        !WriteTreeMask(*tree, MaskLayout::kBitPacked, absl::MakeSpan(mask),
                       absl::MakeSpan(mask_indptr))
             .ok() ||
        !BuildIndptr(b.q_lens, absl::MakeSpan(qo_indptr)).ok() ||
        !BuildIndptr(b.kv_lens, absl::MakeSpan(kv_indptr)).ok()) {
      state.SkipWithError("verify metadata failed");
      return;
    }
    benchmark::DoNotOptimize(tree->next_sibling.data());
    benchmark::DoNotOptimize(mask.data());
  }
  state.SetItemsProcessed(state.iterations() * bs);
}
BENCHMARK(BM_VerifyTreeBitPackedAndIndptrs)->Arg(64)->Arg(256)->Unit(benchmark::kMicrosecond);

// The FULL mask of bs requests of up to `max_seq` committed tokens: [n][seq_len + n] bytes
// each, almost all of them prefix columns set to 1.
void BM_FullMask(benchmark::State& state) {
  const int bs = static_cast<int>(state.range(0));
  const Batch b = MakeBatch(bs, state.range(1));
  absl::StatusOr<VerifyTree> tree =
      BuildVerifyTree(b.parent_list, b.selected, b.seq_lens, kTopK, kDepth, TokenLength(kDraft));
  std::vector<int64_t> mask_indptr(bs + 1);
  if (!tree.ok() || !BuildMaskIndptr(MaskLayout::kFull, b.q_lens, b.kv_lens,
                                     absl::MakeSpan(mask_indptr))
                         .ok()) {
    state.SkipWithError("setup failed");
    return;
  }
  std::vector<uint8_t> mask(mask_indptr.back(), 0);
  for (auto _ : state) {
    if (!WriteTreeMask(*tree, MaskLayout::kFull, absl::MakeSpan(mask), absl::MakeSpan(mask_indptr))
             .ok()) {
      state.SkipWithError("FULL mask failed");
      return;
    }
    benchmark::DoNotOptimize(mask.data());
  }
  const double bytes = static_cast<double>(mask.size());
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * bytes));
  state.counters["mask_bytes"] = bytes;
  state.counters["ns_per_byte"] = benchmark::Counter(
      bytes * 1e-9, benchmark::Counter::kIsIterationInvariantRate | benchmark::Counter::kInvert);
  bench::ReportRatioToMemset(state, mask.size());
}
BENCHMARK(BM_FullMask)->ArgsProduct({{64}, {512, 4096, 32768}})->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace attnmeta
