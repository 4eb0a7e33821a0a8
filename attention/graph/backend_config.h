// BackendConfig (backend_config.proto): what the graph layer sizes its fixed buffers from.

#ifndef ATTNMETA_ATTENTION_GRAPH_BACKEND_CONFIG_H_
#define ATTNMETA_ATTENTION_GRAPH_BACKEND_CONFIG_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "attention/graph/backend_config.pb.h"
#include "attention/metadata/split_kv_planner.h"
#include "kvcache/units.h"

namespace attnmeta {

// OK, or InvalidArgument whose message starts with the first bad field's name: sizes that
// are zero or negative, a max_context_len beyond int32, a page size PageSize does not accept, num_kv_heads not dividing
// num_q_heads, no KV dtype, split-KV options out of the planner's range or without a layout,
// negative speculative settings (top-k without steps, or steps without top-k), capture batch
// sizes outside [1, max_batch_size] or not strictly increasing, max_query_rows_per_request
// negative or above max_context_len + draft_tokens, and a row of token slots
// (max_context_len rounded up to pages, plus draft tokens) beyond int32.
absl::Status ValidateBackendConfig(const BackendConfig& config);

// Parses text format and validates; InvalidArgument for either failure.
absl::StatusOr<BackendConfig> ParseBackendConfig(absl::string_view text);

// Derived values of a validated config.
// REQUIRES: ValidateBackendConfig(config).ok().
PageSize ConfigPageSize(const BackendConfig& config);
// Query rows one request brings at most (max_query_rows_per_request, 1 when unset).
TokenCount MaxQueryRowsPerRequest(const BackendConfig& config);
// Query rows one request brings at most to any replayed forward: MaxQueryRowsPerRequest, or
// draft-extend's draft_tokens when more. The split-KV buffers are sized by it.
TokenCount MaxReplayQueryRowsPerRequest(const BackendConfig& config);
// A request's context in whole pages: max_context_len rounded up to the page size.
// REQUIRES: the config's max_context_len and page_size are valid (ValidateBackendConfig checks
// them before it asks for KvRowTokens).
TokenCount ContextRowTokens(const BackendConfig& config);
// R, a request's row of token slots in the graph's kv_indices: ContextRowTokens plus the
// draft tokens (the verify tree's slots past the context). ValidateBackendConfig bounds it,
// ComputeBufferPlan sizes kv_indices by it. REQUIRES: as ContextRowTokens, draft_tokens >= 0.
TokenCount KvRowTokens(const BackendConfig& config);
// The split-KV planner options of the config's split-KV consumer.
SplitKvOptions ConfigSplitKvOptions(const BackendConfig& config);

}  // namespace attnmeta

#endif  // ATTNMETA_ATTENTION_GRAPH_BACKEND_CONFIG_H_
