#include "attention/kernels/staged_upload_kernel.h"

namespace attnmeta {
namespace kernels {
namespace {

constexpr int kThreads = 256;
constexpr int kHeaderWords = sizeof(StagedUploadHeader) / 16;
static_assert(kHeaderWords <= kThreads, "one word per thread");

// word[0, bytes) to dst: 16 bytes at once when both are 16-byte aligned.
__device__ inline void StoreWord(uint8_t* dst, const uint4& word, uint32_t bytes, bool vector) {
  if (vector) {
    *reinterpret_cast<uint4*>(dst) = word;
    return;
  }
  const uint32_t w[4] = {word.x, word.y, word.z, word.w};
  for (uint32_t b = 0; b < bytes && b < 16; ++b) dst[b] = static_cast<uint8_t>(w[b / 4] >> (8 * (b % 4)));
}

// A load from host memory crosses the bus (a microsecond or more): every thread loads its
// header word and its payload word at once, one round trip for a payload of up to
// kThreads * 16 bytes, and only words past that are loaded after the header is known. Plain
// loads: the host wrote the arena before the launch call, which orders it before them.
__global__ void __launch_bounds__(kThreads) ApplyStagedUploadsKernel(ApplyStagedUploadsParams p) {
  __shared__ uint4 words[kHeaderWords];
  const uint4* payload = reinterpret_cast<const uint4*>(p.payload);
  const uint32_t t = threadIdx.x;
  if (t < kHeaderWords) words[t] = reinterpret_cast<const uint4*>(p.header)[t];
  const uint4 mine = t < p.payload_words ? payload[t] : make_uint4(0, 0, 0, 0);
  if (p.zero != nullptr && t < p.zero_words && t < kMaxZeroWords) p.zero[t] = 0;
  __syncthreads();
  const StagedUploadHeader& header = *reinterpret_cast<const StagedUploadHeader*>(words);
  const bool fresh = header.batch != p.state->applied_batch;
  uint32_t count = fresh ? header.count : 0;
  if (count > kMaxStagedUploads) count = kMaxStagedUploads;
  for (uint32_t e = 0; e < count; ++e) {
    const StagedUpload u = header.entries[e];
    uint8_t* dst = reinterpret_cast<uint8_t*>(u.dst);
    const bool vector = ((u.dst | u.bytes) & 15) == 0;
    const uint32_t first = u.offset / 16;
    const uint32_t n = (u.bytes + 15) / 16;
    if (t >= first && t < first + n) {
      const uint32_t i = t - first;
      StoreWord(dst + 16 * i, mine, u.bytes - 16 * i, vector);
    }
    for (uint32_t i = (first < kThreads ? kThreads - first : 0) + t; i < n; i += kThreads) {
      StoreWord(dst + 16 * i, payload[first + i], u.bytes - 16 * i, vector);
    }
  }
  // Every thread's loads of the payload have returned before the host may reuse the arena.
  __syncthreads();
  if (t == 0) {
    if (fresh) p.state->applied_batch = header.batch;
    const uint64_t runs = p.state->runs + 1;
    p.state->runs = runs;
    __threadfence_system();
    *reinterpret_cast<volatile uint64_t*>(p.host_runs) = runs;
  }
}

}  // namespace

hipError_t LaunchApplyStagedUploads(const ApplyStagedUploadsParams& p, hipStream_t stream) {
  // The error checked after the launch must be the launch's own.
  (void)hipGetLastError();
  ApplyStagedUploadsKernel<<<1, kThreads, 0, stream>>>(p);
  return hipGetLastError();
}

}  // namespace kernels
}  // namespace attnmeta
