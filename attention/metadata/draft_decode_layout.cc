#include "attention/metadata/draft_decode_layout.h"

#include <algorithm>
#include <limits>

#include "absl/strings/str_cat.h"
#include "attention/metadata/lengths.h"

namespace attnmeta {

absl::Status CheckDraftDecodeShape(DraftDecodeShape shape) {
  if (shape.topk < 1 || shape.steps < 1) {
    return absl::InvalidArgumentError(absl::StrCat("draft-decode: topk ", shape.topk, " and steps ",
                                                   shape.steps, " must be >= 1"));
  }
  return absl::OkStatus();
}

TokenCount DraftSourcePosition(TokenLength seq_len, int32_t branch, DraftDecodeShape shape,
                               PageSize page_size) {
  const int64_t len = seq_len.value();
  const int64_t ps = page_size.tokens();
  if (ps == 1 || shape.topk == 1) return TokenCount(len + int64_t{branch} * shape.steps);
  const int64_t pages_per_branch = (len % ps + shape.steps + ps - 1) / ps;
  return TokenCount((len / ps) * ps + int64_t{branch} * pages_per_branch * ps + len % ps);
}

TokenCount DraftRowTokens(TokenLength seq_len, DraftDecodeShape shape, PageSize page_size) {
  return DraftSourcePosition(seq_len, shape.topk - 1, shape, page_size) + TokenCount(shape.steps);
}

TokenCount MaxDraftRowTokens(TokenLength max_seq_len, DraftDecodeShape shape, PageSize page_size) {
  // DraftRowTokens grows by page_size when seq_len does, so the longest is among the last
  // page's lengths.
  TokenCount row(0);
  for (int64_t len = std::max<int64_t>(0, max_seq_len.value() - page_size.tokens() + 1);
       len <= max_seq_len.value(); ++len) {
    row = std::max(row, DraftRowTokens(TokenLength(static_cast<int32_t>(len)), shape, page_size));
  }
  return row;
}

TokenCount DraftStepTokens(absl::Span<const TokenLength> seq_lens, DraftDecodeShape shape,
                           int32_t step) {
  int64_t sum = 0;
  for (TokenLength l : seq_lens) sum += l.value();
  return TokenCount(sum * shape.topk +
                    static_cast<int64_t>(seq_lens.size()) * shape.topk * (int64_t{step} + 1));
}

absl::Status CheckDraftDecodeBatch(const ReqToTokenPool& pool, absl::Span<const ReqPoolIndex> rows,
                                   absl::Span<const TokenLength> seq_lens, DraftDecodeShape shape,
                                   PageSize page_size) {
  if (absl::Status s = CheckDraftDecodeShape(shape); !s.ok()) return s;
  // Every branch holds a token at every step, so more branches than INT32_MAX put the steps'
  // offsets beyond int32; within it, the sums below stay far from INT64_MAX.
  if (rows.size() > static_cast<size_t>(std::numeric_limits<int32_t>::max() / shape.topk)) {
    return absl::OutOfRangeError(absl::StrCat("draft-decode: ", rows.size(), " rows of ",
                                              shape.topk, " branches are beyond int32"));
  }
  if (seq_lens.size() != rows.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("draft-decode: ", rows.size(), " rows and ", seq_lens.size(), " seq_lens"));
  }
  for (size_t s = 0; s < seq_lens.size(); ++s) {
    if (seq_lens[s].value() < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("draft-decode: seq_lens[", s, "] = ", seq_lens[s].value(), " is negative"));
    }
  }
  // No request's draft run is longer than a row, whatever the batch (an empty one too).
  if (shape.steps > pool.max_context_len().value()) {
    return absl::OutOfRangeError(absl::StrCat("draft-decode: ", shape.steps,
                                              " steps, longer than a row of ",
                                              pool.max_context_len().value()));
  }
  const int64_t last = DraftStepTokens(seq_lens, shape, shape.steps - 1).value();
  if (last > std::numeric_limits<int32_t>::max()) {
    return absl::OutOfRangeError(absl::StrCat("draft-decode: the last step uses ", last,
                                              " kv_indices entries, beyond int32 offsets"));
  }
  for (size_t s = 0; s < rows.size(); ++s) {
    const int64_t row_tokens = DraftRowTokens(seq_lens[s], shape, page_size).value();
    absl::StatusOr<absl::Span<const TokenSlot>> row =
        pool.Read(rows[s], TokenCount(0), TokenCount(row_tokens));
    if (!row.ok()) {
      return absl::Status(row.status().code(),
                          absl::StrCat("draft-decode: request ", s, " reads positions [0, ",
                                       row_tokens, ") of its row: ", row.status().message()));
    }
  }
  return absl::OkStatus();
}

absl::Status BuildDraftDecodeStep(const ReqToTokenPool& pool, absl::Span<const ReqPoolIndex> rows,
                                  absl::Span<const TokenLength> seq_lens, DraftDecodeShape shape,
                                  int32_t step, PageSize page_size,
                                  const DraftDecodeStepSpans& out) {
  if (absl::Status s = CheckDraftDecodeBatch(pool, rows, seq_lens, shape, page_size); !s.ok()) {
    return s;
  }
  if (step < 0 || step >= shape.steps) {
    return absl::InvalidArgumentError(
        absl::StrCat("draft-decode: step ", step, " outside [0, ", shape.steps, ")"));
  }
  const size_t bs = rows.size();
  const size_t branches = bs * static_cast<size_t>(shape.topk);
  const int64_t total = DraftStepTokens(seq_lens, shape, step).value();
  if (out.kv_lens.size() != branches || out.kv_indptr.size() != branches + 1 ||
      out.qo_indptr.size() != branches + 1 || out.kv_last_page_len.size() != branches ||
      static_cast<int64_t>(out.kv_indices.size()) < total) {
    return absl::InvalidArgumentError(absl::StrCat(
        "draft-decode: outputs of ", out.kv_lens.size(), "/", out.kv_indptr.size(), "/",
        out.qo_indptr.size(), "/", out.kv_last_page_len.size(), " entries for ", branches,
        " branches, and a kv_indices of ", out.kv_indices.size(), " entries where step ", step,
        " needs ", total));
  }
  const int64_t iters = step + 1;
  out.kv_indptr[0] = TokenOffset(0);
  out.qo_indptr[0] = TokenOffset(0);
  int32_t offset = 0;
  for (size_t s = 0; s < bs; ++s) {
    const TokenLength len = seq_lens[s];
    const absl::Span<const TokenSlot> row = *pool.Read(
        rows[s], TokenCount(0), DraftRowTokens(len, shape, page_size));
    for (int32_t k = 0; k < shape.topk; ++k) {
      const size_t z = s * shape.topk + k;
      const TokenLength kv_len(static_cast<int32_t>(len.value() + iters));
      TokenSlot* dst = out.kv_indices.data() + offset;
      std::copy_n(row.data(), len.value(), dst);
      std::copy_n(row.data() + DraftSourcePosition(len, k, shape, page_size).value(), iters,
                  dst + len.value());
      out.kv_lens[z] = kv_len;
      out.kv_last_page_len[z] = LastPageLen(kv_len, page_size);
      offset += kv_len.value();
      out.kv_indptr[z + 1] = TokenOffset(offset);
      out.qo_indptr[z + 1] = TokenOffset(static_cast<int32_t>(z + 1));
    }
  }
  return absl::OkStatus();
}

}  // namespace attnmeta
