// DeviceMetadataWriter: the graph layer's MetadataWriter (attention/graph/metadata_writer.h)
// on the GPU. From the staged rows and lengths of a padded batch it writes every array of a
// decode, extend, draft-extend or idle replay in one fused kernel launch (target-verify's
// FULL mask in a second, the split-KV plan in another), from device-resident inputs only, so
// that the launches can be captured in a HIP/CUDA graph once per (buffer generation, bucket,
// mode) and replayed for any real batch of that bucket: the kernels' arguments depend on the bucket
// and the buffers, never on the real batch (padded rows are told apart by their staged row,
// kPaddedRow).
//
// With graphs on (the default) the first write of a (generation, bucket, mode) captures the
// launches and every write launches the captured graph. With `Options::uploads` (the
// StagedUploads of the HipDeviceMemory that GraphState stages through) the writer attaches to
// them and its launch starts with their apply kernel: the staged inputs land inside the one
// graph launch of a replay step, with no copy call of their own; a new generation
// (GraphState::Reserve moved the buffers) drops the graphs captured before it once its first
// graph is captured. WriteBatchArrays queues everything; WriteTokenArrays only reports the
// split-KV counts. Neither waits for the GPU: CheckViolations does, and turns what the kernels
// recorded (a row, length or slot in device memory that broke its bound) into a Status.
//
// The split-KV plan is written on the device too (BuildSplitKvPlanOnDevice, from the indptrs
// the fused launch wrote); its counts come from the request's host lengths (CountSplitKvPlan),
// counted by WriteBatchArrays before anything is queued and reported by WriteTokenArrays.
// Draft-decode replays write every step's arrays instead (BuildDraftStepOnDevice, two launches
// per step).

#ifndef ATTNMETA_ATTENTION_KERNELS_DEVICE_METADATA_WRITER_H_
#define ATTNMETA_ATTENTION_KERNELS_DEVICE_METADATA_WRITER_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <tuple>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "attention/graph/captured_write.h"
#include "attention/graph/metadata_writer.h"
#include "attention/kernels/device_violation_word.h"
#include "attention/kernels/hip_port.h"
#include "attention/kernels/metadata_launchers.h"
#include "attention/kernels/staged_uploads.h"
#include "kvcache/units.h"

namespace attnmeta {

class DeviceMetadataWriter : public MetadataWriter {
 public:
  struct Options {
    bool use_graphs = true;
    // When set: attached to for the writer's lifetime (Create fails with FailedPrecondition
    // when another consumer is attached), applied at the head of every launch. Must outlive
    // the writer and be on the writer's stream.
    StagedUploads* uploads = nullptr;
    // Each metadata launch may start under the tail of the kernel ahead of it (the apply
    // kernel of the staged uploads, or the launch before it) and waits for it before reading
    // anything (overlap_preceding_kernel in metadata_launchers.h). Without staged uploads the
    // first launch follows the violation word's memset, which nothing overlaps. False: plain
    // launches.
    bool overlap_launches = true;
  };

  // `req_to_token` is the device copy of the table the replays' rows index (it must mirror
  // the host ReqToTokenPool GraphState checks rows against: same rows and stride); slots read
  // are checked against `pool_slots`. Launches on `stream`. InvalidArgument for an empty
  // table, a stride < 1, a table that is not whole rows, a null table or pool_slots < 1;
  // OutOfRange for more than INT32_MAX rows, rows of more than 2^30 tokens or pool_slots past
  // 2^31; Internal when the runtime fails. A write that fails leaves the writer as it was (its
  // violation word and the staged uploads are touched only once every launch of the write has
  // been checked), but for the split-KV counts: WriteTokenArrays refuses until a WriteBatchArrays
  // succeeds.
  static absl::StatusOr<std::unique_ptr<DeviceMetadataWriter>> Create(
      DeviceReqToToken req_to_token, TokenCount pool_slots, hipStream_t stream, Options options);
  DeviceMetadataWriter(const DeviceMetadataWriter&) = delete;
  DeviceMetadataWriter& operator=(const DeviceMetadataWriter&) = delete;
  ~DeviceMetadataWriter() override;

