#include "attention/kernels/metadata_kernel_args.h"

#include <cstddef>
#include <cstdint>
#include <limits>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "attention/kernels/internal/launch_checks.h"

namespace attnmeta {

using internal::CheckNotNull;
using internal::kMaxMetadataCount;
using kernels::kMaxMetadataRows;

namespace {

absl::StatusOr<kernels::SlotSource> Source(const DeviceReqToToken& r, TokenCount pool_slots,
                                           PageSize page_size) {
  return internal::CheckedSlotSource(r.table, r.max_context_len, pool_slots, page_size);
}

}  // namespace

// The kernel writes the host planner's items through its own plain structs.
static_assert(sizeof(SplitKvWorkItem) == sizeof(kernels::SplitKvWorkEntry) &&
              offsetof(SplitKvWorkItem, sequence) == offsetof(kernels::SplitKvWorkEntry, sequence) &&
              offsetof(SplitKvWorkItem, q_begin) == offsetof(kernels::SplitKvWorkEntry, q_begin) &&
              offsetof(SplitKvWorkItem, q_end) == offsetof(kernels::SplitKvWorkEntry, q_end) &&
              offsetof(SplitKvWorkItem, kv_begin) == offsetof(kernels::SplitKvWorkEntry, kv_begin) &&
              offsetof(SplitKvWorkItem, kv_end) == offsetof(kernels::SplitKvWorkEntry, kv_end) &&
              offsetof(SplitKvWorkItem, partial_slot) ==
                  offsetof(kernels::SplitKvWorkEntry, partial_slot));
static_assert(sizeof(SplitKvReduceItem) == sizeof(kernels::SplitKvReduceEntry) &&
              offsetof(SplitKvReduceItem, sequence) == offsetof(kernels::SplitKvReduceEntry, sequence) &&
              offsetof(SplitKvReduceItem, q_begin) == offsetof(kernels::SplitKvReduceEntry, q_begin) &&
              offsetof(SplitKvReduceItem, q_end) == offsetof(kernels::SplitKvReduceEntry, q_end) &&
              offsetof(SplitKvReduceItem, partial_begin) ==
                  offsetof(kernels::SplitKvReduceEntry, partial_begin) &&
              offsetof(SplitKvReduceItem, partial_end) ==
                  offsetof(kernels::SplitKvReduceEntry, partial_end));

absl::StatusOr<kernels::TokenKvIndicesParams> TokenKvIndicesParamsFor(
    const TokenKvIndicesDeviceInputs& in, DeviceSpan<TokenSlot> kv_indices,
    kernels::DeviceViolation* violation) {
  if (in.kv_indptr.empty()) {
    return absl::InvalidArgumentError("kv_indptr must have batch_size + 1 >= 1 entries, got 0");
  }
  const int64_t bs = internal::ClaimedSize(in.kv_indptr) - 1;
  if (bs > kMaxMetadataRows) {
    return absl::OutOfRangeError(absl::StrCat("batch_size ", bs, " beyond ", kMaxMetadataRows));
  }
  if (internal::ClaimedSize(in.req_pool_indices) != bs) {
    return absl::InvalidArgumentError(
        absl::StrCat("req_pool_indices has ", in.req_pool_indices.size(),
                     " entries, kv_indptr implies batch_size ", bs));
  }
  if (!in.kv_start_idx.empty() && internal::ClaimedSize(in.kv_start_idx) != bs) {
    return absl::InvalidArgumentError(absl::StrCat("kv_start_idx has ", in.kv_start_idx.size(),
                                                   " entries, want 0 or batch_size ", bs));
  }
  const int64_t stride = in.max_context_len.value();
  if (stride < 1 || in.req_to_token.size() % stride != 0) {
    return absl::InvalidArgumentError(absl::StrCat("req_to_token has ", in.req_to_token.size(),
                                                   " entries, not a whole number of rows of ",
                                                   stride));
  }
  if (in.max_kv_len.value() < 0 || in.max_kv_len.value() > stride) {
    return absl::OutOfRangeError(absl::StrCat("max_kv_len ", in.max_kv_len.value(),
                                              " outside [0, max_context_len = ", stride, "]"));
  }
  for (absl::Status s : {CheckNotNull("req_pool_indices", in.req_pool_indices),
                         CheckNotNull("kv_indptr", in.kv_indptr),
                         CheckNotNull("kv_start_idx", in.kv_start_idx),
                         CheckNotNull("kv_indices", kv_indices)}) {
    if (!s.ok()) return s;
  }
  if (bs == 0) return kernels::TokenKvIndicesParams{};
  // Token-level: no page arithmetic, so the slots are read as pages of one.
  absl::StatusOr<kernels::SlotSource> src = internal::CheckedSlotSource(
      in.req_to_token, in.max_context_len, in.pool_slots, *PageSize::Create(1));
  if (!src.ok()) return src.status();

  kernels::TokenKvIndicesParams params{};
  params.src = *src;
  params.rows = reinterpret_cast<const int32_t*>(in.req_pool_indices.data());
  params.kv_indptr = reinterpret_cast<const int32_t*>(in.kv_indptr.data());
  // An empty span means all zeros, whatever its pointer: the kernel reads starts only when
  // given a pointer.
  params.kv_start_idx = in.kv_start_idx.empty()
                            ? nullptr
                            : reinterpret_cast<const int32_t*>(in.kv_start_idx.data());
  params.kv_indices = reinterpret_cast<int32_t*>(kv_indices.data());
  params.kv_indices_capacity = internal::ClaimedSize(kv_indices);
  params.batch_size = static_cast<int32_t>(bs);
  params.violation = violation;
  return params;
}

absl::StatusOr<kernels::IndptrParams> IndptrParamsFor(DeviceSpan<const TokenLength> lens,
                                                      DeviceSpan<TokenOffset> indptr,
                                                      DeviceSpan<TokenLength> last_page_len,
                                                      PageSize page_size,
                                                      kernels::DeviceViolation* violation) {
  if (indptr.size() != lens.size() + 1) {
    return absl::InvalidArgumentError(absl::StrCat("indptr has ", indptr.size(),
                                                   " entries, want lens + 1 = ", lens.size() + 1));
  }
  if (!last_page_len.empty() && last_page_len.size() != lens.size()) {
    return absl::InvalidArgumentError(absl::StrCat("last_page_len has ", last_page_len.size(),
                                                   " entries, want 0 or ", lens.size()));
  }
  if (lens.size() > static_cast<size_t>(kMaxMetadataCount)) {
    return absl::OutOfRangeError(absl::StrCat(lens.size(), " lengths, beyond ", kMaxMetadataCount));
  }
  for (absl::Status s : {CheckNotNull("lens", lens), CheckNotNull("indptr", indptr),
                         CheckNotNull("last_page_len", last_page_len)}) {
    if (!s.ok()) return s;
  }
  kernels::IndptrParams p{};
  p.lens = reinterpret_cast<const int32_t*>(lens.data());
  p.indptr = reinterpret_cast<int32_t*>(indptr.data());
  p.last_page_len = last_page_len.empty() ? nullptr : reinterpret_cast<int32_t*>(last_page_len.data());
  p.n = static_cast<int32_t>(lens.size());
  p.page_size = static_cast<int32_t>(page_size.tokens());
  p.violation = violation;
  return p;
}

absl::StatusOr<kernels::PageTableParams> PageTableParamsFor(
    const DeviceReqToToken& req_to_token, TokenCount pool_slots,
    DeviceSpan<const ReqPoolIndex> rows, DeviceSpan<const TokenLength> kv_lens,
    PageSize page_size, DeviceSpan<PageId> page_table, PageCount page_cols,
    kernels::DeviceViolation* violation) {
  const int64_t cols = page_cols.value();
  absl::StatusOr<kernels::SlotSource> src = Source(req_to_token, pool_slots, page_size);
  if (!src.ok()) return src.status();
  const int64_t bs = internal::ClaimedSize(rows);
  if (kv_lens.size() != rows.size()) {
    return absl::InvalidArgumentError(absl::StrCat(rows.size(), " rows but ", kv_lens.size(),
                                                   " kv_lens"));
  }
  if (bs > kMaxMetadataRows) {
    return absl::OutOfRangeError(absl::StrCat("batch of ", bs, " beyond ", kMaxMetadataRows));
  }
  if (cols > kMaxMetadataCount) {
    return absl::OutOfRangeError(
        absl::StrCat("page_table of ", cols, " columns, beyond ", kMaxMetadataCount));
  }
  if (cols < 0 || internal::ClaimedSize(page_table) < bs * cols) {
    return absl::InvalidArgumentError(absl::StrCat("page_table of ", page_table.size(),
                                                   " entries is not [", bs, "][", cols, "]"));
  }
  for (absl::Status s : {CheckNotNull("rows", rows), CheckNotNull("kv_lens", kv_lens),
                         CheckNotNull("page_table", page_table)}) {
    if (!s.ok()) return s;
  }
  kernels::PageTableParams p{};
  p.src = *src;
  p.rows = reinterpret_cast<const int32_t*>(rows.data());
  p.kv_lens = reinterpret_cast<const int32_t*>(kv_lens.data());
  p.page_table = reinterpret_cast<int32_t*>(page_table.data());
  p.batch_size = static_cast<int32_t>(bs);
  p.cols = static_cast<int32_t>(cols);
  p.violation = violation;
  return p;
}

absl::StatusOr<kernels::FusedMetadataParams> FusedMetadataParamsFor(
    const DecodeMetadataDeviceArgs& a, kernels::DeviceViolation* violation) {
  absl::StatusOr<kernels::SlotSource> src = Source(a.req_to_token, a.pool_slots, a.page_size);
  if (!src.ok()) return src.status();
  const size_t b = a.rows.size();
  if (a.kv_lens.size() != b || a.q_lens.size() != b || a.kv_indptr.size() != b + 1 ||
      a.qo_indptr.size() != b + 1 || a.kv_last_page_len.size() != b) {
    return absl::InvalidArgumentError(absl::StrCat(
        "decode metadata: ", b, " rows, ", a.kv_lens.size(), " kv_lens, ", a.q_lens.size(),
        " q_lens, ", a.kv_indptr.size(), " kv_indptr, ", a.qo_indptr.size(), " qo_indptr, ",
        a.kv_last_page_len.size(), " kv_last_page_len"));
  }
  if (!a.page_table.empty() && a.page_table_cols.value() > kMaxMetadataCount) {
    return absl::OutOfRangeError(absl::StrCat("page_table of ", a.page_table_cols.value(),
                                              " columns, beyond ", kMaxMetadataCount));
  }
  if (!a.page_table.empty() &&
      (a.page_table_cols.value() < 1 ||
       a.page_table.size() < b * static_cast<size_t>(a.page_table_cols.value()))) {
    return absl::InvalidArgumentError(absl::StrCat("page_table of ", a.page_table.size(),
                                                   " entries is not [", b, "][",
                                                   a.page_table_cols.value(), "]"));
  }
  if (a.max_kv_len.value() < 1 || a.max_kv_len.value() > src->stride) {
    return absl::OutOfRangeError(absl::StrCat("max_kv_len ", a.max_kv_len.value(),
                                              " outside [1, max_context_len = ", src->stride, "]"));
  }
  if (b > static_cast<size_t>(kMaxMetadataRows)) {
    return absl::OutOfRangeError(absl::StrCat("batch of ", b, " beyond ", kMaxMetadataRows));
  }
  for (absl::Status s :
       {CheckNotNull("rows", a.rows), CheckNotNull("kv_lens", a.kv_lens),
        CheckNotNull("q_lens", a.q_lens), CheckNotNull("kv_indptr", a.kv_indptr),
        CheckNotNull("qo_indptr", a.qo_indptr), CheckNotNull("kv_last_page_len", a.kv_last_page_len),
        CheckNotNull("kv_indices", a.kv_indices), CheckNotNull("page_table", a.page_table)}) {
    if (!s.ok()) return s;
  }
  kernels::FusedMetadataParams p{};
  p.src = *src;
  p.rows = reinterpret_cast<const int32_t*>(a.rows.data());
  p.kv_lens = reinterpret_cast<const int32_t*>(a.kv_lens.data());
  p.q_lens = reinterpret_cast<const int32_t*>(a.q_lens.data());
  p.kv_indptr = reinterpret_cast<int32_t*>(a.kv_indptr.data());
  p.qo_indptr = reinterpret_cast<int32_t*>(a.qo_indptr.data());
  p.kv_last_page_len = reinterpret_cast<int32_t*>(a.kv_last_page_len.data());
  p.kv_indices = reinterpret_cast<int32_t*>(a.kv_indices.data());
  p.kv_indices_capacity = internal::ClaimedSize(a.kv_indices);
  p.page_table = a.page_table.empty() ? nullptr : reinterpret_cast<int32_t*>(a.page_table.data());
  p.page_table_cols = static_cast<int32_t>(a.page_table_cols.value());
  p.padded_batch = static_cast<int32_t>(b);
  p.violation = violation;
  return p;
}

absl::StatusOr<kernels::TreeMaskParams> TreeMaskParamsFor(const TreeMaskDeviceArgs& a,
                                                          kernels::DeviceViolation* violation) {
  const size_t b = a.q_lens.size();
  if (a.kv_lens.size() != b || a.mask_indptr.size() != b + 1 ||
      (!a.rows.empty() && a.rows.size() != b)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tree mask: ", b, " q_lens, ", a.kv_lens.size(), " kv_lens, ", a.mask_indptr.size(),
        " mask_indptr, ", a.rows.size(), " rows (none or one per q_len)"));
  }
  if (a.max_mask_bytes_per_row < 1) {
    return absl::OutOfRangeError("tree mask: max_mask_bytes_per_row must be >= 1");
  }
  if (b > static_cast<size_t>(kMaxMetadataRows)) {
    return absl::OutOfRangeError(
        absl::StrCat("tree mask: batch of ", b, " beyond ", kMaxMetadataRows));
  }
  for (absl::Status s :
       {CheckNotNull("rows", a.rows), CheckNotNull("q_lens", a.q_lens),
        CheckNotNull("kv_lens", a.kv_lens), CheckNotNull("tree", a.tree),
        CheckNotNull("mask_indptr", a.mask_indptr), CheckNotNull("mask", a.mask)}) {
    if (!s.ok()) return s;
  }
  kernels::TreeMaskParams p{};
  p.rows = a.rows.empty() ? nullptr : reinterpret_cast<const int32_t*>(a.rows.data());
  p.q_lens = reinterpret_cast<const int32_t*>(a.q_lens.data());
  p.kv_lens = reinterpret_cast<const int32_t*>(a.kv_lens.data());
  p.tree = a.tree.data();
  p.tree_capacity = internal::ClaimedSize(a.tree);
  p.mask_indptr = a.mask_indptr.data();
  p.mask = a.mask.data();
  p.mask_capacity = internal::ClaimedSize(a.mask);
  p.padded_batch = static_cast<int32_t>(b);
  p.violation = violation;
  return p;
}

