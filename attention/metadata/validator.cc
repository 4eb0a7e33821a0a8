#include "attention/metadata/validator.h"

#include <cstdint>

#include "absl/strings/str_cat.h"
#include "attention/metadata/lengths.h"
#include "attention/metadata/mode_rules.h"

namespace attnmeta {
namespace {

absl::Status Invalid(absl::string_view array, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(array, ": ", what));
}

// indptr has bs + 1 entries, starts at 0 and never decreases.
absl::Status CheckIndptr(absl::string_view name, absl::Span<const TokenOffset> indptr,
                         int64_t bs) {
  if (static_cast<int64_t>(indptr.size()) != bs + 1) {
    return Invalid(name, absl::StrCat("has ", indptr.size(), " entries, want batch_size + 1 = ",
                                      bs + 1));
  }
  if (indptr[0].value() != 0) {
    return Invalid(name, absl::StrCat("entry 0 = ", indptr[0].value(), ", must be 0"));
  }
  for (int64_t i = 0; i < bs; ++i) {
    if (indptr[i + 1] < indptr[i]) {
      return Invalid(name, absl::StrCat("entry ", i + 1, " = ", indptr[i + 1].value(),
                                        " is less than entry ", i, " = ", indptr[i].value(),
                                        " (must be non-decreasing)"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateForwardMetadata(const ForwardMetadataView& m, const ValidationContext& ctx) {
  const int64_t bs = m.batch_size();
  if (absl::Status s = CheckModeBatchSize(m.mode, bs); !s.ok()) return Invalid("mode", s.message());
  if (absl::Status s = CheckIndptr("kv_indptr", m.kv_indptr, bs); !s.ok()) return s;
  if (absl::Status s = CheckIndptr("qo_indptr", m.qo_indptr, bs); !s.ok()) return s;
  if (static_cast<int64_t>(m.kv_last_page_len.size()) != bs) {
    return Invalid("kv_last_page_len", absl::StrCat("has ", m.kv_last_page_len.size(),
                                                    " entries, want batch_size = ", bs));
  }
  const int64_t total_kv = m.kv_indptr[bs].value();
  if (static_cast<int64_t>(m.kv_indices.size()) < total_kv) {
    return Invalid("kv_indices", absl::StrCat("holds ", m.kv_indices.size(),
                                              " entries, kv_indptr[bs] = ", total_kv));
  }
  for (int64_t i = 0; i < bs; ++i) {
    const TokenCount step = m.kv_indptr[i + 1] - m.kv_indptr[i];
    if (step != m.kv_lens[i].count()) {
      return Invalid("kv_indptr", absl::StrCat("step ", i, " = ", step.value(),
                                               " differs from kv_lens[", i,
                                               "] = ", m.kv_lens[i].value()));
    }
  }
  if (m.qo_indptr[bs].value() != ctx.num_query_rows.value()) {
    return Invalid("qo_indptr", absl::StrCat("qo_indptr[bs] = ", m.qo_indptr[bs].value(),
                                             " but the query tensor has ",
                                             ctx.num_query_rows.value(), " rows"));
  }
  TokenCount max_q;
  for (int64_t i = 0; i < bs; ++i) {
    const TokenCount q_len = m.qo_indptr[i + 1] - m.qo_indptr[i];
    if (absl::Status s = CheckModeSequence(m.mode, i, q_len, m.kv_lens[i].count()); !s.ok()) {
      return Invalid("qo_indptr", s.message());
    }
    if (q_len > max_q) max_q = q_len;
  }
  const int64_t pool = ctx.pool_slots.value();
  const int64_t first_allowed = ctx.allow_padding_page ? 0 : ctx.page_size.tokens();
  for (int64_t k = 0; k < total_kv; ++k) {
    const int64_t s = m.kv_indices[k].value();
    if (s < first_allowed || s >= pool) {
      return Invalid("kv_indices",
                     absl::StrCat("entry ", k, " = slot ", s, " outside [", first_allowed, ", ",
                                  pool, ")", s >= 0 && s < first_allowed ? " (padding page)" : ""));
    }
  }
  if (m.max_q_len != max_q) {
    return Invalid("max_q_len", absl::StrCat("is ", m.max_q_len.value(),
                                             ", the largest q_len is ", max_q.value()));
  }
  const TokenCount max_kv = MaxLength(m.kv_lens);
  if (m.max_kv_len != max_kv) {
    return Invalid("max_kv_len", absl::StrCat("is ", m.max_kv_len.value(),
                                              ", the largest kv_len is ", max_kv.value()));
  }
  const int64_t ps = ctx.page_size.tokens();
  for (int64_t i = 0; i < bs; ++i) {
    const TokenLength want = LastPageLen(m.kv_lens[i], ctx.page_size);
    if (m.kv_last_page_len[i] != want) {
      return Invalid("kv_last_page_len",
                     absl::StrCat("entry ", i, " = ", m.kv_last_page_len[i].value(), ", want ",
                                  want.value(), " for kv_len ", m.kv_lens[i].value(),
                                  " and page_size ", ps));
    }
  }
  const PageTableSpan<const PageId>& pt = m.page_table;
  if (pt.rows() == 0 && pt.cols() == 0) return absl::OkStatus();  // no page-level consumer
  const int64_t need_cols = PagesForTokensCeil(max_kv, ctx.page_size).value();
  if (pt.rows() < bs || pt.cols() < need_cols) {
    return Invalid("page_table", absl::StrCat("is [", pt.rows(), "][", pt.cols(),
                                              "], the batch needs [", bs, "][", need_cols, "]"));
  }
  for (int64_t i = 0; i < bs; ++i) {
    absl::Span<const PageId> row = pt.row(i);
    const TokenSlot* slots = m.kv_indices.data() + m.kv_indptr[i].value();
    const int64_t n = m.kv_lens[i].value();
    for (int64_t t = 0; t < n; ++t) {
      const PageId page = row[t / ps];
      if (PageOf(slots[t], ctx.page_size) != page || OffsetInPage(slots[t], ctx.page_size).value() != t % ps) {
        return Invalid("page_table",
                       absl::StrCat("[", i, "][", t / ps, "] = page ", page.value(),
                                    " disagrees with kv_indices: token ", t, " of sequence ", i,
                                    " is in slot ", slots[t].value(), " (page ",
                                    PageOf(slots[t], ctx.page_size).value(), ", offset ",
                                    OffsetInPage(slots[t], ctx.page_size).value(), ")"));
      }
    }
    for (int64_t j = PagesForTokensCeil(TokenCount(n), ctx.page_size).value(); j < pt.cols(); ++j) {
      if (row[j] != kPaddingPage) {
        return Invalid("page_table", absl::StrCat("[", i, "][", j, "] = page ", row[j].value(),
                                                  " past the sequence's pages, want the padding "
                                                  "page"));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace attnmeta
