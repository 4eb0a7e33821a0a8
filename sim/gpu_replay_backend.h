// The "gpu" ReplayBackend: HipDeviceMemory and DeviceMetadataWriter on one stream, the staged
// inputs applied inside the writer's launch (StagedUploads), with a device copy of
// req_to_token refreshed before every replay.

#ifndef ATTNMETA_SIM_GPU_REPLAY_BACKEND_H_
#define ATTNMETA_SIM_GPU_REPLAY_BACKEND_H_

#include <memory>

#include "absl/status/statusor.h"
#include "kvcache/req_to_token_pool.h"
#include "kvcache/units.h"
#include "sim/replay_backend.h"

namespace attnmeta {

// FailedPrecondition when no GPU is visible; ResourceExhausted when the staged uploads or the
// device table cannot be allocated; DeviceMetadataWriter::Create's InvalidArgument or
// OutOfRange (a table or pool it cannot address); Internal for a runtime failure.
absl::StatusOr<std::unique_ptr<ReplayBackend>> MakeGpuReplayBackend(const ReqToTokenPool& table,
                                                                    TokenCount pool_slots);

}  // namespace attnmeta

#endif  // ATTNMETA_SIM_GPU_REPLAY_BACKEND_H_
