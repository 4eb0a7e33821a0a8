// StagedUploads: small host-to-device copies that ride in a kernel launch the caller makes
// anyway, instead of costing a copy call each.
//
// A graph replay step stages a few kilobytes of inputs (rows, lengths) and launches the
// captured metadata graph. An asynchronous copy from pinned memory and the event that guards
// its source cost more host time than the graph launch itself. Here the host instead writes
// the bytes into a pinned, device-mapped arena (a memcpy), and the apply kernel, queued at the
// head of the consumer's launch (captured in its graph), copies them to their destinations on
// the device; the copies then land in stream order, right before the consumer's kernels.
//
// Protocol: copies staged after the last apply launch form the open batch; the next apply
// kernel to run copies them, and later ones see that the batch was applied. The host writes
// the arena only while every launched apply kernel has run (each publishes a count of runs in
// the arena): opening a batch waits for that. The apply
// kernel runs at the head of the consumer's launch, so a host that runs a step or more ahead
// of the GPU waits until the GPU has started the previous step, never for the stream to drain.
//
// One consumer applies the batches (Attach) and reports each launch of an apply kernel
// (NoteApplyLaunched); HipDeviceMemory stages its small copies here only while one is attached,
// so that a staged copy always has a launch that applies it.

#ifndef ATTNMETA_ATTENTION_KERNELS_STAGED_UPLOADS_H_
#define ATTNMETA_ATTENTION_KERNELS_STAGED_UPLOADS_H_

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "attention/kernels/hip_port.h"
#include "attention/kernels/staged_upload_kernel.h"

namespace attnmeta {

class StagedUploads {
 public:
  static constexpr int64_t kDefaultPayloadBytes = 256 << 10;

  // Allocates the arena (pinned, mapped) for batches of up to `payload_bytes` bytes of copies
  // queued on `stream`. InvalidArgument for payload_bytes < 16 or >= 2^31; ResourceExhausted
  // when pinned or device memory cannot be had; the runtime's error when it fails otherwise.
  static absl::StatusOr<std::unique_ptr<StagedUploads>> Create(
      hipStream_t stream, int64_t payload_bytes = kDefaultPayloadBytes);
  StagedUploads(const StagedUploads&) = delete;
  StagedUploads& operator=(const StagedUploads&) = delete;
  // Waits for the stream, then frees the arena.
  ~StagedUploads();

  // Adds a copy of src[0, bytes) to device address `dst` to the open batch, opening one if
  // none is (which waits for every launched apply kernel to run). A copy to the very range of
  // a copy of the open batch replaces that copy's bytes. InvalidArgument for bytes < 0;
  // ResourceExhausted when the batch has no room left for it (entries or payload; a copy
  // larger than the payload opens nothing) or when its range overlaps another copy of the
  // batch otherwise (a batch's copies land in no order): nothing is staged then. Internal
  // when a launched apply kernel never ran (the stream went idle without it) or the stream
  // failed.
  // REQUIRES: dst is a device address valid until the batch is applied.
  absl::Status Stage(void* dst, const void* src, int64_t bytes);

  // Queues the apply kernel on the stream (into the graph while the stream captures). When it
  // runs it applies the batch that is open then, and clears the device words
  // [zero, zero + zero_bytes) for the consumer (a status word its kernels record into).
  // InvalidArgument unless zero_bytes is a multiple of 4 and at most 4 * kMaxZeroWords.
  // Internal when the launch fails: the open batch is then closed and its copies are lost
  // (they land at most through this launch's kernel, if it was queued after all, never through
  // a later one); batches launched before it are not touched.
  absl::Status EnqueueApply(void* zero = nullptr, int64_t zero_bytes = 0);
  // An apply kernel was launched, directly or in a graph: the open batch, if any, is in flight.
  // The consumer calls it after every successful launch that holds an apply kernel.
  void NoteApplyLaunched();
  // When a batch with copies is open: EnqueueApply and NoteApplyLaunched, so that its copies
  // land before whatever is queued on the stream next. An open batch without copies is closed.
  absl::Status Flush();
  // Drops the open batch's copies (for a consumer whose destinations go away after a failed
  // Flush).
  void Discard();

  // One consumer at a time. FailedPrecondition when one is attached already.
  absl::Status Attach();
  // Flushes the open batch, then detaches.
  absl::Status Detach();
  bool attached() const { return attached_; }
  bool has_open_batch() const { return open_; }

  hipStream_t stream() const { return stream_; }
  int64_t payload_bytes() const { return payload_bytes_; }
  // Apply kernels launched so far.
  uint64_t applies_launched() const { return launched_; }

 private:
  StagedUploads(hipStream_t stream, int64_t payload_bytes)
      : stream_(stream), payload_bytes_(payload_bytes) {}
  // Apply kernels that have finished.
  uint64_t Finished() const;
  // Waits until every launched apply kernel has run.
  absl::Status WaitForApplies();

  hipStream_t stream_;
  int64_t payload_bytes_;
  // One pinned allocation: the header, the runs counter, then the payload.
  void* host_ = nullptr;
  kernels::StagedUploadState* state_ = nullptr;  // device memory
  kernels::StagedUploadHeader* header_ = nullptr;
  volatile uint64_t* runs_ = nullptr;
  uint8_t* payload_ = nullptr;
  kernels::ApplyStagedUploadsParams device_{};
  bool attached_ = false;
  bool open_ = false;
  bool resync_ = false;    // an apply launch failed: count the runs again before the next batch
  uint32_t count_ = 0;     // copies of the open batch
  uint32_t used_ = 0;      // payload bytes of the open batch
  uint64_t launched_ = 0;  // apply kernels launched
  uint64_t batch_ = 0;     // the last batch opened
};

}  // namespace attnmeta

#endif  // ATTNMETA_ATTENTION_KERNELS_STAGED_UPLOADS_H_
