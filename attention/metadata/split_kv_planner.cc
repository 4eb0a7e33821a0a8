#include "attention/metadata/split_kv_planner.h"

#include <algorithm>
#include <limits>

#include "absl/strings/str_cat.h"
#include "attention/metadata/internal/indptr.h"

namespace attnmeta {
namespace {

// Bounds on the options that keep every count and offset of a plan in int32.
constexpr int32_t kMaxUnits = 1 << 20;
constexpr int64_t kMaxTokens = int64_t{1} << 30;

// NumQueryTiles. REQUIRES: q_tile >= 1 (the planners call it after CheckSplitKvOptions).
int64_t CountQueryTiles(absl::Span<const TokenOffset> qo_indptr, TokenCount q_tile) {
  int64_t tiles = 0;
  for (size_t i = 0; i + 1 < qo_indptr.size(); ++i) {
    const int64_t q = (qo_indptr[i + 1] - qo_indptr[i]).value();
    // Ceiling without q + q_tile - 1, which would overflow for a q_tile near INT64_MAX.
    if (q > 0) tiles += q / q_tile.value() + (q % q_tile.value() != 0 ? 1 : 0);
  }
  return tiles;
}

}  // namespace
std::string KvLayoutName(const KvLayout& l) {
  return l.paged() ? absl::StrCat("Paged(page_size ", l.block().tokens(), ")") : "LinearPerToken";
}

SplitKvCapacity SplitKvCapacityFor(int64_t max_tiles, int32_t num_units) {
  const int64_t boundaries = std::max<int64_t>(0, int64_t{num_units} - 1);
  return SplitKvCapacity{max_tiles + boundaries, 2 * boundaries, boundaries};
}

absl::StatusOr<int64_t> NumQueryTiles(absl::Span<const TokenOffset> qo_indptr,
                                      TokenCount q_tile) {
  if (q_tile.value() < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("query tiles: q_tile ", q_tile.value(), " is not >= 1"));
  }
  return CountQueryTiles(qo_indptr, q_tile);
}

absl::Status CheckSplitKvOptions(const SplitKvOptions& options) {
  if (options.num_units < 1 || options.num_units > kMaxUnits ||
      options.kv_granularity.value() < 1 || options.kv_granularity.value() > kMaxTokens ||
      options.q_tile.value() < 1 || options.q_tile.value() > kMaxTokens) {
    return absl::InvalidArgumentError(absl::StrCat(
        "split-KV options: need num_units in [1, ", kMaxUnits, "] and kv_granularity, q_tile in "
        "[1, ", kMaxTokens, "], got ", options.num_units, ", ", options.kv_granularity.value(),
        ", ", options.q_tile.value()));
  }
  return absl::OkStatus();
}

TokenCount SplitKvChunk(const SplitKvOptions& options) {
  const int64_t block = options.layout.block().tokens();
  return TokenCount((options.kv_granularity.value() + block - 1) / block * block);
}

