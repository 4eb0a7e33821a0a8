#include "sim/gpu_replay_backend.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "attention/kernels/device_metadata_writer.h"
#include "attention/kernels/hip_device_memory.h"
#include "attention/kernels/hip_port.h"
#include "attention/kernels/metadata_launchers.h"
#include "attention/kernels/staged_uploads.h"

namespace attnmeta {
namespace {

class GpuReplayBackend : public ReplayBackend {
 public:
  ~GpuReplayBackend() override {
    writer_.reset();
    if (table_.ptr != nullptr) memory_->Free(table_);
    memory_.reset();
    uploads_.reset();
    if (stream_ != nullptr) (void)hipStreamDestroy(stream_);
  }

  static absl::StatusOr<std::unique_ptr<ReplayBackend>> Create(const ReqToTokenPool& table,
                                                               TokenCount pool_slots) {
    int devices = 0;
    if (hipGetDeviceCount(&devices) != hipSuccess || devices == 0) {
      return absl::FailedPreconditionError("backend \"gpu\": no GPU is visible");
    }
    auto b = std::unique_ptr<GpuReplayBackend>(new GpuReplayBackend());
    if (hipStreamCreate(&b->stream_) != hipSuccess) {
      return absl::InternalError("backend \"gpu\": cannot create a stream");
    }
    // The replay's staged inputs (and the small table copies) ride in the writer's launch.
    absl::StatusOr<std::unique_ptr<StagedUploads>> uploads = StagedUploads::Create(b->stream_);
    if (!uploads.ok()) return uploads.status();
    b->uploads_ = *std::move(uploads);
    b->memory_ = std::make_unique<HipDeviceMemory>(b->stream_, b->uploads_.get());
    const int64_t bytes = static_cast<int64_t>(table.table().size() * sizeof(TokenSlot));
    absl::StatusOr<DeviceBuffer> t = b->memory_->Allocate("req_to_token", bytes);
    if (!t.ok()) return t.status();
    b->table_ = *t;
    DeviceReqToToken device_table{
        DeviceSpan<const TokenSlot>(static_cast<const TokenSlot*>(b->table_.ptr),
                                    table.table().size()),
        table.max_context_len()};
    DeviceMetadataWriter::Options options;
    options.uploads = b->uploads_.get();
    absl::StatusOr<std::unique_ptr<DeviceMetadataWriter>> writer =
        DeviceMetadataWriter::Create(device_table, pool_slots, b->stream_, options);
    if (!writer.ok()) return writer.status();
    b->writer_ = *std::move(writer);
    return std::unique_ptr<ReplayBackend>(std::move(b));
  }

  DeviceMemory& memory() override { return *memory_; }
  MetadataWriter& writer() override { return *writer_; }
  absl::Status SyncReqToToken(const ReqToTokenPool& table) override {
    return memory_->CopyToDevice(table_, 0, table.table().data(),
                                 static_cast<int64_t>(table.table().size() * sizeof(TokenSlot)));
  }
  absl::Status CheckAfterReplay() override { return writer_->CheckViolations(); }

 private:
  GpuReplayBackend() = default;
  hipStream_t stream_ = nullptr;
  std::unique_ptr<StagedUploads> uploads_;
  std::unique_ptr<HipDeviceMemory> memory_;
  DeviceBuffer table_;
  std::unique_ptr<DeviceMetadataWriter> writer_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<ReplayBackend>> MakeGpuReplayBackend(const ReqToTokenPool& table,
                                                                    TokenCount pool_slots) {
  return GpuReplayBackend::Create(table, pool_slots);
}

}  // namespace attnmeta
