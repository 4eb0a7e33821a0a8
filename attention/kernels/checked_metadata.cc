#include "attention/kernels/checked_metadata.h"

#include <algorithm>
#include <cstdint>
#include <vector>

#include "absl/strings/str_cat.h"

namespace attnmeta {
namespace {

absl::Status Mismatch(absl::string_view what, int64_t host, int64_t launch) {
  return absl::InvalidArgumentError(absl::StrCat("checked mode: the host metadata's ", what, " is ",
                                                 host, ", the launch's ", launch));
}

}  // namespace

absl::Status CheckLaunchedMetadata(const CheckedMetadata& checked,
                                   const LaunchedMetadataShape& launch) {
  const ForwardMetadataView& m = checked.metadata;
  const ValidationContext& ctx = checked.context;
  // The shapes first: a host copy of another launch would be validated against the wrong
  // pool or query rows.
  if (m.batch_size() != launch.batch_size) {
    return Mismatch("batch size", m.batch_size(), launch.batch_size);
  }
  if (ctx.num_query_rows != launch.query_rows) {
    return absl::InvalidArgumentError(absl::StrCat(
        "checked mode: the context's num_query_rows is ", ctx.num_query_rows.value(),
        ", the launch's query rows ", launch.query_rows.value()));
  }
  if (ctx.pool_slots > launch.pool_slots) {
    return absl::InvalidArgumentError(
        absl::StrCat("checked mode: the context's pool_slots ", ctx.pool_slots.value(),
                     " exceed the launch pools' ", launch.pool_slots.value(), " slots"));
  }
  if (m.custom_mask.layout != launch.mask_layout) {
    return absl::InvalidArgumentError(
        absl::StrCat("checked mode: the host metadata's mask layout is ",
                     MaskLayoutName(m.custom_mask.layout), ", the launch's ",
                     MaskLayoutName(launch.mask_layout)));
  }
  if (launch.max_q_len_exact ? launch.max_q_len != m.max_q_len
                             : launch.max_q_len < m.max_q_len) {
    return Mismatch(launch.max_q_len_exact ? "max_q_len (the launch's must equal it)"
                                           : "max_q_len (the launch's must cover it)",
                    m.max_q_len.value(), launch.max_q_len.value());
  }
  if (launch.page_table) {
    if (m.page_table.rows() == 0 && launch.batch_size > 0) {
      return absl::InvalidArgumentError(
          "checked mode: the launch reads K/V through a page table, the host metadata has none");
    }
    if (m.page_table.cols() != launch.page_table_cols) {
      return Mismatch("page table width (columns)", m.page_table.cols().value(),
                      launch.page_table_cols.value());
    }
    if (ctx.page_size != launch.page_size) {
      return absl::InvalidArgumentError(
          absl::StrCat("checked mode: the context's page_size is ", ctx.page_size.tokens(),
                       ", the launch's page table's ", launch.page_size.tokens()));
    }
  }
  // A tail of query rows no sequence claims passes only where the launch writes it.
  ValidationContext launch_ctx = ctx;
  launch_ctx.allow_unclaimed_rows = ctx.allow_unclaimed_rows && launch.zero_unclaimed_rows;
  if (absl::Status s = ValidateForwardMetadata(m, launch_ctx); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("checked mode: ", s.message()));
  }
  // After validation: kv_indptr has bs + 1 entries, and mask_indptr too with a mask.
  if (!launch.page_table && m.kv_indptr.back().value() > launch.kv_indices_entries.value()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "checked mode: the host metadata's kv_indptr[bs] is ", m.kv_indptr.back().value(),
        " but the launch's kv_indices holds ", launch.kv_indices_entries.value(), " entries"));
  }
  if (m.custom_mask.layout != MaskLayout::kNone &&
      m.custom_mask.mask_indptr.back() > launch.mask_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "checked mode: the host metadata's mask_indptr[bs] is ", m.custom_mask.mask_indptr.back(),
        " but the launch's mask holds ", launch.mask_bytes, " bytes"));
  }
  if (launch.split_plan != nullptr) {
    // Where each sequence's items end (they tile [0, end) from 0: the launcher's plan check).
    const int64_t bs = m.batch_size();
    std::vector<int64_t> end(bs, 0);
    for (const SplitKvWorkItem& w : launch.split_plan->work) {
      if (w.sequence < 0 || w.sequence >= bs) {
        return absl::InvalidArgumentError(
            absl::StrCat("checked mode: a split-KV work item names sequence ", w.sequence,
                         " of a batch of ", bs));
      }
      end[w.sequence] = std::max<int64_t>(end[w.sequence], w.kv_end.value());
    }
    for (int64_t i = 0; i < bs; ++i) {
      const int64_t kv_len = (m.kv_indptr[i + 1] - m.kv_indptr[i]).value();
      if (end[i] != kv_len) {
        return absl::InvalidArgumentError(absl::StrCat(
            "checked mode: the split-KV plan's items of sequence ", i, " end at ", end[i],
            ", its KV length is ", kv_len, " (a plan made for another batch?)"));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace attnmeta
