// Split-KV work planning (flash-decoding / persistent scheduling): partitions the attention
// work of a batch, (sequence, query tile, KV range) items, over the compute units, with the
// metadata to merge the partial results of a (sequence, query tile) that was split.
//
// The KV layout the consumer reads is an input, never inferred from the pool's page size: a
// kernel reading a linear per-token K/V buffer splits in tokens (block size 1, granularity
// 128 by default), and only a kernel reading the paged pool splits on whole pages. (The
// reference system planned linear-K/V work with the pool's page size and lost its accuracy
// at page_size 64.)

#ifndef ATTNMETA_ATTENTION_METADATA_SPLIT_KV_PLANNER_H_
#define ATTNMETA_ATTENTION_METADATA_SPLIT_KV_PLANNER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kvcache/units.h"

namespace attnmeta {

// How the consumer reads K/V.
class KvLayout {
 public:
  // One linear [tokens, heads, head_dim] buffer (e.g. the context-prefill gather's output):
  // any token boundary is a valid split.
  static KvLayout LinearPerToken() { return KvLayout(false, *PageSize::Create(1)); }
  // The paged pool: splits fall on whole pages of `page_size`.
  static KvLayout Paged(PageSize page_size) { return KvLayout(true, page_size); }

  bool paged() const { return paged_; }
  // The split unit in tokens: 1 for linear, the page size for paged.
  PageSize block() const { return block_; }

  friend bool operator==(const KvLayout& a, const KvLayout& b) {
    return a.paged_ == b.paged_ && a.block_ == b.block_;
  }
  friend bool operator!=(const KvLayout& a, const KvLayout& b) { return !(a == b); }

