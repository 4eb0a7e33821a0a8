// ReplayBackend: where a simulator run's GraphState writes its fixed buffers. "cpu": host
// memory and the host metadata writer. "gpu" (in a build with a GPU backend): device memory
// and the metadata kernels captured in HIP/CUDA graphs, reading a device copy of
// req_to_token.

#ifndef ATTNMETA_SIM_REPLAY_BACKEND_H_
#define ATTNMETA_SIM_REPLAY_BACKEND_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "attention/graph/device_memory.h"
#include "attention/graph/metadata_writer.h"
#include "kvcache/req_to_token_pool.h"
#include "kvcache/units.h"

namespace attnmeta {

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
