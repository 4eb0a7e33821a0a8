#include "attention/kernels/decode_split_planner.h"

#include <algorithm>
#include <cstdint>
#include <limits>
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
  // Query row i is sequence i's: the rows must be int32 offsets (and 2 * bs * blocks_per_item
  // below, at most 2 * (2^31 - 1)^2, stays within int64).
  if (bs > std::numeric_limits<int32_t>::max()) {
    return absl::OutOfRangeError(
        absl::StrCat("decode split: ", bs, " sequences, beyond int32 query rows"));
  }
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
  // Chunks stay within the planner's kv_granularity limit (kMaxTokens), even where min_chunk
  // or a sequence longer than max_items_per_sequence such chunks asks for more.
  const int64_t most = kMaxTokens / quantum;
  int64_t lo = std::clamp<int64_t>((shortest + quantum - 1) / quantum, 1, most);
  int64_t hi =
      std::clamp<int64_t>((std::min(longest, kMaxTokens) + quantum - 1) / quantum, lo, most);
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

absl::Status CheckDecodeSplitPlan(const SplitKvPlan& plan, const KvLayout& layout, int64_t bs) {
  if (plan.layout != layout) {
    return absl::InvalidArgumentError(absl::StrCat(
        "split-KV plan: made for layout ", KvLayoutName(plan.layout), ", but this decode reads ",
        KvLayoutName(layout), " (plan it with DecodeKvLayout of the KV source)"));
  }
  if (bs < 0) return absl::InvalidArgumentError("split-KV plan: a negative batch size");
  // Every sequence has at least one work item: checked before anything is sized by bs (the
  // launcher's bs is the length a device span claims, not host memory).
  if (bs > static_cast<int64_t>(plan.work.size())) {
    return absl::InvalidArgumentError(absl::StrCat("split-KV plan: ", plan.work.size(),
                                                   " work items for a batch of ", bs,
                                                   " sequences (each needs one)"));
  }
  if (plan.num_partials < 0) return absl::InvalidArgumentError("split-KV plan: negative num_partials");
  // Every partial slot is one work item's: checked before anything is sized by num_partials.
  if (plan.num_partials > static_cast<int64_t>(plan.work.size())) {
    return absl::InvalidArgumentError(absl::StrCat("split-KV plan: ", plan.num_partials,
                                                   " partial slots for ", plan.work.size(),
                                                   " work items"));
  }
  std::vector<int32_t> direct(bs, 0), split(bs, 0), reduced(bs, 0);
  std::vector<int32_t> owner(plan.num_partials, -1);
  for (size_t k = 0; k < plan.work.size(); ++k) {
    const SplitKvWorkItem& w = plan.work[k];
    if (w.sequence < 0 || w.sequence >= bs || w.q_begin.value() != w.sequence ||
        w.q_end.value() != w.sequence + 1 || w.kv_begin.value() < 0 || w.kv_end < w.kv_begin ||
        w.partial_slot >= plan.num_partials) {
      return absl::InvalidArgumentError(absl::StrCat(
          "split-KV plan: work item ", k, " (sequence ", w.sequence, ", rows [", w.q_begin.value(),
          ", ", w.q_end.value(), "), KV [", w.kv_begin.value(), ", ", w.kv_end.value(),
          "), partial ", w.partial_slot, ") does not fit a decode batch of ", bs, " with ",
          plan.num_partials, " partial slots"));
    }
    if (w.partial_slot < 0) {
      ++direct[w.sequence];
    } else {
      if (owner[w.partial_slot] >= 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("split-KV plan: partial slot ", w.partial_slot, " written twice"));
      }
      owner[w.partial_slot] = w.sequence;
      ++split[w.sequence];
    }
  }
  std::vector<int32_t> merged(plan.num_partials, 0);
  for (size_t r = 0; r < plan.reduce.size(); ++r) {
    const SplitKvReduceItem& red = plan.reduce[r];
    if (red.sequence < 0 || red.sequence >= bs || red.q_begin.value() != red.sequence ||
        red.q_end.value() != red.sequence + 1 || red.partial_begin < 0 ||
        red.partial_begin >= red.partial_end || red.partial_end > plan.num_partials) {
      return absl::InvalidArgumentError(
          absl::StrCat("split-KV plan: reduce item ", r, " (sequence ", red.sequence,
                       ", partials [", red.partial_begin, ", ", red.partial_end,
                       ")) does not fit a decode batch of ", bs, " with ", plan.num_partials,
                       " partial slots"));
    }
    ++reduced[red.sequence];
    for (int32_t s = red.partial_begin; s < red.partial_end; ++s) {
      if (owner[s] != red.sequence || merged[s]++ != 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "split-KV plan: reduce item ", r, " merges partial slot ", s,
            ", which no work item of sequence ", red.sequence, " writes or another item merges"));
      }
    }
  }
  for (int64_t i = 0; i < bs; ++i) {
    const bool one_direct = direct[i] == 1 && split[i] == 0 && reduced[i] == 0;
    const bool merged_once = direct[i] == 0 && split[i] > 0 && reduced[i] == 1;
    if (!one_direct && !merged_once) {
      return absl::InvalidArgumentError(absl::StrCat(
          "split-KV plan: sequence ", i, " has ", direct[i], " direct items, ", split[i],
          " split items and ", reduced[i], " reduce items; it needs one direct item, or split "
          "items and one reduce item"));
    }
  }
  // Each sequence's items tile its KV range from position 0 without gaps or overlaps (the
  // merged log-sum-exp of overlapping items would count their tokens twice).
  std::vector<const SplitKvWorkItem*> items;
  for (const SplitKvWorkItem& w : plan.work) items.push_back(&w);
  std::sort(items.begin(), items.end(), [](const SplitKvWorkItem* a, const SplitKvWorkItem* b) {
    return a->sequence != b->sequence ? a->sequence < b->sequence : a->kv_begin < b->kv_begin;
  });
  for (size_t k = 0; k < items.size(); ++k) {
    const SplitKvWorkItem& w = *items[k];
    const bool first = k == 0 || items[k - 1]->sequence != w.sequence;
    const TokenPosition expected = first ? TokenPosition(0) : items[k - 1]->kv_end;
    if (w.kv_begin != expected) {
      return absl::InvalidArgumentError(absl::StrCat(
          "split-KV plan: the items of sequence ", w.sequence, " do not tile its KV from 0: an item "
          "begins at ", w.kv_begin.value(), " where ", expected.value(), " was expected"));
    }
  }
  for (int32_t s = 0; s < plan.num_partials; ++s) {
    if (owner[s] >= 0 && merged[s] == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("split-KV plan: partial slot ", s, " is written but never merged"));
    }
  }
  return absl::OkStatus();
}

}  // namespace attnmeta