namespace {

// A batch's query tiles and their KV chunks, counted sequence by sequence as WritePlan walks
// them. REQUIRES: q_tile and chunk in [1, kMaxTokens], 0 <= q <= kv <= INT32_MAX.
struct TileCount {
  int64_t tiles = 0;         // (sequence, query tile) pairs: NumQueryTiles
  int64_t total_chunks = 0;  // (query tile, KV chunk) pairs
  void Add(int64_t q, int64_t kv, int64_t q_tile, int64_t chunk) {
    if (q <= 0) return;
    const int64_t q_tiles = (q + q_tile - 1) / q_tile;
    tiles += q_tiles;
    total_chunks += q_tiles * ((kv + chunk - 1) / chunk);
  }
};

struct PlanShape {
  int64_t chunk;
  int64_t total_chunks;
  int64_t tiles;
};

// OutOfRange when a plan of `tiles` query tiles could hold more work items than int32
// offsets (unit_indptr, partial slots) address: up to tiles + num_units - 1 of them.
absl::Status CheckWorkItemBound(int64_t tiles, const SplitKvOptions& options) {
  const int64_t most = SplitKvCapacityFor(tiles, options.num_units).work_items;
  if (most > std::numeric_limits<int32_t>::max()) {
    return absl::OutOfRangeError(absl::StrCat("split-KV plan: ", tiles, " query tiles over ",
                                              options.num_units, " units can make ", most,
                                              " work items, past int32 offsets"));
  }
  return absl::OkStatus();
}

// The input checks shared by both entry points; returns the chunk and the batch's total
// chunk count.
absl::StatusOr<PlanShape> CheckPlanInputs(absl::Span<const TokenOffset> qo_indptr,
                                          absl::Span<const TokenOffset> kv_indptr,
                                          const SplitKvOptions& options) {
  if (absl::Status s = CheckSplitKvOptions(options); !s.ok()) return s;
  if (qo_indptr.size() != kv_indptr.size()) {
    return absl::InvalidArgumentError(absl::StrCat("qo_indptr has ", qo_indptr.size(),
                                                   " entries, kv_indptr ", kv_indptr.size()));
  }
  if (absl::Status s = internal::CheckIndptr("qo_indptr", qo_indptr); !s.ok()) return s;
  if (absl::Status s = internal::CheckIndptr("kv_indptr", kv_indptr); !s.ok()) return s;
  const int64_t chunk = SplitKvChunk(options).value();
  const int64_t q_tile = options.q_tile.value();
  TileCount count;
  for (size_t i = 0; i + 1 < qo_indptr.size(); ++i) {
    const int64_t q = (qo_indptr[i + 1] - qo_indptr[i]).value();
    const int64_t kv = (kv_indptr[i + 1] - kv_indptr[i]).value();
    if (q > kv) {
      return absl::InvalidArgumentError(
          absl::StrCat("sequence ", i, ": q_len ", q, " exceeds kv_len ", kv));
    }
    count.Add(q, kv, q_tile, chunk);
  }
  if (absl::Status s = CheckWorkItemBound(count.tiles, options); !s.ok()) return s;
  return PlanShape{chunk, count.total_chunks, count.tiles};
}

// The plan of inputs CheckPlanInputs accepted (their `shape`), written into `out` after its
// capacity is checked.
absl::StatusOr<SplitKvPlanCounts> WritePlan(absl::Span<const TokenOffset> qo_indptr,
                                            absl::Span<const TokenOffset> kv_indptr,
                                            const SplitKvOptions& options, const PlanShape& shape,
                                            const SplitKvPlanSpans& out) {
  const int64_t chunk = shape.chunk;
  const int64_t total_chunks = shape.total_chunks;
  const int64_t bs = static_cast<int64_t>(qo_indptr.size()) - 1;
  const int64_t q_tile = options.q_tile.value();
  const int64_t units = options.num_units;
  const SplitKvCapacity cap = SplitKvCapacityFor(shape.tiles, options.num_units);
  if (static_cast<int64_t>(out.work.size()) < cap.work_items ||
      static_cast<int64_t>(out.reduce.size()) < cap.reduce_items ||
      static_cast<int64_t>(out.unit_indptr.size()) < units + 1) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "split-KV plan buffers hold ", out.work.size(), " work items, ", out.reduce.size(),
        " reduce items and ", out.unit_indptr.size(), " unit offsets; the batch can need ",
        cap.work_items, ", ", cap.reduce_items, " and ", units + 1));
  }

  SplitKvPlanCounts counts;
  counts.chunk = TokenCount(chunk);
  const int64_t base = total_chunks / units;
  const int64_t extra = total_chunks % units;
  auto quota = [&](int64_t u) { return base + (u < extra ? 1 : 0); };

  int64_t n = 0;  // work items written
  out.unit_indptr[0] = 0;
  int64_t unit = 0;
  int64_t left = quota(0);  // chunks the current unit may still take
  for (int64_t i = 0; i < bs; ++i) {
    const int64_t q = (qo_indptr[i + 1] - qo_indptr[i]).value();
    const int64_t kv = (kv_indptr[i + 1] - kv_indptr[i]).value();
    const int64_t kv_chunks = (kv + chunk - 1) / chunk;
    for (int64_t q0 = 0; q0 < q; q0 += q_tile) {
      const TokenOffset q_begin = qo_indptr[i] + TokenCount(q0);
      const TokenOffset q_end = qo_indptr[i] + TokenCount(std::min(q, q0 + q_tile));
      const int64_t first_item = n;
      for (int64_t c = 0; c < kv_chunks;) {
        while (left == 0) {
          out.unit_indptr[++unit] = static_cast<int32_t>(n);
          left = quota(unit);
        }
        const int64_t take = std::min(left, kv_chunks - c);
        out.work[n++] = SplitKvWorkItem{
            static_cast<int32_t>(i), q_begin, q_end,
            TokenPosition(static_cast<int32_t>(c * chunk)),
            TokenPosition(static_cast<int32_t>(std::min(kv, (c + take) * chunk))), -1};
        c += take;
        left -= take;
      }
      if (n - first_item > 1) {
        const int32_t begin = counts.num_partials;
        for (int64_t w = first_item; w < n; ++w) out.work[w].partial_slot = counts.num_partials++;
        out.reduce[counts.reduce_items++] =
            SplitKvReduceItem{static_cast<int32_t>(i), q_begin, q_end, begin, counts.num_partials};
      }
    }
  }
  for (int64_t u = unit + 1; u <= units; ++u) out.unit_indptr[u] = static_cast<int32_t>(n);
  counts.work_items = n;
  return counts;
}

}  // namespace

