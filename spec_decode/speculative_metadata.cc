#include "spec_decode/speculative_metadata.h"

#include <algorithm>
#include <cstdint>
#include <limits>

#include "absl/strings/str_cat.h"
#include "attention/metadata/lengths.h"
#include "attention/metadata/mode_rules.h"
#include "attention/metadata/request_rows.h"
#include "attention/metadata/validator.h"

namespace attnmeta {
namespace {

// All steps of a draft-decode together: each step's kv_indices are bounded by int32 offsets
// (CheckDraftDecodeBatch), but not their sum, which grows with the square of the steps.
constexpr int64_t kMaxDraftDecodeIndices = std::numeric_limits<int32_t>::max();

absl::Status CheckQueryRows(absl::string_view mode, int64_t rows, TokenCount num_query_rows) {
  if (rows != num_query_rows.value()) {
    return absl::InvalidArgumentError(absl::StrCat(
        mode, ": the batch has ", rows, " query rows (qo_indptr[bs]) but the query tensor has ",
        num_query_rows.value()));
  }
  return absl::OkStatus();
}

BuildOptions ToBuildOptions(const SpecBuildOptions& options, TokenCount num_query_rows) {
  BuildOptions b;
  b.page_table = options.page_table;
  if (options.check_pool_slots.has_value()) {
    b.check = MetadataCheck{*options.check_pool_slots, num_query_rows};
  }
  return b;
}

}  // namespace

absl::StatusOr<ForwardMetadata> BuildDraftExtendMetadata(const DraftExtendBatch& batch,
                                                         const ReqToTokenPool& pool,
                                                         PageSize page_size,
                                                         const SpecBuildOptions& options) {
  const size_t bs = batch.req_rows.size();
  const int64_t per_req = batch.num_tokens_per_req.value();
  const bool fixed = per_req != 0;
  if (per_req < 0 || per_req > std::numeric_limits<int32_t>::max() ||
      fixed == !batch.accept_lens.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "draft-extend: give either num_tokens_per_req in [1, INT32_MAX] or accept_lens, got ",
        per_req, " and ", batch.accept_lens.size(), " accepted lengths"));
  }
  if (!fixed && batch.accept_lens.size() != bs) {
    return absl::InvalidArgumentError(absl::StrCat("draft-extend: ", batch.accept_lens.size(),
                                                   " accepted lengths for ", bs, " requests"));
  }
  std::vector<TokenLength> q_lens(bs, TokenLength(static_cast<int32_t>(per_req)));
  // accepted + 1 is a query length: the bound keeps it within int32.
  const int64_t accept_bound =
      std::min<int64_t>(batch.num_draft_tokens.value(), std::numeric_limits<int32_t>::max());
  int64_t rows = 0;
  for (size_t i = 0; i < bs; ++i) {
    if (!fixed) {
      const int32_t accepted = batch.accept_lens[i].value();
      if (accepted < 0 || accepted >= accept_bound) {
        return absl::InvalidArgumentError(absl::StrCat("draft-extend: request ", i, " accepted ",
                                                       accepted, " draft tokens, outside [0, ",
                                                       accept_bound, ")"));
      }
      q_lens[i] = TokenLength(accepted + 1);
    }
    rows += q_lens[i].value();
  }
  if (absl::Status s = CheckQueryRows("draft-extend", rows, batch.num_query_rows); !s.ok()) {
    return s;
  }
  ForwardBatch fb;
  fb.mode = ForwardMode::kDraftExtend;
  fb.req_rows = batch.req_rows;
  fb.kv_lens = batch.kv_lens;
  fb.q_lens = q_lens;
  return BuildForwardMetadata(fb, pool, page_size, ToBuildOptions(options, batch.num_query_rows));
}

