// The launch function of varlen (unified) attention (what it computes and its argument struct:
// varlen_attention.h), defined by the device source.

#ifndef ATTNMETA_ATTENTION_KERNELS_VARLEN_ATTENTION_LAUNCH_H_
#define ATTNMETA_ATTENTION_KERNELS_VARLEN_ATTENTION_LAUNCH_H_

#include <cstdint>

#include "attention/kernels/hip_port.h"
#include "attention/kernels/varlen_attention.h"

namespace attnmeta {
namespace kernels {

// Launches batch_size * q_tiles * (num_q_heads / heads_per_block) blocks, or with
// vector_chunks > 0 batch_size * num_kv_heads * vector_chunks blocks (ceil(vector_chunks / 2)
// for vector_chunks > 1 at head dims up to 128); hipErrorInvalidValue for
// a dtype or head dim that is not compiled. With overlap_preceding the launch may start under
// the tail of the kernel ahead on the stream (LaunchKernelAfterPreceding in hip_port.h): every
// block waits for that kernel before it reads anything.
// REQUIRES: the launcher's checks passed (shapes, alignment, the grid fits); overlap_preceding
// only where DeviceOverlapsLaunches says yes.
hipError_t LaunchVarlenAttentionKernel(const VarlenAttentionParams& p, bool overlap_preceding,
                                       hipStream_t stream);

}  // namespace kernels
}  // namespace attnmeta

#endif  // ATTNMETA_ATTENTION_KERNELS_VARLEN_ATTENTION_LAUNCH_H_
