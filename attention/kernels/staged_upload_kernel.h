// The device side of StagedUploads (staged_uploads.h): the layout of the pinned host arena
// the host stages small copies in, and the kernel that applies them. Plain types only: no
// Abseil, no glog.

#ifndef ATTNMETA_ATTENTION_KERNELS_STAGED_UPLOAD_KERNEL_H_
#define ATTNMETA_ATTENTION_KERNELS_STAGED_UPLOAD_KERNEL_H_

#include <cstdint>

#include "attention/kernels/hip_port.h"

namespace attnmeta {
namespace kernels {

// Copies one batch may hold.
inline constexpr uint32_t kMaxStagedUploads = 8;

// One copy: payload bytes [offset, offset + bytes) to device address dst.
struct StagedUpload {
  uint64_t dst;
  uint32_t offset;  // a multiple of 16
  uint32_t bytes;
};

// The arena's head, in pinned host memory, written by the host only while no launched apply
// kernel is still to run (see StagedUploads), but for the count of a batch whose apply launch
// failed, cleared while that launch's kernel may be queued. 16-byte words, so that the kernel reads
// it in one round trip over the bus.
struct alignas(16) StagedUploadHeader {
  uint64_t batch;  // the open batch's number, from 1; a batch is applied once
  uint32_t count;  // entries[0, count) are its copies; <= kMaxStagedUploads
  uint32_t reserved;
  StagedUpload entries[kMaxStagedUploads];
};
static_assert(sizeof(StagedUploadHeader) % 16 == 0, "read as 16-byte words");

// The apply kernel's own state, in device memory.
struct StagedUploadState {
  uint64_t applied_batch;  // the last batch applied (0: none)
  uint64_t runs;           // apply kernels that have run
};

struct ApplyStagedUploadsParams {
  const StagedUploadHeader* header;  // device address of the pinned header
  const uint8_t* payload;            // device address of the pinned payload, 16-byte aligned
  uint32_t payload_words;            // its capacity in 16-byte words
  StagedUploadState* state;          // device memory
  uint64_t* host_runs;               // device address of a pinned word: state.runs, published
  uint32_t* zero;                    // [zero_words] device words to clear, or null
  uint32_t zero_words;               // <= kMaxZeroWords
};

// Words an apply kernel clears for its consumer (a status word), so that the consumer's launch
// needs no memset of its own.
inline constexpr uint32_t kMaxZeroWords = 64;

// One block: clears `zero`; unless the header's batch was applied already, runs its copies;
// then counts the run in state.runs and publishes the count in host_runs for the host to poll.
hipError_t LaunchApplyStagedUploads(const ApplyStagedUploadsParams& p, hipStream_t stream);

}  // namespace kernels
}  // namespace attnmeta

#endif  // ATTNMETA_ATTENTION_KERNELS_STAGED_UPLOAD_KERNEL_H_