  // Unimplemented for mask layouts other than FULL; InvalidArgument for a split-KV request
  // without the host lengths of its padded rows (host_kv_lens, host_q_lens), or for
  // draft-decode with a split-KV plan. WriteBatchArrays also refuses (CountSplitKvPlan's
  // InvalidArgument or OutOfRange) split-KV host lengths the planner refuses, before it queues
  // anything, and a request CheckWriteFitsBuffers refuses (InvalidArgument; a null
  // req_to_token too, which this writer does not read), checked at capture and on direct
  // writes, not on relaunches; WriteTokenArrays reports the counts of the last WriteBatchArrays,
  // and is FailedPrecondition when that one failed or none ran. With graphs, a write is captured
  // once per (generation, bucket, mode) and later writes of that key relaunch the capture
  // without checking the lengths again; one that differs from the captured write in anything
  // else it fixes (page size, page table, split-KV options, mask layout, draft shape, with a
  // mask q_len_per_request, the buffers: captured_write.h) is FailedPrecondition, naming the
  // difference, and launches nothing. GraphState keeps them the same within a generation (a
  // regrow or a new config starts a new generation).
  MemorySpace space() const override { return MemorySpace::kDevice; }
  absl::Status CheckSupported(const MetadataWriteRequest& request) const override;
  // The launchers' bound on a launch's rows (kernels::kMaxMetadataRows).
  int64_t max_write_rows() const override;
  absl::Status WriteBatchArrays(const MetadataWriteRequest& request,
                                const GraphBuffers& buffers) override;
  absl::Status WriteTokenArrays(const MetadataWriteRequest& request, const GraphBuffers& buffers,
                                SplitKvPlanCounts* split_kv_counts) override;

  // Waits for the stream; OK, or OutOfRange naming the first violation the kernels of the last
  // write recorded (every write clears the word first).
  absl::Status CheckViolations();

  // Graphs captured so far (a regrow shows as a new capture of the same bucket).
  int64_t graphs_captured() const { return graphs_captured_; }

 private:
  struct Graph {
    uint64_t generation;
    int64_t bucket;
    ForwardMode mode;
    CapturedWrite recorded;  // what its relaunches write
    hipGraph_t graph;
    hipGraphExec_t exec;
  };
  DeviceMetadataWriter(DeviceReqToToken req_to_token, TokenCount pool_slots, hipStream_t stream,
                       Options options, DeviceViolationWord violation)
      : req_to_token_(req_to_token),
        pool_slots_(pool_slots),
        stream_(stream),
        options_(options),
        violation_(std::move(violation)) {}
  // Queues the kernels of `request` on the stream: launches them when `direct`, else the
  // stream is capturing them.
  absl::Status Launch(const MetadataWriteRequest& request, const GraphBuffers& buffers,
                      bool direct);
  // Launches the graph captured for the request's (generation, bucket, mode), capturing it
  // first when there is none.
  absl::Status LaunchGraph(const MetadataWriteRequest& request, const GraphBuffers& buffers);
  // After every launch of the staged uploads' apply kernel (directly or in a graph).
  void NoteLaunched();
  void DropGraphs();

  DeviceReqToToken req_to_token_;
  TokenCount pool_slots_;
  hipStream_t stream_;
  Options options_;
  DeviceViolationWord violation_;
  std::vector<Graph> graphs_;
  uint64_t generation_ = 0;
  int64_t graphs_captured_ = 0;
  // The split-KV plan of the last WriteBatchArrays, which WriteTokenArrays reports; empty
  // after one that failed.
  std::optional<SplitKvPlanCounts> split_kv_counts_;
};

}  // namespace attnmeta

#endif  // ATTNMETA_ATTENTION_KERNELS_DEVICE_METADATA_WRITER_H_