absl::StatusOr<kernels::DraftStepParams> DraftStepParamsFor(const DraftStepDeviceArgs& a,
                                                            kernels::DeviceViolation* violation) {
  absl::StatusOr<kernels::SlotSource> src = Source(a.req_to_token, a.pool_slots, a.page_size);
  if (!src.ok()) return src.status();
  if (absl::Status s = CheckDraftDecodeShape(a.shape); !s.ok()) return s;
  if (a.step < 0 || a.step >= a.shape.steps) {
    return absl::InvalidArgumentError(
        absl::StrCat("draft step ", a.step, " outside [0, ", a.shape.steps, ")"));
  }
  const size_t b = a.rows.size();
  if (b > static_cast<size_t>(kMaxMetadataRows / a.shape.topk)) {
    return absl::OutOfRangeError(absl::StrCat("draft step: ", b, " rows of ", a.shape.topk,
                                              " branches, beyond ", kMaxMetadataRows));
  }
  const size_t branches = b * static_cast<size_t>(a.shape.topk);
  if (a.seq_lens.size() != b || a.kv_lens.size() != branches ||
      a.kv_indptr.size() != branches + 1 || a.qo_indptr.size() != branches + 1 ||
      a.kv_last_page_len.size() != branches) {
    return absl::InvalidArgumentError(absl::StrCat(
        "draft step: ", b, " rows, ", a.seq_lens.size(), " seq_lens, and outputs of ",
        a.kv_lens.size(), "/", a.kv_indptr.size(), "/", a.qo_indptr.size(), "/",
        a.kv_last_page_len.size(), " entries for ", branches, " branches"));
  }
  for (absl::Status s :
       {CheckNotNull("rows", a.rows), CheckNotNull("seq_lens", a.seq_lens),
        CheckNotNull("kv_lens", a.kv_lens), CheckNotNull("kv_indptr", a.kv_indptr),
        CheckNotNull("qo_indptr", a.qo_indptr), CheckNotNull("kv_last_page_len", a.kv_last_page_len),
        CheckNotNull("kv_indices", a.kv_indices)}) {
    if (!s.ok()) return s;
  }
  kernels::DraftStepParams p{};
  p.src = *src;
  p.rows = reinterpret_cast<const int32_t*>(a.rows.data());
  p.seq_lens = reinterpret_cast<const int32_t*>(a.seq_lens.data());
  p.padded_batch = static_cast<int32_t>(b);
  p.topk = a.shape.topk;
  p.steps = a.shape.steps;
  p.step = a.step;
  p.kv_lens = reinterpret_cast<int32_t*>(a.kv_lens.data());
  p.kv_indptr = reinterpret_cast<int32_t*>(a.kv_indptr.data());
  p.qo_indptr = reinterpret_cast<int32_t*>(a.qo_indptr.data());
  p.kv_last_page_len = reinterpret_cast<int32_t*>(a.kv_last_page_len.data());
  p.kv_indices = reinterpret_cast<int32_t*>(a.kv_indices.data());
  p.kv_indices_capacity = internal::ClaimedSize(a.kv_indices);
  p.violation = violation;
  return p;
}

