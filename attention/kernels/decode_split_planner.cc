#include "attention/kernels/decode_split_planner.h"

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace attnmeta {
namespace {

// Token positions the decode kernel handles in int32 with room for its step arithmetic.
constexpr int64_t kMaxTokens = int64_t{1} << 30;

}  // namespace

absl::StatusOr<SplitKvPlan> PlanDecodeSplitKv(absl::Span<const TokenOffset> kv_indptr,
                                              KvLayout layout, const DecodeSplitOptions& o) {
  if (o.multiprocessor_count < 1 || o.blocks_per_item < 1 || o.blocks_per_multiprocessor < 1 ||
      o.max_items_per_sequence < 1 || o.min_chunk.value() < 1 || o.min_chunk.value() > kMaxTokens) {
    return absl::InvalidArgumentError(absl::StrCat(
        "decode split: need multiprocessor_count, blocks_per_item, blocks_per_multiprocessor, "
        "max_items_per_sequence >= 1 and min_chunk in [1, ",
        kMaxTokens, "], got ", o.multiprocessor_count, ", ", o.blocks_per_item, ", ",
        o.blocks_per_multiprocessor, ", ", o.max_items_per_sequence, ", ", o.min_chunk.value()));
  }
  if (kv_indptr.empty()) return absl::InvalidArgumentError("decode split: kv_indptr is empty");
  const int64_t bs = static_cast<int64_t>(kv_indptr.size()) - 1;
  std::vector<TokenOffset> qo_indptr(bs + 1);
  for (int64_t i = 0; i <= bs; ++i) qo_indptr[i] = TokenOffset(static_cast<int32_t>(i));
  SplitKvOptions options;
  options.layout = layout;
  options.q_tile = TokenCount(1);
  const int64_t target_blocks = int64_t{o.multiprocessor_count} * o.blocks_per_multiprocessor;
  if (2 * bs * o.blocks_per_item >= target_blocks) {
    // One unit takes every chunk: one item per sequence, nothing split.
    options.num_units = 1;
    return PlanSplitKv(qo_indptr, kv_indptr, options);
  }
  // Rounded down, so that items * blocks_per_item stays within the wave (rounded up, 132
  // multiprocessors at one block each made 17 items of 8 blocks: 4 of the 136 blocks ran as a
  // second wave). At least 2 here: the batch gives fewer than target / 2 blocks.
  const int64_t target_items = target_blocks / o.blocks_per_item;
  // Chunks are whole multiples of 16 tokens and of the layout's block, so that the planner
  // keeps them as they are.
  const int64_t quantum = std::lcm<int64_t>(16, layout.block().tokens());
  int64_t longest = 0;
  for (int64_t i = 0; i < bs; ++i) {
    longest = std::max<int64_t>(longest, (kv_indptr[i + 1] - kv_indptr[i]).value());
  }
  auto items_for = [&](int64_t chunk) {
    int64_t items = 0;
    for (int64_t i = 0; i < bs; ++i) {
      items += ((kv_indptr[i + 1] - kv_indptr[i]).value() + chunk - 1) / chunk;
    }
    return items;
  };
  // The smallest chunk whose items fit the target: rounding each sequence's share up to whole
  // chunks must not spill a few items into a second wave (bs 8 x 4k: chunks of 1,008 tokens
  // gave 5 items a sequence, 40 in all for a target of 33; 1,024 gives 32). A chunk as long
  // as the longest sequence gives bs items, which fit (the batch is under half the target).
  // No sequence in more than max_items_per_sequence chunks: the block that completes its
  // reduce item merges every partial of it, 32 per round trip.
  const int64_t shortest = std::max<int64_t>(
      o.min_chunk.value(), (longest + o.max_items_per_sequence - 1) / o.max_items_per_sequence);
  int64_t lo = std::max<int64_t>(1, (shortest + quantum - 1) / quantum);
  int64_t hi = std::max<int64_t>(lo, (std::min(longest, kMaxTokens) + quantum - 1) / quantum);
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (items_for(mid * quantum) <= target_items) {
      hi = mid;
    } else {
      lo = mid + 1;
    }
  }
  const int64_t chunk = lo * quantum;
  options.num_units = static_cast<int32_t>(std::clamp<int64_t>(items_for(chunk), 1, int64_t{1} << 20));
  options.kv_granularity = TokenCount(chunk);
  return PlanSplitKv(qo_indptr, kv_indptr, options);
}

}  // namespace attnmeta
