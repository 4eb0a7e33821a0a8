#include "attention/metadata/builders.h"

#include <algorithm>
#include <cstdint>
#include <limits>

#include "absl/strings/str_cat.h"
#include "attention/metadata/internal/indptr.h"
#include "attention/metadata/mode_rules.h"
#include "attention/metadata/request_rows.h"
#include "attention/metadata/validator.h"

namespace attnmeta {
namespace {

constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();

absl::Status CheckLengths(const char* name, absl::Span<const TokenLength> lens) {
  for (size_t i = 0; i < lens.size(); ++i) {
    if (lens[i].value() < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, "[", i, "] = ", lens[i].value(), " is negative"));
    }
  }
  return absl::OkStatus();
}

// The slots of positions [start, start + len) of request i's row, or the pool's error
// (OutOfRange: row or range outside the table; FailedPrecondition: row not allocated) naming
// the request.
absl::StatusOr<absl::Span<const TokenSlot>> RowRange(const ReqToTokenPool& pool, size_t i,
                                                     ReqPoolIndex row, int64_t start,
                                                     int64_t len) {
  absl::StatusOr<absl::Span<const TokenSlot>> r =
      pool.Read(row, TokenCount(start), TokenCount(len));
  if (!r.ok()) {
    return absl::Status(r.status().code(), absl::StrCat("request ", i, ": ", r.status().message()));
  }
  return r;
}

}  // namespace

absl::Status BuildIndptr(absl::Span<const TokenLength> lens, absl::Span<TokenOffset> out) {
  if (out.size() != lens.size() + 1) {
    return absl::InvalidArgumentError(absl::StrCat("indptr output has ", out.size(),
                                                   " entries, want ", lens.size() + 1));
  }
  if (absl::Status s = CheckLengths("lens", lens); !s.ok()) return s;
  int64_t total = 0;
  for (TokenLength l : lens) total += l.value();
  if (total > kInt32Max) {
    return absl::OutOfRangeError(
        absl::StrCat("lengths sum to ", total, ", beyond int32 offsets (", kInt32Max, ")"));
  }
  int32_t acc = 0;
  out[0] = TokenOffset(0);
  for (size_t i = 0; i < lens.size(); ++i) {
    acc += lens[i].value();
    out[i + 1] = TokenOffset(acc);
  }
  return absl::OkStatus();
}

absl::Status BuildKvLastPageLen(absl::Span<const TokenLength> kv_lens, PageSize page_size,
                                absl::Span<TokenLength> out) {
  if (out.size() != kv_lens.size()) {
    return absl::InvalidArgumentError(absl::StrCat("kv_last_page_len output has ", out.size(),
                                                   " entries, want ", kv_lens.size()));
  }
  if (absl::Status s = CheckLengths("kv_lens", kv_lens); !s.ok()) return s;
  for (size_t i = 0; i < kv_lens.size(); ++i) out[i] = LastPageLen(kv_lens[i], page_size);
  return absl::OkStatus();
}

absl::Status BuildTokenKvIndices(const ReqToTokenPool& pool, absl::Span<const ReqPoolIndex> rows,
                                 absl::Span<const TokenOffset> kv_indptr,
                                 absl::Span<const TokenPosition> kv_start_idx,
                                 absl::Span<TokenSlot> out) {
  if (absl::Status s = internal::CheckIndptr("kv_indptr", kv_indptr); !s.ok()) return s;
  const size_t bs = kv_indptr.size() - 1;
  if (rows.size() != bs) {
    return absl::InvalidArgumentError(absl::StrCat("req rows has ", rows.size(),
                                                   " entries, kv_indptr implies batch_size ", bs));
  }
  if (!kv_start_idx.empty() && kv_start_idx.size() != bs) {
    return absl::InvalidArgumentError(absl::StrCat("kv_start_idx has ", kv_start_idx.size(),
                                                   " entries, want 0 or batch_size ", bs));
  }
  auto start = [&](size_t i) { return kv_start_idx.empty() ? 0 : kv_start_idx[i].value(); };
  for (size_t i = 0; i < bs; ++i) {
    const int64_t len = (kv_indptr[i + 1] - kv_indptr[i]).value();
    if (absl::Status s = RowRange(pool, i, rows[i], start(i), len).status(); !s.ok()) return s;
  }
  if (static_cast<int64_t>(out.size()) < kv_indptr[bs].value()) {
    return absl::InvalidArgumentError(absl::StrCat("kv_indices output holds ", out.size(),
                                                   " slots, kv_indptr[bs] = ",
                                                   kv_indptr[bs].value()));
  }
  for (size_t i = 0; i < bs; ++i) {
    const absl::Span<const TokenSlot> src =
        *RowRange(pool, i, rows[i], start(i), (kv_indptr[i + 1] - kv_indptr[i]).value());
    std::copy(src.begin(), src.end(), out.begin() + kv_indptr[i].value());
  }
  return absl::OkStatus();
}