absl::StatusOr<kernels::SplitKvPlanParams> SplitKvPlanParamsFor(
    const SplitKvPlanDeviceArgs& a, kernels::DeviceViolation* violation) {
  if (absl::Status s = CheckSplitKvOptions(a.options); !s.ok()) return s;
  if (a.qo_indptr.empty() || a.qo_indptr.size() != a.kv_indptr.size()) {
    return absl::InvalidArgumentError(absl::StrCat("split-KV plan: qo_indptr has ",
                                                   a.qo_indptr.size(), " entries, kv_indptr ",
                                                   a.kv_indptr.size()));
  }
  if (a.unit_indptr.size() < static_cast<size_t>(a.options.num_units) + 1) {
    return absl::InvalidArgumentError(absl::StrCat("split-KV plan: unit_indptr holds ",
                                                   a.unit_indptr.size(), " entries, ",
                                                   a.options.num_units + 1, " needed"));
  }
  if (a.qo_indptr.size() - 1 > static_cast<size_t>(kMaxMetadataCount)) {
    return absl::OutOfRangeError(absl::StrCat("split-KV plan: batch of ", a.qo_indptr.size() - 1,
                                              " beyond ", kMaxMetadataCount));
  }
  for (absl::Status s : {CheckNotNull("qo_indptr", a.qo_indptr), CheckNotNull("kv_indptr", a.kv_indptr),
                         CheckNotNull("work", a.work), CheckNotNull("unit_indptr", a.unit_indptr),
                         CheckNotNull("reduce", a.reduce)}) {
    if (!s.ok()) return s;
  }
  kernels::SplitKvPlanParams p{};
  p.qo_indptr = reinterpret_cast<const int32_t*>(a.qo_indptr.data());
  p.kv_indptr = reinterpret_cast<const int32_t*>(a.kv_indptr.data());
  p.n = static_cast<int32_t>(a.qo_indptr.size() - 1);
  p.num_units = a.options.num_units;
  p.chunk = static_cast<int32_t>(SplitKvChunk(a.options).value());
  p.q_tile = static_cast<int32_t>(a.options.q_tile.value());
  p.work = reinterpret_cast<kernels::SplitKvWorkEntry*>(a.work.data());
  p.work_capacity = internal::ClaimedSize(a.work);
  p.unit_indptr = a.unit_indptr.data();
  p.reduce = reinterpret_cast<kernels::SplitKvReduceEntry*>(a.reduce.data());
  p.reduce_capacity = internal::ClaimedSize(a.reduce);
  p.violation = violation;
  return p;
}

