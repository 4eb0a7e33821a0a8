#include "sim/host_replay_backend.h"

#include "attention/graph/host_device_memory.h"
#include "attention/graph/host_metadata_writer.h"

namespace attnmeta {
namespace {

class HostReplayBackend : public ReplayBackend {
 public:
  DeviceMemory& memory() override { return memory_; }
  MetadataWriter& writer() override { return writer_; }
  absl::Status SyncReqToToken(const ReqToTokenPool&) override { return absl::OkStatus(); }
  absl::Status CheckAfterReplay() override { return memory_.VerifyCanaries(); }

 private:
  HostDeviceMemory memory_;
  HostMetadataWriter writer_;
};

}  // namespace

std::unique_ptr<ReplayBackend> MakeHostReplayBackend() {
  return std::make_unique<HostReplayBackend>();
}

}  // namespace attnmeta
