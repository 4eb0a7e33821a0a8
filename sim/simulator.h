// The serving simulator behind attnmeta_sim: a small scheduler drives a Workload through the
// whole stack, step by step, and checks everything it can at every step.
//
// For every scenario and page size: a PagedTokenAllocator with a shuffled free list and a
// ReqToTokenPool hold the requests; a GraphState on the options' replay backend (host memory
// and the host writer, or device memory and the metadata kernels in captured graphs) captures
// and replays the graph-able modes; what the backend's writer cannot write (Unimplemented) is
// counted, not replayed. Each step the scheduler runs one of:
//  - a prefill step: chunked prefill under a token budget, requests admitted while rows and
//    pages last (fewer when the pool is short: a backoff), shared prefixes taken from a prefix
//    cache of whole pages; with mixed_chunk the running decodes join it (a mixed batch);
//  - a decode step: every running request decodes one token (decode, graph-replayed when a
//    capture size holds the batch), or, with speculative decoding, one EAGLE round:
//    draft-decode over top-k branches (its slots taken under an allocator checkpoint and
//    rolled back), target-verify over a tree with the FULL mask, greedy acceptance against an
//    acceptance model, the accepted tokens' K/V moved to their positions and the rest freed,
//    then a variable draft-extend; when the pool cannot hold the step, the newest requests are
//    retracted (freed and queued again), and no request is admitted until one finishes;
//  - an idle step when nothing has arrived yet.
// Every forward's metadata is built eagerly and validated (slot ownership included); a
// replayed one is read back to the host, validated, and must equal the eager one
// (DiffMetadata). In the checked steps
// the attention of every metadata path (token-level, page table, split-KV) over the K/V pool
// is compared with dense attention over each request's logical tokens, which the simulator
// tracks without slots; a backend with attention kernels (the GPU's) also runs them over each
// replayed forward's metadata where the replay left it, compared with dense attention
// (kMaxDeviceRelativeError; their lse within kMaxDeviceLseError). The first failure stops the run
// and is reported, with a MetadataSnapshot of the failing forward when a dump directory is given.

#ifndef ATTNMETA_SIM_SIMULATOR_H_
#define ATTNMETA_SIM_SIMULATOR_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "sim/report.pb.h"
#include "sim/workload.pb.h"

namespace attnmeta {

class ReplayBackend;

struct SimOptions {
  // Where graph replays run (replay_backend.h): "cpu", or "gpu" in a GPU build.
  std::string backend = "cpu";
  std::vector<int64_t> page_sizes;  // empty: the workload's
  std::string scenario;             // non-empty: run only the workload's scenario of this name
  int64_t max_steps = 0;            // > 0: stop each run after this many steps (not a failure)
  std::optional<uint64_t> seed;     // replaces the workload's seed
  std::string dump_dir;             // where snapshots go; empty: none are written
  bool dump_all = false;            // a snapshot of every forward, not only a failing one
  // Test-only: at this step of every run, the eager metadata of the first forward whose
  // sequence 0 has two KV tokens or more is corrupted after it is built (its token 0 pointed
  // at token 1's slot), as a builder bug would; the run must then fail. -1: off.
  int64_t inject_fault_step = -1;
  // Test-only: makes each run's replay backend in place of the one `backend` names (which the
  // report still shows). Null: MakeReplayBackend(backend).
  std::function<std::unique_ptr<ReplayBackend>()> make_backend;
  std::ostream* progress = nullptr;  // a progress line every 100 steps; null: quiet
};

// The relative L2 error above which attention does not match dense attention. The reference
// paths and dense attention accumulate in double over the same float K/V, so a correct
// step is near 1e-7; one misplaced token moves it by orders of magnitude more.
inline constexpr double kMaxRelativeError = 1e-4;
// The bound for the attention kernels of the GPU backend, per query row: they read bf16 K, V
// and Q (the run's values are then bf16 numbers, for the CPU paths too), multiply the softmax
// weights into V in bf16 and write bf16 outputs, about 2.4e-3 for a correct row by estimate. One
// token too many or too few moves a row of n tokens by about 1 / sqrt(n) (0.05 at 400).
inline constexpr double kMaxDeviceRelativeError = 1e-2;
// The bound on |lse - dense lse| / (1 + |dense lse|) per query row and head for the attention
// kernels' log-sum-exp (natural log): they compute it in fp32 from the same bf16 inputs, so a
// correct one is within about 1e-5; lse in log2 units, without the softmax scale, or of
// another row is off by far more.
inline constexpr double kMaxDeviceLseError = 1e-3;

// The workload RunWorkload runs: `workload` with the options' page sizes, validated, with the
// options checked. InvalidArgument: the workload does not validate, a page size of the options
// is outside [1, 2^20] or makes a scenario invalid, max_steps < 0, dump_all without dump_dir, a
// backend this build does not have, a scenario name the workload does not have. With a
// scenario named, the workload holds only that scenario. Checks only: it starts no backend.
absl::StatusOr<Workload> PrepareWorkload(const Workload& workload, const SimOptions& options);

// Runs every scenario of PrepareWorkload(workload, options) at every page size. Before anything
// is run: PrepareWorkload's error, or the backend's when it cannot start (FailedPrecondition for
// "gpu" with no GPU visible). A run that fails is reported as failed (RunReport::failure), not as
// an error.
absl::StatusOr<SimReport> RunWorkload(const Workload& workload, const SimOptions& options);

// The report as a table: one line per run, then the verdict.
std::string FormatReportTable(const SimReport& report);
// The report as JSON (proto3 JSON mapping of report.proto, field names as declared).
absl::StatusOr<std::string> ReportToJson(const SimReport& report);

}  // namespace attnmeta

#endif  // ATTNMETA_SIM_SIMULATOR_H_