absl::StatusOr<kernels::GatherKvParams> GatherKvParamsFor(const GatherKvDeviceArgs& a,
                                                          kernels::DeviceViolation* violation) {
  if (a.head_dim < 1 || a.head_dim > 256 || a.num_kv_heads < 1) {
    return absl::InvalidArgumentError(absl::StrCat("gather: head_dim ", a.head_dim,
                                                   " outside [1, 256] or num_kv_heads ",
                                                   a.num_kv_heads, " < 1"));
  }
  int64_t element = 0;
  switch (a.dtype) {
    case KvElementType::kBf16:
    case KvElementType::kFp16:
      element = 2;
      break;
  }
  if (element == 0) return absl::InvalidArgumentError("gather: unknown K/V element type");
  const int64_t row_bytes = int64_t{a.num_kv_heads} * a.head_dim * element;
  if (a.k_pool.size() != a.v_pool.size() || a.k_pool.size() % row_bytes != 0 ||
      a.k_out.size() != a.v_out.size() || a.k_out.size() % row_bytes != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "gather: K/V pools of ", a.k_pool.size(), " and ", a.v_pool.size(), " bytes and outputs of ",
        a.k_out.size(), " and ", a.v_out.size(), " bytes are not whole rows of ", row_bytes));
  }
  // Slots and output rows are int32 (tok_idx, cu_k): rows past 2^31 are not addressable, and
  // a claimed size past that is refused rather than trusted.
  const int64_t pool_rows = internal::ClaimedSize(a.k_pool) / row_bytes;
  const int64_t out_rows = internal::ClaimedSize(a.k_out) / row_bytes;
  if (pool_rows > (int64_t{1} << 31) || out_rows > (int64_t{1} << 31)) {
    return absl::OutOfRangeError("gather: K/V pools or outputs of more than 2^31 rows");
  }
  if (a.cu_k.empty()) return absl::InvalidArgumentError("gather: cu_k needs bs + 1 >= 1 entries");
  if (a.cu_k.size() - 1 > static_cast<size_t>(std::numeric_limits<int32_t>::max())) {
    return absl::OutOfRangeError("gather: more than INT32_MAX sequences");
  }
  for (const void* ptr : {static_cast<const void*>(a.k_pool.data()),
                          static_cast<const void*>(a.v_pool.data()),
                          static_cast<const void*>(a.k_out.data()),
                          static_cast<const void*>(a.v_out.data())}) {
    if (reinterpret_cast<uintptr_t>(ptr) % element != 0) {
      return absl::InvalidArgumentError(absl::StrCat("gather: a K/V pointer is not aligned to the ",
                                                     element, "-byte element"));
    }
  }
  for (absl::Status s : {CheckNotNull("k_pool", a.k_pool), CheckNotNull("v_pool", a.v_pool),
                         CheckNotNull("tok_idx", a.tok_idx), CheckNotNull("cu_k", a.cu_k),
                         CheckNotNull("k_out", a.k_out), CheckNotNull("v_out", a.v_out)}) {
    if (!s.ok()) return s;
  }
  kernels::GatherKvParams p{};
  p.k_pool = a.k_pool.data();
  p.v_pool = a.v_pool.data();
  p.pool_slots = pool_rows;
  p.row_bytes = row_bytes;
  p.tok_idx = reinterpret_cast<const int32_t*>(a.tok_idx.data());
  p.tok_capacity = internal::ClaimedSize(a.tok_idx);
  p.cu_k = reinterpret_cast<const int32_t*>(a.cu_k.data());
  p.batch_size = static_cast<int32_t>(a.cu_k.size() - 1);
  p.k_out = a.k_out.data();
  p.v_out = a.v_out.data();
  p.out_rows = out_rows;
  p.violation = violation;
  return p;
}

}  // namespace attnmeta