 private:
  KvLayout(bool paged, PageSize block) : paged_(paged), block_(block) {}
  bool paged_;
  PageSize block_;
};

// "LinearPerToken" or "Paged(page_size N)", for messages.
std::string KvLayoutName(const KvLayout& layout);

struct SplitKvOptions {
  KvLayout layout = KvLayout::LinearPerToken();
  int32_t num_units = 1;                    // compute units to spread the work over, [1, 2^20]
  TokenCount kv_granularity = TokenCount(128);  // split boundaries are multiples of this, in
                                            // tokens, rounded up to whole blocks; [1, 2^30]
  TokenCount q_tile = TokenCount(64);       // query rows per tile, [1, 2^30]
};

// One piece of work: query rows [q_begin, q_end) of the batch's query array (all of one
// sequence) against KV positions [kv_begin, kv_end) of that sequence (token positions, not
// slots). partial_slot < 0: the item covers its tile's whole KV range and writes the final
// output; otherwise it writes partial output and log-sum-exp to that slot.
struct SplitKvWorkItem {
  int32_t sequence;
  TokenOffset q_begin;
  TokenOffset q_end;
  TokenPosition kv_begin;
  TokenPosition kv_end;
  int32_t partial_slot;
};

// A (sequence, query tile) split over several items: merge partial slots
// [partial_begin, partial_end) into rows [q_begin, q_end) by log-sum-exp.
struct SplitKvReduceItem {
  int32_t sequence;
  TokenOffset q_begin;
  TokenOffset q_end;
  int32_t partial_begin;
  int32_t partial_end;
};

struct SplitKvPlan {
  // The layout the plan was made for; a consumer refuses a plan made for another layout.
  KvLayout layout = KvLayout::LinearPerToken();
  TokenCount chunk;                       // the split unit actually used, in tokens
  std::vector<SplitKvWorkItem> work;      // [unit_indptr[num_units]], grouped by unit
  std::vector<int32_t> unit_indptr;       // [num_units + 1]: unit u runs work[unit_indptr[u],
                                          // unit_indptr[u + 1])
  std::vector<SplitKvReduceItem> reduce;  // one per split (sequence, tile)
  int32_t num_partials = 0;               // partial slots used
};

// The most a plan can use for a batch of at most `max_tiles` (sequence, query tile) pairs:
// the graph layer sizes its fixed buffers with it.
struct SplitKvCapacity {
  int64_t work_items;  // max_tiles + num_units - 1
  int64_t partials;    // 2 * (num_units - 1): each unit boundary splits at most one tile
  int64_t reduce_items;  // num_units - 1
};
// With num_units < 1 there are no boundaries: work_items is max_tiles, the others 0.
// REQUIRES: 0 <= max_tiles <= 2^62 (a batch's tiles, or a buffer plan's B * ceil(Q / q_tile)).
SplitKvCapacity SplitKvCapacityFor(int64_t max_tiles, int32_t num_units);

// The number of (sequence, query tile) pairs of a batch: sum of ceil(q_len / q_tile) over the
// sequences of qo_indptr with q_len > 0. InvalidArgument for q_tile < 1.
absl::StatusOr<int64_t> NumQueryTiles(absl::Span<const TokenOffset> qo_indptr, TokenCount q_tile);

// Plans a batch. Every (sequence, q tile) with q_len > 0 has its KV range [0, kv_len) covered
// exactly once by its items, split only at multiples of the chunk (kv_granularity rounded up
// to whole blocks of the layout); units get their share in order, none more than the mean
// plus one chunk. InvalidArgument: options out of range, indptrs of different sizes, not
// starting at 0 or decreasing, or a sequence with q_len > kv_len; OutOfRange: more work items
// than int32 offsets address can come of it (query tiles + num_units - 1 > INT32_MAX).
// (Partial slots number at most 2 * (num_units - 1) < 2^21, so they fit in int32.)
absl::StatusOr<SplitKvPlan> PlanSplitKv(absl::Span<const TokenOffset> qo_indptr,
                                        absl::Span<const TokenOffset> kv_indptr,
                                        const SplitKvOptions& options);

// Fixed buffers a plan is written into (the graph layer's), with what was written.
struct SplitKvPlanSpans {
  absl::Span<SplitKvWorkItem> work;      // >= SplitKvCapacityFor(tiles, units).work_items
  absl::Span<int32_t> unit_indptr;       // >= num_units + 1
  absl::Span<SplitKvReduceItem> reduce;  // >= SplitKvCapacityFor(tiles, units).reduce_items
};
struct SplitKvPlanCounts {
  TokenCount chunk;
  int64_t work_items = 0;    // work[0, work_items) and unit_indptr[0, num_units] written
  int64_t reduce_items = 0;  // reduce[0, reduce_items) written
  int32_t num_partials = 0;
};

// PlanSplitKv into fixed buffers, allocating nothing: the same plan, the same errors, plus
// ResourceExhausted (nothing written) when a span is smaller than the capacity the batch can
// need (tiles = NumQueryTiles(qo_indptr, q_tile)). Entries past the counts keep their
// contents. The plan's layout is options.layout.
absl::StatusOr<SplitKvPlanCounts> PlanSplitKvInto(absl::Span<const TokenOffset> qo_indptr,
                                                  absl::Span<const TokenOffset> kv_indptr,
                                                  const SplitKvOptions& options,
                                                  const SplitKvPlanSpans& out);

// InvalidArgument unless every option is in range (the checks of PlanSplitKv).
absl::Status CheckSplitKvOptions(const SplitKvOptions& options);
// The split unit a plan uses: kv_granularity rounded up to whole blocks of the layout.
// REQUIRES: CheckSplitKvOptions(options) is OK.
TokenCount SplitKvChunk(const SplitKvOptions& options);

// What PlanSplitKvInto writes for the batch of per-sequence query rows `q_lens` and KV lengths
// `kv_lens`, computed in O(batch + query tiles) without writing the plan: for writers that
// write the plan on the device and must still report its counts on the host. InvalidArgument:
// options out of range, lengths of different sizes, a negative length, or q_len > kv_len;
// OutOfRange: query rows or KV tokens summing past INT32_MAX (the indptrs' int32 offsets), or
// PlanSplitKv's bound on work items.
absl::StatusOr<SplitKvPlanCounts> CountSplitKvPlan(absl::Span<const TokenLength> q_lens,
                                                   absl::Span<const TokenLength> kv_lens,
                                                   const SplitKvOptions& options);

}  // namespace attnmeta

#endif  // ATTNMETA_ATTENTION_METADATA_SPLIT_KV_PLANNER_H_
