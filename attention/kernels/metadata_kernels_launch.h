// The launch functions of the metadata kernels (their argument structs and what each kernel
// does: metadata_kernels.h), defined by the device source.
//
// A launch function with `overlap_preceding` launches through LaunchKernelAfterPreceding
// (hip_port.h): the blocks may start under the tail of the kernel ahead on the stream, and each
// waits for it (WaitForPrecedingGrid) before it reads anything, so such a launch is right after
// any kernel, one that writes its inputs included, provided that a kernel ahead which was itself
// launched to overlap waits before it ends. Without it, a plain launch.

#ifndef ATTNMETA_ATTENTION_KERNELS_METADATA_KERNELS_LAUNCH_H_
#define ATTNMETA_ATTENTION_KERNELS_METADATA_KERNELS_LAUNCH_H_

#include <cstdint>

#include "attention/kernels/hip_port.h"
#include "attention/kernels/metadata_kernels.h"

namespace attnmeta {
namespace kernels {

hipError_t LaunchIndptrKernel(const IndptrParams& p, bool overlap_preceding, hipStream_t stream);
hipError_t LaunchPageTableKernel(const PageTableParams& p, int32_t passes, bool overlap_preceding,
                                 hipStream_t stream);
hipError_t LaunchTokenKvIndicesKernel(const TokenKvIndicesParams& p, int32_t passes,
                                      bool overlap_preceding, hipStream_t stream);
hipError_t LaunchFusedMetadataKernel(const FusedMetadataParams& p, int32_t row_blocks,
                                     bool overlap_preceding, hipStream_t stream);
// The fused kernel's blocks that one multiprocessor of the current device runs at once.
hipError_t FusedMetadataBlocksPerMultiprocessor(int32_t* blocks);
hipError_t LaunchDraftStepKernels(const DraftStepParams& p, int32_t passes, bool overlap_preceding,
                                  hipStream_t stream);
hipError_t LaunchSplitKvPlanKernel(const SplitKvPlanParams& p, bool overlap_preceding,
                                   hipStream_t stream);
hipError_t LaunchTreeMaskKernel(const TreeMaskParams& p, int32_t passes, bool overlap_preceding,
                                hipStream_t stream);
hipError_t LaunchGatherKvKernel(const GatherKvParams& p, int32_t blocks, bool overlap_preceding,
                                hipStream_t stream);
// Whether the kernels of this build, as they run on the current device, wait for the kernel
// ahead where they call WaitForPrecedingGrid (KernelWaitsForPrecedingGrid in hip_port.h, asked
// of a kernel compiled like all of them), into *waits.
hipError_t KernelsWaitForPrecedingGrids(bool* waits);

}  // namespace kernels
}  // namespace attnmeta

#endif  // ATTNMETA_ATTENTION_KERNELS_METADATA_KERNELS_LAUNCH_H_
