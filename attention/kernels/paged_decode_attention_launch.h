// The launch functions of paged decode attention and its merge kernel (what they compute and
// their argument structs: paged_decode_attention.h), defined by the device source.

#ifndef ATTNMETA_ATTENTION_KERNELS_PAGED_DECODE_ATTENTION_LAUNCH_H_
#define ATTNMETA_ATTENTION_KERNELS_PAGED_DECODE_ATTENTION_LAUNCH_H_

#include <cstdint>

#include "attention/kernels/hip_port.h"
#include "attention/kernels/paged_decode_attention.h"

namespace attnmeta {
namespace kernels {

// Launches num_work * DecodeBlocksPerItem(num_q_heads, heads_per_block) blocks;
// hipErrorInvalidValue for a shape that is not compiled. overlap_preceding: a launch whose
// blocks may start under the tail of the kernel ahead on the stream (LaunchKernelAfterPreceding
// in hip_port.h); before waiting for that kernel a block reads nothing, or only its metadata
// with p.metadata_before_wait or p.warm_l2_before_wait, and writes nothing. Every block allows
// the next kernel to start
// once it has read its K and V.
// REQUIRES: the launcher's checks passed (shapes, alignment, the grid fits).
hipError_t LaunchPagedDecodeKernel(const PagedDecodeParams& p, bool overlap_preceding,
                                   hipStream_t stream);

// The blocks of the kernel a split launch (LaunchPagedDecodeKernel with partial slots) would
// run for p's dtype, head_dim, heads_per_block and variant (no other field is read) that fit on
// one multiprocessor of the current device, into *blocks; hipErrorInvalidValue for a shape that
// is not compiled.
hipError_t PagedDecodeBlocksPerMultiprocessor(const PagedDecodeParams& p, int32_t* blocks);

// One warp per (reduce item, query head): out and lse of each reduce item's row from its
// partials. overlap_preceding: its blocks may start under the tail of the kernel ahead (the
// attention launch) and wait for it before they read anything.
// REQUIRES: num_reduce >= 1.
hipError_t LaunchDecodeMergeKernel(const DecodeMergeParams& p, bool overlap_preceding,
                                   hipStream_t stream);

}  // namespace kernels
}  // namespace attnmeta

#endif  // ATTNMETA_ATTENTION_KERNELS_PAGED_DECODE_ATTENTION_LAUNCH_H_