absl::Status BuildPageTable(const ReqToTokenPool& pool, absl::Span<const ReqPoolIndex> rows,
                            absl::Span<const TokenLength> kv_lens, PageSize page_size,
                            PageTableSpan<PageId> out) {
  const size_t bs = kv_lens.size();
  if (rows.size() != bs) {
    return absl::InvalidArgumentError(
        absl::StrCat("req rows has ", rows.size(), " entries, kv_lens has ", bs));
  }
  if (absl::Status s = CheckLengths("kv_lens", kv_lens); !s.ok()) return s;
  for (size_t i = 0; i < bs; ++i) {
    if (absl::Status s = RowRange(pool, i, rows[i], 0, kv_lens[i].value()).status(); !s.ok()) {
      return s;
    }
  }
  const PageCount need_cols = PagesForTokensCeil(MaxLength(kv_lens), page_size);
  if (out.rows() < static_cast<int64_t>(bs) || out.cols() < need_cols) {
    return absl::InvalidArgumentError(absl::StrCat("page table output is [", out.rows(), "][",
                                                   out.cols().value(), "], the batch needs [", bs,
                                                   "][", need_cols.value(), "]"));
  }
  const int64_t ps = page_size.tokens();
  for (size_t i = 0; i < bs; ++i) {
    absl::Span<PageId> row = out.row(static_cast<int64_t>(i));
    const absl::Span<const TokenSlot> src = *RowRange(pool, i, rows[i], 0, kv_lens[i].value());
    const int64_t pages = PagesForTokensCeil(kv_lens[i].count(), page_size).value();
    for (int64_t j = 0; j < pages; ++j) row[j] = PageOf(src[j * ps], page_size);
    std::fill(row.begin() + pages, row.end(), kPaddingPage);
  }
  return absl::OkStatus();
}

