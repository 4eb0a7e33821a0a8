#include "attention/kernels/staged_uploads.h"

#include <atomic>
#include <cstring>
#include <thread>

#include "absl/strings/str_cat.h"
#include "attention/kernels/internal/device_queries.h"

namespace attnmeta {
namespace {

using internal::RuntimeStatus;

constexpr int64_t kRunsOffset = 192;
constexpr int64_t kPayloadOffset = 256;
static_assert(sizeof(kernels::StagedUploadHeader) <= kRunsOffset);

constexpr uint32_t RoundUp16(int64_t bytes) { return static_cast<uint32_t>((bytes + 15) / 16 * 16); }

}  // namespace

absl::StatusOr<std::unique_ptr<StagedUploads>> StagedUploads::Create(hipStream_t stream,
                                                                     int64_t payload_bytes) {
  if (payload_bytes < 16 || payload_bytes >= (int64_t{1} << 31)) {
    return absl::InvalidArgumentError(
        absl::StrCat("staged uploads: payload of ", payload_bytes, " bytes (16 to 2^31 - 1)"));
  }
  std::unique_ptr<StagedUploads> u(new StagedUploads(stream, payload_bytes));
  const size_t bytes = static_cast<size_t>(kPayloadOffset + RoundUp16(payload_bytes));
  if (hipHostMalloc(&u->host_, bytes, hipHostMallocMapped | hipHostMallocCoherent) != hipSuccess) {
    (void)hipGetLastError();
    u->host_ = nullptr;
    return absl::ResourceExhaustedError(
        absl::StrCat("staged uploads: no pinned host memory for ", bytes, " bytes"));
  }
  std::memset(u->host_, 0, bytes);
  if (hipMalloc(&u->state_, sizeof(kernels::StagedUploadState)) != hipSuccess) {
    (void)hipGetLastError();
    u->state_ = nullptr;
    return absl::ResourceExhaustedError("staged uploads: no device memory for the kernel's state");
  }
  if (absl::Status s = RuntimeStatus(hipMemset(u->state_, 0, sizeof(kernels::StagedUploadState)),
                                     "staged uploads: clear the kernel's state");
      !s.ok()) {
    return s;
  }
  void* device = nullptr;
  if (absl::Status s = RuntimeStatus(hipHostGetDevicePointer(&device, u->host_, 0),
                                     "staged uploads: device address of the arena");
      !s.ok()) {
    return s;
  }
  char* host = static_cast<char*>(u->host_);
  char* dev = static_cast<char*>(device);
  u->header_ = reinterpret_cast<kernels::StagedUploadHeader*>(host);
  u->runs_ = reinterpret_cast<volatile uint64_t*>(host + kRunsOffset);
  u->payload_ = reinterpret_cast<uint8_t*>(host + kPayloadOffset);
  u->device_.header = reinterpret_cast<const kernels::StagedUploadHeader*>(dev);
  u->device_.payload = reinterpret_cast<const uint8_t*>(dev + kPayloadOffset);
  u->device_.payload_words = RoundUp16(payload_bytes) / 16;
  u->device_.state = u->state_;
  u->device_.host_runs = reinterpret_cast<uint64_t*>(dev + kRunsOffset);
  return u;
}

StagedUploads::~StagedUploads() {
  (void)hipStreamSynchronize(stream_);
  if (host_ != nullptr) (void)hipHostFree(host_);
  if (state_ != nullptr) (void)hipFree(state_);
}

uint64_t StagedUploads::Finished() const {
  const uint64_t finished = *runs_;
  std::atomic_thread_fence(std::memory_order_acquire);
  return finished;
}

absl::Status StagedUploads::WaitForApplies() {
  if (resync_) {
    // An apply launch reported failure: whether its kernel was queued is unknown, so count
    // what has run once the stream is idle.
    if (absl::Status s = RuntimeStatus(hipStreamSynchronize(stream_), "staged uploads: stream");
        !s.ok()) {
      return s;
    }
    launched_ = Finished();
    resync_ = false;
    return absl::OkStatus();
  }
  // Polls the counter the apply kernel increments; asks the stream now and then, so that an
  // apply kernel that will never run (a failed launch) is an error rather than a hang.
  for (int64_t poll = 0;; ++poll) {
    if (Finished() >= launched_) return absl::OkStatus();
    if (poll % 256 != 255) continue;
    const hipError_t q = hipStreamQuery(stream_);
    if (q == hipSuccess) {
      if (Finished() >= launched_) return absl::OkStatus();
      return absl::InternalError(absl::StrCat("staged uploads: ", launched_ - Finished(),
                                              " apply kernel(s) reported launched never ran"));
    }
    if (q != hipErrorNotReady) return RuntimeStatus(q, "staged uploads: stream");
    // Some runtimes also record "not ready" as the last error: a later launch check would
    // take it for its own.
    (void)hipGetLastError();
    std::this_thread::yield();
  }
}

absl::Status StagedUploads::Stage(void* dst, const void* src, int64_t bytes) {
  if (bytes < 0) {
    return absl::InvalidArgumentError(absl::StrCat("staged uploads: ", bytes, " bytes"));
  }
  if (bytes == 0) return absl::OkStatus();
  if (bytes > payload_bytes_) {
    return absl::ResourceExhaustedError(absl::StrCat("staged uploads: ", bytes,
                                                     " bytes exceed the payload of ", payload_bytes_));
  }
  if (!open_) {
    if (absl::Status s = WaitForApplies(); !s.ok()) return s;
    // Every apply kernel has run: the arena is the host's until the next one is launched.
    open_ = true;
    count_ = 0;
    used_ = 0;
    header_->count = 0;
    header_->batch = ++batch_;
  }
  // The copies of a batch are applied by different threads at once, in no order: a copy whose
  // range meets one staged before it in the batch replaces it when the range is the same (a
  // step retried after a failure stages the same inputs again), and otherwise waits for the
  // next batch (ResourceExhausted: the caller applies this batch first).
  const uint64_t begin = reinterpret_cast<uint64_t>(dst);
  for (uint32_t e = 0; e < count_; ++e) {
    const kernels::StagedUpload& u = header_->entries[e];
    if (begin < u.dst + u.bytes && u.dst < begin + static_cast<uint64_t>(bytes)) {
      if (u.dst == begin && u.bytes == static_cast<uint64_t>(bytes)) {
        std::memcpy(payload_ + u.offset, src, static_cast<size_t>(bytes));
        return absl::OkStatus();
      }
      return absl::ResourceExhaustedError(
          "staged uploads: the copy overlaps one staged in this batch (applied in no order)");
    }
  }
  if (count_ >= kernels::kMaxStagedUploads || bytes > payload_bytes_ - used_) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "staged uploads: no room for ", bytes, " bytes (", count_, " copies and ", used_, " of ",
        payload_bytes_, " bytes staged)"));
  }
  std::memcpy(payload_ + used_, src, static_cast<size_t>(bytes));
  header_->entries[count_] = kernels::StagedUpload{reinterpret_cast<uint64_t>(dst), used_,
                                                  static_cast<uint32_t>(bytes)};
  used_ += RoundUp16(bytes);
  // The count last: an entry is complete before it counts.
  std::atomic_thread_fence(std::memory_order_release);
  header_->count = ++count_;
  return absl::OkStatus();
}