absl::StatusOr<SplitKvPlanCounts> PlanSplitKvInto(absl::Span<const TokenOffset> qo_indptr,
                                                  absl::Span<const TokenOffset> kv_indptr,
                                                  const SplitKvOptions& options,
                                                  const SplitKvPlanSpans& out) {
  absl::StatusOr<PlanShape> shape = CheckPlanInputs(qo_indptr, kv_indptr, options);
  if (!shape.ok()) return shape.status();
  return WritePlan(qo_indptr, kv_indptr, options, *shape, out);
}

absl::StatusOr<SplitKvPlanCounts> CountSplitKvPlan(absl::Span<const TokenLength> q_lens,
                                                   absl::Span<const TokenLength> kv_lens,
                                                   const SplitKvOptions& options) {
  if (absl::Status s = CheckSplitKvOptions(options); !s.ok()) return s;
  if (q_lens.size() != kv_lens.size()) {
    return absl::InvalidArgumentError(absl::StrCat("q_lens has ", q_lens.size(),
                                                   " entries, kv_lens ", kv_lens.size()));
  }
  const int64_t chunk = SplitKvChunk(options).value();
  const int64_t q_tile = options.q_tile.value();
  TileCount count;
  int64_t q_total = 0, kv_total = 0;
  for (size_t i = 0; i < q_lens.size(); ++i) {
    const int64_t q = q_lens[i].value();
    const int64_t kv = kv_lens[i].value();
    if (q < 0 || kv < 0 || q > kv) {
      return absl::InvalidArgumentError(
          absl::StrCat("sequence ", i, ": q_len ", q, ", kv_len ", kv));
    }
    // The indptrs PlanSplitKvInto plans from are int32; within them the chunk count below
    // stays under 2^62.
    q_total += q;
    kv_total += kv;
    if (q_total > std::numeric_limits<int32_t>::max() ||
        kv_total > std::numeric_limits<int32_t>::max()) {
      return absl::OutOfRangeError(absl::StrCat(
          "split-KV counts: the lengths through sequence ", i, " pass int32 offsets"));
    }
    count.Add(q, kv, q_tile, chunk);
  }
  if (absl::Status s = CheckWorkItemBound(count.tiles, options); !s.ok()) return s;
  const int64_t total_chunks = count.total_chunks;
  // WritePlan hands out chunks in order, units [0, extra) taking base + 1 and the rest base:
  // the unit of the g-th chunk is arithmetic, and a tile's items are the units its chunks span.
  const int64_t base = total_chunks / options.num_units;
  const int64_t extra = total_chunks % options.num_units;
  auto unit_of = [&](int64_t g) {
    return g < extra * (base + 1) ? g / (base + 1) : extra + (g - extra * (base + 1)) / base;
  };
  SplitKvPlanCounts counts;
  counts.chunk = TokenCount(chunk);
  int64_t g = 0;  // the tile's first chunk
  for (size_t i = 0; i < q_lens.size(); ++i) {
    const int64_t q = q_lens[i].value();
    const int64_t kv_chunks = (kv_lens[i].value() + chunk - 1) / chunk;
    for (int64_t q0 = 0; q0 < q; q0 += q_tile, g += kv_chunks) {
      const int64_t items = unit_of(g + kv_chunks - 1) - unit_of(g) + 1;
      counts.work_items += items;
      if (items > 1) {
        counts.num_partials += static_cast<int32_t>(items);
        ++counts.reduce_items;
      }
    }
  }
  return counts;
}

absl::StatusOr<SplitKvPlan> PlanSplitKv(absl::Span<const TokenOffset> qo_indptr,
                                        absl::Span<const TokenOffset> kv_indptr,
                                        const SplitKvOptions& options) {
  // Checked first, so that nothing is allocated for inputs the planner refuses.
  absl::StatusOr<PlanShape> shape = CheckPlanInputs(qo_indptr, kv_indptr, options);
  if (!shape.ok()) return shape.status();
  SplitKvPlan plan;
  plan.layout = options.layout;
  const SplitKvCapacity cap = SplitKvCapacityFor(shape->tiles, options.num_units);
  plan.work.resize(cap.work_items);
  plan.reduce.resize(cap.reduce_items);
  plan.unit_indptr.resize(options.num_units + 1);
  absl::StatusOr<SplitKvPlanCounts> counts = WritePlan(
      qo_indptr, kv_indptr, options, *shape,
      SplitKvPlanSpans{absl::MakeSpan(plan.work), absl::MakeSpan(plan.unit_indptr),
                       absl::MakeSpan(plan.reduce)});
  if (!counts.ok()) return counts.status();
  plan.chunk = counts->chunk;
  plan.work.resize(counts->work_items);
  plan.reduce.resize(counts->reduce_items);
  plan.num_partials = counts->num_partials;
  return plan;
}

}  // namespace attnmeta
