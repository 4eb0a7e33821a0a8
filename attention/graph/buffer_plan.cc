#include "attention/graph/buffer_plan.h"

#include <algorithm>
#include <initializer_list>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "attention/metadata/split_kv_planner.h"

namespace attnmeta {
namespace {

constexpr int64_t kMaxBytes = int64_t{1} << 62;

// The product of `factors`, or OutOfRange naming `buffer` when it passes 2^62.
absl::StatusOr<int64_t> Product(absl::string_view buffer, std::initializer_list<int64_t> factors) {
  int64_t p = 1;
  for (int64_t f : factors) {
    if (f < 0 || (f != 0 && p > kMaxBytes / f)) {
      return absl::OutOfRangeError(absl::StrCat(buffer, ": capacity overflows 2^62"));
    }
    p *= f;
  }
  return p;
}

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace

int64_t ElementBytes(BufferElement e) {
  switch (e) {
    case BufferElement::kInt32: return 4;
    case BufferElement::kInt64: return 8;
    case BufferElement::kUint8: return 1;
    case BufferElement::kFloat32: return 4;
    case BufferElement::kSplitKvWorkItem: return sizeof(SplitKvWorkItem);
    case BufferElement::kSplitKvReduceItem: return sizeof(SplitKvReduceItem);
  }
  return 0;
}

absl::string_view ElementName(BufferElement e) {
  switch (e) {
    case BufferElement::kInt32: return "int32";
    case BufferElement::kInt64: return "int64";
    case BufferElement::kUint8: return "uint8";
    case BufferElement::kFloat32: return "float32";
    case BufferElement::kSplitKvWorkItem: return "work item";
    case BufferElement::kSplitKvReduceItem: return "reduce item";
  }
  return "?";
}

const BufferSpec* BufferPlan::Find(absl::string_view name) const {
  for (const BufferSpec& b : buffers) {
    if (b.name == name) return &b;
  }
  return nullptr;
}

absl::StatusOr<BufferPlan> ComputeBufferPlan(const BackendConfig& c, int64_t batch_capacity) {
  if (absl::Status s = ValidateBackendConfig(c); !s.ok()) return s;
  if (batch_capacity < 1 || batch_capacity >= std::numeric_limits<int32_t>::max()) {
    return absl::InvalidArgumentError(absl::StrCat("batch capacity ", batch_capacity,
                                                   " outside [1, INT32_MAX) (int32 indptrs)"));
  }
  namespace gb = graph_buffer;
  const int64_t b = batch_capacity;
  const int64_t draft = c.speculative().draft_tokens();
  BufferPlan plan;
  plan.batch_capacity = b;
  plan.kv_row_tokens = KvRowTokens(c);

  // Adds a buffer of `element`s whose capacity is the product of `factors`.
  auto add = [&](absl::string_view name, BufferElement element, absl::string_view shape,
                 std::initializer_list<int64_t> factors, bool int32_addressed = true) -> absl::Status {
    absl::StatusOr<int64_t> capacity = Product(name, factors);
    if (!capacity.ok()) return capacity.status();
    if (int32_addressed && *capacity > std::numeric_limits<int32_t>::max()) {
      return absl::OutOfRangeError(absl::StrCat(name, ": ", *capacity, " elements (", shape,
                                                ") beyond int32 offsets"));
    }
    absl::StatusOr<int64_t> bytes = Product(name, {*capacity, ElementBytes(element)});
    if (!bytes.ok()) return bytes.status();
    plan.buffers.push_back(
        BufferSpec{std::string(name), element, std::string(shape), *capacity, *bytes, int32_addressed});
    return absl::OkStatus();
  };
  using E = BufferElement;
  for (absl::Status s : {
           add(gb::kStagedInputs, E::kInt32, "[3 * B]: rows, kv_lens, q_lens", {3, b}),
           add(gb::kKvIndptr, E::kInt32, "[B + 1]", {b + 1}),
           add(gb::kQoIndptr, E::kInt32, "[B + 1]", {b + 1}),
           add(gb::kKvLastPageLen, E::kInt32, "[B]", {b}),
           add(gb::kKvIndices, E::kInt32, "[B * (ceil(ctx / ps) * ps + draft_tokens)]",
               {b, plan.kv_row_tokens.value()}),
       }) {
    if (!s.ok()) return s;
  }
  if (c.consumers().page_table()) {
    plan.page_table_cols =
        PagesForTokensCeil(TokenCount(c.max_context_len() + draft), ConfigPageSize(c));
    if (absl::Status s = add(gb::kPageTable, E::kInt32, "[B][ceil((ctx + draft_tokens) / ps)]",
                             {b, plan.page_table_cols.value()});
        !s.ok()) {
      return s;
    }
  }
  if (draft > 0) {
    if (absl::Status s = add(gb::kTreeMask, E::kUint8, "[B * n * n], n = draft_tokens",
                             {b, draft, draft}, /*int32_addressed=*/false);
        !s.ok()) {
      return s;
    }
    if (absl::Status s = add(gb::kMaskIndptr, E::kInt64, "[B + 1]", {b + 1}); !s.ok()) return s;
    if (absl::Status s = add(gb::kCustomMask, E::kUint8, "[B * n * (ctx + n)], n = draft_tokens",
                             {b, draft, c.max_context_len() + draft}, /*int32_addressed=*/false);
        !s.ok()) {
      return s;
    }
  }
  if (c.speculative().topk() > 0) {
    const int64_t topk = c.speculative().topk();
    const int64_t steps = c.speculative().steps();
    plan.draft_branch_tokens = ContextRowTokens(c) + TokenCount(steps);
    // Each step's offsets start at 0 in its own part of the buffer, but the whole buffer is
    // kept int32-addressable too, so a kernel may index it flat.
    for (absl::Status s : {
             add(gb::kDraftQoIndptr, E::kInt32, "[B * topk + 1]", {b * topk + 1}),
             add(gb::kDraftKvIndptr, E::kInt32, "[steps][B * topk + 1]", {steps, b * topk + 1}),
             add(gb::kDraftKvLens, E::kInt32, "[steps][B * topk]", {steps, b, topk}),
             add(gb::kDraftKvLastPageLen, E::kInt32, "[steps][B * topk]", {steps, b, topk}),
             add(gb::kDraftKvIndices, E::kInt32,
                 "[steps][B * topk * (ceil(ctx / ps) * ps + steps)]",
                 {steps, b, topk, plan.draft_branch_tokens.value()}),
         }) {
      if (!s.ok()) return s;
    }
  }
  if (c.consumers().split_kv().enabled()) {
    const SplitKvConsumer& split = c.consumers().split_kv();
    const int64_t q_rows = MaxReplayQueryRowsPerRequest(c).value();
    absl::StatusOr<int64_t> tiles = Product(gb::kSplitKvWork, {b, CeilDiv(q_rows, split.q_tile())});
    if (!tiles.ok()) return tiles.status();
    const SplitKvCapacity cap = SplitKvCapacityFor(*tiles, split.num_units());
    for (absl::Status s : {
             add(gb::kSplitKvWork, E::kSplitKvWorkItem, "[B * ceil(Q / q_tile) + units - 1]",
                 {cap.work_items}),
             add(gb::kSplitKvUnitIndptr, E::kInt32, "[units + 1]", {int64_t{split.num_units()} + 1}),
             add(gb::kSplitKvReduce, E::kSplitKvReduceItem, "[units - 1]", {cap.reduce_items}),
             add(gb::kSplitKvPartialOut, E::kFloat32, "[2 * (units - 1) * q_tile * q_heads * head_dim]",
                 {cap.partials, split.q_tile(), c.num_q_heads(), c.head_dim()}),
             add(gb::kSplitKvPartialLse, E::kFloat32, "[2 * (units - 1) * q_tile * q_heads]",
                 {cap.partials, split.q_tile(), c.num_q_heads()}),
         }) {
      if (!s.ok()) return s;
    }
  }
  for (const BufferSpec& s : plan.buffers) {
    if (plan.total_bytes > kMaxBytes - s.bytes) {
      return absl::OutOfRangeError(absl::StrCat(s.name, ": the plan's total overflows 2^62"));
    }
    plan.total_bytes += s.bytes;
  }
  return plan;
}

std::string PlanTable(const BufferPlan& plan) {
  std::string out = absl::StrFormat("%-22s %-12s %-48s %14s %16s\n", "buffer", "element",
                                    "shape", "capacity", "bytes");
  for (const BufferSpec& b : plan.buffers) {
    absl::StrAppendFormat(&out, "%-22s %-12s %-48s %14d %16d\n", b.name, ElementName(b.element),
                          b.shape, b.capacity, b.bytes);
  }
  absl::StrAppendFormat(&out, "%-22s %-12s %-48s %14s %16d\n", "total", "", "", "",
                        plan.total_bytes);
  absl::StrAppendFormat(&out, "B = %d requests, R = %d slots per request, C = %d pages\n",
                        plan.batch_capacity, plan.kv_row_tokens.value(),
                        plan.page_table_cols.value());
  return out;
}

}  // namespace attnmeta
