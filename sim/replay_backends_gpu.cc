// MakeReplayBackend in a build with a GPU backend: "cpu" and "gpu".

#include "absl/strings/str_cat.h"
#include "sim/gpu_replay_backend.h"
#include "sim/host_replay_backend.h"
#include "sim/replay_backend.h"

namespace attnmeta {

absl::StatusOr<std::unique_ptr<ReplayBackend>> MakeReplayBackend(absl::string_view name,
                                                                 const ReqToTokenPool& table,
                                                                 TokenCount pool_slots) {
  if (name == "cpu") return MakeHostReplayBackend();
  if (name == "gpu") return MakeGpuReplayBackend(table, pool_slots);
  return absl::InvalidArgumentError(
      absl::StrCat("backend \"", name, "\": this build has \"cpu\" and \"gpu\""));
}

std::vector<std::string> ReplayBackendNames() { return {"cpu", "gpu"}; }

}  // namespace attnmeta
