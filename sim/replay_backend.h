// ReplayBackend: where a simulator run's GraphState writes its fixed buffers. "cpu": host
// memory and the host metadata writer. "gpu" (in a build with a GPU backend): device memory
// and the metadata kernels captured in HIP/CUDA graphs, reading a device copy of
// req_to_token; and the attention kernels, which read a replay's metadata where the replay
// left it.

#ifndef ATTNMETA_SIM_REPLAY_BACKEND_H_
#define ATTNMETA_SIM_REPLAY_BACKEND_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "attention/graph/device_memory.h"
#include "attention/graph/metadata_writer.h"
#include "attention/metadata/forward_metadata.h"
#include "attention/metadata/reference_attention.h"
#include "attention/metadata/split_kv_planner.h"
#include "kvcache/req_to_token_pool.h"
#include "kvcache/units.h"

namespace attnmeta {

// A replayed forward, as a backend's attention kernels read it: its metadata where the replay
// left it (the backend's memory) and its query rows.
struct ReplayAttentionInputs {
  AttentionDims dims;
  PageSize page_size = *PageSize::Create(1);
  // The real rows (ReplayResult::metadata, or one draft-decode step's).
  ForwardMetadataView metadata;
  // [qo_indptr[bs]][num_q_heads][head_dim]: the real query rows, on the host.
  absl::Span<const float> q;
  // A decode replay's split-KV plan (split_kv.work_items == 0: none): the whole bucket's
  // metadata (ReplayResult::padded, which the plan covers), the plan's counts and layout, and
  // the graph buffers that hold its items.
  ForwardMetadataView padded;
  SplitKvPlanCounts split_kv;
  KvLayout split_layout = KvLayout::LinearPerToken();
  SplitKvPlanSpans split_buffers;
};

// One attention path's outputs over the real query rows.
struct ReplayAttentionOutput {
  std::string path;        // "token-level", "page-table" or "split-KV", as the CPU reference's
  std::vector<float> out;  // [rows][num_q_heads][head_dim]
  std::vector<float> lse;  // [rows][num_q_heads], natural log; -inf for a row that sees nothing
};

class ReplayBackend {
 public:
  virtual ~ReplayBackend() = default;

  virtual DeviceMemory& memory() = 0;
  virtual MetadataWriter& writer() = 0;
  // Makes what the writer reads for req_to_token equal to `table` (the host writer reads the
  // table itself; the GPU backend copies it to the device). Called before every replay.
  virtual absl::Status SyncReqToToken(const ReqToTokenPool& table) = 0;
  // After a replay: OK, or the first problem the backend saw (the host memory's canaries, a
  // violation the device kernels recorded).
  virtual absl::Status CheckAfterReplay() = 0;

  // Whether AttendReplay runs attention kernels on forwards of `dims` (the GPU backend: the
  // head counts and head dims its kernels take). The host backend has none: its replays are
  // checked by the CPU reference attention over the metadata read back.
  virtual bool AttendsReplays(const AttentionDims& dims) const { return false; }
  // Makes the K and V pools the kernels read equal to `k` and `v` ([slots][num_kv_heads]
  // [head_dim] each, rounded to the kernels' element type).
  virtual absl::Status SyncKvPool(absl::Span<const float> k, absl::Span<const float> v) {
    return absl::UnimplementedError("this replay backend runs no attention kernels");
  }
  // The attention of a replayed forward by each path its metadata offers: token-level, the
  // page table when it has one, and a decode's split-KV plan. REQUIRES: AttendsReplays(in.dims),
  // SyncKvPool since the pool last changed.
  virtual absl::StatusOr<std::vector<ReplayAttentionOutput>> AttendReplay(
      const ReplayAttentionInputs& in) {
    return absl::UnimplementedError("this replay backend runs no attention kernels");
  }
};

// The backend named `name` for a run over `table` and a pool of `pool_slots` slots.
// InvalidArgument naming the backends this build has for another name; the GPU backend's
// errors (FailedPrecondition when no device is visible).
absl::StatusOr<std::unique_ptr<ReplayBackend>> MakeReplayBackend(absl::string_view name,
                                                                 const ReqToTokenPool& table,
                                                                 TokenCount pool_slots);

// The names MakeReplayBackend accepts in this build.
std::vector<std::string> ReplayBackendNames();

}  // namespace attnmeta

#endif  // ATTNMETA_SIM_REPLAY_BACKEND_H_