absl::Status StagedUploads::EnqueueApply(void* zero, int64_t zero_bytes) {
  if (zero_bytes < 0 || zero_bytes % 4 != 0 || zero_bytes > 4 * int64_t{kernels::kMaxZeroWords} ||
      (zero == nullptr && zero_bytes > 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "staged uploads: cannot clear ", zero_bytes, " bytes (whole words, at most ",
        4 * kernels::kMaxZeroWords, ")"));
  }
  kernels::ApplyStagedUploadsParams p = device_;
  p.zero = static_cast<uint32_t*>(zero);
  p.zero_words = static_cast<uint32_t>(zero_bytes / 4);
  absl::Status launched = internal::LaunchResult(kernels::LaunchApplyStagedUploads(p, stream_),
                                                 "staged uploads apply");
  if (!launched.ok()) {
    // The open batch may or may not be applied: it is closed (its copies are lost, which the
    // caller learns from this status), and the next batch waits for the stream to count the
    // runs again. Its entries are cleared from the header, or the next apply kernel to run (a
    // graph holding one, launched again) would land them into destinations the caller may
    // have freed since. Every apply kernel launched before had run when the batch opened, so
    // only this launch's kernel, if it was queued after all, can be reading the header: it
    // reads it once, and lands the whole batch or none of it. With no batch open the header
    // is left alone: it holds the last batch launched, which its kernel may have yet to apply.
    if (open_) {
      header_->count = 0;
      count_ = 0;
      used_ = 0;
      open_ = false;
    }
    resync_ = true;
  }
  return launched;
}

void StagedUploads::NoteApplyLaunched() {
  ++launched_;
  open_ = false;
}

absl::Status StagedUploads::Flush() {
  if (!open_) return absl::OkStatus();
  if (count_ == 0) {
    // Nothing to apply (a copy without room opened it): closed without a launch.
    open_ = false;
    return absl::OkStatus();
  }
  if (absl::Status s = EnqueueApply(); !s.ok()) return s;
  NoteApplyLaunched();
  return absl::OkStatus();
}

void StagedUploads::Discard() {
  if (!open_) return;
  // No apply kernel is pending while a batch is open: the header is the host's.
  count_ = 0;
  header_->count = 0;
  open_ = false;
}

absl::Status StagedUploads::Attach() {
  if (attached_) {
    return absl::FailedPreconditionError("staged uploads: a consumer is attached already");
  }
  attached_ = true;
  return absl::OkStatus();
}

absl::Status StagedUploads::Detach() {
  absl::Status s = Flush();
  attached_ = false;
  return s;
}

}  // namespace attnmeta