absl::StatusOr<ForwardMetadata> BuildForwardMetadata(const ForwardBatch& batch,
                                                     const ReqToTokenPool& pool,
                                                     PageSize page_size,
                                                     const BuildOptions& options) {
  const size_t bs = batch.req_rows.size();
  if (batch.kv_lens.size() != bs || batch.q_lens.size() != bs) {
    return absl::InvalidArgumentError(absl::StrCat("batch arrays disagree: ", bs, " rows, ",
                                                   batch.kv_lens.size(), " kv_lens, ",
                                                   batch.q_lens.size(), " q_lens"));
  }
  if (!batch.kv_start_idx.empty() && batch.kv_start_idx.size() != bs) {
    return absl::InvalidArgumentError(absl::StrCat("kv_start_idx has ", batch.kv_start_idx.size(),
                                                   " entries, want 0 or batch_size ", bs));
  }
  if (options.page_table && !batch.kv_start_idx.empty()) {
    return absl::InvalidArgumentError(
        "a page table needs sequences that start at position 0; drop kv_start_idx or the "
        "page table");
  }
  if (absl::Status s = CheckModeBatchSize(batch.mode, static_cast<int64_t>(bs)); !s.ok()) {
    return s;
  }
  if (absl::Status s = CheckModeMask(batch.mode, options.mask_layout); !s.ok()) return s;
  if (options.mask_layout == MaskLayout::kNone && !batch.tree_mask.empty()) {
    return absl::InvalidArgumentError("a tree mask without a mask layout to build");
  }
  for (size_t i = 0; i < bs; ++i) {
    if (absl::Status s = CheckModeSequence(batch.mode, static_cast<int64_t>(i),
                                           batch.q_lens[i].count(), batch.kv_lens[i].count());
        !s.ok()) {
      return s;
    }
  }
  // Every row range first, so that no array is sized from a length the pool cannot hold.
  for (size_t i = 0; i < bs; ++i) {
    const int64_t start = batch.kv_start_idx.empty() ? 0 : batch.kv_start_idx[i].value();
    if (absl::Status s = RowRange(pool, i, batch.req_rows[i], start, batch.kv_lens[i].value())
                             .status();
        !s.ok()) {
      return s;
    }
  }
  // Distinct rows bound the page table too: with a repeated row it is bs x the longest row's
  // pages for any bs.
  if (absl::Status s = CheckDistinctRows(batch.req_rows); !s.ok()) return s;
  // The tree rows before any array: the mask is the batch's q_len * kv_len bytes, which the
  // caller's lengths can make gigabytes, and BuildCustomMask would refuse the rows after.
  if (options.mask_layout != MaskLayout::kNone) {
    if (absl::Status s = CheckTreeRows(batch.tree_mask, batch.q_lens,
                                       /*draft_tree=*/batch.mode == ForwardMode::kTargetVerify);
        !s.ok()) {
      return s;
    }
  }
  ForwardMetadata m;
  m.mode = batch.mode;
  m.kv_lens.assign(batch.kv_lens.begin(), batch.kv_lens.end());
  m.kv_indptr.resize(bs + 1);
  m.qo_indptr.resize(bs + 1);
  m.kv_last_page_len.resize(bs);
  if (absl::Status s = BuildIndptr(batch.kv_lens, absl::MakeSpan(m.kv_indptr)); !s.ok()) return s;
  if (absl::Status s = BuildIndptr(batch.q_lens, absl::MakeSpan(m.qo_indptr)); !s.ok()) return s;
  m.kv_indices.resize(m.kv_indptr.back().value());
  if (absl::Status s = BuildTokenKvIndices(pool, batch.req_rows, m.kv_indptr, batch.kv_start_idx,
                                           absl::MakeSpan(m.kv_indices));
      !s.ok()) {
    return s;
  }
  if (absl::Status s =
          BuildKvLastPageLen(batch.kv_lens, page_size, absl::MakeSpan(m.kv_last_page_len));
      !s.ok()) {
    return s;
  }
  m.max_q_len = MaxLength(batch.q_lens);
  m.max_kv_len = MaxLength(batch.kv_lens);
  if (options.page_table) {
    m.page_table = PageTable(static_cast<int64_t>(bs), PagesForTokensCeil(m.max_kv_len, page_size));
    if (absl::Status s =
            BuildPageTable(pool, batch.req_rows, batch.kv_lens, page_size, m.page_table.span());
        !s.ok()) {
      return s;
    }
  }
  if (options.mask_layout != MaskLayout::kNone) {
    m.mask_layout = options.mask_layout;
    m.mask_indptr.resize(bs + 1);
    if (absl::Status s = BuildMaskIndptr(m.mask_layout, batch.q_lens, batch.kv_lens,
                                         absl::MakeSpan(m.mask_indptr));
        !s.ok()) {
      return s;
    }
    m.custom_mask.resize(m.mask_indptr.back());
    if (absl::Status s = BuildCustomMask(m.mask_layout, batch.tree_mask, batch.q_lens,
                                         batch.kv_lens, m.mask_indptr,
                                         absl::MakeSpan(m.custom_mask));
        !s.ok()) {
      return s;
    }
  }
  if (options.check.has_value()) {
    ValidationContext ctx{options.check->pool_slots, page_size, options.check->num_query_rows};
    ctx.check_slot_ownership = true;
    if (absl::Status s = ValidateForwardMetadata(m.view(), ctx); !s.ok()) return s;
  }
  return m;
}

}  // namespace attnmeta
