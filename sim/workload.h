// Workload (workload.proto): loading, checking, and the embedded default workload.

#ifndef ATTNMETA_SIM_WORKLOAD_H_
#define ATTNMETA_SIM_WORKLOAD_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "attention/graph/backend_config.pb.h"
#include "kvcache/units.h"
#include "sim/workload.pb.h"

namespace attnmeta {

// What the simulator holds in host memory at most for one run: its graph buffers, what it keeps
// per slot of its pool (float K and V, and a checked forward's query rows, outputs and K/V
// scratch, at most one row of each per slot) and its req_to_token table, together.
inline constexpr int64_t kMaxSimulatedBytes = int64_t{4} << 30;

// OK, or InvalidArgument whose message starts with the path of the first bad field
// ("scenarios[1].requests[3].prompt_len: ..."): no page sizes or scenarios, a page size out of
// range, a negative check_steps, a scenario name that is not [A-Za-z0-9_]+ or repeats, a backend
// that ValidateBackendConfig rejects at some page size or whose buffers ComputeBufferPlan refuses,
// graph buffers, per-slot floats and req_to_token rows (ReqToTokenWidth) that take more than
// kMaxSimulatedBytes together, a pool of less than one page or of more than 2^31 slots,
// non-positive max_running_requests, chunked_prefill_tokens or max_steps, speculative settings
// without top-k, steps or an acceptance probability in [0, 1] (NaN is not), more than 64 draft
// tokens, a request with a negative arrival or one not before max_steps, a non-positive prompt
// or output,
// prompt + output beyond max_context_len, a request that needs more pages than the pool has, a
// shared prefix outside [1, prompt_len] or without a group, and requests of one group with
// different shared prefixes.
absl::Status ValidateWorkload(const Workload& workload);

// Parses text format. InvalidArgument naming the line and column of a syntax error or an
// unknown field. The workload is not validated (a caller may change it first).
absl::StatusOr<Workload> ParseWorkloadText(absl::string_view text);

// ParseWorkloadText, then ValidateWorkload: either's error.
absl::StatusOr<Workload> ParseWorkload(absl::string_view text);

// The default workload, compiled in (sim/default_workload.textproto).
absl::string_view DefaultWorkloadText();

// How many token slots a row of the simulator's req_to_token table holds: a request's context,
// the verify tree's slots and, with EAGLE, the draft runs (MaxDraftRowTokens).
// REQUIRES: the scenario's backend passes ValidateBackendConfig at `page_size`, and with
// draft_tokens > 0 has topk >= 1 and steps >= 1.
TokenCount ReqToTokenWidth(const Scenario& scenario, PageSize page_size);

// The scenario's backend with `page_size`. REQUIRES: ValidateWorkload passed.
BackendConfig ScenarioConfig(const Scenario& scenario, PageSize page_size);

}  // namespace attnmeta

#endif  // ATTNMETA_SIM_WORKLOAD_H_