absl::StatusOr<ForwardMetadata> BuildTargetVerifyMetadata(
    const ReqToTokenPool& pool, absl::Span<const ReqPoolIndex> req_rows, const VerifyTree& tree,
    MaskLayout mask_layout, TokenCount num_query_rows, PageSize page_size,
    const SpecBuildOptions& options) {
  const int64_t bs = tree.batch_size();
  const int32_t n = tree.num_draft_tokens.value();
  if (static_cast<int64_t>(req_rows.size()) != bs) {
    return absl::InvalidArgumentError(absl::StrCat("target-verify: ", req_rows.size(),
                                                   " request rows for a tree of ", bs,
                                                   " requests"));
  }
  if (mask_layout == MaskLayout::kNone) {
    return absl::InvalidArgumentError("target-verify: the tree needs a mask layout");
  }
  if (absl::Status s = CheckQueryRows("target-verify", bs * n, num_query_rows); !s.ok()) return s;
  std::vector<TokenLength> q_lens(bs, TokenLength(n));
  std::vector<TokenLength> kv_lens(bs);
  for (int64_t b = 0; b < bs; ++b) {
    const int64_t kv = int64_t{tree.seq_lens[b].value()} + n;
    if (kv > std::numeric_limits<int32_t>::max()) {
      return absl::OutOfRangeError(absl::StrCat("target-verify: request ", b, " has ", kv,
                                                " KV tokens, beyond int32"));
    }
    kv_lens[b] = TokenLength(static_cast<int32_t>(kv));
  }
  ForwardBatch fb;
  fb.mode = ForwardMode::kTargetVerify;
  fb.req_rows = req_rows;
  fb.kv_lens = kv_lens;
  fb.q_lens = q_lens;
  fb.tree_mask = tree.sees;
  BuildOptions b = ToBuildOptions(options, num_query_rows);
  b.mask_layout = mask_layout;
  return BuildForwardMetadata(fb, pool, page_size, b);
}

absl::StatusOr<std::vector<ForwardMetadata>> BuildDraftDecodeMetadata(
    const ReqToTokenPool& pool, absl::Span<const ReqPoolIndex> req_rows,
    absl::Span<const TokenLength> seq_lens, DraftDecodeShape shape, TokenCount num_query_rows,
    PageSize page_size, const SpecBuildOptions& options) {
  // What the steps would refuse, refused before their arrays are allocated (a shape's topk
  // and steps are the caller's, up to INT32_MAX each).
  if (absl::Status s = CheckDraftDecodeBatch(pool, req_rows, seq_lens, shape, page_size);
      !s.ok()) {
    return s;
  }
  // Distinct rows, as every builder and graph replay ask: two requests on one row would draft
  // into one row's slots, and the steps' arrays are sized by the rows.
  if (absl::Status s = CheckDistinctRows(req_rows); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("draft-decode: ", s.message()));
  }
  // Not empty (the validator's rule): the steps' arrays would be sized by the shape alone.
  if (absl::Status s =
          CheckModeBatchSize(ForwardMode::kDraftDecode, static_cast<int64_t>(req_rows.size()));
      !s.ok()) {
    return s;
  }
  const size_t branches = req_rows.size() * shape.topk;
  if (absl::Status s = CheckQueryRows("draft-decode", static_cast<int64_t>(branches),
                                      num_query_rows);
      !s.ok()) {
    return s;
  }
  // Each step holds at least one more entry than the one before, so this loop ends within
  // about 2^16 steps.
  int64_t total = 0;
  for (int32_t step = 0; step < shape.steps; ++step) {
    total += DraftStepTokens(seq_lens, shape, step).value();
    if (total > kMaxDraftDecodeIndices) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "draft-decode: ", shape.steps, " steps of ", branches, " branches need more than ",
          kMaxDraftDecodeIndices, " kv_indices entries in all (", total, " by step ", step, ")"));
    }
  }
  std::vector<ForwardMetadata> steps(shape.steps);
  for (int32_t step = 0; step < shape.steps; ++step) {
    ForwardMetadata& m = steps[step];
    m.mode = ForwardMode::kDraftDecode;
    m.kv_lens.resize(branches);
    m.kv_indptr.resize(branches + 1);
    m.qo_indptr.resize(branches + 1);
    m.kv_last_page_len.resize(branches);
    m.kv_indices.resize(DraftStepTokens(seq_lens, shape, step).value());
    if (absl::Status s = BuildDraftDecodeStep(
            pool, req_rows, seq_lens, shape, step, page_size,
            DraftDecodeStepSpans{absl::MakeSpan(m.kv_lens), absl::MakeSpan(m.kv_indptr),
                                 absl::MakeSpan(m.qo_indptr), absl::MakeSpan(m.kv_last_page_len),
                                 absl::MakeSpan(m.kv_indices)});
        !s.ok()) {
      return s;
    }
    m.max_q_len = TokenCount(branches > 0 ? 1 : 0);
    m.max_kv_len = MaxLength(m.kv_lens);
    if (options.check_pool_slots.has_value()) {
      ValidationContext ctx{*options.check_pool_slots, page_size, num_query_rows};
      ctx.check_slot_ownership = true;
      if (absl::Status s = ValidateForwardMetadata(m.view(), ctx); !s.ok()) {
        return absl::Status(s.code(), absl::StrCat("draft-decode step ", step, ": ", s.message()));
      }
    }
  }
  return steps;
}

}  // namespace attnmeta
