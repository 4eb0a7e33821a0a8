#include "attention/graph/backend_config.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>

#include "absl/strings/str_cat.h"
#include "google/protobuf/text_format.h"

namespace attnmeta {
namespace {

absl::Status Bad(absl::string_view field, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", why));
}

// Bounds of the split-KV planner's options (split_kv_planner.h).
constexpr int64_t kMaxUnits = int64_t{1} << 20;
constexpr int64_t kMaxSplitTokens = int64_t{1} << 30;

}  // namespace

absl::Status ValidateBackendConfig(const BackendConfig& c) {
  if (c.max_batch_size() < 1) return Bad("max_batch_size", absl::StrCat(c.max_batch_size(), " < 1"));
  if (c.max_context_len() < 1 || c.max_context_len() > std::numeric_limits<int32_t>::max()) {
    return Bad("max_context_len",
               absl::StrCat(c.max_context_len(), " outside [1, INT32_MAX] (int32 positions)"));
  }
  if (absl::StatusOr<PageSize> ps = PageSize::Create(c.page_size()); !ps.ok()) {
    return Bad("page_size", ps.status().message());
  }
  if (c.num_q_heads() < 1) return Bad("num_q_heads", absl::StrCat(c.num_q_heads(), " < 1"));
  if (c.num_kv_heads() < 1 || c.num_q_heads() % c.num_kv_heads() != 0) {
    return Bad("num_kv_heads", absl::StrCat(c.num_kv_heads(), " does not divide num_q_heads ",
                                            c.num_q_heads()));
  }
  if (c.head_dim() < 1) return Bad("head_dim", absl::StrCat(c.head_dim(), " < 1"));
  // Open proto3 enums keep values outside the declared set (a newer peer's, a cast).
  if (!KvDtype_IsValid(c.kv_dtype())) {
    return Bad("kv_dtype", absl::StrCat(static_cast<int>(c.kv_dtype()), " is not a KvDtype"));
  }
  if (c.kv_dtype() == KV_DTYPE_UNSPECIFIED) return Bad("kv_dtype", "unspecified");
  const SplitKvConsumer& split = c.consumers().split_kv();
  if (split.enabled()) {
    if (split.num_units() < 1 || split.num_units() > kMaxUnits) {
      return Bad("consumers.split_kv.num_units",
                 absl::StrCat(split.num_units(), " outside [1, ", kMaxUnits, "]"));
    }
    if (split.kv_granularity() < 1 || split.kv_granularity() > kMaxSplitTokens) {
      return Bad("consumers.split_kv.kv_granularity",
                 absl::StrCat(split.kv_granularity(), " outside [1, 2^30]"));
    }
    if (split.q_tile() < 1 || split.q_tile() > kMaxSplitTokens) {
      return Bad("consumers.split_kv.q_tile", absl::StrCat(split.q_tile(), " outside [1, 2^30]"));
    }
    if (!SplitKvLayout_IsValid(split.layout())) {
      return Bad("consumers.split_kv.layout",
                 absl::StrCat(static_cast<int>(split.layout()), " is not a SplitKvLayout"));
    }
    if (split.layout() == SPLIT_KV_LAYOUT_UNSPECIFIED) {
      return Bad("consumers.split_kv.layout", "unspecified: the consumer's layout is an input");
    }
  }
  const SpeculativeConfig& spec = c.speculative();
  if (spec.draft_tokens() < 0) return Bad("speculative.draft_tokens", "negative");
  if (spec.topk() < 0) return Bad("speculative.topk", "negative");
  if (spec.steps() < 0) return Bad("speculative.steps", "negative");
  if ((spec.topk() > 0) != (spec.steps() > 0)) {
    return Bad("speculative.topk", absl::StrCat("top-k ", spec.topk(), " with steps ",
                                                spec.steps(), ": both or neither"));
  }
  // One request's row of token slots must stay int32-addressable (the plan checks the
  // buffers; these name the field that overflows first: a context within a page of INT32_MAX
  // rounds up past it with no draft tokens at all).
  const int64_t context_row = ContextRowTokens(c).value();
  if (context_row > std::numeric_limits<int32_t>::max()) {
    return Bad("max_context_len",
               absl::StrCat(c.max_context_len(), " rounded up to pages of ", c.page_size(), " is ",
                            context_row, " slots per request, beyond int32"));
  }
  const int64_t row = KvRowTokens(c).value();
  if (row > std::numeric_limits<int32_t>::max()) {
    return Bad("speculative.draft_tokens",
               absl::StrCat("max_context_len rounded up to pages plus ", spec.draft_tokens(),
                            " draft tokens is ", row, " slots per request, beyond int32"));
  }
  int64_t previous = 0;
  for (int i = 0; i < c.capture_batch_sizes_size(); ++i) {
    const int64_t b = c.capture_batch_sizes(i);
    if (b < 1 || b > c.max_batch_size() || b <= previous) {
      return Bad(absl::StrCat("capture_batch_sizes[", i, "]"),
                 absl::StrCat(b, ": need strictly increasing sizes in [1, max_batch_size = ",
                              c.max_batch_size(), "]"));
    }
    previous = b;
  }
  if (c.max_query_rows_per_request() < 0 ||
      c.max_query_rows_per_request() > c.max_context_len() + spec.draft_tokens()) {
    return Bad("max_query_rows_per_request",
               absl::StrCat(c.max_query_rows_per_request(), " outside [0, max_context_len + "
                                                            "draft_tokens]"));
  }
  return absl::OkStatus();
}

absl::StatusOr<BackendConfig> ParseBackendConfig(absl::string_view text) {
  BackendConfig c;
  if (!google::protobuf::TextFormat::ParseFromString(std::string(text), &c)) {
    return absl::InvalidArgumentError("not a BackendConfig in text format");
  }
  if (absl::Status s = ValidateBackendConfig(c); !s.ok()) return s;
  return c;
}

PageSize ConfigPageSize(const BackendConfig& c) { return *PageSize::Create(c.page_size()); }

TokenCount MaxQueryRowsPerRequest(const BackendConfig& c) {
  return TokenCount(c.max_query_rows_per_request() == 0 ? 1 : c.max_query_rows_per_request());
}

TokenCount MaxReplayQueryRowsPerRequest(const BackendConfig& c) {
  return std::max(MaxQueryRowsPerRequest(c), TokenCount(c.speculative().draft_tokens()));
}

TokenCount ContextRowTokens(const BackendConfig& c) {
  const PageSize ps = ConfigPageSize(c);
  return TokensInPages(PagesForTokensCeil(TokenCount(c.max_context_len()), ps), ps);
}

TokenCount KvRowTokens(const BackendConfig& c) {
  return ContextRowTokens(c) + TokenCount(c.speculative().draft_tokens());
}

SplitKvOptions ConfigSplitKvOptions(const BackendConfig& c) {
  const SplitKvConsumer& split = c.consumers().split_kv();
  SplitKvOptions o;
  o.layout = split.layout() == SPLIT_KV_LAYOUT_PAGED ? KvLayout::Paged(ConfigPageSize(c))
                                                     : KvLayout::LinearPerToken();
  o.num_units = split.num_units();
  o.kv_granularity = TokenCount(split.kv_granularity());
  o.q_tile = TokenCount(split.q_tile());
  return o;
}

}  // namespace attnmeta
