// MakeReplayBackend in a build without a GPU backend: "cpu" only.

#include "absl/strings/str_cat.h"
#include "sim/host_replay_backend.h"
#include "sim/replay_backend.h"

namespace attnmeta {

absl::StatusOr<std::unique_ptr<ReplayBackend>> MakeReplayBackend(absl::string_view name,
                                                                 const ReqToTokenPool&,
                                                                 TokenCount) {
  if (name == "cpu") return MakeHostReplayBackend();
  return absl::InvalidArgumentError(absl::StrCat(
      "backend \"", name, "\": this build has only \"cpu\" (build with --config=cuda or "
      "--config=rocm for \"gpu\")"));
}

std::vector<std::string> ReplayBackendNames() { return {"cpu"}; }

}  // namespace attnmeta
